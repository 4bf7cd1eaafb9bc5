"""``tether await`` (linkerd-await) against a real admin server on 127.0.0.1 that is ready when the test says.

The server answers ``/ready`` with 503 until the test sets its ``ready`` event, counts the checks
so a test can wait for them (no sleeps), and records ``POST /shutdown``.  ``tether await`` runs as
its own process, as the kubelet runs the postStart hook, so exec and exit codes are real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from executables import TETHER

from tether.cli.await_cmd import await_
from tether.injector import MeshConfig, inject
from tether.platform.local.await_proxy import EX_UNAVAILABLE, parse_duration, wait_ready

from .helpers import deployment

DEADLINE_S = 30.0


class AdminServer:
    """The proxy admin server's ``/ready`` and ``/shutdown``, driven by events."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.shutdown_posted = threading.Event()
        self.statuses: list[int] = []
        self.shutdown_saw: list[bool] = []
        self.marker: Path | None = None  # exists when the wrapped program has run
        self.stall_after: int | None = None  # checks answered before the server stops answering
        self.release = threading.Event()
        self._checks = threading.Condition()
        admin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if admin.stall_after is not None and len(admin.statuses) >= admin.stall_after:
                    admin.release.wait(DEADLINE_S)
                status = 200 if self.path == "/ready" and admin.ready.is_set() else 503
                self.send_response(status)
                self.send_header("Content-Length", "3")
                self.end_headers()
                self.wfile.write(b"ok\n" if status == 200 else b"no\n")
                with admin._checks:
                    admin.statuses.append(status)
                    admin._checks.notify_all()

            def do_POST(self) -> None:  # noqa: N802
                if self.path == "/shutdown":
                    admin.shutdown_saw.append(admin.marker is not None and admin.marker.exists())
                    admin.shutdown_posted.set()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def wait_for_checks(self, count: int) -> None:
        with self._checks:
            assert self._checks.wait_for(lambda: len(self.statuses) >= count, DEADLINE_S), self.statuses


@pytest.fixture
def admin() -> Iterator[AdminServer]:
    server = AdminServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("LINKERD_AWAIT", "LINKERD_DISABLED"))}
    return subprocess.Popen(
        [TETHER, "await", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**environ, **(env or {})}
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PRINT_PID_AND_EXIT_7 = "import os, sys; print(os.getpid()); sys.exit(7)"


def test_waits_through_503_then_execs_the_command(admin: AdminServer) -> None:
    proc = start(f"--port={admin.port}", "--backoff=10ms", "--timeout=30s", "--", sys.executable, "-c", PRINT_PID_AND_EXIT_7)
    try:
        admin.wait_for_checks(2)  # two refusals: it kept polling instead of running the app
        assert proc.poll() is None
        admin.ready.set()
    finally:
        code, out, err = finish(proc)
    assert code == 7, err
    assert out.strip() == str(proc.pid)  # exec'd: the app replaced tether await in the same process
    assert admin.statuses[:2] == [503, 503] and admin.statuses[-1] == 200
    assert not admin.shutdown_posted.is_set()


def test_as_a_hook_it_exits_0_once_ready(admin: AdminServer) -> None:
    proc = start(f"--port={admin.port}", "--backoff=10ms", "--timeout=30s")
    try:
        admin.wait_for_checks(1)
        admin.ready.set()
    finally:
        code, out, err = finish(proc)
    assert (code, out, err) == (0, "", "")
    assert admin.statuses[0] == 503 and admin.statuses[-1] == 200


def test_timeout_fails_clearly_and_runs_nothing(admin: AdminServer, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code, out, err = finish(
        start(f"--port={admin.port}", "-b", "10ms", "-t", "300ms", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    )
    assert code == EX_UNAVAILABLE
    assert "linkerd-proxy failed to become ready within the 0.3s timeout" in err
    assert f"GET http://localhost:{admin.port}/ready: HTTP 503" in err
    assert not marker.exists() and admin.statuses and set(admin.statuses) == {503}


def test_a_check_cut_short_by_the_timeout_keeps_the_last_answer_as_evidence(admin: AdminServer) -> None:
    admin.stall_after = 1  # one 503, then checks that hang until the timeout ends them
    try:
        assert wait_ready(admin.port, backoff=0.01, timeout=1.0, host="127.0.0.1") == "HTTP 503"
    finally:
        admin.release.set()


def test_timeout_when_nothing_listens() -> None:
    port = free_port()
    code, _, err = finish(start(f"--port={port}", "--backoff=10ms", "--timeout=200ms"))
    assert code == EX_UNAVAILABLE
    assert "failed to become ready" in err and "ConnectionRefusedError" in err


def test_shutdown_runs_the_child_then_posts_shutdown(admin: AdminServer, tmp_path: Path) -> None:
    admin.ready.set()
    admin.marker = tmp_path / "child-done"
    script = f"open({str(admin.marker)!r}, 'w').close(); raise SystemExit(3)"
    code, _, err = finish(start(f"--port={admin.port}", "--shutdown", "--timeout=30s", "--", sys.executable, "-c", script))
    assert code == 3, err  # the child's exit code
    assert admin.shutdown_posted.is_set() and admin.shutdown_saw == [True]  # after the child ended


def test_disabled_by_the_environment_runs_the_command_at_once() -> None:
    port = free_port()  # nothing listens: any check would fail
    env = {"LINKERD_AWAIT_DISABLED": "no mesh here"}
    code, out, err = finish(start(f"--port={port}", "-v", "--timeout=100ms", "--", sys.executable, "-c", "print('app')", env=env))
    assert (code, out) == (0, "app\n")
    assert "Linkerd readiness check skipped: no mesh here" in err


def test_a_missing_program_is_reported() -> None:
    code, _, err = finish(start("--", "/nonexistent/app", env={"LINKERD_DISABLED": "1"}))
    assert code == 71 and "failed to exec /nonexistent/app" in err


def test_shutdown_needs_a_command() -> None:
    code, _, err = finish(start("--shutdown"))
    assert code == 2 and "--shutdown needs a command" in err


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0.0), ("10ms", 0.01), ("1s", 1.0), ("2m", 120.0), ("1h", 3600.0), ("1d", 86400.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "1.5s", "-1s", "1w", "s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_the_injected_hook_runs_against_the_proxy_admin_port(admin: AdminServer, anchors_pem: str) -> None:
    """The classic sidecar's rendered postStart command, run as is (``tether`` from this venv)."""
    annotations = {
        "config.linkerd.io/proxy-enable-native-sidecar": "false",
        "config.linkerd.io/admin-port": str(admin.port),
    }
    config = MeshConfig(trust_anchors_pem=anchors_pem)
    result = inject(deployment(annotations=annotations), {"linkerd.io/inject": "enabled"}, config)
    proxy = result.obj["spec"]["template"]["spec"]["containers"][0]
    command = proxy["lifecycle"]["postStart"]["exec"]["command"]
    assert command[:2] == ["tether", "await"]
    await_.make_context("await", command[2:])  # the flags parse
    admin.ready.set()
    code, out, err = finish(start(*command[2:]))
    assert (code, err) == (0, "") and admin.statuses == [200]
