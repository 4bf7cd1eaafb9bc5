"""The launcher with stand-in components (tiny Python servers): start, ready, status, stop, failures. No root."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

from tether.platform.local.containers import Backoff
from tether.platform.local.launcher import ComponentSpec, Launcher

SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path in ("/ready", "/live") else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("stand-in serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_start_wait_status_stop(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "run", tmp_path / "logs")
    port = _free_port()
    spec = ComponentSpec("standin", (sys.executable, "-c", SERVER, str(port)), f"http://127.0.0.1:{port}",
                         addr=f"127.0.0.1:{port}", version="9.9.9", stop_timeout=5)
    record, started = launcher.start(spec)
    try:
        assert started
        assert launcher.start(spec) == (record, False)  # idempotent
        (outcome,) = launcher.wait_ready(["standin"], timeout=20)
        assert outcome.problem is None
        status = launcher.status("standin")
        assert status.healthy and status.live and status.record.version == "9.9.9"
        assert Launcher(tmp_path / "run", tmp_path / "logs").running("standin") == record  # from another process
    finally:
        assert launcher.stop("standin")
    assert launcher.status("standin").state == "stopped"
    assert not launcher.stop("standin")
    log = (tmp_path / "logs" / "standin.log").read_text()
    assert "stand-in serving" in log and "stopped standin" in log


def test_a_component_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "run", tmp_path / "logs")
    spec = ComponentSpec("broken", (sys.executable, "-c", "print('bad flag: --nope'); raise SystemExit(2)"),
                         "http://127.0.0.1:9")
    launcher.start(spec)
    seen = []
    (outcome,) = launcher.wait_ready(["broken"], timeout=20, progress=seen.append)
    assert seen == [outcome]
    try:
        assert outcome.problem == "its process exited (code 2); it is restarted with backoff"
        assert "bad flag: --nope" in outcome.log_tail
        assert outcome.log == tmp_path / "logs" / "broken.log"
        assert launcher.status("broken").state in ("restarting", "running")
    finally:
        assert launcher.stop("broken")
    assert launcher.status("broken").state == "stopped"


def test_a_killed_component_is_restarted_with_its_count(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "run", tmp_path / "logs", Backoff(initial=0.2, max=1.0, reset=60.0))
    port = _free_port()
    spec = ComponentSpec("standin", (sys.executable, "-c", SERVER, str(port)), f"http://127.0.0.1:{port}",
                         stop_timeout=5)
    launcher.start(spec)
    try:
        for kill in range(1, 3):
            (outcome,) = launcher.wait_ready(["standin"], timeout=20)
            assert outcome.problem is None, outcome
            status = launcher.status("standin")
            assert status.healthy and status.restarts == kill - 1 and status.pid
            os.kill(status.pid, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while launcher.status("standin").restarts < kill or not launcher.status("standin").ready:
                assert time.monotonic() < deadline, launcher.status("standin")
                time.sleep(0.1)
            assert launcher.status("standin").pid != status.pid
        assert "exited with code -9; restarting in" in (tmp_path / "logs" / "standin.log").read_text()
    finally:
        assert launcher.stop("standin")
    assert launcher.status("standin").state == "stopped"


def test_a_component_that_never_gets_ready_times_out(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "run", tmp_path / "logs")
    spec = ComponentSpec("slow", (sys.executable, "-c", "import time; time.sleep(60)"), "http://127.0.0.1:9",
                         stop_timeout=5)
    launcher.start(spec)
    try:
        (outcome,) = launcher.wait_ready(["slow"], timeout=1)
        assert outcome.problem is not None and outcome.problem.startswith("not ready after 1s")
    finally:
        launcher.stop("slow")
