"""The policy controller's ``io.linkerd.proxy.outbound.OutboundPolicy`` to a ``ClientPolicy`` (proxy-api.md §3.4).

``translate`` raises ``InvalidPolicy`` (naming the field) for a message the
proxy cannot use -- no protocol, no metadata, a route without rules, a filter
or backend of no known kind, a bad regex, a header modifier naming an
``l5d-*`` header; the caller then uses ``invalid_policy`` (proxy.md §7.1:
every request 500, every opaque connection refused), as linkerd2-proxy does.

A balanced backend (``BalanceP2c`` over ``DestinationGet{path}``) gets its
balancer from ``balancer_for(path)`` (the caller's ``Destination.Get`` watch,
leased for as long as the policy names it); a ``forward`` backend is one
endpoint (egress, fallback).

Route matches are translated by ``core.policy_translation``'s functions, the
ones the inbound side uses. Callers: ``io.discovery``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from google.protobuf.duration_pb2 import Duration

from tether.api import http_route_pb2, meta_pb2
from tether.api import outbound_pb2 as pb
from tether.api.addresses import InvalidAddress
from tether.proxy.core.client_policy import (
    ClientPolicy,
    Accrual,
    Distribution,
    OpaqueRoute,
    OutboundRoute,
    OutboundRule,
    PolicyRef,
    Retry,
    RouteBackend,
    Timeouts,
)
from tether.proxy.core import route_filters
from tether.proxy.core.endpoint import Endpoint
from tether.proxy.core.route_filters import HeaderModifier, Invalid, RequestFilter
from tether.proxy.core.policy_translation import InvalidPolicy, grpc_match, host_matches, http_match
from tether.proxy.core.server_policy import HostMatch, Protocol, Rule

BalancerFor = Callable[[str], object]

_GRPC_CODES = {"cancelled": 1, "deadine_exceeded": 4, "resource_exhausted": 8, "internal": 13, "unavailable": 14}


def translate(message: pb.OutboundPolicy, balancer_for: BalancerFor) -> ClientPolicy:
    t = _Translator(balancer_for)
    policy = _policy(message, t)
    return replace(policy, unapplied=tuple(t.unapplied)) if t.unapplied else policy


def _policy(message: pb.OutboundPolicy, t: _Translator) -> ClientPolicy:
    if not message.HasField("metadata"):
        raise InvalidPolicy("metadata: not set")
    parent = _ref(message.metadata, "metadata")
    protocol = message.protocol
    kind = protocol.WhichOneof("kind")
    if kind is None:
        raise InvalidPolicy("protocol: not set")
    if kind == "detect":
        d = protocol.detect
        return ClientPolicy(parent, Protocol.DETECT,
                            http1=t.http_routes(d.http1.routes, "protocol.detect.http1.routes"),
                            http2=t.http_routes(d.http2.routes, "protocol.detect.http2.routes"),
                            opaque=t.opaque_routes(d.opaque.routes, "protocol.detect.opaque.routes"),
                            detect_timeout=_seconds(d.timeout) if d.HasField("timeout") else None,
                            accrual=_accrual(d.http1.failure_accrual)
                            if d.http1.HasField("failure_accrual") else None)
    if kind in ("http1", "http2"):
        block = getattr(protocol, kind)
        routes = t.http_routes(block.routes, f"protocol.{kind}.routes")
        accrual = _accrual(block.failure_accrual) if block.HasField("failure_accrual") else None
        return ClientPolicy(parent, Protocol(kind), http1=routes, http2=routes, accrual=accrual)
    if kind == "grpc":
        block = protocol.grpc
        routes = t.grpc_routes(block.routes, "protocol.grpc.routes")
        accrual = _accrual(block.failure_accrual) if block.HasField("failure_accrual") else None
        return ClientPolicy(parent, Protocol.GRPC, http1=routes, http2=routes, accrual=accrual)
    if kind == "opaque":
        return ClientPolicy(parent, Protocol.OPAQUE, opaque=t.opaque_routes(protocol.opaque.routes,
                                                                           "protocol.opaque.routes"))
    if kind == "tls":
        return ClientPolicy(parent, Protocol.TLS, tls=t.opaque_routes(protocol.tls.routes, "protocol.tls.routes"))
    raise InvalidPolicy(f"protocol.{kind}: not supported by this proxy")


def invalid_policy(parent: PolicyRef = PolicyRef.default("invalid")) -> ClientPolicy:
    """Linkerd's built-in invalid policy: every request fails with 500, every opaque connection is refused."""
    meta = PolicyRef.default("invalid")
    rule = OutboundRule(Rule(()), filters=(Invalid("invalid client policy"),))
    route = OutboundRoute(meta, (), (rule,))
    return ClientPolicy(parent, Protocol.DETECT, http1=(route,), http2=(route,),
                        opaque=(OpaqueRoute(meta, forbidden=True),))


class _Translator:
    def __init__(self, balancer_for: BalancerFor) -> None:
        self.balancer_for = balancer_for
        self.unapplied: list[str] = []  # fields this proxy does not apply, by where they are

    def note(self, where: str, what: str) -> None:
        self.unapplied.append(f"{where} ({what})")

    def http_routes(self, routes: Iterable[Any], where: str) -> tuple[OutboundRoute, ...]:
        return tuple(self._route(r, f"{where}[{i}]", grpc=False) for i, r in enumerate(routes))

    def grpc_routes(self, routes: Iterable[Any], where: str) -> tuple[OutboundRoute, ...]:
        return tuple(self._route(r, f"{where}[{i}]", grpc=True) for i, r in enumerate(routes))

    def _route(self, message: pb.HttpRoute | pb.GrpcRoute, where: str, grpc: bool) -> OutboundRoute:
        if not message.HasField("metadata"):
            raise InvalidPolicy(f"{where}.metadata: not set")
        if not message.rules:
            raise InvalidPolicy(f"{where}.rules: empty")
        rules = []
        for i, rule in enumerate(message.rules):
            here = f"{where}.rules[{i}]"
            if grpc:
                matches = tuple(grpc_match(m, f"{here}.matches[{j}]") for j, m in enumerate(rule.matches))
            else:
                matches = tuple(http_match(m, f"{here}.matches[{j}]") for j, m in enumerate(rule.matches))
            filters: list[RequestFilter] = []
            responses: list[HeaderModifier] = []
            for j, f in enumerate(rule.filters):
                translated = _filter(f, f"{here}.filters[{j}]")
                if isinstance(translated, tuple):
                    responses.append(translated[0])
                else:
                    filters.append(translated)
            distribution, backends = self._distribution(rule.backends, f"{here}.backends", grpc)
            rules.append(OutboundRule(Rule(matches), tuple(filters), tuple(responses), distribution, backends,
                                      _timeouts(rule), _retry(rule, f"{here}.retry", grpc),
                                      rule.allow_l5d_request_headers))
        return OutboundRoute(_ref(message.metadata, f"{where}.metadata"), host_matches(message.hosts), tuple(rules),
                             grpc)

    def _distribution(self, message: Any, where: str, grpc: bool,
                      opaque: bool = False) -> tuple[Distribution, tuple[RouteBackend, ...]]:
        kind = message.WhichOneof("kind")
        if kind is None:
            raise InvalidPolicy(f"{where}: not set")
        if kind == "empty":
            return Distribution.EMPTY, ()
        if kind == "first_available":
            backends = message.first_available.backends
            return Distribution.FIRST_AVAILABLE, tuple(
                self._backend(b, 1, f"{where}.first_available.backends[{i}]", grpc, opaque)
                for i, b in enumerate(backends))
        weighted = message.random_available.backends
        return Distribution.RANDOM_AVAILABLE, tuple(
            self._backend(w.backend, w.weight, f"{where}.random_available.backends[{i}]", grpc, opaque)
            for i, w in enumerate(weighted))

    def _backend(self, message: Any, weight: int, where: str, grpc: bool, opaque: bool = False) -> RouteBackend:
        backend = message.backend
        filters: tuple[RequestFilter, ...] = ()
        timeout = None
        if opaque:  # Forbidden/Invalid: the connection is refused
            if any(f.WhichOneof("kind") in ("forbidden", "invalid") for f in message.filters):
                filters = (Invalid("forbidden"),)
        else:
            filters = tuple(_request_only(_filter(f, f"{where}.filters[{i}]"), f"{where}.filters[{i}]")
                            for i, f in enumerate(message.filters))
            timeout = _seconds(message.requestTimeout) if message.HasField("requestTimeout") else None
            if timeout is not None:
                self.note(f"{where}.requestTimeout", "backend request timeout")
        meta = _ref(backend.metadata, f"{where}.backend.metadata") if backend.HasField("metadata") \
            else PolicyRef.default("backend")
        kind = backend.WhichOneof("kind")
        if kind == "balancer":
            discovery = backend.balancer.discovery
            if discovery.WhichOneof("kind") != "dst" or not discovery.dst.path:
                raise InvalidPolicy(f"{where}.backend.balancer.discovery: no Destination path")
            path = discovery.dst.path
            return RouteBackend(meta, weight, path, self.balancer_for(path), None, filters, timeout)
        if kind == "forward":
            try:
                endpoint = Endpoint.from_proto(backend.forward)
            except (InvalidAddress, ValueError) as exc:
                raise InvalidPolicy(f"{where}.backend.forward: {exc}") from None
            return RouteBackend(meta, weight, "", None, endpoint, filters, timeout)  # no service: no authority
        return RouteBackend(meta, weight, filters=filters, request_timeout=timeout)  # no dispatcher: 502

    def opaque_routes(self, routes: Iterable[Any], where: str) -> tuple[OpaqueRoute, ...]:
        """Opaque routes, or TLS routes (which add their SNI matches): one rule each, as Linkerd sends them."""
        out = []
        for i, route in enumerate(routes):
            here = f"{where}[{i}]"
            meta = _ref(route.metadata, f"{here}.metadata") if route.HasField("metadata") \
                else PolicyRef.default("opaq")
            if not route.rules:
                raise InvalidPolicy(f"{here}.rules: empty")
            rule = route.rules[0]
            forbidden = any(f.WhichOneof("kind") in ("forbidden", "invalid") for f in rule.filters)
            distribution, backends = self._distribution(rule.backends, f"{here}.rules[0].backends", False, True) \
                if rule.HasField("backends") else (Distribution.EMPTY, ())
            if len(route.rules) > 1:
                self.note(f"{here}.rules[1:]", "rules after the first of a connection route")
            snis: tuple[HostMatch, ...] = ()
            if isinstance(route, pb.TlsRoute):
                for j, sni in enumerate(route.snis):
                    if sni.WhichOneof("match") is None:
                        raise InvalidPolicy(f"{here}.snis[{j}]: not set")
                snis = host_matches(route.snis)
            out.append(OpaqueRoute(meta, forbidden, backends, distribution, snis))
        return tuple(out)


def _ref(message: meta_pb2.Metadata, where: str) -> PolicyRef:
    which = message.WhichOneof("kind")
    if which == "default":
        return PolicyRef.default(message.default)
    if which == "resource":
        r = message.resource
        return PolicyRef(r.group, r.kind, r.namespace, r.name, r.port, r.section)
    raise InvalidPolicy(f"{where}: not set")


def _seconds(d: Duration) -> float:
    return float(d.ToNanoseconds()) / 1e9


def _filter(message: Any, where: str) -> RequestFilter | tuple[HeaderModifier]:
    """A request filter, or a response header modifier (as a 1-tuple)."""
    kind = message.WhichOneof("kind")
    if kind == "request_header_modifier":
        return route_filters.header_modifier_from_proto(message.request_header_modifier,
                                                        f"{where}.request_header_modifier")
    if kind == "response_header_modifier":
        return (route_filters.header_modifier_from_proto(message.response_header_modifier,
                                                         f"{where}.response_header_modifier"),)
    if kind == "redirect":
        return route_filters.redirect_from_proto(message.redirect, f"{where}.redirect")
    if kind == "failure_injector":
        return route_filters.failure_from_proto(message.failure_injector, f"{where}.failure_injector")
    raise InvalidPolicy(f"{where}: unknown filter")


def _request_only(f: RequestFilter | tuple[HeaderModifier], where: str) -> RequestFilter:
    if isinstance(f, tuple):
        raise InvalidPolicy(f"{where}: a response filter on a backend")
    return f


def _timeouts(rule: pb.HttpRoute.Rule | pb.GrpcRoute.Rule) -> Timeouts:
    t = rule.timeouts
    request = _seconds(t.request) if t.HasField("request") else None
    if request is None and rule.HasField("requestTimeout"):  # deprecated field
        request = _seconds(rule.requestTimeout)
    return Timeouts(request or None, _seconds(t.response) if t.HasField("response") else None,
                    _seconds(t.idle) if t.HasField("idle") else None)


def _retry(rule: pb.HttpRoute.Rule | pb.GrpcRoute.Rule, where: str, grpc: bool) -> Retry | None:
    if not rule.HasField("retry"):
        return None
    r = rule.retry
    timeout = _seconds(r.timeout) if r.HasField("timeout") else None
    backoff = (_seconds(r.backoff.min_backoff), _seconds(r.backoff.max_backoff)) if r.HasField("backoff") else None
    if grpc:
        c = r.conditions
        codes = frozenset(code for name, code in _GRPC_CODES.items() if getattr(c, name))
        return Retry(r.max_retries, r.max_request_bytes, (), codes, timeout, backoff)
    ranges = []
    for i, s in enumerate(r.conditions.status_ranges):
        lo, hi = s.start or 100, s.end or 599
        if lo > hi or not 100 <= lo <= 599 or not 100 <= hi <= 599:
            raise InvalidPolicy(f"{where}.conditions.status_ranges[{i}]: {s.start}-{s.end}")
        ranges.append((lo, hi))
    return Retry(r.max_retries, r.max_request_bytes, tuple(ranges), frozenset(), timeout, backoff)


def _accrual(message: pb.FailureAccrual) -> Accrual | None:
    min_ready = message.ejection.min_ready_endpoints if message.HasField("ejection") else 0
    kind = message.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "consecutive_failures":
        c = message.consecutive_failures
        b = c.backoff
        return Accrual(max(c.max_failures, 1), _seconds(b.min_backoff), _seconds(b.max_backoff), b.jitter_ratio,
                       min_ready=min_ready)
    u = message.unified
    rate = u.success_rate_threshold if 0.0 < u.success_rate_threshold <= 1.0 else None
    if u.max_consecutive_failures == 0 and rate is None:
        return None
    b = u.backoff
    window = max(_seconds(u.decay), 0.01) if u.HasField("decay") else 10.0  # Linkerd: default 10 s, at least 10 ms
    return Accrual(u.max_consecutive_failures, _seconds(b.min_backoff), _seconds(b.max_backoff), b.jitter_ratio,
                   rate, window, max(u.min_requests, 1), min_ready)
