"""Tests of tether.resources (a package, so test module names cannot clash with other parts' tests)."""
