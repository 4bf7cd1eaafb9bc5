"""Fixtures for the demo's tests: the ``emojivoto`` package importable, sample proxy metrics.

The demo apps live in ``demo/emojivoto`` (run as ``python -m emojivoto.<app>``
from ``demo/``), so that directory goes on ``sys.path`` here.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO_DIR = ROOT / "demo"

if str(DEMO_DIR) not in sys.path:
    sys.path.insert(0, str(DEMO_DIR))
