"""What a proxy holds in memory before its first connection: no grpcio, no cryptography (docs/benchmarks.md, the proxy's memory).

grpcio is ~16 MB of resident memory and runs threads; the proxy's control-plane calls use ``io.grpc_client``
and its tap server ``io.grpc_server``, both on h2. The import-linter contract ``proxy-no-grpcio`` forbids the
import in the whole proxy; this checks, in a fresh interpreter, that the modules ``python -m tether.proxy``
loads -- the tap server's included -- do not pull it in either.
"""

from __future__ import annotations

import subprocess
import sys

STARTUP = ("tether.proxy.main", "uvloop", "tether.proxy.app", "tether.proxy.io.admin", "tether.proxy.io.tap_server")


def test_startup_modules_load_no_grpcio() -> None:
    code = f"import sys; import {', '.join(STARTUP)}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"the proxy loads grpcio ({out}): its gRPC goes over h2 (io.grpc_client, io.grpc_server)"


def test_startup_modules_load_no_cryptography() -> None:
    """cryptography (~12 MB resident) is loaded only by ``tether.proxy.certify``, a short-lived process."""
    code = (f"import sys; import {', '.join(STARTUP)}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"the proxy loads cryptography at start ({out}): its X.509 work belongs in tether.proxy.certify"
