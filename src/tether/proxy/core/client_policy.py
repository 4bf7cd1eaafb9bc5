"""Outbound client policy as the proxy holds it (proxy.md §7.1, §7.2, §7.5, §7.6): the policy controller's
``OutboundPolicy`` for one target, translated once per update (``core.client_policy_translation``) so that
no protobuf is touched per request.

- ``ClientPolicy``: the parent (a Service port, an EgressNetwork, or a default
  such as ``egress-fallback``), its protocol, its HTTP/1, HTTP/2 or gRPC
  routes, its opaque routes and its failure accrual.
- ``OutboundRoute`` / ``OutboundRule``: Gateway API routes; a request's route
  and rule are chosen as the inbound side chooses them
  (``server_policy.select_route``: hosts, then the best match).
- Filters: ``core.route_filters``'s (shared with inbound routes): ``HeaderModifier``
  (request or response; never ``l5d-*`` names), ``Redirect`` (a 3xx the proxy
  answers), ``FailureInjector`` (a share of requests failed with its status or
  gRPC code) and ``Invalid`` (500: what the controller could not express).
- ``RouteBackend``: a balancer (a Service's endpoints, leased by the watch),
  a forward endpoint (an egress or fallback target), or nothing (502); drawn
  per request by weight (``choose``), one not ready giving its share to the
  others (``RandomAvailable``) or the first ready one (``FirstAvailable``).
- ``OpaqueRoute``: a connection's route (the opaque ones, a TCPRoute among
  them, and the TLS ones, chosen by SNI with ``select_tls_route``): refused
  when forbidden, else a backend drawn by weight per connection, one with an
  ``Invalid`` filter refusing it.
- ``default_routes``: the controller's answer when the Service has no
  HTTPRoute or GRPCRoute (a single route named ``default``).

Pure. Callers: ``core.client_policy_translation``, ``core.policy_routes``, ``io.discovery``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from tether.proxy.core import labels
from tether.proxy.core.endpoint import Endpoint
from tether.proxy.core.route_filters import HeaderModifier, RequestFilter
from tether.proxy.core.server_policy import CATCH_ALL, HostMatch, Protocol, RouteMatch, Rule



@dataclass(frozen=True, slots=True)
class PolicyRef:
    """Where a policy object came from (``meta.Metadata``): a resource, or a default (kind ``default``)."""

    group: str
    kind: str
    namespace: str
    name: str
    port: int = 0
    section: str = ""

    @classmethod
    def default(cls, name: str) -> PolicyRef:
        return cls("", "default", "", name)

    @property
    def is_default(self) -> bool:
        return self.kind == "default"

    def labels(self, prefix: str) -> str:
        """``<prefix>_group``, ``_kind``, ``_namespace``, ``_name``, ``_port``, ``_section_name`` (proxy.md §9.5)."""
        return labels.render((f"{prefix}_group", self.group), (f"{prefix}_kind", self.kind),
                             (f"{prefix}_namespace", self.namespace), (f"{prefix}_name", self.name),
                             (f"{prefix}_port", str(self.port) if self.port else ""),
                             (f"{prefix}_section_name", self.section))

    def route_labels(self) -> str:
        """A route's labels: group, kind, namespace and name."""
        return labels.render(("route_group", self.group), ("route_kind", self.kind),
                             ("route_namespace", self.namespace), ("route_name", self.name))


# -- backends, rules, routes --------------------------------------------------------------------------------


class Distribution(enum.Enum):
    EMPTY = "empty"
    FIRST_AVAILABLE = "first-available"
    RANDOM_AVAILABLE = "random-available"


@dataclass(frozen=True, slots=True, eq=False)
class RouteBackend:
    """One backend of a rule: exactly one of ``balancer`` (discovery's, for ``authority``) and ``endpoint``
    (forward), or neither (no dispatcher: 502)."""

    meta: PolicyRef
    weight: int = 1
    authority: str = ""  # the balancer's Destination path (name:port), for metrics and errors
    balancer: Any = field(default=None, compare=False)  # core.balancer.Balancer
    endpoint: Endpoint | None = None
    filters: tuple[RequestFilter, ...] = ()
    request_timeout: float | None = None
    labels: str = ""  # backend_* labels, rendered once

    def __post_init__(self) -> None:
        if not self.labels:
            object.__setattr__(self, "labels", self.meta.labels("backend"))

    @property
    def ready(self) -> bool:
        """Whether it takes requests now: a balancer with endpoints, a forward endpoint, or a backend that
        fails them at once (no dispatcher, e.g. a missing Service with the controller's failure injector)."""
        return self.balancer.has_endpoints if self.balancer is not None else True


@dataclass(frozen=True, slots=True)
class Timeouts:
    request: float | None = None  # the whole exchange
    response: float | None = None  # from the request sent to the response's end
    idle: float | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """A rule's retries: up to ``limit`` more attempts of a request whose response matches the conditions."""

    limit: int
    max_request_bytes: int
    statuses: tuple[tuple[int, int], ...] = ()  # HTTP: inclusive ranges
    grpc_codes: frozenset[int] = frozenset()  # gRPC
    timeout: float | None = None  # per attempt
    backoff: tuple[float, float] | None = None  # (min, max) seconds

    def retryable(self, status: int, grpc_status: int | None) -> bool:
        if grpc_status is not None and self.grpc_codes:
            return grpc_status in self.grpc_codes
        return any(lo <= status <= hi for lo, hi in self.statuses)


@dataclass(frozen=True, slots=True)
class OutboundRule:
    match: Rule  # the matches (server_policy's, so the inbound and outbound sides score alike)
    filters: tuple[RequestFilter, ...] = ()
    response_filters: tuple[HeaderModifier, ...] = ()
    distribution: Distribution = Distribution.FIRST_AVAILABLE
    backends: tuple[RouteBackend, ...] = ()
    timeouts: Timeouts = Timeouts()
    retry: Retry | None = None
    allow_l5d_request_headers: bool = False

    def score(self, request: Any) -> tuple[int, int, int, int, int] | None:
        return self.match.score(request)

    def choose(self, draw: float) -> RouteBackend | None:
        """The backend of one request: weighted among the ready ones (all, when none is ready)."""
        return choose(self.distribution, self.backends, draw)


def choose(distribution: Distribution, backends: tuple[RouteBackend, ...], draw: float) -> RouteBackend | None:
    """A backend of a distribution, for one request or connection: the first ready one (``FirstAvailable``), or
    drawn by weight among the ready ones (all, when none is ready); None when there is none to draw."""
    if len(backends) == 1:
        return backends[0] if backends[0].weight > 0 or distribution is Distribution.FIRST_AVAILABLE else None
    if not backends:
        return None
    if distribution is Distribution.FIRST_AVAILABLE:
        return next((b for b in backends if b.ready), backends[0])
    ready = [b for b in backends if b.ready and b.weight > 0] or [b for b in backends if b.weight > 0]
    if not ready:
        return None
    point = draw * sum(b.weight for b in ready)
    for backend in ready:
        point -= backend.weight
        if point < 0:
            return backend
    return ready[-1]


@dataclass(frozen=True, slots=True)
class OutboundRoute:
    meta: PolicyRef
    hosts: tuple[HostMatch, ...]
    rules: tuple[OutboundRule, ...]
    grpc: bool = False
    labels: str = ""  # route_* labels, rendered once

    def __post_init__(self) -> None:
        if not self.labels:
            object.__setattr__(self, "labels", self.meta.route_labels())


@dataclass(frozen=True, slots=True)
class OpaqueRoute:
    """An opaque or TLS route: connections, not requests. ``snis`` (TLS routes only): the SNI names it takes;
    none: every name."""

    meta: PolicyRef
    forbidden: bool = False  # the connection is refused (Forbidden, or Invalid)
    backends: tuple[RouteBackend, ...] = ()
    distribution: Distribution = Distribution.FIRST_AVAILABLE
    snis: tuple[HostMatch, ...] = ()

    def choose(self, draw: float) -> RouteBackend | None:
        return choose(self.distribution, self.backends, draw)


def select_tls_route(routes: tuple[OpaqueRoute, ...], sni: str) -> OpaqueRoute | None:
    """The TLS route of a connection with this SNI, as linkerd2-proxy's ``tls_route::find``: an exact name beats
    a ``*.`` suffix, a longer suffix a shorter one, any SNI match a route without names; ties go to the first
    listed; None when no route takes the name."""
    sni = sni.rstrip(".")
    best: tuple[tuple[int, int], OpaqueRoute] | None = None
    for route in routes:
        if route.snis:
            scores = [score for match in route.snis if (score := match.score(sni)) is not None]
            if not scores:
                continue
            score = max(scores)
        else:
            score = (0, 0)
        if best is None or score > best[0]:
            best = (score, route)
    return best[1] if best is not None else None


@dataclass(frozen=True, slots=True)
class Accrual:
    """Failure accrual (``core.breaker``): an endpoint is shut for a backoff after ``max_failures`` failures in a
    row (0: not by count), or -- the unified breaker's other half -- when its success rate over the last
    ``window`` seconds falls below ``success_rate`` once ``min_requests`` answers are in it. An endpoint is not
    shut while that would leave fewer than ``min_ready`` endpoints of its balancer un-ejected
    (``ejection.min_ready_endpoints``; 0: no minimum)."""

    max_failures: int
    min_backoff: float
    max_backoff: float
    jitter: float = 0.0
    success_rate: float | None = None
    window: float = 10.0
    min_requests: int = 5
    min_ready: int = 0


@dataclass(frozen=True, slots=True)
class ClientPolicy:
    parent: PolicyRef
    protocol: Protocol
    http1: tuple[OutboundRoute, ...] = ()
    http2: tuple[OutboundRoute, ...] = ()  # gRPC routes too, when the protocol is gRPC
    opaque: tuple[OpaqueRoute, ...] = ()
    tls: tuple[OpaqueRoute, ...] = ()  # the TLS routes (protocol TLS), chosen by SNI
    detect_timeout: float | None = None
    accrual: Accrual | None = None
    unapplied: tuple[str, ...] = ()  # what the message asks that this proxy does not do (logged by name)
    parent_labels: str = ""
    # Per protocol (``only[h2]``: HTTP/1, HTTP/2): the route and rule every request takes, when there is only one
    # and it matches everything (a Service without HTTPRoutes): no matching per request (``_catch_all``).
    only: tuple[tuple[OutboundRoute, OutboundRule] | None, ...] = field(default=(None, None), init=False,
                                                                          repr=False, compare=False)
    # What ``core.policy_routes`` prepares once per rule of this policy (its labels, filters, shared route).
    prepared: dict[int, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.parent_labels:
            object.__setattr__(self, "parent_labels", self.parent.labels("parent"))
        object.__setattr__(self, "only", (_catch_all(self.http1), _catch_all(self.http2)))

    def backends(self) -> list[RouteBackend]:
        """Every backend of every route (HTTP, gRPC, opaque and TLS)."""
        return [b for _, b in self.backends_by_family()]

    def backends_by_family(self) -> list[tuple[str, RouteBackend]]:
        """Every backend with the family of its balancer metrics (proxy.md §9.5): ``http`` for HTTP and gRPC
        routes, ``tcp`` for opaque routes, ``tls`` for TLS routes (a Service both ways is in both, as
        linkerd2-proxy builds a balancer per protocol stack)."""
        out = [("http", b) for route in (*self.http1, *self.http2) for rule in route.rules for b in rule.backends]
        out.extend(("tcp", b) for route in self.opaque for b in route.backends)
        out.extend(("tls", b) for route in self.tls for b in route.backends)
        return out

    def routes(self, h2: bool) -> tuple[OutboundRoute, ...]:
        return self.http2 if h2 else self.http1

    def default_routes(self, h2: bool) -> bool:
        """Whether the Service has no HTTPRoute/GRPCRoute for this protocol (the controller's ``default``
        route): then a ServiceProfile's routes apply (Linkerd 2.20's fallback)."""
        routes = self.routes(h2)
        return all(r.meta.is_default and r.meta.name in ("http", "grpc") for r in routes)


def _catch_all(routes: tuple[OutboundRoute, ...]) -> tuple[OutboundRoute, OutboundRule] | None:
    if len(routes) != 1 or routes[0].hosts or len(routes[0].rules) != 1:
        return None
    rule = routes[0].rules[0]
    matches = rule.match.matches
    if not matches or all(m == CATCH_ALL or m == RouteMatch() for m in matches):
        return routes[0], rule
    return None

