"""The proxy's metrics, kept in plain dicts and rendered in the Prometheus text format.

Linkerd's legacy transport family (proxy.md §9.3): for every connection side a
``Meter`` is opened under its label set (``tether.proxy.core.labels``) and closed with
an ``errno``. Bytes are not counted here: the driver's streams count them in two
integer fields each, and a scrape adds the open meters' counts to the closed
ones' totals -- so the forwarding path pays one addition per read.

Label sets stay bounded: a series with no open connection that has not changed
for ``retain_idle`` (``LINKERD2_PROXY_METRICS_RETAIN_IDLE``, 10 minutes) is
dropped at the next scrape, as Linkerd does, and past ``max_series`` per family
the least recently touched idle series go first.

Callers: the driver (meters, error counts), the layers' commands (error reasons),
``tether.proxy.app`` (collectors for identity and the process) and
``tether.proxy.io.admin`` (``render``).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterable
from typing import Protocol

MAX_SERIES = 10_000


class Counted(Protocol):
    """What a meter reads its bytes from: the driver's stream of one connection side."""

    rx: int  # bytes read from the socket
    tx: int  # bytes written to the socket


class _TcpSeries:
    __slots__ = ("opened", "closed", "read", "written", "live", "touched")

    def __init__(self, now: float) -> None:
        self.opened = 0
        self.closed: dict[str, int] = {}
        self.read = 0
        self.written = 0
        self.live: set[Meter] = set()
        self.touched = now


class Meter:
    """One open connection side; ``close`` folds its byte counts into the series."""

    __slots__ = ("_metrics", "_series", "stream")

    def __init__(self, metrics: TcpMetrics, series: _TcpSeries, stream: Counted) -> None:
        self._metrics = metrics
        self._series = series
        self.stream = stream

    def close(self, errno: str = "") -> None:
        series = self._series
        if self not in series.live:
            return
        series.live.discard(self)
        series.read += self.stream.rx
        series.written += self.stream.tx
        series.closed[errno] = series.closed.get(errno, 0) + 1
        series.touched = self._metrics.clock()


# The outbound connections to endpoints, whose bytes are ``outbound_tcp_transfer_cost_bytes_total``'s.
_TO_ENDPOINTS = 'direction="outbound",peer="dst"'
_LOCALITIES = {"local": "Local", "remote": "Remote"}  # the endpoint's zone_locality label (from discovery)


def _locality(labels: str) -> str:
    _, found, rest = labels.partition('dst_zone_locality="')
    return _LOCALITIES.get(rest.partition('"')[0], "Unknown") if found else "Unknown"


class TcpMetrics:
    """``tcp_open_total``, ``tcp_close_total``, ``tcp_open_connections``, ``tcp_{read,write}_bytes_total``, and
    ``outbound_tcp_transfer_cost_bytes_total{op="Send"|"Recv",zone_locality}``: the bytes of the outbound
    connections to endpoints by the endpoint's ``zone_locality`` label (``Unknown`` without one), kept when their
    series expire (a counter never goes down)."""

    def __init__(self, clock: Callable[[], float], retain_idle: float, max_series: int = MAX_SERIES) -> None:
        self.clock = clock
        self._retain_idle = retain_idle
        self._max_series = max_series
        self._series: dict[str, _TcpSeries] = {}
        self._expired_transfer: dict[tuple[str, str], int] = {}  # (op, zone_locality): bytes of expired series

    def open(self, labels: str, stream: Counted) -> Meter:
        series = self._series.get(labels)
        now = self.clock()
        if series is None:
            if len(self._series) >= self._max_series:
                self._evict(now, force=True)
            series = self._series[labels] = _TcpSeries(now)
        series.opened += 1
        series.touched = now
        meter = Meter(self, series, stream)
        series.live.add(meter)
        return meter

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Each series' current values (tests and ``render``): opened, closed by errno, open, read, written."""
        out: dict[str, dict[str, object]] = {}
        for labels, s in self._series.items():
            out[labels] = {
                "open_total": s.opened,
                "close_total": dict(s.closed),
                "open_connections": len(s.live),
                "read_bytes_total": s.read + sum(m.stream.rx for m in s.live),
                "write_bytes_total": s.written + sum(m.stream.tx for m in s.live),
            }
        return out

    def render(self, out: list[str]) -> None:
        self._evict(self.clock(), force=False)
        snap = self.snapshot()
        families = (
            ("tcp_open_total", "counter", "Total count of opened connections.", "open_total"),
            ("tcp_open_connections", "gauge", "Number of currently-open connections.", "open_connections"),
            ("tcp_read_bytes_total", "counter", "Total count of bytes read from peers.", "read_bytes_total"),
            ("tcp_write_bytes_total", "counter", "Total count of bytes written to peers.", "write_bytes_total"),
        )
        for name, kind, help_, key in families:
            _header(out, name, kind, help_)
            out.extend(f"{name}{{{labels}}} {values[key]}" for labels, values in snap.items())
        _header(out, "tcp_close_total", "counter", "Total count of closed connections.")
        for labels, values in snap.items():
            closed = values["close_total"]
            assert isinstance(closed, dict)
            out.extend(f'tcp_close_total{{{labels},errno="{errno}"}} {n}' for errno, n in closed.items())
        transfer = dict(self._expired_transfer)
        for labels, values in snap.items():
            if labels.startswith(_TO_ENDPOINTS):
                self._add_transfer(transfer, labels, values["write_bytes_total"], values["read_bytes_total"])
        _header(out, "outbound_tcp_transfer_cost_bytes_total", "counter",
                "The total number of bytes sent and received on outbound connections to endpoints.")
        out.extend(f'outbound_tcp_transfer_cost_bytes_total{{op="{op}",zone_locality="{zone}"}} {n}'
                   for (op, zone), n in sorted(transfer.items()))

    @staticmethod
    def _add_transfer(into: dict[tuple[str, str], int], labels: str, sent: object, received: object) -> None:
        zone = _locality(labels)
        assert isinstance(sent, int) and isinstance(received, int)
        into[("Send", zone)] = into.get(("Send", zone), 0) + sent
        into[("Recv", zone)] = into.get(("Recv", zone), 0) + received

    def _drop(self, key: str) -> None:
        series = self._series.pop(key)
        if key.startswith(_TO_ENDPOINTS):
            self._add_transfer(self._expired_transfer, key, series.written, series.read)

    def _evict(self, now: float, *, force: bool) -> None:
        idle = [(s.touched, k) for k, s in self._series.items() if not s.live]
        expired = [k for touched, k in idle if now - touched > self._retain_idle]
        for key in expired:
            self._drop(key)
        if force and len(self._series) >= self._max_series:
            # Too many series even after expiry: drop the least recently touched idle tenth.
            idle = sorted((t, k) for t, k in idle if k in self._series)
            for _, key in idle[: max(1, self._max_series // 10)]:
                self._drop(key)


class Counter:
    """A counter family with one free-form label set per series (rendered labels as keys)."""

    def __init__(
        self, name: str, help_: str, clock: Callable[[], float], retain_idle: float, kind: str = "counter"
    ) -> None:
        self.name = name
        self.help = help_
        self.kind = kind
        self._clock = clock
        self._retain_idle = retain_idle
        self.values: dict[str, float] = {}
        self._touched: dict[str, float] = {}

    def inc(self, labels: str = "", amount: float = 1) -> None:
        values = self.values
        if labels in values:  # the usual case: no dict.get call (per request on the authz and route counters)
            values[labels] += amount
        else:
            if len(values) >= MAX_SERIES:
                self._expire(self._clock(), force=True)
            values[labels] = amount
        self._touched[labels] = self._clock()

    def get(self, labels: str = "") -> float:
        return self.values.get(labels, 0)

    def render(self, out: list[str]) -> None:
        self._expire(self._clock(), force=False)
        _header(out, self.name, self.kind, self.help)
        for labels, value in self.values.items():
            out.append(f"{self.name}{{{labels}}} {number(value)}" if labels else f"{self.name} {number(value)}")

    def _expire(self, now: float, *, force: bool) -> None:
        for key in stale_series(self._touched, now, self._retain_idle, force=force):
            self.values.pop(key, None)
            self._touched.pop(key, None)


def stale_series(touched: dict[str, float], now: float, retain_idle: float, *, force: bool) -> list[str]:
    """The label sets to drop: those untouched for ``retain_idle``; with ``force`` (a family at ``MAX_SERIES``)
    and none idle that long, the least recently touched tenth."""
    stale = [k for k, t in touched.items() if now - t > retain_idle]
    if force and not stale:
        stale = [k for _, k in sorted((t, k) for k, t in touched.items())[: max(1, MAX_SERIES // 10)]]
    return stale


Collector = Callable[[list[str]], None]


class Registry:
    """Everything ``/metrics`` shows, in order; a collector appends its lines to the output."""

    def __init__(self, *, retain_idle: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.retain_idle = retain_idle
        self.tcp = TcpMetrics(clock, retain_idle)
        self.counters: dict[str, Counter] = {}
        self._collectors: list[Collector] = []
        self._early: list[Collector] = []  # the legacy HTTP family (request_total...), printed before tcp_*

    def counter(self, name: str, help_: str) -> Counter:
        family = self.counters.get(name)
        if family is None:
            family = self.counters[name] = Counter(name, help_, self.clock, self.retain_idle)
        return family

    def add_collector(self, collector: Collector, *, before_tcp: bool = False) -> None:
        (self._early if before_tcp else self._collectors).append(collector)

    def render(self) -> str:
        out: list[str] = []
        for family in self.counters.values():
            family.render(out)
        for collector in self._early:
            collector(out)
        self.tcp.render(out)
        for collector in self._collectors:
            collector(out)
        out.append("# EOF")
        return "\n".join(out) + "\n"


def _header(out: list[str], name: str, kind: str, help_: str) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")


def number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def gauge(out: list[str], name: str, help_: str, value: float | None, labels: str = "") -> None:
    """One gauge line (nothing but the header when ``value`` is None)."""
    _header(out, name, "gauge", help_)
    if value is not None:
        out.append(f"{name}{{{labels}}} {number(value)}" if labels else f"{name} {number(value)}")


def samples(out: list[str], name: str, kind: str, help_: str, values: Iterable[tuple[str, float]]) -> None:
    _header(out, name, kind, help_)
    out.extend(f"{name}{{{labels}}} {number(v)}" if labels else f"{name} {number(v)}" for labels, v in values)


# -- process metrics, from /proc ------------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _boot_time() -> float:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


_BOOT_TIME = _boot_time()


def process_collector(out: list[str]) -> None:
    """``process_*`` as kubert-prometheus-process reports them (Linux)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return
    # Fields after the command name, 0-based from field 3 ("state").
    utime, stime = int(fields[11]), int(fields[12])
    threads, start_ticks = int(fields[17]), int(fields[19])
    vsize, rss_pages = int(fields[20]), int(fields[21])
    start = _BOOT_TIME + start_ticks / _TICKS
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = 0
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    gauge(out, "process_start_time_seconds", "Time that the process started (in seconds since the UNIX epoch)", start)
    samples(out, "process_uptime_seconds_total", "counter", "Total time since the process started (in seconds)",
            [("", max(0.0, time.time() - start))])
    samples(out, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds",
            [("", (utime + stime) / _TICKS)])
    gauge(out, "process_virtual_memory_bytes", "Virtual memory size in bytes", vsize)
    gauge(out, "process_resident_memory_bytes", "Resident memory size in bytes", rss_pages * _PAGE)
    gauge(out, "process_open_fds", "Number of open file descriptors", open_fds)
    gauge(out, "process_max_fds", "Maximum number of open file descriptors", max_fds)
    gauge(out, "process_threads", "Number of OS threads in the process", threads)
