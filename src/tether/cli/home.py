"""Where the CLI keeps state: ``$TETHER_HOME`` (default ``~/.tether``) and the store inside it."""

from __future__ import annotations

import os
from pathlib import Path

STORE_FILE = "store.db"


def state_dir() -> Path:
    """The state directory; the only place that reads ``TETHER_HOME``."""
    return Path(os.environ.get("TETHER_HOME") or Path.home() / ".tether")


def store_path() -> Path:
    return state_dir() / STORE_FILE
