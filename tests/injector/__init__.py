"""Tests of tether.injector, tether inject/uninject and tether injector serve."""
