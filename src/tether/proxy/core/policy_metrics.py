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
  backend relayed to the client. The cores observe them through series bound
  once per request (``request_frames``, ``backend_frames``): no label rendering
  per chunk;
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
client's to choose, so they are not bounded by the mesh's routes: every family
keeps at most ``MAX_SERIES`` series and expires idle ones as the proxy's other
families do (``core.metrics.Counter``).

Pure: the callers pass durations. Callers: ``core.routes`` (backend requests),
``core.policy_routes`` (``RouteReport``: statuses, durations, retries),
``tether.proxy.app`` (rendering, through its registry).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from functools import lru_cache

from tether.proxy.codec import detect
from tether.proxy.codec.addrs import is_dns_name
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core import labels
from tether.proxy.core.http_metrics import render_histogram
from tether.proxy.core.metrics import MAX_SERIES, Counter, Registry, stale_series

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
        series = self._series(labels_)
        series[bisect_left(self.buckets, seconds)] += 1
        series[-2] += seconds
        series[-1] += 1

    def bind(self, labels_: str) -> Callable[[float], None]:
        """An observer of ``labels_``'s series, for a request's many observations (a series expired while a
        request holds it loses the rest of that request's)."""
        return _Bound(self._series(labels_), self.buckets).observe

    def _series(self, labels_: str) -> list[float]:
        """``labels_``'s series, made if new, touched now."""
        series = self.series.get(labels_)
        if series is None:
            if len(self.series) >= MAX_SERIES:
                self._expire(force=True)
            series = self.series[labels_] = [0.0] * (len(self.buckets) + 3)
        self._touched[labels_] = self._clock()
        return series

    def render(self, out: list[str]) -> None:
        self._expire(force=False)
        out.append(f"# HELP {self.name} {self.help}")
        out.append(f"# TYPE {self.name} histogram")
        for key, series in self.series.items():
            render_histogram(out, self.name, key, series, self.buckets)

    def _expire(self, *, force: bool) -> None:
        for key in stale_series(self._touched, self._clock(), self._retain_idle, force=force):
            self.series.pop(key, None)
            self._touched.pop(key, None)


class _Bound:
    """One series of a histogram, held by a request (``_Histogram.bind``)."""

    __slots__ = ("series", "buckets")

    def __init__(self, series: list[float], buckets: tuple[float, ...]) -> None:
        self.series = series
        self.buckets = buckets

    def observe(self, value: float) -> None:
        series = self.series
        series[bisect_left(self.buckets, value)] += 1
        series[-2] += value
        series[-1] += 1


class _Family:
    """The metrics of one protocol (``http`` or ``grpc``)."""

    def __init__(self, registry: Registry, proto: str) -> None:
        prefix = f"outbound_{proto}_route"
        self.duration = _Histogram(f"{prefix}_request_duration_seconds",
                                   f"The time between request initialization and response completion ({proto}).",
                                   registry.clock, registry.retain_idle)
        self.statuses = registry.counter(f"{prefix}_request_statuses_total", "Completed request-response streams.")
        self.backend_duration = _Histogram(f"{prefix}_backend_response_duration_seconds",
                                           f"The time from a backend request to its response's end ({proto}).",
                                           registry.clock, registry.retain_idle, BACKEND_BUCKETS)
        self.request_frames = _Histogram(f"{prefix}_request_frame_size_bytes",
                                         f"The size of request body frames sent on the route ({proto}).",
                                         registry.clock, registry.retain_idle, FRAME_BUCKETS)
        self.backend_frames = _Histogram(f"{prefix}_backend_response_frame_size_bytes",
                                         f"The size of response body frames of a backend ({proto}).",
                                         registry.clock, registry.retain_idle, FRAME_BUCKETS)
        self.backend_statuses = registry.counter(f"{prefix}_backend_response_statuses_total",
                                                 "Completed responses of backends.")
        self.backend_requests = registry.counter(f"{prefix}_backend_requests_total",
                                                 "The total number of requests dispatched to a backend.")
        self.retry: dict[str, Counter] = {
            what: registry.counter(f"{prefix}_retry_{what}_total", f"Retry {what.replace('_', ' ')}.")
            for what in _RETRY}


class PolicyMetrics:
    """The outbound route families, registered in the proxy's registry (``render`` is the registry's);
    ``hostname_labels``: ``LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS``."""

    def __init__(self, registry: Registry, *, hostname_labels: bool = False) -> None:
        self.hostname_labels = hostname_labels
        self.http = _Family(registry, "http")
        self.grpc = _Family(registry, "grpc")
        self.protocol_connections = registry.counter("outbound_tcp_protocol_connections_total",
                                                     "The number of connections, by the policy's protocol.")
        self.tcp_open = registry.counter("outbound_tcp_route_open_total", "The number of connections opened.")
        self.tcp_close = registry.counter("outbound_tcp_route_close_total", "The number of connections closed.")
        self.tls_open = registry.counter("outbound_tls_route_open_total", "The number of connections opened.")
        self.tls_close = registry.counter("outbound_tls_route_close_total", "The number of connections closed.")
        self.detection = DetectMetrics(registry, "outbound")
        registry.add_collector(self._render_histograms)

    def backend_request(self, grpc: bool, route_labels: str, backend_labels: str) -> None:
        (self.grpc if grpc else self.http).backend_requests.inc(f"{route_labels},{backend_labels}")

    def hostname(self, request: RequestHead) -> str:
        """The ``hostname`` label's value for ``request`` (see the module docstring); "" when not exported."""
        return request_host(request) if self.hostname_labels else ""

    def sni_hostname(self, server_name: str) -> str:
        """The ``hostname`` label's value for a TLS route's connection: its SNI, when exported."""
        return server_name if self.hostname_labels else ""

    def retry(self, grpc: bool, route_labels: str, what: str, hostname: str = "") -> None:
        """One retry event of the route; its four series come into being together, as Linkerd creates them (a
        retry here waits for its backend instead of overflowing: ``overflow`` stays 0)."""
        key = f"{route_labels},{_hostname(hostname)}"
        for name, counter in (self.grpc if grpc else self.http).retry.items():
            counter.inc(key, 1 if name == what else 0)

    def backend_response(self, grpc: bool, route_labels: str, backend_labels: str, status: int,
                         grpc_status: int | None, seconds: float) -> None:
        """An attempt at a backend ended: its status (0: no response: ``error="UNKNOWN"``)."""
        family = self.grpc if grpc else self.http
        key = f"{route_labels},{backend_labels}"
        family.backend_duration.observe(key, seconds)
        family.backend_statuses.inc(f"{key},{_outcome(grpc, status, grpc_status, '' if status else 'UNKNOWN')}")

    def request_frames(self, grpc: bool, route_labels: str, hostname: str = "") -> Callable[[float], None]:
        """The observer of a request's body frame sizes on the route (``hostname`` as ``hostname()``)."""
        return (self.grpc if grpc else self.http).request_frames.bind(f"{route_labels},{_hostname(hostname)}")

    def backend_frames(self, grpc: bool, route_labels: str, backend_labels: str) -> Callable[[float], None]:
        """The observer of the body frame sizes of a backend's response to one request."""
        return (self.grpc if grpc else self.http).backend_frames.bind(f"{route_labels},{backend_labels}")

    def finished(self, grpc: bool, route_labels: str, seconds: float, status: int, grpc_status: int | None,
                 error: str, hostname: str = "") -> None:
        """A request on the route is over: its status (0: none was sent) and ``error`` (Linkerd's
        ``REQUEST_TIMEOUT``, ``UNKNOWN``...; empty when a status came); ``hostname`` as ``hostname()``."""
        family = self.grpc if grpc else self.http
        key = f"{route_labels},{_hostname(hostname)}"
        family.duration.observe(key, seconds)
        family.statuses.inc(f"{key},{_outcome(grpc, status, grpc_status, error)}")

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

    def _render_histograms(self, out: list[str]) -> None:
        for family in (self.http, self.grpc):
            family.duration.render(out)
            family.backend_duration.render(out)
            family.request_frames.render(out)
            family.backend_frames.render(out)


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


# Label renderings asked for on every request, cached (a C call, where rendering is a dozen Python calls):
# statuses, codes and errors are few; hostnames are the client's, so their cache is bounded.
@lru_cache(maxsize=1024)
def _hostname(hostname: str) -> str:
    return labels.render(("hostname", hostname))


@lru_cache(maxsize=1024)
def _outcome(grpc: bool, status: int, grpc_status: int | None, error: str) -> str:
    """``http_status`` (or ``grpc_status``, by name) and ``error``."""
    if grpc:
        code = "" if grpc_status is None else GRPC_CODES[grpc_status] if 0 <= grpc_status < len(GRPC_CODES) \
            else str(grpc_status)
        return labels.render(("grpc_status", code), ("error", error))
    return labels.render(("http_status", str(status) if status else ""), ("error", error))
