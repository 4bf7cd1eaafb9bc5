"""The protobuf runtime the serving proxy loads: upb's C messages without the pure-Python message implementation.

protobuf's ``descriptor_pool`` and ``internal.builder`` import ``google.protobuf.internal.python_message`` at their
top, and with it ``text_format``, ``decoder``, ``encoder``, ``containers`` and ``pickle``: ~1.1 MB resident in the
proxy (docs/proxy.md, "Memory"). With the upb backend (the C extension ``google._upb._message``, the one pip
installs) upb builds, parses and prints the messages and none of that module's functions is called. So the process
entry (``tether.proxy.main``) puts a placeholder in its place before the first protobuf import: any use of one of
its attributes imports the real module and the placeholder takes on its contents, so a protobuf that does use it
still works, only without the saving. With the pure-Python backend nothing is deferred (it needs the module).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

PYTHON_MESSAGE = "google.protobuf.internal.python_message"


class _Deferred(types.ModuleType):
    """Stands in for a module until one of its attributes is used, then loads it and becomes a copy of it."""

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def defer_python_message() -> bool:
    """Put the placeholder in place when protobuf runs on upb and nothing has loaded the module yet; True if done."""
    if PYTHON_MESSAGE in sys.modules:
        return False
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() != "upb":
        return False
    placeholder = _Deferred(PYTHON_MESSAGE)
    placeholder.__spec__ = None  # the import system reads it (an import in progress?) before using the module
    sys.modules[PYTHON_MESSAGE] = placeholder
    return True
