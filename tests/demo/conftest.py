"""Fixtures for the demo's tests: the ``emojivoto`` package importable, sample proxy metrics.

The demo apps live in ``demo/emojivoto`` (run as ``python -m emojivoto.<app>``
from ``demo/``), so that directory goes on ``sys.path`` here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DEMO_DIR = ROOT / "demo"

if str(DEMO_DIR) not in sys.path:
    sys.path.insert(0, str(DEMO_DIR))


def load_demo(name: str) -> ModuleType:
    """The demo's script ``demo/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"tether_demo_{name}", DEMO_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
