"""The programs the tests run, where the suite's Python installed them: one home for their paths.

A module of ``tests/`` itself (pytest puts ``tests/`` on ``sys.path`` for its ``conftest.py``): every
directory's tests import it as ``executables``.
"""

from __future__ import annotations

import sys
from pathlib import Path

TETHER = str(Path(sys.executable).parent / "tether")  # the installed ``tether`` script
