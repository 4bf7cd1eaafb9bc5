"""The policy controller's ``io.linkerd.proxy.inbound.Server`` message to a ``ServerPolicy`` (proxy-api.md §3.3).

``translate`` raises ``InvalidPolicy`` (naming the field) for a message the
proxy cannot use -- no protocol, an authorization without authentication, a
route without rules, a bad network or regex, a filter ``core.route_filters``
refuses; the caller then uses Linkerd's
built-in invalid policy (proxy.md §8.1). Every discovered policy gets the
implicit ``default:localhost`` authorization; a request on a route is
authorized by the server's authorizations and the route's own (linkerd2-proxy
adds the server's to every route); an HTTP protocol without routes gets one
catch-all route. A gRPC route's
``service``/``method`` match becomes a path match on ``/service/method``.

Callers: ``io.policy_client``.
"""

from __future__ import annotations

import ipaddress
import re

from tether.api import inbound_pb2 as pb
from tether.api import grpc_route_pb2, http_route_pb2, meta_pb2, net_pb2
from tether.api.addresses import InvalidAddress, from_ip_address
from tether.proxy.core.authz import Authn, Authorization, Meta, Network
from tether.proxy.core.ratelimit import RateLimit
from tether.proxy.core import route_filters
from tether.proxy.core.route_filters import InvalidPolicy as InvalidPolicy  # where the translators raise it
from tether.proxy.core.route_filters import RequestFilter
from tether.proxy.core.server_policy import (
    HostMatch,
    HttpRoute,
    PathKind,
    PathMatch,
    Protocol,
    RouteMatch,
    Rule,
    ServerPolicy,
    ValueMatch,
    with_localhost,
)

_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "HEAD", "TRACE")
_DEFAULT_ROUTE = Meta.default("default")


def translate(message: pb.Server) -> ServerPolicy:
    labels = dict(message.labels)
    meta = Meta(labels.get("group", "policy.linkerd.io"), labels.get("kind", "server"), labels.get("name", ""))
    authorizations = with_localhost([_authz(a, f"authorizations[{i}]") for i, a in enumerate(message.authorizations)])
    kind = message.protocol.WhichOneof("kind")
    if kind is None:
        raise InvalidPolicy("protocol: not set")
    protocol = Protocol(kind)
    detect_timeout = None
    routes: list[HttpRoute] = []
    ratelimit = None
    if kind == "detect":
        detect = message.protocol.detect
        detect_timeout = detect.timeout.ToTimedelta().total_seconds() if detect.HasField("timeout") else None
        routes = [_http_route(r, f"protocol.detect.http_routes[{i}]", authorizations)
                  for i, r in enumerate(detect.http_routes)]
        if detect.HasField("http_local_rate_limit"):
            ratelimit = _ratelimit(detect.http_local_rate_limit, "protocol.detect.http_local_rate_limit")
    elif kind in ("http1", "http2"):
        block = getattr(message.protocol, kind)
        routes = [_http_route(r, f"protocol.{kind}.routes[{i}]", authorizations) for i, r in enumerate(block.routes)]
        if block.HasField("local_rate_limit"):
            ratelimit = _ratelimit(block.local_rate_limit, f"protocol.{kind}.local_rate_limit")
    elif kind == "grpc":
        routes = [_grpc_route(r, f"protocol.grpc.routes[{i}]", authorizations)
                  for i, r in enumerate(message.protocol.grpc.routes)]
    if kind not in ("opaque", "tls") and not routes:
        routes = [HttpRoute(_DEFAULT_ROUTE, (), (Rule(()),), authorizations)]
    return ServerPolicy(meta, protocol, authorizations, tuple(routes), detect_timeout, ratelimit)


def _ratelimit(message: pb.HttpLocalRateLimit, where: str) -> RateLimit:
    meta = _meta(message.metadata, where) if message.HasField("metadata") else Meta.default("ratelimit")
    overrides = {}
    for i, override in enumerate(message.overrides):
        if not override.HasField("limit"):
            raise InvalidPolicy(f"{where}.overrides[{i}].limit: not set")
        for identity in override.clients.identities:
            overrides[identity.name] = override.limit.requestsPerSecond
    return RateLimit(meta, message.total.requestsPerSecond if message.HasField("total") else None,
                     message.identity.requestsPerSecond if message.HasField("identity") else None, overrides)


def _meta(message: meta_pb2.Metadata, where: str) -> Meta:
    which = message.WhichOneof("kind")
    if which == "default":
        return Meta.default(message.default)
    if which == "resource":
        return Meta(message.resource.group, message.resource.kind, message.resource.name)
    raise InvalidPolicy(f"{where}.metadata: not set")


def _authz(message: pb.Authz, where: str) -> Authorization:
    if message.HasField("metadata"):
        meta = _meta(message.metadata, where)
    else:  # older controllers: labels only
        labels = dict(message.labels)
        meta = Meta(labels.get("group", "policy.linkerd.io"), labels.get("kind", "serverauthorization"),
                    labels.get("name", ""))
    networks = tuple(Network(_network(n.net, f"{where}.networks[{i}].net"),
                             tuple(_network(e, f"{where}.networks[{i}].except") for e in getattr(n, "except")))
                     for i, n in enumerate(message.networks))
    authn = message.authentication
    permit = authn.WhichOneof("permit")
    if permit == "unauthenticated":
        return Authorization(meta, networks, Authn.UNAUTHENTICATED)
    if permit != "meshTLS":
        raise InvalidPolicy(f"{where}.authentication: not set")
    clients = authn.meshTLS.WhichOneof("clients")
    if clients == "unauthenticated":
        return Authorization(meta, networks, Authn.MESH_TLS)
    if clients != "identities":
        raise InvalidPolicy(f"{where}.authentication.meshTLS: no clients")
    ids = authn.meshTLS.identities
    return Authorization(meta, networks, Authn.IDENTITIES, frozenset(i.name for i in ids.identities),
                         tuple(tuple(s.parts) for s in ids.suffixes))


def _network(message: net_pb2.IPNetwork, where: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(f"{from_ip_address(message.ip)}/{message.prefix_len}", strict=False)
    except (InvalidAddress, ValueError) as exc:
        raise InvalidPolicy(f"{where}: {exc}") from None


def _http_route(message: pb.HttpRoute, where: str, server: tuple[Authorization, ...]) -> HttpRoute:
    if not message.rules:
        raise InvalidPolicy(f"{where}.rules: empty")
    rules = []
    for i, rule in enumerate(message.rules):
        matches = tuple(http_match(m, f"{where}.rules[{i}].matches[{j}]") for j, m in enumerate(rule.matches))
        filters = tuple(_filter(f, f"{where}.rules[{i}].filters[{j}]") for j, f in enumerate(rule.filters))
        rules.append(Rule(matches, filters))
    return HttpRoute(_meta(message.metadata, where), host_matches(message.hosts), tuple(rules),
                     (*server, *(_authz(a, f"{where}.authorizations[{i}]") for i, a in enumerate(message.authorizations))))


def _grpc_route(message: pb.GrpcRoute, where: str, server: tuple[Authorization, ...]) -> HttpRoute:
    if not message.rules:
        raise InvalidPolicy(f"{where}.rules: empty")
    rules = []
    for i, rule in enumerate(message.rules):
        matches = [grpc_match(m, f"{where}.rules[{i}].matches") for m in rule.matches]
        filters = tuple(_filter(f, f"{where}.rules[{i}].filters[{j}]") for j, f in enumerate(rule.filters))
        rules.append(Rule(tuple(matches), filters))
    return HttpRoute(_meta(message.metadata, where), host_matches(message.hosts), tuple(rules),
                     (*server, *(_authz(a, f"{where}.authorizations[{i}]") for i, a in enumerate(message.authorizations))))


def grpc_match(match: grpc_route_pb2.GrpcRouteMatch, where: str) -> RouteMatch:
    """A gRPC service/method match as a path match on ``/service/method``, method POST."""
    service, method = match.rpc.service, match.rpc.method
    if service and method:
        path = PathMatch(PathKind.EXACT, f"/{service}/{method}")
    elif service:
        path = PathMatch(PathKind.PREFIX, f"/{service}")
    elif method:
        path = PathMatch(PathKind.REGEX, f"/[^/]+/{method}", re.compile(rf"/[^/]+/{re.escape(method)}"))
    else:
        path = PathMatch(PathKind.PREFIX, "/")
    headers = tuple(_header(h, f"{where}.headers") for h in match.headers)
    return RouteMatch(path, headers, (), "POST")


def host_matches(hosts: object) -> tuple[HostMatch, ...]:
    out = []
    for host in hosts:  # type: ignore[attr-defined]  # a repeated HostMatch
        if host.WhichOneof("match") == "exact":
            out.append(HostMatch(exact=host.exact.rstrip(".").lower()))
        else:
            out.append(HostMatch(suffix=tuple(label.lower() for label in reversed(host.suffix.reverse_labels))))
    return tuple(out)


def http_match(message: http_route_pb2.HttpRouteMatch, where: str) -> RouteMatch:
    path = None
    if message.HasField("path"):
        kind = message.path.WhichOneof("kind")
        value = getattr(message.path, kind) if kind else ""
        if kind == "exact":
            path = PathMatch(PathKind.EXACT, value)
        elif kind == "prefix":
            path = PathMatch(PathKind.PREFIX, value)
        elif kind == "regex":
            path = PathMatch(PathKind.REGEX, value, _regex(value, f"{where}.path.regex"))
    headers = tuple(_header(h, f"{where}.headers") for h in message.headers)
    query = []
    for q in message.query_params:
        if q.WhichOneof("value") == "regex":
            query.append(ValueMatch(q.name, pattern=_regex(q.regex, f"{where}.query_params")))
        else:
            query.append(ValueMatch(q.name, exact=q.exact))
    method = None
    if message.HasField("method"):
        which = message.method.WhichOneof("type")
        method = _METHODS[message.method.registered] if which == "registered" else message.method.unregistered
    return RouteMatch(path, headers, tuple(query), method)


def _header(message: http_route_pb2.HeaderMatch, where: str) -> ValueMatch:
    name = message.name.lower()
    if message.WhichOneof("value") == "regex":
        return ValueMatch(name, pattern=_regex(message.regex, where))
    return ValueMatch(name, exact=message.exact.decode("latin-1"))


def _regex(text: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise InvalidPolicy(f"{where}: {exc}") from None


def _filter(message: pb.HttpRoute.Filter | pb.GrpcRoute.Filter, where: str) -> RequestFilter:
    """An inbound HTTP or gRPC route's filter (a gRPC route has no redirect)."""
    kind = message.WhichOneof("kind")
    if kind == "failure_injector":
        return route_filters.failure_from_proto(message.failure_injector, f"{where}.failure_injector")
    if kind == "request_header_modifier":
        return route_filters.header_modifier_from_proto(message.request_header_modifier,
                                                        f"{where}.request_header_modifier")
    if kind == "redirect" and isinstance(message, pb.HttpRoute.Filter):
        return route_filters.redirect_from_proto(message.redirect, f"{where}.redirect")
    raise InvalidPolicy(f"{where}: unknown filter")
