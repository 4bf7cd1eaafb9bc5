"""Closed-loop maximum throughput with wrk: a fixed number of keep-alive connections, as fast as they go."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bench.dataplane.procs import which

_REQUESTS = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m)\b", re.MULTILINE)
_NON2XX = re.compile(r"Non-2xx or 3xx responses:\s*(\d+)")
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def wrk_binary() -> Path | None:
    return which("wrk")


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def wrk_argv(binary: Path, host: str, port: int, connections: int, duration: float) -> list[str]:
    # One thread: the load generator has one CPU. wrk takes whole seconds.
    return [str(binary), "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "5s",
            f"http://{host}:{port}/"]


def parse_wrk(output: str) -> WrkResult:
    m = _REQUESTS.search(output)
    if m is None:
        raise ValueError(f"wrk printed no request count:\n{output}")
    errors = 0
    if (n := _NON2XX.search(output)) is not None:
        errors += int(n.group(1))
    if (s := _SOCKET_ERRORS.search(output)) is not None:
        errors += sum(int(g) for g in s.groups())
    return WrkResult(int(m.group(1)), float(m.group(2)) * _UNIT[m.group(3)], errors)
