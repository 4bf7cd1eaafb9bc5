"""A package's public names, imported on first use rather than with the package.

Importing ``tether.destination.client`` first imports ``tether.destination``;
when that ``__init__`` imports the whole service (watchers, translators, the
resource models) every CLI command that only needs the client pays for it —
most of a ``tether diagnose``'s CPU time.  A package lists its public names
with the module each lives in and sets ``__getattr__ = lazy_exports(...)``; the
import then happens when the name is first read (PEP 562).  Type checkers see
the same names through an ``if TYPE_CHECKING:`` import beside it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving each of ``exports`` (name -> module) on first access."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # later reads skip __getattr__
        return value

    return __getattr__
