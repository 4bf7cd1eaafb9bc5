"""Linkerd 2.20's outbound route metrics (proxy.md §9.5), for requests routed by client policy.

- ``outbound_{http,grpc}_route_request_duration_seconds`` (histogram, buckets
  0.05, 0.5, 1, 10) and ``..._request_statuses_total`` (``http_status`` or
  ``grpc_status``, and ``error``): one per request, as the client saw it;
- ``outbound_{http,grpc}_route_backend_requests_total``: one per attempt, under
  the backend the route drew, and ``..._backend_response_duration_seconds``
  (0.025 ... 10) and ``..._backend_response_statuses_total`` when it ended;
- ``outbound_{http,grpc}_route_request_frame_size_bytes`` (128, 1024, 10240): each
  request body chunk (an HTTP/1 chunk or read, an HTTP/2 DATA frame) the client
  sent on the route, once (a retry's replay is not counted again), and
  ``..._backend_response_frame_size_bytes``: each response body chunk of the
  backend relayed to the client;
- ``outbound_{http,grpc}_route_retry_{requests,successes,limit_exceeded,overflow}_total`` (``overflow`` always
  0: a retry waits for its backend's readiness here, where Linkerd's gives up);
- ``outbound_tcp_protocol_connections_total{protocol}``: connections by their
  policy's protocol;
- ``outbound_tcp_detect_http_results_total{result}`` and
  ``outbound_tcp_detect_http_duration_seconds`` (0.001, 0.1): HTTP detection on
  connections whose policy is known (``DetectMetrics``, which also keeps the
  inbound side's ``inbound_tcp_detect_http_*`` under the ``srv_*`` labels);
- ``outbound_tcp_route_{open,close}_total`` (``target_ip``, ``target_port``;
  ``error`` on close): opaque connections under a policy's opaque route (a
  TCPRoute, an EgressNetwork's among them);
- ``outbound_tls_route_{open,close}_total`` (``hostname``; ``error`` on
  close): TLS connections under the TLS route their SNI chose.

Labels: ``parent_*`` (group, kind, namespace, name, port, section_name: the
Service port or EgressNetwork), ``route_*`` (group, kind, namespace, name),
``backend_*`` (as the parent's) and ``hostname``. ``hostname`` is empty unless
``LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS`` is true (``hostname_labels``);
then, as linkerd2-proxy's, it is the host of the request's URI (an absolute-form
target's authority, else the ``Host`` or ``:authority`` header, without the port)
when that is a DNS name, in lower case (an IP literal or anything else: empty),
on the request-level families (durations, statuses, retries, request frames; never the
``backend_*`` ones), and the SNI on the TLS route families. Hostnames are the
client's to choose, so they are not bounded by the mesh's routes.

The per-request path renders no labels and calls no counter: the series of a
route (and hostname) are one ``RouteSeries``, those of a route's backend one
``BackendSeries``, which requests update in place; a request finds them by
their rendered labels (one dict lookup), and the HTTP cores call their
``request_frame``, ``response`` and ``frame`` methods as the pick's observers.
As the proxy's other families, a series is touched at a scrape when its
requests moved since the previous one, and dropped when untouched for
``retain_idle`` (or, past ``MAX_SERIES`` routes or backends, the least recently
touched tenth); a request holding a series that expires meanwhile loses the
rest of its observations.

Pure: the callers pass durations. Callers: ``core.policy_routes``
(``RouteReport``, ``BackendReport``: which series a request updates),
``core.exchange`` (a request's begin and end on its route), ``core.routes``
(the pick's observers), ``tether.proxy.app`` (rendering, through its registry).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from functools import lru_cache
from typing import ClassVar, TypeVar

from tether.proxy.codec import detect
from tether.proxy.codec.addrs import is_dns_name
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core import labels
from tether.proxy.core.http_metrics import render_histogram
from tether.proxy.core.metrics import MAX_SERIES, Registry, stale_series

DURATION_BUCKETS = (0.05, 0.5, 1.0, 10.0)
DETECT_BUCKETS = (0.001, 0.1)
DETECT_RESULTS = ("not_http", "http/1", "http/2", "read_timeout", "error")  # Linkerd's ``result`` values
# A verdict's ``result`` (a connection closed before detection ended: ``error``).
_RESULT_OF: dict[type[detect.Verdict], str] = {
    detect.Http1: "http/1", detect.Http2: "http/2", detect.Opaque: "not_http", detect.ReadTimeout: "read_timeout"}
FRAME_BUCKETS = (128.0, 1024.0, 10240.0)
BACKEND_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0)
GRPC_CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
              "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
              "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
_RETRY = ("requests", "successes", "limit_exceeded", "overflow")


class _Histogram:
    """Seconds in ``DURATION_BUCKETS`` (or bytes in other buckets) per label set: bucket counts (+Inf last), then sum and count."""

    def __init__(self, name: str, help_: str, clock: Callable[[], float], retain_idle: float,
                 buckets: tuple[float, ...] = DURATION_BUCKETS) -> None:
        self.buckets = buckets
        self.name = name
        self.help = help_
        self._clock = clock
        self._retain_idle = retain_idle
        self.series: dict[str, list[float]] = {}
        self._touched: dict[str, float] = {}

    def observe(self, labels_: str, seconds: float) -> None:
        series = self.series.get(labels_)
        if series is None:
            if len(self.series) >= MAX_SERIES:
                self._expire(force=True)
            series = self.series[labels_] = histogram(self.buckets)
        self._touched[labels_] = self._clock()
        series[bisect_left(self.buckets, seconds)] += 1
        series[-2] += seconds
        series[-1] += 1

    def render(self, out: list[str]) -> None:
        self._expire(force=False)
        _header(out, self.name, "histogram", self.help)
        for key, series in self.series.items():
            render_histogram(out, self.name, key, series, self.buckets)

    def _expire(self, *, force: bool) -> None:
        for key in stale_series(self._touched, self._clock(), self._retain_idle, force=force):
            self.series.pop(key, None)
            self._touched.pop(key, None)


def histogram(buckets: tuple[float, ...]) -> list[float]:
    """An empty histogram over ``buckets``: the count per bucket (+Inf last), then the sum and the count."""
    return [0.0] * (len(buckets) + 3)


class _Series:
    """What the series of a route and those of a route's backend have in common: counted ``requests`` (what
    expiry watches, ``_expire``), statuses by their rendered ``http_status``/``grpc_status`` and ``error``
    labels, a duration histogram (None until the first observation) and a frame size one (None until a
    request binds ``frame``)."""

    __slots__ = ("grpc", "requests", "seen", "touched", "statuses", "duration", "frames")
    durations: ClassVar[tuple[float, ...]]  # the duration histogram's buckets

    def __init__(self, grpc: bool, now: float) -> None:
        self.grpc = grpc
        self.requests = 0
        self.seen = 0  # ``requests`` at the last scrape
        self.touched = now
        self.statuses: dict[str, int] = {}
        self.duration: list[float] | None = None
        self.frames: list[float] | None = None

    def ended(self, status: int, grpc_status: int | None, seconds: float, error: str | None = None) -> None:
        """A request (an attempt, at a backend) ended after ``seconds`` with ``status`` (0: none) and ``error``
        (Linkerd's ``REQUEST_TIMEOUT``, ``UNKNOWN``...; empty when a status came; None: ``UNKNOWN`` without a
        status, as for a backend's response). A backend's is its pick's ``outcome``, called by the cores."""
        buckets = self.durations
        duration = self.duration
        if duration is None:
            duration = self.duration = histogram(buckets)
        duration[bisect_left(buckets, seconds)] += 1
        duration[-2] += seconds
        duration[-1] += 1
        outcome = _outcome(self.grpc, status, grpc_status, ("" if status else "UNKNOWN") if error is None else error)
        self.statuses[outcome] = self.statuses.get(outcome, 0) + 1

    def frame(self, size: float) -> None:
        """A body frame of ``size`` bytes."""
        frames = self.frames
        assert frames is not None
        frames[bisect_left(FRAME_BUCKETS, size)] += 1
        frames[-2] += size
        frames[-1] += 1


class RouteSeries(_Series):
    """The request-level series of one route and ``hostname`` label in one protocol's families, updated in place
    by its requests (``core.policy_routes.RouteReport`` finds it by its labels, a dict lookup per request: no
    label rendering, no call into a counter): ``requests`` begun on it, their statuses and durations, the
    frames of their bodies (``frame``: ``core.exchange.route_begun``) and ``retries``, None until the route's
    first retry event (its four series come into being together, as Linkerd creates them)."""

    __slots__ = ("retries",)
    durations = DURATION_BUCKETS

    def __init__(self, grpc: bool, now: float) -> None:
        super().__init__(grpc, now)
        self.retries: list[int] | None = None  # requests, successes, limit_exceeded, overflow (as ``_RETRY``)

    def retry(self, what: str) -> None:
        """One retry event (a name of ``_RETRY``; a retry here waits for its backend instead of overflowing:
        ``overflow`` stays 0)."""
        retries = self.retries
        if retries is None:
            retries = self.retries = [0] * len(_RETRY)
        retries[_RETRY.index(what)] += 1


class BackendSeries(_Series):
    """The series of one route's backend in one protocol's families, updated in place per attempt:
    ``requests`` (``..._backend_requests_total``), and from ``ended`` (a ``Pick.outcome``) and ``frame`` (a
    ``Pick.frames``: the response body relayed) the response statuses, durations and body frame sizes. The
    cores call those two bound methods directly: one call per response and per chunk, where binding labels
    per request took four."""

    __slots__ = ()
    durations = BACKEND_BUCKETS


_S = TypeVar("_S", RouteSeries, BackendSeries)


class RouteFamily:
    """The metrics of one protocol (``http`` or ``grpc``): the request-level series by route (parent, route and
    ``hostname`` labels), the backend ones by route and backend (parent, route and backend labels)."""

    def __init__(self, proto: str, clock: Callable[[], float], retain_idle: float) -> None:
        self.prefix = f"outbound_{proto}_route"
        self.proto = proto
        self.grpc = proto == "grpc"
        self.clock = clock
        self.retain_idle = retain_idle
        self.routes: dict[str, RouteSeries] = {}
        self.backends: dict[str, BackendSeries] = {}

    def route(self, key: str) -> RouteSeries:
        """The series of the route ``key`` names, made if new (or expired)."""
        series = self.routes.get(key)
        if series is None:
            series = self.routes[key] = RouteSeries(self.grpc, self._room(self.routes))
        return series

    def backend(self, key: str) -> BackendSeries:
        """The series of the route's backend ``key`` names, made if new (or expired)."""
        series = self.backends.get(key)
        if series is None:
            series = self.backends[key] = BackendSeries(self.grpc, self._room(self.backends))
        return series

    def _room(self, series: dict[str, _S]) -> float:
        """Now, after room was made for one more series in ``series`` (past ``MAX_SERIES``: the least recently
        touched go)."""
        now = self.clock()
        if len(series) >= MAX_SERIES:
            _expire(series, now, self.retain_idle, force=True)
        return now

    def render(self, out: list[str]) -> None:
        now = self.clock()
        _expire(self.routes, now, self.retain_idle, force=False)
        _expire(self.backends, now, self.retain_idle, force=False)
        prefix, proto, routes, backends = self.prefix, self.proto, self.routes.items(), self.backends.items()
        _header(out, f"{prefix}_request_statuses_total", "counter", "Completed request-response streams.")
        out.extend(f"{prefix}_request_statuses_total{{{key},{outcome}}} {n}"
                   for key, series in routes for outcome, n in series.statuses.items())
        _header(out, f"{prefix}_backend_response_statuses_total", "counter", "Completed responses of backends.")
        out.extend(f"{prefix}_backend_response_statuses_total{{{key},{outcome}}} {n}"
                   for key, backend in backends for outcome, n in backend.statuses.items())
        _header(out, f"{prefix}_backend_requests_total", "counter",
                "The total number of requests dispatched to a backend.")
        out.extend(f"{prefix}_backend_requests_total{{{key}}} {backend.requests}" for key, backend in backends)
        for i, what in enumerate(_RETRY):
            _header(out, f"{prefix}_retry_{what}_total", "counter", f"Retry {what.replace('_', ' ')}.")
            out.extend(f"{prefix}_retry_{what}_total{{{key}}} {series.retries[i]}"
                       for key, series in routes if series.retries is not None)
        for name, help_, buckets, of in (
                ("request_duration_seconds",
                 f"The time between request initialization and response completion ({proto}).", DURATION_BUCKETS,
                 [(key, series.duration) for key, series in routes]),
                ("backend_response_duration_seconds",
                 f"The time from a backend request to its response's end ({proto}).", BACKEND_BUCKETS,
                 [(key, backend.duration) for key, backend in backends]),
                ("request_frame_size_bytes", f"The size of request body frames sent on the route ({proto}).",
                 FRAME_BUCKETS, [(key, series.frames) for key, series in routes]),
                ("backend_response_frame_size_bytes", f"The size of response body frames of a backend ({proto}).",
                 FRAME_BUCKETS, [(key, backend.frames) for key, backend in backends])):
            _header(out, f"{prefix}_{name}", "histogram", help_)
            for key, hist in of:
                if hist is not None:
                    render_histogram(out, f"{prefix}_{name}", key, hist, buckets)


def _expire(series: dict[str, _S], now: float, retain_idle: float, *, force: bool) -> None:
    """Drops the series whose requests have not moved for ``retain_idle`` (a series that moved since the last
    look is touched now); with ``force``, room for one more (``stale_series``)."""
    touched = {}
    for key, one in series.items():
        if one.requests != one.seen:
            one.seen = one.requests
            one.touched = now
        touched[key] = one.touched
    for key in stale_series(touched, now, retain_idle, force=force):
        del series[key]


def _header(out: list[str], name: str, kind: str, help_: str) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")


class PolicyMetrics:
    """The outbound route families, registered in the proxy's registry (``render`` is the registry's);
    ``hostname_labels``: ``LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS``."""

    def __init__(self, registry: Registry, *, hostname_labels: bool = False) -> None:
        self.hostname_labels = hostname_labels
        self.http = RouteFamily("http", registry.clock, registry.retain_idle)
        self.grpc = RouteFamily("grpc", registry.clock, registry.retain_idle)
        self.protocol_connections = registry.counter("outbound_tcp_protocol_connections_total",
                                                     "The number of connections, by the policy's protocol.")
        self.tcp_open = registry.counter("outbound_tcp_route_open_total", "The number of connections opened.")
        self.tcp_close = registry.counter("outbound_tcp_route_close_total", "The number of connections closed.")
        self.tls_open = registry.counter("outbound_tls_route_open_total", "The number of connections opened.")
        self.tls_close = registry.counter("outbound_tls_route_close_total", "The number of connections closed.")
        self.detection = DetectMetrics(registry, "outbound")
        registry.add_collector(self._render_routes)

    def family(self, grpc: bool) -> RouteFamily:
        return self.grpc if grpc else self.http

    def hostname(self, request: RequestHead) -> str:
        """The ``hostname`` label's value for ``request`` (see the module docstring); "" when not exported."""
        return request_host(request) if self.hostname_labels else ""

    def sni_hostname(self, server_name: str) -> str:
        """The ``hostname`` label's value for a TLS route's connection: its SNI, when exported."""
        return server_name if self.hostname_labels else ""

    def connection(self, protocol: str, parent_labels: str) -> None:
        """A connection to a target whose policy says ``protocol`` (Linkerd's names: ``http/1``, ``http/2``,
        ``detect``, ``opaq``, ``tls``)."""
        self.protocol_connections.inc(f'{labels.render(("protocol", protocol))},{parent_labels}')

    def tcp_opened(self, route_labels: str, *, tls: bool = False) -> None:
        """A connection on a policy's opaque route (``route_labels``: parent, route and target), or with ``tls``
        on a TLS route (parent, route and hostname)."""
        (self.tls_open if tls else self.tcp_open).inc(route_labels)

    def tcp_closed(self, route_labels: str, error: str, *, tls: bool = False) -> None:
        """``error``: ``forbidden``, ``invalid_backend``, ``invalid_policy``, ``unexpected`` or "" (Linkerd's
        values)."""
        (self.tls_close if tls else self.tcp_close).inc(f"{route_labels},{labels.render(('error', error))}")

    def _render_routes(self, out: list[str]) -> None:
        self.http.render(out)
        self.grpc.render(out)


class DetectMetrics:
    """``<direction>_tcp_detect_http_results_total{result}`` and ``..._duration_seconds`` (0.001, 0.1) of one
    direction's HTTP detection: outbound per parent (``parent_*``), inbound per server (``srv_*``)."""

    def __init__(self, registry: Registry, direction: str) -> None:
        self.clock = registry.clock
        self.results = registry.counter(f"{direction}_tcp_detect_http_results_total", "Protocol detection results.")
        self.duration = _Histogram(f"{direction}_tcp_detect_http_duration_seconds",
                                   "Time taken for protocol detection.", registry.clock, registry.retain_idle,
                                   DETECT_BUCKETS)
        registry.add_collector(self.duration.render)

    def detected(self, key_labels: str, verdict: detect.Verdict, seconds: float) -> None:
        """HTTP detection under ``key_labels`` ended with ``verdict`` after ``seconds``; the five result series
        of those labels come into being together, as Linkerd creates them."""
        result = _RESULT_OF.get(type(verdict), "error")
        for name in DETECT_RESULTS:
            self.results.inc(f'{labels.render(("result", name))},{key_labels}', 1 if name == result else 0)
        self.duration.observe(key_labels, seconds)


def request_host(request: RequestHead) -> str:
    """The host of a request's URI when it is a DNS name (lower case), else "": an absolute-form target's
    authority, else the ``Host`` (HTTP/1) or ``:authority`` (HTTP/2) header, without its port."""
    target = request.target
    if b"://" in target:
        authority = target.partition(b"://")[2].partition(b"/")[0].partition(b"?")[0]
    else:
        authority = next((v for n, v in request.headers if n.lower() in (b"host", b":authority")), b"")
    host = authority.rpartition(b"@")[2].decode("latin-1")
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        host = name
    return host.lower() if is_dns_name(host) else ""


def route_key(route_labels: str, hostname: str) -> str:
    """The labels of a route's request-level series: its parent and route labels, and ``hostname``'s."""
    return f"{route_labels},{_hostname(hostname)}"


# Label renderings asked for on every request, cached (a C call, where rendering is a dozen Python calls):
# statuses, codes and errors are few; hostnames are the client's, so their cache is bounded.
@lru_cache(maxsize=1024)
def _hostname(hostname: str) -> str:
    return labels.render(("hostname", hostname))


@lru_cache(maxsize=1024)
def _outcome(grpc: bool, status: int, grpc_status: int | None, error: str) -> str:
    """``http_status`` (or ``grpc_status``, by name) and ``error``. A gRPC response without a status (an error, a
    response the backend ended without trailers) and a code beyond the known ones are ``UNKNOWN``, as
    linkerd2-proxy labels them (its ``GrpcRsp`` has no empty value); ``http_status`` is empty without a status."""
    if grpc:
        code = GRPC_CODES[grpc_status] if grpc_status is not None and 0 <= grpc_status < len(GRPC_CODES) \
            else "UNKNOWN"
        return labels.render(("grpc_status", code), ("error", error))
    return labels.render(("http_status", str(status) if status else ""), ("error", error))
