"""Linkerd's legacy HTTP metrics (proxy.md §9.2): ``request_total``, ``response_total``, ``response_latency_ms``.

The layer records each request under its endpoint label set (rendered once
per request by the caller: direction, target, TLS, ``dst_*`` or ``srv_*``),
and each response with its status, its classification (``success`` unless the
status is 5xx or the response failed) and its latency in whole milliseconds,
from the request head to the end of the response. Recording is a few dict
operations; text is only made on a scrape.

Label sets stay bounded as the TCP family's do: a label set not touched for
``retain_idle`` is dropped at the next scrape, and past ``max_series`` the least
recently touched go first.

Callers: ``tether.proxy.http.layer`` (recording), ``tether.proxy.metrics.Registry`` (rendering).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from tether.proxy.metrics import MAX_SERIES

# response_latency_ms buckets (ms), Linkerd's; +Inf follows.
BUCKETS: tuple[int, ...] = (1, 2, 3, 4, 5, 10, 20, 30, 40, 50, 100, 200, 300, 400, 500, 1000, 2000, 3000, 4000,
                            5000, 10000, 20000, 30000, 40000, 50000)


class _Series:
    """Everything recorded under one endpoint label set."""

    __slots__ = ("requests", "responses", "latency", "touched")

    def __init__(self, now: float) -> None:
        self.requests = 0
        self.responses: dict[str, int] = {}  # rendered status/classification labels -> count
        self.latency: dict[int, list[int]] = {}  # status -> bucket counts (+Inf last), then [sum, count]
        self.touched = now


class HttpMetrics:
    def __init__(self, clock: Callable[[], float], retain_idle: float, max_series: int = MAX_SERIES) -> None:
        self._clock = clock
        self._retain_idle = retain_idle
        self._max_series = max_series
        self._series: dict[str, _Series] = {}

    def _get(self, labels: str) -> _Series:
        series = self._series.get(labels)
        now = self._clock()
        if series is None:
            if len(self._series) >= self._max_series:
                self._evict(now, force=True)
            series = self._series[labels] = _Series(now)
        series.touched = now
        return series

    def request(self, labels: str) -> None:
        self._get(labels).requests += 1

    def response(self, labels: str, status: int, success: bool, latency_ms: int, error: str = "") -> None:
        series = self._get(labels)
        key = (f'status_code="{status}",classification="{"success" if success else "failure"}",'
               f'grpc_status="",error="{error}"')
        series.responses[key] = series.responses.get(key, 0) + 1
        hist = series.latency.get(status)
        if hist is None:
            hist = series.latency[status] = [0] * (len(BUCKETS) + 3)
        hist[bisect_left(BUCKETS, latency_ms)] += 1
        hist[-2] += latency_ms
        hist[-1] += 1

    def snapshot(self) -> dict[str, _Series]:
        return dict(self._series)

    def render(self, out: list[str]) -> None:
        self._evict(self._clock(), force=False)
        series = self._series
        out.append("# HELP request_total Total count of HTTP requests.")
        out.append("# TYPE request_total counter")
        out.extend(f"request_total{{{labels}}} {s.requests}" for labels, s in series.items())
        out.append("# HELP response_latency_ms Elapsed times between a request's headers being received and its "
                   "response stream completing")
        out.append("# TYPE response_latency_ms histogram")
        for labels, s in series.items():
            for status, hist in s.latency.items():
                base = f'{labels},status_code="{status}"'
                total = 0
                for i, le in enumerate(BUCKETS):
                    total += hist[i]
                    out.append(f'response_latency_ms_bucket{{{base},le="{le}"}} {total}')
                total += hist[len(BUCKETS)]
                out.append(f'response_latency_ms_bucket{{{base},le="+Inf"}} {total}')
                out.append(f"response_latency_ms_sum{{{base}}} {hist[-2]}")
                out.append(f"response_latency_ms_count{{{base}}} {hist[-1]}")
        out.append("# HELP response_total Total count of HTTP responses.")
        out.append("# TYPE response_total counter")
        for labels, s in series.items():
            out.extend(f"response_total{{{labels},{key}}} {n}" for key, n in s.responses.items())

    def _evict(self, now: float, *, force: bool) -> None:
        stale = [k for k, s in self._series.items() if now - s.touched > self._retain_idle]
        if force and not stale:
            oldest = sorted(self._series.items(), key=lambda kv: kv[1].touched)
            stale = [k for k, _ in oldest[: max(1, self._max_series // 10)]]
        for key in stale:
            del self._series[key]
