"""The backend every variant ends at: nginx from Debian, one process, a fixed 1 KiB body, status 200."""

from __future__ import annotations

from pathlib import Path

from bench.dataplane.procs import Pinning, Proc, StartError, Supervisor, free_port, wait_for_port, which

BODY_SIZE = 1024
BODY = "x" * BODY_SIZE


def nginx_binary() -> Path | None:
    return which("nginx")


def nginx_config(workdir: Path, host: str, port: int) -> str:
    """One process (no master), access log off, keep-alive for as long as the run lasts."""
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
}}
"""


def start_backend(
    sup: Supervisor, pinning: Pinning, nice: int, host: str = "127.0.0.1"
) -> tuple[Proc, tuple[str, int]]:
    binary = nginx_binary()
    if binary is None:
        raise StartError("nginx not found: run dev/bench-setup.sh (Debian package nginx-light)")
    workdir = sup.tempdir("nginx")
    (workdir / "tmp").mkdir()
    port = free_port(host)
    conf = workdir / "nginx.conf"
    conf.write_text(nginx_config(workdir, host, port))
    argv = [str(binary), "-e", str(workdir / "error.log"), "-p", str(workdir), "-c", str(conf)]
    proc = sup.start("backend/nginx", argv, cpus=pinning.sut, nice=nice, log=workdir / "nginx.log")
    wait_for_port(host, port, timeout=10, proc=proc)
    return proc, (host, port)
