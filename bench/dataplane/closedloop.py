"""Closed-loop maximum throughput with wrk: a fixed number of keep-alive connections, as fast as they go."""

from __future__ import annotations

import re
from collections.abc import Sequence
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


def wrk_argv(binary: Path, host: str, port: int, connections: int, duration: float,
             headers: Sequence[str] = ()) -> list[str]:
    # One thread: the load generator has one CPU. wrk takes whole seconds.
    extra = [arg for header in headers for arg in ("-H", header)]
    return [str(binary), "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "5s", *extra,
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


# -- h2load (Debian nghttp2-client): HTTP/2 and gRPC over h2c -------------------------------------------------

_H2_DONE = re.compile(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                      r"(\d+) errored, (\d+) timeout", re.MULTILINE)
_H2_FINISHED = re.compile(r"^finished in ([\d.]+)(us|ms|s|m)\b", re.MULTILINE)
_H2_STATUS = re.compile(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", re.MULTILINE)
_H2_DATA = re.compile(r"^traffic: .*?, (\d+)\S* \((\d+)\) data", re.MULTILINE)


def h2load_binary() -> Path | None:
    return which("h2load")


@dataclass(frozen=True)
class H2Load:
    """What one h2load run sends: HTTP/2 GETs, or gRPC unary calls (POST with one framed message)."""

    path: str = "/"
    body_file: Path | None = None  # the request body (gRPC: the framed message); h2load then POSTs
    headers: tuple[str, ...] = ()


def h2load_argv(binary: Path, host: str, port: int, load: H2Load, connections: int, streams: int,
                *, duration: float | None = None, requests: int | None = None, h1: bool = False) -> list[str]:
    """One thread, ``connections`` connections each with up to ``streams`` requests in flight, for ``duration``
    seconds or ``requests`` requests; ``h1``: HTTP/1.1 instead (one request in flight per connection)."""
    argv = [str(binary), "-t1", f"-c{connections}", f"-m{1 if h1 else streams}", "-T5"]
    if duration is not None:
        argv.append(f"-D{max(1, round(duration))}")
    if requests is not None:
        argv.append(f"-n{requests}")
    if h1:
        argv.append("--h1")
    if load.body_file is not None:
        argv += ["-d", str(load.body_file)]
    for header in load.headers:
        argv += ["-H", header]
    return argv + [f"http://{host}:{port}{load.path}"]


@dataclass(frozen=True)
class H2LoadResult:
    requests: int  # succeeded
    seconds: float
    errors: int  # failed, errored, timed out, or a status other than 2xx
    data_bytes: int  # response bodies (DATA payloads), all requests

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def parse_h2load(output: str) -> H2LoadResult:
    done, finished = _H2_DONE.search(output), _H2_FINISHED.search(output)
    if done is None or finished is None:
        raise ValueError(f"h2load printed no request count:\n{output}")
    _total, _started, _done, succeeded, failed, errored, timeout = (int(g) for g in done.groups())
    errors = failed + errored + timeout
    if (st := _H2_STATUS.search(output)) is not None:
        errors += sum(int(g) for g in st.groups()[1:])
        succeeded = min(succeeded, int(st.group(1)))
    data = _H2_DATA.search(output)
    return H2LoadResult(succeeded, float(finished.group(1)) * _UNIT[finished.group(2)], errors,
                        int(data.group(2)) if data else 0)
