"""An open-loop HTTP/1.1 load generator that does not suffer coordinated omission.

Requests are due on a steady schedule (request ``i`` at ``t0 + i / rate``),
whatever the server does. A pool of keep-alive connections carries them, one
request in flight per connection (no pipelining); a due request takes the
connection that has been idle longest, or waits for one. Latency is measured
from the request's *scheduled* time to the end of its response, so a slow
server is charged for the requests it delayed, not just the ones it served.

The generator reports its own overload: ``gen_lag`` is how late a request went
out although a connection was free for it (time the generator itself lost),
and ``max_backlog`` is the most requests ever due and not yet sent. It sleeps
in ``epoll_wait`` between events; a ``timerfd`` armed with nanosecond
resolution (epoll's own timeout has only milliseconds) wakes it ``SPIN``
seconds before the next request is due, and it polls without sleeping for the
rest. Spinning all the time would be more precise on an idle CPU, but on a
shared machine the scheduler then treats the generator as a CPU hog.

Run as ``python -m bench.dataplane.openloop HOST PORT --rate R --duration S``;
it prints one JSON object (see ``Summary``). No sockets are opened on import.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import select
import socket
import sys
import time
from array import array
from collections import deque
from dataclasses import asdict, dataclass
from typing import Sequence

SPIN = 0.00015  # seconds before a due request to stop sleeping and poll (50 us was often late on a VM)
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# The generator counts itself overloaded when it is late as a rule (its median lag, with a connection
# free) or leaves requests unsent. Its p99 lag is reported but not judged: on a shared or virtual machine
# a sleeping process sometimes takes milliseconds to be woken, which is noise, not overload.
GEN_LAG_P50_LIMIT_US = 50.0

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


def request_bytes(host: str, path: str = "/") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tether-bench\r\n\r\n".encode("ascii")


def parse_head(buf: bytes | bytearray) -> tuple[int, int] | None:
    """``(status, total response length)`` once the head is in ``buf``; ``None`` if more is needed.

    Only what the backend sends is understood: a ``Content-Length`` body. A head
    without one raises ``ValueError`` (the caller counts an error and reconnects).
    """
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 65536:
            raise ValueError("response head larger than 64 KiB")
        return None
    if buf[:5] != b"HTTP/" or len(buf) < 12:
        raise ValueError(f"not an HTTP/1 response: {bytes(buf[:16])!r}")
    status = int(buf[9:12])
    m = _CONTENT_LENGTH.search(buf, 0, end + 2)
    if m is None:
        raise ValueError("response without Content-Length")
    return status, end + 4 + int(m.group(1))


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    rank = max(1, min(n, int(-(-p * n // 100))))  # ceil(p/100 * n)
    return float(sorted_values[rank - 1])


@dataclass
class Summary:
    target_rate: float
    duration: float
    connections: int
    scheduled: int
    sent: int
    completed: int
    errors: int
    achieved_rate: float
    latency_us: dict[str, float]  # p50, p90, p99, p99.9, max, mean
    gen_lag_us: dict[str, float]  # p50, p99, max
    queued_for_connection: int  # requests that found no idle connection when due
    max_backlog: int  # most requests ever due and not yet sent
    end_backlog: int  # requests not yet answered when the last one was due
    sustained: bool
    generator_overloaded: bool

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def summarize(
    rate: float,
    duration: float,
    connections: int,
    scheduled: int,
    sent: int,
    errors: int,
    latencies: Sequence[float],
    gen_lag: Sequence[float],
    queued: int,
    max_backlog: int,
    end_backlog: int,
) -> Summary:
    """Turn raw samples (seconds) into the summary; pure, so it is tested without sockets."""
    lat = sorted(latencies)
    lag = sorted(gen_lag)
    us = 1e6
    latency = {f"p{p:g}": percentile(lat, p) * us for p in PERCENTILES}
    latency["max"] = (lat[-1] if lat else 0.0) * us
    latency["mean"] = (sum(lat) / len(lat) if lat else 0.0) * us
    lag_us = {"p50": percentile(lag, 50) * us, "p99": percentile(lag, 99) * us, "max": (lag[-1] if lag else 0.0) * us}
    completed = len(lat)
    # Below capacity a stall leaves a backlog that drains; at capacity it grows until the schedule ends.
    sustained = errors == 0 and completed == scheduled and end_backlog <= connections + scheduled // 100
    return Summary(
        target_rate=rate,
        duration=duration,
        connections=connections,
        scheduled=scheduled,
        sent=sent,
        completed=completed,
        errors=errors,
        achieved_rate=completed / duration if duration > 0 else 0.0,
        latency_us=latency,
        gen_lag_us=lag_us,
        queued_for_connection=queued,
        max_backlog=max_backlog,
        end_backlog=end_backlog,
        sustained=sustained,
        generator_overloaded=lag_us["p50"] > GEN_LAG_P50_LIMIT_US or sent < scheduled,
    )


class _Conn:
    __slots__ = ("sock", "fd", "buf", "sched", "need", "status", "idle_since")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray()
        self.sched = -1.0  # scheduled time of the request in flight; < 0 when idle
        self.need = -1  # total length of the response being read, once its head is in
        self.status = 0
        self.idle_since = 0.0


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Timer:
    """A CLOCK_MONOTONIC timerfd (the clock of ``time.perf_counter`` on Linux) armed at absolute times.

    Falls back to ``fd = -1`` (callers then use epoll's millisecond timeout) if
    the C library does not have it.
    """

    _CLOCK_MONOTONIC = 1
    _TFD_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000
    _TFD_TIMER_ABSTIME = 1
    _PR_SET_TIMERSLACK = 29

    def __init__(self) -> None:
        self.fd = -1
        self.at = 0.0
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._settime = libc.timerfd_settime
            self.fd = libc.timerfd_create(self._CLOCK_MONOTONIC, self._TFD_NONBLOCK_CLOEXEC)
            libc.prctl(self._PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # 1 us instead of the default 50 us
        except (OSError, AttributeError):
            self.fd = -1
        self._spec = _Itimerspec()

    def arm(self, at: float) -> None:
        """Fire once at monotonic time ``at`` (0 disarms)."""
        if at == self.at:
            return
        self.at = at
        sec = int(at)
        self._spec.it_value.tv_sec = sec
        self._spec.it_value.tv_nsec = int((at - sec) * 1e9)
        self._settime(self.fd, self._TFD_TIMER_ABSTIME if at else 0, ctypes.byref(self._spec), None)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _connect(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _warm(socks: list[socket.socket], req: bytes) -> None:
    """One request on every fresh connection, all in flight at once, so handshakes are done before t0 and a
    proxy that pools its upstream connections per request holds as many as the run can use at once (sent one
    connection after another, they would all reuse one, and the run would measure the pool filling up)."""
    for sock in socks:
        sock.sendall(req)
    for sock in socks:
        buf = bytearray()
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed during warm-up request")
            buf += chunk
            head = parse_head(buf)
            if head is not None and len(buf) >= head[1]:
                if head[0] != 200:
                    raise ConnectionError(f"warm-up request got status {head[0]}")
                break


def run(host: str, port: int, rate: float, duration: float, connections: int = 32, drain: float = 2.0) -> Summary:
    """Send ``rate * duration`` requests on schedule and wait up to ``drain`` s for the last ones."""
    req = request_bytes(host)
    conns: list[_Conn] = []
    ep = select.epoll()
    by_fd: dict[int, _Conn] = {}

    def add(sock: socket.socket) -> _Conn:
        sock.setblocking(False)
        c = _Conn(sock)
        by_fd[c.fd] = c
        ep.register(c.fd, select.EPOLLIN)
        return c

    socks = [_connect(host, port) for _ in range(connections)]
    _warm(socks, req)
    conns.extend(add(s) for s in socks)

    perf = time.perf_counter
    poll = ep.poll
    interval = 1.0 / rate
    scheduled = max(1, int(round(rate * duration)))
    latencies = array("d")
    gen_lag = array("d")
    errors = queued = inflight = sent = max_backlog = 0
    end_backlog = -1
    idle: deque[_Conn] = deque(conns)

    def replace(c: _Conn) -> None:
        ep.unregister(c.fd)
        del by_fd[c.fd]
        c.sock.close()
        try:
            fresh = add(_connect(host, port))
        except OSError:
            return  # the pool shrinks; backlog and errors will show it
        fresh.idle_since = perf()
        idle.append(fresh)

    timer = Timer()
    if timer.fd >= 0:
        ep.register(timer.fd, select.EPOLLIN)
    gc.collect()
    gc.disable()
    t0 = perf() + 0.01
    for c in conns:
        c.idle_since = t0
    schedule_end = t0 + (scheduled - 1) * interval
    deadline = t0 + duration + drain
    next_ts = t0
    try:
        while True:
            now = perf()
            while sent < scheduled and next_ts <= now and idle:
                c = idle.popleft()
                try:
                    c.sock.send(req)
                except OSError:
                    errors += 1
                    replace(c)
                    continue
                if c.idle_since > next_ts:
                    queued += 1
                    gen_lag.append(now - c.idle_since)
                else:
                    gen_lag.append(now - next_ts)
                c.sched = next_ts
                inflight += 1
                sent += 1
                next_ts = t0 + sent * interval
            if sent < scheduled and next_ts <= now:
                backlog = min(scheduled, int((now - t0) * rate) + 1) - sent
                if backlog > max_backlog:
                    max_backlog = backlog
            if end_backlog < 0 and now >= schedule_end and sent >= scheduled:
                end_backlog = inflight
            elif end_backlog < 0 and now >= schedule_end + interval:
                end_backlog = inflight + (scheduled - sent)
            if sent >= scheduled and inflight == 0:
                break
            if now > deadline:
                break
            if sent < scheduled and idle:
                wait = next_ts - now
                if wait <= SPIN:
                    timeout = 0.0
                elif timer.fd >= 0:
                    timer.arm(next_ts - SPIN)
                    timeout = deadline - now
                else:
                    timeout = wait - 0.001 if wait > 0.0015 else 0.0
            else:
                if timer.at:
                    timer.arm(0.0)
                timeout = deadline - now
            for fd, _ev in poll(timeout):
                got = by_fd.get(fd)
                if got is None:
                    if fd == timer.fd:
                        timer.arm(0.0)
                    continue
                c = got
                try:
                    data = c.sock.recv(262144)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    if c.sched >= 0:
                        errors += 1
                        inflight -= 1
                    replace(c)
                    continue
                buf = c.buf
                buf += data
                if c.need < 0:
                    try:
                        head = parse_head(buf)
                    except ValueError:
                        errors += 1
                        inflight -= 1
                        replace(c)
                        continue
                    if head is None:
                        continue
                    c.status, c.need = head
                if len(buf) < c.need:
                    continue
                t = perf()
                if c.status == 200:
                    latencies.append(t - c.sched)
                else:
                    errors += 1
                del buf[: c.need]
                c.need = -1
                c.sched = -1.0
                inflight -= 1
                c.idle_since = t
                idle.append(c)
    finally:
        gc.enable()
        for c in list(by_fd.values()):
            c.sock.close()
        ep.close()
        timer.close()
    errors += inflight  # never answered within the drain time
    if end_backlog < 0:
        end_backlog = inflight + (scheduled - sent)
    return summarize(rate, duration, connections, scheduled, sent, errors, latencies, gen_lag, queued, max_backlog,
                     end_backlog)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dataplane.openloop", description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--rate", type=float, required=True, help="requests per second")
    ap.add_argument("--duration", type=float, required=True, help="seconds of schedule")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--drain", type=float, default=2.0, help="seconds to wait for the last responses")
    args = ap.parse_args(argv)
    summary = run(args.host, args.port, args.rate, args.duration, args.connections, args.drain)
    sys.stdout.write(summary.to_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
