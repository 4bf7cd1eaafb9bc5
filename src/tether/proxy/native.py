"""The proxy's hot modules compiled to C by mypyc, used only when built from exactly these sources.

Per request the proxy runs its sans-IO code (``codec``, the HTTP cores and the decisions of ``core``): as
interpreted Python that is most of its CPU (docs/benchmarks.md). ``dev/build_native.py`` (run by ``./run``)
compiles the modules of ``COMPILED`` with mypyc, which turns type-checked Python into a C extension with the
same behaviour, into ``<venv>/tether-native/``, and writes a manifest with a fingerprint of the sources.

``install()`` puts a finder in front of the import system that loads those extensions instead of the
``.py`` files, but only when the manifest's fingerprint is that of the sources on disk: a source edited
after the build (a developer's tree) runs interpreted, never stale. ``TETHER_PURE_PYTHON=1`` runs
interpreted whatever is built (and ``./run`` then builds nothing). Without a C compiler the build is skipped
and everything runs interpreted: the compiled modules are an optimisation, never a requirement.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

# hashlib's blake2b without hashlib: hashlib loads OpenSSL's digests (~0.65 MB resident) for a proxy that needs
# one digest, once, at start (docs/proxy.md, "Memory").
from _blake2 import blake2b

# The modules compiled, by the file they come from: what every request runs, and nothing that runs only on a
# control-plane update (translation of discovery and policy answers), at start, or in tests. Not core/errors.py:
# its ErrorKind is an Enum with an __init__, which mypyc cannot compile (the compiled __init__ rejects the
# members while the Enum class is being built). Not core/outbound.py: its per-connection carriers are closures made
# at import (tcp_forward), whose compiled environment mypyc 2.4 leaves unset (AttributeError '__mypyc_env__'); it
# runs once per connection, not per request.
COMPILED: tuple[str, ...] = (
    "codec/common.py",
    "codec/grpc_framing.py",
    "codec/http1.py",
    "codec/http2.py",
    "codec/http2_events.py",
    "codec/http2_hpack.py",
    "core/balancer.py",
    "core/breaker.py",
    "core/durations.py",
    "core/endpoint.py",
    "core/exchange.py",
    "core/http.py",
    "core/http1_headers.py",
    "core/http1_proxy.py",
    "core/http2_proxy.py",
    "core/http_metrics.py",
    "core/inbound.py",
    "core/inbound_authz.py",
    "core/inbound_profile_routes.py",
    "core/inbound_route_metrics.py",
    "core/metrics.py",
    "core/observers.py",
    "core/orig_proto.py",
    "core/policy_metrics.py",
    "core/retries.py",
    "core/route_headers.py",
    "core/routes.py",
)

PURE_ENV = "TETHER_PURE_PYTHON"
MANIFEST = "manifest.json"
_PACKAGE = Path(__file__).resolve().parent


def native_dir() -> Path:
    """Where the build puts the extensions: inside the virtual environment, whose Python they were built for."""
    return Path(sys.prefix) / "tether-native"


def source_paths() -> list[Path]:
    return [_PACKAGE / relative for relative in COMPILED]


def build_blocker() -> str | None:
    """Why the modules cannot be compiled on this machine (no C compiler, no Python headers), or None."""
    import shutil  # only the build asks: not loaded by the serving proxy (~0.8 MB with sysconfig)
    import sysconfig

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers ({headers})"
    return None


def fingerprint() -> str:
    """The sources and the interpreter the extensions must match (a change to either means rebuild)."""
    digest = blake2b(sys.version.encode())
    for relative, path in zip(COMPILED, source_paths()):
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


class _Finder:
    """A meta-path finder for exactly the built modules (and mypyc's shared library of the group)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        file = self.files.get(name)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(name, str(file))
        return importlib.util.spec_from_file_location(name, file, loader=loader)


# What install() decided, for the proxy's start log and `tether version`-like reports.
status = "interpreted: not installed"


def install() -> str:
    """Load the compiled modules from now on when they match the sources; returns (and keeps) what was decided."""
    global status
    status = _decide()
    return status


def _decide() -> str:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"interpreted: {PURE_ENV} is set"
    directory = native_dir()
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return "interpreted: not built (./run builds it when a C compiler is present)"
    except (OSError, ValueError) as e:
        return f"interpreted: {directory / MANIFEST} unreadable ({e})"
    try:
        current = fingerprint()
    except OSError as e:
        return f"interpreted: a compiled module's source is unreadable ({e})"
    if manifest.get("fingerprint") != current:
        return "interpreted: the sources changed since the build (./run rebuilds)"
    files = {name: directory / relative for name, relative in manifest.get("files", {}).items()}
    if not files or not all(path.is_file() for path in files.values()):
        return f"interpreted: {directory} is incomplete"
    sys.meta_path.insert(0, _Finder(files))
    return f"compiled: {len(COMPILED)} modules from {directory}"
