"""Tests of the demo (emojivoto), ``tether stat`` and the viz package behind it."""
