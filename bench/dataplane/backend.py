"""The backend every variant ends at: nginx from Debian, one process, a fixed 1 KiB body, status 200.

nginx listens twice: HTTP/1.1 for the HTTP/1 variants, and HTTP/2 over
cleartext (h2c, prior knowledge: ``listen ... http2`` without TLS) for the
HTTP/2 and gRPC variants. On the HTTP/2 port, ``GRPC_PATH`` answers as a gRPC
server would a unary call: ``content-type: application/grpc``, one
length-prefixed message (``GRPC_RESPONSE``) and the trailer ``grpc-status: 0``
(nginx's ``add_trailer``). The response is fixed, so nginx stays as cheap as
for the other loads and the proxies are what is measured; a real gRPC client
(grpcio) checks every path with it before the run (``runner.check_path``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.dataplane.procs import Pinning, Proc, StartError, Supervisor, free_port, wait_for_port, which

BODY_SIZE = 1024
BODY = "x" * BODY_SIZE
GRPC_PATH = "/bench.Echo/Ping"
# A protobuf message with one string field (field 1, "ping" / "pong" + padding), gRPC length-prefixed.
GRPC_REQUEST_MESSAGE = b"\x0a\x04ping"
GRPC_RESPONSE_MESSAGE = b"\x0a\x40" + b"pong" * 16


def grpc_frame(message: bytes) -> bytes:
    """One uncompressed gRPC message: flag 0, 4-byte big-endian length, the message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


GRPC_REQUEST = grpc_frame(GRPC_REQUEST_MESSAGE)
GRPC_RESPONSE = grpc_frame(GRPC_RESPONSE_MESSAGE)
assert b"$" not in GRPC_RESPONSE  # nginx would read a variable there


@dataclass(frozen=True)
class Backend:
    http1: tuple[str, int]
    h2c: tuple[str, int]


def nginx_binary() -> Path | None:
    return which("nginx")


def nginx_config(workdir: Path, host: str, port: int, h2_port: int) -> str:
    """One process (no master), access log off, keep-alive for as long as the run lasts."""
    # nginx takes the bytes between the quotes as they are (NUL included); only " and \\ need escaping.
    grpc_body = GRPC_RESPONSE.decode("latin-1").replace("\\", "\\\\").replace('"', '\\"')
    temp = "\n".join(f"    {kind}_temp_path {workdir / 'tmp' / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""\
daemon off;
master_process off;
worker_processes 1;
pid {workdir / 'nginx.pid'};
error_log {workdir / 'error.log'} warn;
worker_rlimit_nofile 65536;
events {{
    worker_connections 16384;
}}
http {{
    access_log off;
    server_tokens off;
    default_type application/octet-stream;
    keepalive_timeout 3600s;
    keepalive_requests 1000000000;
{temp}
    server {{
        listen {host}:{port} backlog=4096;
        location / {{
            return 200 "{BODY}";
        }}
    }}
    server {{
        listen {host}:{h2_port} http2 backlog=4096;
        http2_max_concurrent_streams 1024;
        location / {{
            return 200 "{BODY}";
        }}
        location = {GRPC_PATH} {{
            default_type application/grpc;
            add_trailer grpc-status 0 always;
            return 200 "{grpc_body}";
        }}
    }}
}}
"""


def start_backend(sup: Supervisor, pinning: Pinning, nice: int, host: str = "127.0.0.1") -> tuple[Proc, Backend]:
    binary = nginx_binary()
    if binary is None:
        raise StartError("nginx not found: run dev/bench-setup.sh (Debian package nginx-light)")
    workdir = sup.tempdir("nginx")
    (workdir / "tmp").mkdir()
    port, h2_port = free_port(host), free_port(host)
    conf = workdir / "nginx.conf"
    conf.write_bytes(nginx_config(workdir, host, port, h2_port).encode("latin-1"))
    argv = [str(binary), "-e", str(workdir / "error.log"), "-p", str(workdir), "-c", str(conf)]
    proc = sup.start("backend/nginx", argv, cpus=pinning.sut, nice=nice, log=workdir / "nginx.log")
    wait_for_port(host, port, timeout=10, proc=proc)
    wait_for_port(host, h2_port, timeout=10, proc=proc)
    return proc, Backend((host, port), (host, h2_port))
