"""Linkerd's legacy HTTP metrics (proxy.md §9.2): ``request_total``, ``response_total``, ``response_latency_ms``,
and the ServiceProfile route families (``route_*``, ``route_actual_*``, ``route_retryable_total``: ``RouteMetrics``).

The layer records each request under its endpoint label set (rendered once
per request by the caller: direction, target, TLS, ``dst_*`` or ``srv_*``),
and each response with its status, its classification (``success`` unless the
status is 5xx or the response failed) and its latency in whole milliseconds,
from the request head to the end of the response. Recording is a few dict
operations; text is only made on a scrape.

Label sets stay bounded as the TCP family's do: a label set not touched for
``retain_idle`` is dropped at the next scrape, and past ``max_series`` the least
recently touched go first.

Callers: ``tether.proxy.core.http1_proxy`` and ``core.http2_proxy`` (recording), ``tether.proxy.core.metrics.Registry`` (rendering).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from tether.proxy.core.metrics import MAX_SERIES, number

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


S = TypeVar("S", "_Series", "_RouteSeries")


class _Store(Generic[S]):
    """Series by label set, bounded: one not touched for ``retain_idle`` goes at the next scrape, and past
    ``max_series`` the least recently touched tenth goes first."""

    def __init__(self, clock: Callable[[], float], retain_idle: float, max_series: int,
                 make: Callable[[float], S]) -> None:
        self._clock = clock
        self._retain_idle = retain_idle
        self._max_series = max_series
        self._make: Callable[[float], S] = make
        self._series: dict[str, S] = {}

    def _get(self, labels: str) -> S:
        series = self._series.get(labels)
        now = self._clock()
        if series is None:
            if len(self._series) >= self._max_series:
                self._evict(now, force=True)
            series = self._series[labels] = self._make(now)
        series.touched = now
        return series

    def snapshot(self) -> dict[str, S]:
        return dict(self._series)

    def _evict(self, now: float, *, force: bool) -> None:
        stale = [k for k, s in self._series.items() if now - s.touched > self._retain_idle]
        if force and not stale:
            oldest = sorted(self._series.items(), key=lambda kv: kv[1].touched)
            stale = [k for k, _ in oldest[: max(1, self._max_series // 10)]]
        for key in stale:
            del self._series[key]


def _observe(latency: dict[int, list[int]], status: int, latency_ms: int) -> None:
    """One latency sample in the status's histogram: bucket counts (+Inf last), then sum and count."""
    hist = latency.get(status)
    if hist is None:
        hist = latency[status] = [0] * (len(BUCKETS) + 3)
    hist[bisect_left(BUCKETS, latency_ms)] += 1
    hist[-2] += latency_ms
    hist[-1] += 1


_RESPONSE_KEYS: dict[tuple[int, bool, str, int | None], str] = {}  # response_total's labels, rendered once each


class HttpMetrics(_Store["_Series"]):
    def __init__(self, clock: Callable[[], float], retain_idle: float, max_series: int = MAX_SERIES) -> None:
        super().__init__(clock, retain_idle, max_series, _Series)
        self.routes = RouteMetrics(clock, retain_idle, max_series)  # route_* (profiles), printed after these

    def request(self, labels: str) -> _Series:
        """One request under ``labels``; returns its series, which the caller may hand to ``response`` for the
        same labels (a lookup less per request: the HTTP/1 core)."""
        series = self._series.get(labels)
        if series is None:
            series = self._get(labels)
        else:  # _get's usual case, without its call
            series.touched = self._clock()
        series.requests += 1
        return series

    def response(self, labels: str, status: int, success: bool, latency_ms: int, error: str = "",
                 grpc_status: int | None = None, series: _Series | None = None) -> None:
        """``grpc_status``: the response's ``grpc-status`` (gRPC, from the HTTP/2 layer); None prints ``""``.
        ``series``: what ``request`` returned for ``labels``, if the caller kept it."""
        if series is None or self._series.get(labels) is not series:  # not kept, or dropped since (expiry)
            series = self._series.get(labels)
            if series is None:
                series = self._get(labels)
            else:  # _get's usual case, without its call (the HTTP/2 core keeps no series: once per response)
                series.touched = self._clock()
        else:
            series.touched = self._clock()
        key = _RESPONSE_KEYS.get((status, success, error, grpc_status))
        if key is None:  # rendered once per (status, result, error, grpc), not once per response
            grpc = "" if grpc_status is None else grpc_status
            key = (f'status_code="{status}",classification="{"success" if success else "failure"}",'
                   f'grpc_status="{grpc}",error="{error}"')
            if len(_RESPONSE_KEYS) < 4096:
                _RESPONSE_KEYS[(status, success, error, grpc_status)] = key
        series.responses[key] = series.responses.get(key, 0) + 1
        hist = series.latency.get(status)  # as _observe does, inline: one call fewer per response
        if hist is None:
            hist = series.latency[status] = [0] * (len(BUCKETS) + 3)
        hist[bisect_left(BUCKETS, latency_ms)] += 1
        hist[-2] += latency_ms
        hist[-1] += 1

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
                render_histogram(out, "response_latency_ms", f'{labels},status_code="{status}"', hist)
        out.append("# HELP response_total Total count of HTTP responses.")
        out.append("# TYPE response_total counter")
        for labels, s in series.items():
            out.extend(f"response_total{{{labels},{key}}} {n}" for key, n in s.responses.items())
        self.routes.render(out)



# -- ServiceProfile route metrics (proxy.md §9.2) ----------------------------------------------------------------


class _RouteSeries:
    """Everything recorded under one route label set (``direction, dst, rt_*``)."""

    __slots__ = ("requests", "responses", "latency", "actual_requests", "actual_responses", "retryable",
                 "retryable_total", "no_budget", "touched")

    def __init__(self, now: float) -> None:
        self.requests = 0
        self.responses: dict[str, int] = {}
        self.latency: dict[int, list[int]] = {}  # status (0: no response, an error) -> buckets, sum, count
        self.actual_requests = 0  # attempts, retries included
        self.actual_responses: dict[str, int] = {}
        self.retryable = False  # the route has a retry policy: route_retryable_total is printed (0 until used)
        self.retryable_total = 0
        self.no_budget = 0
        self.touched = now


_CLASS_KEYS: dict[tuple[int, bool, str, int | None], str] = {}  # rendered once per (status, result, error, grpc)


def _class_key(status: int, success: bool, error: str, grpc_status: int | None = None) -> str:
    """A response's labels; ``status`` 0 when there was no response (a timeout), as Linkerd leaves it out;
    ``grpc_status`` for a gRPC response (the HTTP/2 layer), else ``""``."""
    key = _CLASS_KEYS.get((status, success, error, grpc_status))
    if key is None:
        result = "success" if success else "failure"
        grpc = "" if grpc_status is None else grpc_status
        if status:
            key = f'status_code="{status}",classification="{result}",grpc_status="{grpc}",error="{error}"'
        else:
            key = f'classification="{result}",grpc_status="{grpc}",error="{error}"'
        if len(_CLASS_KEYS) < 4096:
            _CLASS_KEYS[(status, success, error, grpc_status)] = key
    return key


class RouteMetrics(_Store["_RouteSeries"]):
    """``route_*`` (the logical request, across its attempts) and ``route_actual_*`` (each attempt).

    Recorded by the HTTP layer for requests that matched a profile route
    (the default route too), under the route's label set (built once per
    profile update): ``request`` when it starts (its first attempt too),
    ``retryable`` and ``actual_response`` for an attempt that failed,
    ``response`` when it ends (with its last attempt's, unless that got no
    response). Two series lookups for a request without retries. Bounded like
    ``HttpMetrics``.
    """

    def __init__(self, clock: Callable[[], float], retain_idle: float, max_series: int = MAX_SERIES) -> None:
        super().__init__(clock, retain_idle, max_series, _RouteSeries)

    def request(self, labels: str, retryable: bool = False) -> None:
        series = self._get(labels)
        series.requests += 1
        series.actual_requests += 1
        if retryable:
            series.retryable = True

    def response(self, labels: str, status: int, success: bool, latency_ms: int, error: str = "",
                 actual: bool = True, grpc_status: int | None = None) -> None:
        """The request's end; ``actual``: its last attempt had this response too (not for a timeout)."""
        series = self._get(labels)
        key = _class_key(status, success, error, grpc_status)
        series.responses[key] = series.responses.get(key, 0) + 1
        if actual:
            series.actual_responses[key] = series.actual_responses.get(key, 0) + 1
        _observe(series.latency, status, latency_ms)

    def actual_response(self, labels: str, status: int, success: bool, error: str = "",
                        grpc_status: int | None = None) -> None:
        """An attempt that was not the last one."""
        series = self._get(labels)
        key = _class_key(status, success, error, grpc_status)
        series.actual_responses[key] = series.actual_responses.get(key, 0) + 1

    def retryable(self, labels: str, withdrew: bool) -> None:
        """A failed response the route could retry; ``withdrew``: the budget allowed it (one more attempt)."""
        series = self._get(labels)
        series.retryable = True
        series.retryable_total += 1
        if withdrew:
            series.actual_requests += 1
        else:
            series.no_budget += 1

    def render(self, out: list[str]) -> None:
        self._evict(self._clock(), force=False)
        series = self._series
        if not series:
            return  # as Linkerd: no family at all until a profile route is used
        out.append("# HELP route_request_total Total count of HTTP requests.")
        out.append("# TYPE route_request_total counter")
        out.extend(f"route_request_total{{{labels}}} {s.requests}" for labels, s in series.items())
        out.append("# HELP route_response_latency_ms Elapsed times between a request's headers being received "
                   "and its response stream completing")
        out.append("# TYPE route_response_latency_ms histogram")
        for labels, s in series.items():
            for status, hist in s.latency.items():
                render_histogram(out, "route_response_latency_ms",
                                 f'{labels},status_code="{status}"' if status else labels, hist)
        out.append("# HELP route_response_total Total count of HTTP responses.")
        out.append("# TYPE route_response_total counter")
        for labels, s in series.items():
            out.extend(f"route_response_total{{{labels},{key}}} {n}" for key, n in s.responses.items())
        retryable = [(labels, s) for labels, s in series.items() if s.retryable]
        if retryable:
            out.append("# HELP route_retryable_total Total count of retryable HTTP responses.")
            out.append("# TYPE route_retryable_total counter")
            for labels, s in retryable:
                out.append(f"route_retryable_total{{{labels}}} {s.retryable_total}")
                out.append(f'route_retryable_total{{{labels},skipped="no_budget"}} {s.no_budget}')
        out.append("# HELP route_actual_request_total Total count of HTTP requests.")
        out.append("# TYPE route_actual_request_total counter")
        out.extend(f"route_actual_request_total{{{labels}}} {s.actual_requests}" for labels, s in series.items())
        out.append("# HELP route_actual_response_total Total count of HTTP responses.")
        out.append("# TYPE route_actual_response_total counter")
        for labels, s in series.items():
            out.extend(f"route_actual_response_total{{{labels},{key}}} {n}" for key, n in s.actual_responses.items())



def render_histogram(out: list[str], name: str, labels: str, hist: Sequence[float],
                     buckets: Sequence[int | float] = BUCKETS) -> None:
    """A histogram's cumulative ``buckets`` (by default Linkerd's latency boundaries), then +Inf, sum and
    count; ``hist``: the count per bucket (+Inf last), then the sum and the count. (``buckets`` typed as ints or
    floats, not floats: compiled, an int bucket in a float variable would render as "5.0", not Linkerd's "5".)"""
    total = 0
    for i, le in enumerate(buckets):
        total += int(hist[i])
        out.append(f'{name}_bucket{{{labels},le="{le}"}} {total}')
    total += int(hist[len(buckets)])
    out.append(f'{name}_bucket{{{labels},le="+Inf"}} {total}')
    out.append(f"{name}_sum{{{labels}}} {number(hist[-2])}")
    out.append(f"{name}_count{{{labels}}} {int(hist[-1])}")
