"""Index states to ``io.linkerd.proxy.outbound.OutboundPolicy`` messages, as Linkerd's policy controller encodes them.

``encode(target, state, config)`` is the only entry.  What a proxy receives:

* **Service, no routes**: ``detect`` (10s) with one default HTTP route
  (metadata ``default: http``, ``PathPrefix /``, first-available to the
  Service's balancer) for HTTP/1 and HTTP/2 and a default opaque route
  (``opaq``).  A route named ``default`` is what tells a linkerd2-proxy that no
  HTTPRoute applies, so it uses the Service's ServiceProfile instead (Linkerd
  2.20's fallback).
* **Service with routes**, Linkerd 2.20's precedence: ``appProtocol``
  ``http``/``h2c`` take HTTPRoutes (GRPCRoutes first on ``h2c``); an opaque
  port (``appProtocol`` opaque or unknown, or an opaque port) takes its first
  TCPRoute (Linkerd's ``MAXIMUM_ALLOWED_TCP_ROUTES`` = 1) as an ``opaque``
  route, else the default opaque route; otherwise (detect) GRPCRoutes win
  (``grpc``), then HTTPRoutes (``detect``), then TLSRoutes (``tls``, one
  route per TLSRoute with its SNI matches), then the first TCPRoute
  (``opaque``), else the default ``detect``.
* Rules: matches, filters, weighted backends (``random_available``; none
  listed: first-available to the parent), ``timeouts`` (and the deprecated
  ``requestTimeout``), retries (backoff 25ms-250ms, jitter 1, 64 KiB bodies),
  failure accrual on the protocol, backends balanced P2C by peak EWMA (or the
  penalty estimator under ``penalize-failures``) with queue 100 / failfast 3s.
  A missing or unsupported backend stays in the distribution with its weight
  and a failure-injector filter (HTTP 500, or gRPC code 500 as Linkerd sends).
* TLSRoute and TCPRoute rules: weighted backends (``random_available``) or,
  none listed, first-available to the parent; Service backends balanced by
  plain peak EWMA; a missing or unsupported backend carries an ``Invalid``
  filter (the proxy refuses the connection).
* **EgressNetwork**: the routes plus a default route that forwards to the
  original destination (Allow) or fails it (Deny: HTTP 403, gRPC
  PERMISSION_DENIED, opaque and TLS ``Forbidden``) -- for TLSRoutes too
  (``tls-egress-allow``/``-deny``), but not after a TCPRoute, which Linkerd
  sends alone.
* **Undefined port**: opaque, no backends, ``Forbidden``.  **Egress fallback**:
  ``detect`` forwarding to the original destination (``egress-fallback``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from google.protobuf.duration_pb2 import Duration

from tether.api import destination_pb2, grpc_route_pb2, http_route_pb2, meta_pb2, opaque_route_pb2, tls_route_pb2
from tether.api import outbound_pb2 as pb
from tether.api.addresses import to_tcp_address
from tether.policy import route_translator as rt
from tether.policy.outbound import annotations as ann
from tether.policy.config import PolicyConfig
from tether.policy.outbound.index import (
    AddressTarget,
    EgressFallback,
    OutboundState,
    Parent,
    ResolvedBackend,
    ResolvedRoute,
    ResolvedRule,
    State,
    Target,
    UndefinedPort,
)
from tether.resources.routes import RouteFilter

DETECT_TIMEOUT = 10.0
QUEUE_CAPACITY = 100
FAILFAST_TIMEOUT = 3.0
EWMA_DEFAULT_RTT = 0.030
EWMA_DECAY = 10.0
PENALTY_DECAY = 10.0
RETRY_MIN_BACKOFF = 0.025
RETRY_MAX_BACKOFF = 0.250
RETRY_MAX_REQUEST_BYTES = 64 * 1024
GRPC_PERMISSION_DENIED = 7
MAXIMUM_ALLOWED_TCP_ROUTES = 1  # Linkerd's: a TCPRoute cannot select, so only the first one counts

_GRPC_CONDITION_FIELDS = {
    "cancelled": "cancelled",
    "deadline-exceeded": "deadine_exceeded",  # sic: the proto's field name
    "resource-exhausted": "resource_exhausted",
    "internal": "internal",
    "unavailable": "unavailable",
}


def encode(target: Target, state: State, config: PolicyConfig) -> pb.OutboundPolicy:
    """The message for ``state``; ``target`` gives the original destination of address lookups."""
    original = (target.ip, target.port) if isinstance(target, AddressTarget) else None
    if isinstance(state, UndefinedPort):
        return _undefined_port(state)
    if isinstance(state, EgressFallback):
        assert original is not None
        return _fallback(*original)
    return _Encoder(state, config, original).policy()


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def _default_meta(name: str) -> meta_pb2.Metadata:
    return meta_pb2.Metadata(default=name)


def _resource_meta(group: str, kind: str, namespace: str, name: str, port: int = 0) -> meta_pb2.Metadata:
    return meta_pb2.Metadata(resource=meta_pb2.Resource(group=group, kind=kind, namespace=namespace, name=name,
                                                        port=port))


def _parent_meta(parent: Parent) -> meta_pb2.Metadata:
    group = "core" if parent.kind == "Service" else "policy.linkerd.io"
    return _resource_meta(group, parent.kind, parent.namespace, parent.name, parent.port)


def _queue() -> pb.Queue:
    return pb.Queue(capacity=QUEUE_CAPACITY, failfast_timeout=_duration(FAILFAST_TIMEOUT))


def _forward(meta: meta_pb2.Metadata | None, ip: str, port: int, weight: int = 1) -> pb.Backend:
    return pb.Backend(metadata=meta, queue=_queue(),
                      forward=destination_pb2.WeightedAddr(addr=to_tcp_address(ip, port), weight=weight))


def _undefined_port(state: UndefinedPort) -> pb.OutboundPolicy:
    route = pb.OpaqueRoute(
        metadata=_default_meta("undefined-port"),
        rules=[pb.OpaqueRoute.Rule(
            backends=pb.OpaqueRoute.Distribution(empty=pb.OpaqueRoute.Distribution.Empty()),
            filters=[pb.OpaqueRoute.Filter(forbidden=opaque_route_pb2.Forbidden())],
        )],
    )
    return pb.OutboundPolicy(
        metadata=_resource_meta("core", "Service", state.namespace, state.name, state.port),
        protocol=pb.ProxyProtocol(opaque=pb.ProxyProtocol.Opaque(routes=[route])),
    )


def _fallback(ip: str, port: int) -> pb.OutboundPolicy:
    meta = _default_meta("egress-fallback")
    backend = _forward(meta, ip, port)
    opaque = pb.ProxyProtocol.Opaque(routes=[pb.OpaqueRoute(
        metadata=meta,
        rules=[pb.OpaqueRoute.Rule(backends=pb.OpaqueRoute.Distribution(
            first_available=pb.OpaqueRoute.Distribution.FirstAvailable(
                backends=[pb.OpaqueRoute.RouteBackend(backend=backend)])))],
    )])
    http_route = pb.HttpRoute(
        metadata=meta,
        rules=[pb.HttpRoute.Rule(
            matches=[http_route_pb2.HttpRouteMatch()],
            backends=pb.HttpRoute.Distribution(first_available=pb.HttpRoute.Distribution.FirstAvailable(
                backends=[pb.HttpRoute.RouteBackend(backend=backend)])),
        )],
    )
    return pb.OutboundPolicy(
        metadata=meta,
        protocol=pb.ProxyProtocol(detect=pb.ProxyProtocol.Detect(
            timeout=_duration(DETECT_TIMEOUT),
            opaque=opaque,
            http1=pb.ProxyProtocol.Http1(routes=[http_route]),
            http2=pb.ProxyProtocol.Http2(routes=[http_route]),
        )),
    )


# -- matches and filters ------------------------------------------------------------------------------


def _http_filter(f: RouteFilter) -> pb.HttpRoute.Filter:
    if f.request_header_modifier is not None:
        return pb.HttpRoute.Filter(request_header_modifier=rt.request_header_modifier(f.request_header_modifier))
    if f.response_header_modifier is not None:
        return pb.HttpRoute.Filter(response_header_modifier=rt.response_header_modifier(f.response_header_modifier))
    assert f.request_redirect is not None, f"{f.type} is not an outbound filter"
    return pb.HttpRoute.Filter(redirect=rt.redirect(f.request_redirect))


def _grpc_filter(f: RouteFilter) -> pb.GrpcRoute.Filter:
    assert f.request_header_modifier is not None, f"{f.type} is not an outbound gRPC filter"
    return pb.GrpcRoute.Filter(request_header_modifier=rt.request_header_modifier(f.request_header_modifier))


def _timeouts(t: ann.Timeouts) -> http_route_pb2.Timeouts:
    out = http_route_pb2.Timeouts()
    if t.request is not None:
        out.request.CopyFrom(_duration(t.request))
    if t.response is not None:
        out.response.CopyFrom(_duration(t.response))
    if t.idle is not None:
        out.idle.CopyFrom(_duration(t.idle))
    return out


def _retry_backoff() -> pb.ExponentialBackoff:
    return pb.ExponentialBackoff(min_backoff=_duration(RETRY_MIN_BACKOFF), max_backoff=_duration(RETRY_MAX_BACKOFF),
                                 jitter_ratio=1.0)


def _http_retry(r: ann.Retry) -> pb.HttpRoute.Retry:
    statuses = cast("tuple[tuple[int, int], ...]", r.conditions or ())
    ranges = [pb.HttpRoute.Retry.Conditions.StatusRange(start=lo, end=hi) for lo, hi in statuses]
    conditions = pb.HttpRoute.Retry.Conditions(status_ranges=ranges)
    out = pb.HttpRoute.Retry(max_retries=r.limit, max_request_bytes=RETRY_MAX_REQUEST_BYTES, conditions=conditions,
                             backoff=_retry_backoff())
    if r.timeout is not None:
        out.timeout.CopyFrom(_duration(r.timeout))
    return out


def _grpc_retry(r: ann.Retry) -> pb.GrpcRoute.Retry:
    conditions = pb.GrpcRoute.Retry.Conditions(
        **{_GRPC_CONDITION_FIELDS[c]: True for c in (r.conditions or ())}  # type: ignore[index]
    )
    out = pb.GrpcRoute.Retry(max_retries=r.limit, max_request_bytes=RETRY_MAX_REQUEST_BYTES, conditions=conditions,
                             backoff=_retry_backoff())
    if r.timeout is not None:
        out.timeout.CopyFrom(_duration(r.timeout))
    return out


def _backoff(b: ann.Backoff, honor_retry_after: bool) -> pb.ExponentialBackoff:
    return pb.ExponentialBackoff(min_backoff=_duration(b.min_penalty), max_backoff=_duration(b.max_penalty),
                                 jitter_ratio=b.jitter, respect_retry_after_hint=honor_retry_after)


def _accrual(a: ann.FailureAccrual | None) -> pb.FailureAccrual | None:
    if a is None:
        return None
    if a.success_rate is None:
        return pb.FailureAccrual(consecutive_failures=pb.FailureAccrual.ConsecutiveFailures(
            max_failures=a.max_failures, backoff=_backoff(a.backoff, False)))
    sr = a.success_rate
    return pb.FailureAccrual(unified=pb.FailureAccrual.Unified(
        success_rate_threshold=sr.threshold, decay=_duration(sr.window), min_requests=sr.min_requests,
        max_consecutive_failures=a.max_failures, backoff=_backoff(a.backoff, a.honor_retry_after)))


@dataclass(frozen=True, slots=True)
class _RouteKind:
    """What differs between the HTTP and gRPC route messages."""

    name: str
    route: Any
    match: Callable[[Any], Any]
    filter: Callable[[RouteFilter], Any]
    retry: Callable[[ann.Retry], Any]
    invalid: Callable[[str], Any]  # the filter that fails requests to an unusable backend
    deny: Any  # the filter of an EgressNetwork's deny route
    default_matches: list[Any]


_HTTP = _RouteKind(
    name="http",
    route=pb.HttpRoute,
    match=rt.http_match,
    filter=_http_filter,
    retry=_http_retry,
    invalid=lambda message: pb.HttpRoute.Filter(
        failure_injector=http_route_pb2.HttpFailureInjector(status=500, message=message)),
    deny=pb.HttpRoute.Filter(failure_injector=http_route_pb2.HttpFailureInjector(
        status=403, message="traffic not allowed")),
    default_matches=[http_route_pb2.HttpRouteMatch(path=http_route_pb2.PathMatch(prefix="/"))],
)
_GRPC = _RouteKind(
    name="grpc",
    route=pb.GrpcRoute,
    match=rt.grpc_match,
    filter=_grpc_filter,
    retry=_grpc_retry,
    # Linkerd sends code 500 for a bad backend of a gRPC route (sic); the proxy fails the call either way.
    invalid=lambda message: pb.GrpcRoute.Filter(
        failure_injector=grpc_route_pb2.GrpcFailureInjector(code=500, message=message)),
    deny=pb.GrpcRoute.Filter(failure_injector=grpc_route_pb2.GrpcFailureInjector(
        code=GRPC_PERMISSION_DENIED, message="traffic not allowed")),
    default_matches=[],
)


def sni_match(hostname: str) -> tls_route_pb2.SniMatch:
    """``*.example.com`` -> a suffix (labels reversed, as the proto wants), else an exact name."""
    if hostname.startswith("*."):
        return tls_route_pb2.SniMatch(suffix=tls_route_pb2.SniMatch.Suffix(
            reverse_labels=list(reversed(hostname[2:].split(".")))))
    return tls_route_pb2.SniMatch(exact=hostname)


# -- one Service or EgressNetwork policy -------------------------------------------------------------------


class _Encoder:
    def __init__(self, state: OutboundState, config: PolicyConfig, original: tuple[str, int] | None) -> None:
        self.state = state
        self.config = config
        self.original = original
        self.parent = state.parent
        self.egress = state.parent.kind == "EgressNetwork"
        self.load = self._load()
        self.default_backend = self._default_backend()

    def _load(self, plain: bool = False) -> dict[str, object]:
        """The balancers' load estimator: peak EWMA, or with ``penalize-failures`` (not ``plain``) the penalty one."""
        biaser = self.state.settings.load_biaser
        if biaser is None or plain:
            return {"peak_ewma": pb.Backend.BalanceP2c.PeakEwma(default_rtt=_duration(EWMA_DEFAULT_RTT),
                                                                decay=_duration(EWMA_DECAY))}
        return {"penalty_peak_ewma": pb.Backend.BalanceP2c.PenaltyPeakEwma(
            default_rtt=_duration(EWMA_DEFAULT_RTT), decay=_duration(EWMA_DECAY),
            penalty=_duration(biaser.penalty), max_retry_after=_duration(biaser.max_retry_after),
            penalty_decay=_duration(PENALTY_DECAY))}

    def _balancer(self, meta: meta_pb2.Metadata, authority: str, load: dict[str, object]) -> pb.Backend:
        return pb.Backend(metadata=meta, queue=_queue(), balancer=pb.Backend.BalanceP2c(
            discovery=pb.Backend.EndpointDiscovery(dst=pb.Backend.EndpointDiscovery.DestinationGet(path=authority)),
            **load))  # type: ignore[arg-type]

    def _default_backend(self) -> pb.Backend:
        meta = _parent_meta(self.parent)
        if self.egress:
            assert self.original is not None, "EgressNetwork policies are served for address lookups only"
            return _forward(meta, *self.original)
        assert self.parent.authority is not None
        # The response-code penalty is for HTTP and gRPC: an opaque Service's own balancer keeps plain EWMA.
        protocol = self.state.app_protocol
        opaque = protocol is not None and (protocol == "opaque" or protocol.startswith("unknown:"))
        return self._balancer(meta, self.parent.authority, self._load(plain=opaque))

    def policy(self) -> pb.OutboundPolicy:
        return pb.OutboundPolicy(metadata=_parent_meta(self.parent), protocol=self._protocol())

    def _protocol(self) -> pb.ProxyProtocol:
        s = self.state
        accrual = _accrual(s.settings.accrual)
        protocol = s.app_protocol
        if protocol == "http1":
            return pb.ProxyProtocol(http1=pb.ProxyProtocol.Http1(routes=self._http_routes(), failure_accrual=accrual))
        if protocol == "http2":
            if s.grpc_routes:
                return pb.ProxyProtocol(grpc=pb.ProxyProtocol.Grpc(routes=self._grpc_routes(),
                                                                    failure_accrual=accrual))
            return pb.ProxyProtocol(http2=pb.ProxyProtocol.Http2(routes=self._http_routes(), failure_accrual=accrual))
        if protocol is not None:  # opaque, or an appProtocol Linkerd does not know
            if s.tcp_routes:
                return pb.ProxyProtocol(opaque=pb.ProxyProtocol.Opaque(routes=self._tcp_routes()))
            return pb.ProxyProtocol(opaque=pb.ProxyProtocol.Opaque(routes=[self._opaque_route()]))
        if s.grpc_routes:
            return pb.ProxyProtocol(grpc=pb.ProxyProtocol.Grpc(routes=self._grpc_routes(), failure_accrual=accrual))
        if not s.http_routes and s.tls_routes:
            return pb.ProxyProtocol(tls=pb.ProxyProtocol.Tls(routes=self._tls_routes()))
        if not s.http_routes and s.tcp_routes:
            return pb.ProxyProtocol(opaque=pb.ProxyProtocol.Opaque(routes=self._tcp_routes()))
        routes = self._http_routes()
        return pb.ProxyProtocol(detect=pb.ProxyProtocol.Detect(
            timeout=_duration(DETECT_TIMEOUT),
            opaque=pb.ProxyProtocol.Opaque(routes=[self._opaque_route()]),
            http1=pb.ProxyProtocol.Http1(routes=routes, failure_accrual=accrual),
            http2=pb.ProxyProtocol.Http2(routes=routes, failure_accrual=accrual),
        ))

    # -- opaque ---------------------------------------------------------------------------------------

    def _opaque_route(self) -> pb.OpaqueRoute:
        filters = []
        if self.egress:
            deny = self.parent.traffic_policy == "Deny"
            name = "tcp-egress-deny" if deny else "tcp-egress-allow"
            if deny:
                filters = [pb.OpaqueRoute.Filter(forbidden=opaque_route_pb2.Forbidden())]
        else:
            name = "opaq"
        return pb.OpaqueRoute(metadata=_default_meta(name), rules=[pb.OpaqueRoute.Rule(
            backends=pb.OpaqueRoute.Distribution(first_available=pb.OpaqueRoute.Distribution.FirstAvailable(
                backends=[pb.OpaqueRoute.RouteBackend(backend=self.default_backend)])),
            filters=filters,
        )])

    # -- TLS and TCP routes ---------------------------------------------------------------------------------

    def _tcp_routes(self) -> list[pb.OpaqueRoute]:
        # An EgressNetwork's default route would follow only an empty list, which cannot happen here (as Linkerd).
        return [self._stream_route(pb.OpaqueRoute, r) for r in self.state.tcp_routes[:MAXIMUM_ALLOWED_TCP_ROUTES]]

    def _tls_routes(self) -> list[pb.TlsRoute]:
        routes = [self._stream_route(pb.TlsRoute, r) for r in self.state.tls_routes]
        if self.egress:
            deny = self.parent.traffic_policy == "Deny"
            routes.append(pb.TlsRoute(
                metadata=_default_meta(f"tls-egress-{'deny' if deny else 'allow'}"),
                rules=[pb.TlsRoute.Rule(
                    backends=pb.TlsRoute.Distribution(first_available=pb.TlsRoute.Distribution.FirstAvailable(
                        backends=[pb.TlsRoute.RouteBackend(backend=self.default_backend)])),
                    filters=[pb.TlsRoute.Filter(forbidden=opaque_route_pb2.Forbidden())] if deny else [],
                )],
            ))
        return routes

    def _stream_route(self, kind: Any, route: ResolvedRoute) -> Any:
        """A TCPRoute as an ``OpaqueRoute`` or a TLSRoute as a ``TlsRoute`` (``kind``): its one rule's backends."""
        rules = []
        for rule in route.rules:
            out = kind.Rule()
            if rule.backends:
                out.backends.random_available.backends.extend(
                    self._stream_backend(kind, b) for b in rule.backends)
            else:
                out.backends.first_available.backends.append(kind.RouteBackend(backend=self.default_backend))
            rules.append(out)
        message = kind(metadata=_resource_meta(route.group, route.kind, route.namespace, route.name),
                             rules=rules)
        if kind is pb.TlsRoute:
            message.snis.extend(sni_match(h) for h in route.hostnames)
        return message

    def _stream_backend(self, kind: Any, b: ResolvedBackend) -> Any:
        # Connections are balanced on connect time: plain peak EWMA, never the response-code penalty.
        backend, message = self._backend(b, self._load(plain=True))
        filters = [] if message is None else [kind.Filter(invalid=opaque_route_pb2.Invalid(message=message))]
        return kind.WeightedRouteBackend(weight=b.weight, backend=kind.RouteBackend(backend=backend, filters=filters))

    # -- HTTP and gRPC --------------------------------------------------------------------------------------

    def _http_routes(self) -> list[pb.HttpRoute]:
        routes = [self._route(_HTTP, r) for r in self.state.http_routes]
        if self.egress:
            routes.append(self._default_route(_HTTP, self.parent.traffic_policy == "Deny"))
        elif not routes:
            routes.append(self._default_route(_HTTP, False))
        return routes

    def _grpc_routes(self) -> list[pb.GrpcRoute]:
        routes = [self._route(_GRPC, r) for r in self.state.grpc_routes]
        if self.egress:
            routes.append(self._default_route(_GRPC, self.parent.traffic_policy == "Deny"))
        return routes

    def _default_route(self, kind: _RouteKind, deny: bool) -> Any:
        """The parent's own route: Service ``http``, or an EgressNetwork's allow/deny route."""
        s = self.state.settings
        if self.egress:
            name = f"{kind.name}-egress-{'deny' if deny else 'allow'}"
        else:
            name = kind.name
        rule = kind.route.Rule(
            matches=kind.default_matches,
            filters=[kind.deny] if deny else [],
            timeouts=_timeouts(s.timeouts),
        )
        rule.backends.first_available.backends.append(kind.route.RouteBackend(backend=self.default_backend))
        retry = s.grpc_retry if kind is _GRPC else s.http_retry
        self._rule_limits(kind, rule, s.timeouts, retry)
        return kind.route(metadata=_default_meta(name), rules=[rule])

    def _route(self, kind: _RouteKind, route: ResolvedRoute) -> Any:
        return kind.route(
            metadata=_resource_meta(route.group, route.kind, route.namespace, route.name),
            hosts=[rt.host_match(h) for h in route.hostnames],
            rules=[self._rule(kind, rule) for rule in route.rules],
        )

    def _rule(self, kind: _RouteKind, rule: ResolvedRule) -> Any:
        out = kind.route.Rule(
            matches=[kind.match(m) for m in rule.matches],
            filters=[kind.filter(f) for f in rule.filters],
            timeouts=_timeouts(rule.timeouts),
            allow_l5d_request_headers=self.config.allow_l5d_request_headers,
        )
        if rule.backends:
            out.backends.random_available.backends.extend(self._weighted(kind, b) for b in rule.backends)
        else:
            out.backends.first_available.backends.append(kind.route.RouteBackend(backend=self.default_backend))
        self._rule_limits(kind, out, rule.timeouts, rule.retry)
        return out

    @staticmethod
    def _rule_limits(kind: _RouteKind, rule: Any, timeouts: ann.Timeouts, retry: ann.Retry | None) -> None:
        if timeouts.request is not None:  # the deprecated field, still read by older proxies
            rule.requestTimeout.CopyFrom(_duration(timeouts.request))
        if retry is not None:
            rule.retry.CopyFrom(kind.retry(retry))

    def _weighted(self, kind: _RouteKind, b: ResolvedBackend) -> Any:
        backend, message = self._backend(b)
        if message is None:
            filters = [kind.filter(f) for f in b.filters]
        else:
            filters = [kind.invalid(message)]
        return kind.route.WeightedRouteBackend(
            weight=b.weight, backend=kind.route.RouteBackend(backend=backend, filters=filters))

    # -- backends -----------------------------------------------------------------------------------------

    def _backend(self, b: ResolvedBackend, load: dict[str, object] | None = None) -> tuple[pb.Backend, str | None]:
        """The backend message (balanced by ``load``, else the parent's), and why it is invalid (None: usable)."""
        if b.kind == "Service":
            meta = _resource_meta("core", "Service", b.namespace, b.name, b.port or 0)
            if b.message is None and b.authority is not None:
                return self._balancer(meta, b.authority, self.load if load is None else load), None
            return pb.Backend(metadata=meta, queue=_queue()), b.message
        if b.kind == "EgressNetwork":
            port = b.port or (self.original[1] if self.original else 0)
            meta = _resource_meta("policy.linkerd.io", "EgressNetwork", b.namespace, b.name, port)
            message = b.message
            if message is None:
                if not self.egress:
                    message = "EgressNetwork backends attach to EgressNetwork parents only"
                elif (b.namespace, b.name) != (self.parent.namespace, self.parent.name):
                    message = "Route with EgressNetwork backend needs to have the same EgressNetwork as a parent"
            if message is None and self.original is not None:
                return _forward(meta, *self.original, weight=b.weight), None
            return pb.Backend(metadata=meta, queue=_queue()), message
        return pb.Backend(metadata=_default_meta("invalid"), queue=_queue()), b.message
