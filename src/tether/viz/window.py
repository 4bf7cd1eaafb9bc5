"""Rates over a window: what one proxy did between two scrapes, and the golden metrics of a group of pods.

``activity(old, new, seconds)`` is the difference of two ``PodCounters`` of
the same pod, as Prometheus' ``increase`` sees it: a counter that went down
(or a new ``process_start_time_seconds``) restarted, and counts from zero.
Gauges (open connections) are taken from the newer scrape.

``golden(activities)`` sums a workload's pods, as ``linkerd viz stat`` sums
its series by the owner label: success rate = successes / responses; RPS =
the sum of each pod's responses per second; p50/p95/p99 from the summed
latency buckets with ``histogram_quantile``'s interpolation; TCP_CONN = open
inbound connections; the mTLS share is of the open inbound connections, or of
those opened in the window when none is open.  A value that cannot be known
(no scrape, a single scrape, no request in the window, a proxy without request
metrics) is ``None``, printed "-".

Pure.  Callers: ``tether.viz.stat`` and tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tether.viz.proxy_metrics import Client, PodCounters

QUANTILES = (0.5, 0.95, 0.99)


@dataclass(slots=True)
class Activity:
    seconds: float  # 0 when there is one scrape only: gauges known, rates not
    has_requests: bool
    success: float = 0.0
    failure: float = 0.0
    latency: dict[float, float] = field(default_factory=dict)
    tcp_opened: float = 0.0
    tcp_opened_mtls: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    tcp_open: float = 0.0
    tcp_open_mtls: float = 0.0
    clients: dict[Client, float] = field(default_factory=dict)


def _increase(old: float, new: float) -> float:
    return new - old if new >= old else new


def activity(old: PodCounters | None, new: PodCounters, seconds: float) -> Activity:
    out = Activity(seconds=seconds if old is not None else 0.0, has_requests=new.has_requests,
                   tcp_open=new.tcp_open, tcp_open_mtls=new.tcp_open_mtls, clients=dict(new.clients))
    if old is None or seconds <= 0:
        out.seconds = 0.0
        return out
    if old.start_time is not None and new.start_time is not None and old.start_time != new.start_time:
        old = PodCounters()
    out.success = _increase(old.success, new.success)
    out.failure = _increase(old.failure, new.failure)
    out.latency = {le: _increase(old.latency.get(le, 0.0), n) for le, n in new.latency.items()}
    out.tcp_opened = _increase(old.tcp_opened, new.tcp_opened)
    out.tcp_opened_mtls = _increase(old.tcp_opened_mtls, new.tcp_opened_mtls)
    out.read_bytes = _increase(old.read_bytes, new.read_bytes)
    out.write_bytes = _increase(old.write_bytes, new.write_bytes)
    return out


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The ``q`` quantile of cumulative ``le -> count`` buckets, interpolated linearly inside a bucket.

    As Prometheus does it: the first bucket starts at 0, a rank that falls in
    the ``+Inf`` bucket gives the highest finite bound, and counts are made
    monotonic first.
    """
    items = sorted(buckets.items())
    if not items:
        return None
    fixed: list[tuple[float, float]] = []
    highest = 0.0
    for le, count in items:
        highest = max(highest, count)
        fixed.append((le, highest))
    total = fixed[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in fixed:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


@dataclass(frozen=True, slots=True)
class Golden:
    success_rate: float | None = None
    rps: float | None = None
    latency_ms: tuple[float | None, float | None, float | None] = (None, None, None)
    tcp_open: float | None = None
    mtls: float | None = None  # share of inbound connections that are mTLS, 0..1
    read_rate: float | None = None
    write_rate: float | None = None
    clients: Mapping[Client, float] = field(default_factory=dict)


def golden(activities: Iterable[Activity]) -> Golden:
    items = list(activities)
    if not items:
        return Golden()
    timed = [a for a in items if a.seconds > 0]
    tcp_open = sum(a.tcp_open for a in items)
    open_mtls = sum(a.tcp_open_mtls for a in items)
    opened = sum(a.tcp_opened for a in timed)
    opened_mtls = sum(a.tcp_opened_mtls for a in timed)
    mtls = open_mtls / tcp_open if tcp_open > 0 else (opened_mtls / opened if opened > 0 else None)
    clients: dict[Client, float] = {}
    for a in items:
        for client, n in a.clients.items():
            clients[client] = clients.get(client, 0.0) + n
    read_rate = sum(a.read_bytes / a.seconds for a in timed) if timed else None
    write_rate = sum(a.write_bytes / a.seconds for a in timed) if timed else None

    success_rate = rps = None
    latency: tuple[float | None, float | None, float | None] = (None, None, None)
    with_requests = [a for a in timed if a.has_requests]
    responses = sum(a.success + a.failure for a in with_requests)
    if responses > 0:
        success_rate = sum(a.success for a in with_requests) / responses
        rps = sum((a.success + a.failure) / a.seconds for a in with_requests)
        buckets: dict[float, float] = {}
        for a in with_requests:
            for le, n in a.latency.items():
                buckets[le] = buckets.get(le, 0.0) + n
        p50, p95, p99 = (histogram_quantile(q, buckets) for q in QUANTILES)
        latency = (p50, p95, p99)
    return Golden(success_rate=success_rate, rps=rps, latency_ms=latency, tcp_open=tcp_open, mtls=mtls,
                  read_rate=read_rate, write_rate=write_rate, clients=clients)
