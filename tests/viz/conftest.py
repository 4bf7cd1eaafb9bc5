"""Fixtures for viz's tests: the local platform's (from ``tests/up``), torn down and checked even on failure."""

from __future__ import annotations

from up.conftest import clean_host, new_platform

__all__ = ["clean_host", "new_platform"]
