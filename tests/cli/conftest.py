"""Runs the real ``tether`` executable against a state directory of the test's own."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from executables import TETHER

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "emojivoto"

Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def tether_executable() -> str:
    """The installed ``tether`` script, for a test that runs it with arguments the ``tether`` fixture does not take."""
    return TETHER


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def tether(home: Path) -> Run:
    def run(*args: str, input: str | None = None, ok: bool | None = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "TETHER_HOME": str(home), "NO_COLOR": "1"}
        proc = subprocess.run([TETHER, *args], input=input, capture_output=True, text=True, env=env, timeout=60)
        assert "Traceback" not in proc.stderr, proc.stderr
        if ok is True:
            assert proc.returncode == 0, proc.stderr
        elif ok is False:
            assert proc.returncode != 0, proc.stdout
        return proc

    return run
