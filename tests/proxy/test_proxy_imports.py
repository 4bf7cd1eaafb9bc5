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


# What a proxy without tap or SPIRE does not need, with what loading it would cost (docs/proxy.md, "Memory"):
# hashlib loads OpenSSL's digests (~0.65 MB; native.py's fingerprint uses _blake2, the identity client's key
# password os.urandom); shutil and sysconfig (~0.8 MB) only the native build's check uses; tap's messages and
# server, and the SPIRE client, load when configured; the hpack package's Huffman table of tuples (~0.4 MB) is
# replaced by codec.hpack_huffman's bytes.
NOT_AT_START = ("hashlib", "secrets", "shutil", "sysconfig", "tether.api.tap_pb2", "tether.proxy.io.proxy_tap",
                "tether.proxy.io.spire_client", "hpack")


def test_startup_modules_leave_out_what_only_options_or_the_build_use() -> None:
    untapped = [m for m in STARTUP if m != "tether.proxy.io.tap_server"]
    code = (f"import sys; import {', '.join(untapped)}; "
            f"print(sorted(m for m in {NOT_AT_START!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"the proxy loads {out} at start: import it where it is used (docs/proxy.md, 'Memory')"


def test_protobuf_runs_on_upb_without_its_python_message_implementation() -> None:
    """``tether.proxy.main`` defers ``python_message`` (and text_format, decoder, pickle... with it, ~1.1 MB): the
    proxy's messages still parse and serialise, and the first use of the module loads the real one."""
    code = """
import sys
from google.protobuf.internal import api_implementation
from tether.proxy.protobuf_runtime import PYTHON_MESSAGE, defer_python_message
assert api_implementation.Type() == "upb", api_implementation.Type()
assert defer_python_message()
import tether.proxy.app, tether.proxy.io.admin
from tether.api import destination_pb2, inbound_pb2
loaded = [m for m in ("google.protobuf.text_format", "google.protobuf.internal.decoder", "pickle") if m in sys.modules]
update = destination_pb2.Update(add=destination_pb2.WeightedAddrSet(metric_labels={"zone": "a"}))
again = destination_pb2.Update.FromString(update.SerializeToString())
server = inbound_pb2.Server.FromString(inbound_pb2.Server(labels={"name": "web"}).SerializeToString())
placeholder = sys.modules[PYTHON_MESSAGE]
kind = type(placeholder).__name__
helper = placeholder._AttachFieldHelpers  # the first use loads the real module
print(loaded, kind, again.add.metric_labels["zone"], server.labels["name"], callable(helper),
      sys.modules[PYTHON_MESSAGE] is not placeholder, "google.protobuf.text_format" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] _Deferred a web True True True", out
