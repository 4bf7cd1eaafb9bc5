"""Waiting for the pod's own proxy, as Linkerd's ``linkerd-await`` does (workload side, no controllers).

Role: poll the proxy admin server's ``GET /ready`` on ``localhost:<port>`` until it answers 2xx
(each try bounded by 5 s, ``backoff`` between failed tries), within an optional overall timeout;
ask the proxy to exit with ``POST /shutdown``; run a program as a child, forwarding SIGTERM, for
``--shutdown``.  Durations use linkerd-await's grammar: an integer and ``ms|s|m|h|d`` (bare ``0``).

Caller: ``tether await`` (``tether.cli.await_cmd``), the classic sidecar's postStart hook and
app-command wrapper rendered by ``tether.injector``.
"""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

REQUEST_TIMEOUT_S = 5.0  # linkerd-await's per-request bound
# sysexits.h, as linkerd-await uses them
EX_UNAVAILABLE = 69
EX_OSERR = 71

_DURATION = re.compile(r"\s*(\d+)(ms|s|m|h|d)?\s*", re.ASCII)
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``500ms``, ``1s``, ``2m``, ``1h``, ``1d`` or ``0``; ``ValueError`` otherwise."""
    match = _DURATION.fullmatch(text)
    if match is None or len(match[1]) > 15:
        raise ValueError(f"invalid duration {text!r} (an integer and ms, s, m, h or d, e.g. 2m)")
    if match[2] is None:
        if int(match[1]) != 0:
            raise ValueError(f"invalid duration {text!r}: missing unit (ms, s, m, h or d)")
        return 0.0
    return int(match[1]) * _SECONDS[match[2]]


def disabled_reason(environ: Mapping[str, str]) -> str | None:
    """``LINKERD_AWAIT_DISABLED`` (or ``LINKERD_DISABLED``) when set and non-empty: skip waiting."""
    return environ.get("LINKERD_AWAIT_DISABLED") or environ.get("LINKERD_DISABLED") or None


def _request(method: str, host: str, port: int, path: str, timeout: float) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, headers={"User-Agent": "tether-await"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def probe_ready(port: int, host: str = "localhost", timeout: float = REQUEST_TIMEOUT_S) -> str | None:
    """One ``GET /ready``: None when ready (2xx), else what went wrong."""
    try:
        status = _request("GET", host, port, "/ready", timeout)
    except (OSError, http.client.HTTPException) as err:
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return None if 200 <= status < 300 else f"HTTP {status}"


def wait_ready(port: int, *, backoff: float, timeout: float | None, host: str = "localhost") -> str | None:
    """Poll until ready: None on success, else the last failure once ``timeout`` has elapsed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: str | None = None
    while True:
        budget = REQUEST_TIMEOUT_S
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return last or "no check completed"
            budget = min(budget, remaining)
        failure = probe_ready(port, host, budget)
        if failure is None:
            return None
        # An attempt the overall deadline cut short says only that time ran out; the proxy's last
        # real answer (HTTP 503, say) is the better evidence, so it is kept.
        cut_short = deadline is not None and budget < REQUEST_TIMEOUT_S and time.monotonic() >= deadline
        if last is None or not cut_short:
            last = failure
        pause = backoff if deadline is None else min(backoff, max(deadline - time.monotonic(), 0.0))
        time.sleep(pause)


def send_shutdown(port: int, host: str = "localhost") -> None:
    """``POST /shutdown`` to the proxy admin server; failures are ignored, as in linkerd-await."""
    try:
        _request("POST", host, port, "/shutdown", REQUEST_TIMEOUT_S)
    except (OSError, http.client.HTTPException):
        pass


def run_child(argv: Sequence[str]) -> int:
    """Run ``argv`` to completion, forwarding SIGTERM to it; its exit code, or EX_OSERR if signalled.

    Raises ``OSError`` when the program cannot be started.
    """
    child = subprocess.Popen(list(argv))

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code if code >= 0 else EX_OSERR
