"""One inbound port's policy as the proxy holds it (proxy.md §8.1–8.3), and its HTTP routes' matching (§7.2).

A ``ServerPolicy`` is what the policy controller's ``Server`` message says
(``core.policy_translation`` builds it), or a built-in one:

- ``default_policy``: what ``LINKERD2_PROXY_INBOUND_DEFAULT_POLICY`` allows
  until the controller answers -- protocol detection (opaque on the ports
  without detection), one catch-all HTTP route, TCP authorizations equal to
  the route's (§8.2);
- ``INVALID``: what replaces a message the proxy cannot use -- no TCP
  authorization, one catch-all HTTP route without authorizations (every
  request 403).

``ServerPolicy.route(request)`` picks a request's route the Gateway API way:
a route's hosts (exact beats suffix beats none), then its rules' best match
scored by (path kind and length, header count, query count, method); ties go
to the first listed. None: no route (404).

Callers: ``core.inbound_authz``, ``core.policy_translation``, ``io.policy_client``.
"""

from __future__ import annotations

import enum
import functools
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from tether.proxy.codec.addrs import IpNetwork
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.authz import ALL_NETWORKS, LOCALHOST, Authn, Authorization, Meta, Network
from tether.proxy.core.config import DefaultPolicy
from tether.proxy.core.ratelimit import RateLimit
from tether.proxy.core.route_filters import Invalid, RequestFilter


class Protocol(enum.Enum):
    DETECT = "detect"
    OPAQUE = "opaque"
    TLS = "tls"
    HTTP1 = "http1"
    HTTP2 = "http2"
    GRPC = "grpc"


class PathKind(enum.IntEnum):
    """Ordered as they rank: an exact path beats a prefix, which beats a regex."""

    REGEX = 1
    PREFIX = 2
    EXACT = 3


@dataclass(frozen=True, slots=True)
class PathMatch:
    kind: PathKind
    value: str
    pattern: re.Pattern[str] | None = None  # REGEX

    def matches(self, path: str) -> bool:
        if self.kind is PathKind.EXACT:
            return path == self.value
        if self.kind is PathKind.PREFIX:
            # Gateway API prefixes match whole path segments: /foo matches /foo and /foo/bar, not /foobar.
            prefix = self.value.rstrip("/")
            return path == prefix or path.startswith(prefix + "/") or not prefix
        assert self.pattern is not None
        return self.pattern.fullmatch(path) is not None


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A header (bytes) or query parameter (str) criterion: ``exact`` or a ``pattern`` over the whole value."""

    name: str  # lower-case for headers
    exact: str | None = None
    pattern: re.Pattern[str] | None = None

    def matches(self, value: str) -> bool:
        if self.pattern is not None:
            return self.pattern.fullmatch(value) is not None
        return value == self.exact


@dataclass(frozen=True, slots=True)
class RouteMatch:
    path: PathMatch | None = None
    headers: tuple[ValueMatch, ...] = ()
    query: tuple[ValueMatch, ...] = ()
    method: str | None = None

    def score(self, request: _Request) -> tuple[int, int, int, int, int] | None:
        """How well it matches ``request`` (higher is better), or None when it does not."""
        if self.method is not None and request.method != self.method:
            return None
        if self.path is not None and not self.path.matches(request.path):
            return None
        for header in self.headers:
            if not any(header.matches(v) for v in request.header(header.name)):
                return None
        for param in self.query:
            if not any(param.matches(v) for v in request.query(param.name)):
                return None
        path_rank, path_len = (int(self.path.kind), len(self.path.value)) if self.path is not None else (0, 0)
        return (path_rank, path_len, len(self.headers), len(self.query), int(self.method is not None))


CATCH_ALL = RouteMatch(PathMatch(PathKind.PREFIX, "/"))


@dataclass(frozen=True, slots=True)
class HostMatch:
    exact: str | None = None
    suffix: tuple[str, ...] = ()  # labels in normal order: *.example.com -> ("example", "com")

    def score(self, host: str) -> tuple[int, int] | None:
        if self.exact is not None:
            return (2, len(self.exact)) if host == self.exact else None
        tail = ".".join(self.suffix)
        return (1, len(self.suffix)) if host.endswith("." + tail) else None


@dataclass(frozen=True, slots=True)
class Rule:
    matches: tuple[RouteMatch, ...]  # empty: everything, as a "/" prefix
    filters: tuple[RequestFilter, ...] = ()  # inbound: applied in order once the request is authorized

    def score(self, request: _Request) -> tuple[int, int, int, int, int] | None:
        if not self.matches:
            return CATCH_ALL.score(request)
        scores = [s for s in (m.score(request) for m in self.matches) if s is not None]
        return max(scores) if scores else None

    def matched_prefix(self, request: RequestHead) -> str | None:
        """The path prefix of the match that selected ``request`` (a redirect's prefix replacement needs it);
        None when the winning match was not a path prefix."""
        req = _Request(request)
        found = [(s, m) for m in self.matches or (CATCH_ALL,) if (s := m.score(req)) is not None]
        if not found:
            return None
        path = max(found, key=lambda pair: pair[0])[1].path
        return path.value if path is not None and path.kind is PathKind.PREFIX else None


@dataclass(frozen=True, slots=True)
class HttpRoute:
    meta: Meta
    hosts: tuple[HostMatch, ...]
    rules: tuple[Rule, ...]
    authorizations: tuple[Authorization, ...]


@dataclass(frozen=True, slots=True)
class ServerPolicy:
    meta: Meta
    protocol: Protocol
    authorizations: tuple[Authorization, ...]  # for TCP (opaque) connections
    http_routes: tuple[HttpRoute, ...] = ()
    detect_timeout: float | None = None
    ratelimit: RateLimit | None = field(default=None, compare=False)  # HTTP; its buckets are shared state
    # The route and rule every request takes, when that does not depend on the request: a single route for
    # any host whose one rule matches everything (the default policies' route). Spares matching per request.
    every: tuple[HttpRoute, Rule] | None = field(init=False, default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        routes = self.http_routes
        if len(routes) == 1 and not routes[0].hosts and len(routes[0].rules) == 1 \
                and _matches_all(routes[0].rules[0]):
            object.__setattr__(self, "every", (routes[0], routes[0].rules[0]))

    @property
    def opaque(self) -> bool:
        return self.protocol in (Protocol.OPAQUE, Protocol.TLS)

    def route(self, request: RequestHead) -> HttpRoute | None:
        """The request's best route, or None (no route: 404)."""
        chosen = self.select(request)
        return chosen[0] if chosen is not None else None

    def select(self, request: RequestHead) -> tuple[HttpRoute, Rule] | None:
        """The request's best route and rule (``select_route``), or None."""
        if self.every is not None:
            return self.every
        return select_route(self.http_routes, request)


class Scored(typing.Protocol):
    def score(self, request: _Request) -> tuple[int, int, int, int, int] | None: ...


class Routed(typing.Protocol):
    @property
    def hosts(self) -> tuple[HostMatch, ...]: ...

    @property
    def rules(self) -> Sequence[Scored]: ...


R = typing.TypeVar("R", bound=Routed)


def select_route(routes: Sequence[R], request: RequestHead) -> tuple[R, Any] | None:
    """The best (route, rule) for ``request`` -- inbound and outbound alike: the route's hosts (exact beats
    suffix beats none), then its rules' best match; ties go to the first listed. None: no route."""
    req = _Request(request)
    best: tuple[tuple[int, int], tuple[int, int, int, int, int]] | None = None
    chosen: tuple[R, Any] | None = None
    for route in routes:
        if route.hosts:
            host_scores = [s for s in (h.score(req.host) for h in route.hosts) if s is not None]
            if not host_scores:
                continue
            host_score = max(host_scores)
        else:
            host_score = (0, 0)
        rule_best: tuple[int, int, int, int, int] | None = None
        rule_chosen: Any = None
        for rule in route.rules:
            s = rule.score(req)
            if s is not None and (rule_best is None or s > rule_best):
                rule_best, rule_chosen = s, rule
        if rule_best is None:
            continue
        score = (host_score, rule_best)
        if best is None or score > best:
            best, chosen = score, (route, rule_chosen)
    return chosen


def _matches_all(rule: Rule) -> bool:
    """Whether ``rule`` matches every request (no matches, or one on nothing but a "/" prefix)."""
    return not rule.matches or any(
        m.method is None and not m.headers and not m.query
        and (m.path is None or (m.path.kind is PathKind.PREFIX and not m.path.value.rstrip("/")))
        for m in rule.matches)


class _Request:
    """A request head seen by route matching: method, path, host, headers and query, decoded lazily."""

    __slots__ = ("head", "method", "path", "_query_text", "host", "_query")

    def __init__(self, head: RequestHead) -> None:
        self.head = head
        self.method = head.method.decode("latin-1").upper()
        target = head.target.decode("latin-1")
        if "://" in target:  # absolute form: the path starts after the authority
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        path, _, self._query_text = target.partition("?")
        self.path = path or "/"
        host = next((v for n, v in head.headers if n.lower() in (b"host", b":authority")), b"")
        self.host = _strip_port(host.decode("latin-1")).rstrip(".").lower()
        self._query: list[tuple[str, str]] | None = None

    def header(self, name: str) -> list[str]:
        key = name.encode("latin-1")
        return [v.decode("latin-1") for n, v in self.head.headers if n.lower() == key]

    def query(self, name: str) -> list[str]:
        if self._query is None:
            self._query = parse_qsl(self._query_text, keep_blank_values=True)
        return [v for k, v in self._query if k == name]


def _strip_port(host: str) -> str:
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() else host


# -- built-in policies ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def default_policy(policy: DefaultPolicy, cluster_networks: tuple[IpNetwork, ...], *, opaque: bool,
                   detect_timeout: float | None = None) -> ServerPolicy:
    """``LINKERD2_PROXY_INBOUND_DEFAULT_POLICY`` as a server policy (§8.2); ``opaque``: a port without detection."""
    meta = Meta.default(policy.value)
    if policy is DefaultPolicy.DENY:
        return ServerPolicy(meta, Protocol.OPAQUE, ())
    networks = tuple(Network(n) for n in cluster_networks) if policy.value.startswith("cluster-") else ALL_NETWORKS
    authn = Authn.IDENTITIES if policy.value.endswith("-authenticated") else Authn.UNAUTHENTICATED
    authz = Authorization(meta, networks, authn, suffixes=((),) if authn is Authn.IDENTITIES else ())
    authorizations = (LOCALHOST, authz)
    route = HttpRoute(Meta.default("default"), (), (Rule(()),), authorizations)
    return ServerPolicy(meta, Protocol.OPAQUE if opaque else Protocol.DETECT, authorizations, (route,),
                        detect_timeout)


INVALID = ServerPolicy(
    Meta.default("invalid"), Protocol.DETECT, (),
    (HttpRoute(Meta.default("invalid"), (), (Rule((), (Invalid("invalid server policy"),)),), ()),),
)


def with_localhost(authorizations: Sequence[Authorization]) -> tuple[Authorization, ...]:
    """A discovered policy's authorizations with the implicit ``default:localhost`` first (§8.1)."""
    return (LOCALHOST, *authorizations)
