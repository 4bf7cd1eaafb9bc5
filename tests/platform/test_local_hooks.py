"""hooks.pre_stop: a container's preStop handler started, watched until over, cancelled at the grace period's end;
handlers the local platform does not run are named in a warning, never silently taken."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest

from tether.platform.local import hooks


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _container(handler: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}
    if handler is not None:
        spec["lifecycle"] = {"preStop": handler}
    return spec


def _start(handler: dict[str, Any] | None, clock: Clock | None = None, **over: Any) -> hooks.Hook | None:
    def no_exec(argv: list[str]) -> subprocess.Popen:
        raise AssertionError(f"exec of {argv}")

    def no_get(port: int, path: str, host: str | None, timeout: float) -> bool:
        raise AssertionError("a GET")

    kwargs: dict[str, Any] = {"run_exec": no_exec, "http_get": no_get, "grace": 30.0,
                              "port_of": lambda port: 8080 if port in ("http", 8080) else None}
    kwargs.update(over)
    return hooks.pre_stop("ns/pod", _container(handler), clock=clock or Clock(), **kwargs)


def test_no_handler_is_no_hook() -> None:
    assert _start(None) is None


def test_sleep_is_over_after_its_seconds() -> None:
    clock = Clock()
    hook = _start({"sleep": {"seconds": 3}}, clock)
    assert hook is not None and not hook.done()
    clock.now += 2.9
    assert not hook.done()
    clock.now += 0.1
    assert hook.done()


def test_exec_runs_the_command_and_is_over_when_it_exits(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[list[str]] = []

    def run_exec(argv: list[str]) -> subprocess.Popen:
        ran.append(argv)
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"],
                                stdin=subprocess.PIPE)

    hook = _start({"exec": {"command": ["/bin/sleep", 5]}}, run_exec=run_exec)
    assert ran == [["/bin/sleep", "5"]]
    assert hook is not None and not hook.done()
    proc = hook.proc  # type: ignore[attr-defined]
    proc.stdin.close()
    proc.wait()
    with caplog.at_level(logging.WARNING, logger=hooks.__name__):
        assert hook.done()
    assert "ns/pod: container app: lifecycle.preStop.exec: exited with 3" in caplog.text


def test_exec_still_running_at_the_deadline_is_killed() -> None:
    procs: list[subprocess.Popen] = []

    def run_exec(argv: list[str]) -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return procs[0]

    hook = _start({"exec": {"command": ["sleep", "60"]}}, run_exec=run_exec)
    assert hook is not None
    hook.cancel()
    assert procs[0].returncode is not None


def test_http_get_resolves_a_named_port_and_is_over_when_answered() -> None:
    asked: list[tuple[int, str, str | None]] = []

    def http_get(port: int, path: str, host: str | None, timeout: float) -> bool:
        asked.append((port, path, host))
        return True

    hook = _start({"httpGet": {"port": "http", "path": "/quit"}}, http_get=http_get)
    assert hook is not None
    assert hook.finished.wait(10)  # type: ignore[attr-defined]
    assert hook.done() and asked == [(8080, "/quit", None)]


@pytest.mark.parametrize("handler,named", [
    ({"tcpSocket": {"port": 8080}}, "tcpSocket is not run by the local platform"),
    ({"sleep": {"seconds": "5"}}, "sleep.seconds must be a whole number"),
    ({"exec": {}}, "exec has no command"),
    ({"httpGet": {"port": "admin"}}, "httpGet.port 'admin' names no port"),
])
def test_handlers_not_run_are_named(handler: dict[str, Any], named: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=hooks.__name__):
        assert _start(handler) is None
    assert "pod ns/pod: container app: lifecycle.preStop" in caplog.text and named in caplog.text
