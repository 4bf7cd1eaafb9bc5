"""What the outbound index keeps of each watched object: Services, EgressNetworks, routes, Namespaces.

``facts_of`` reads one raw object (as a platform watch yields it) through
``tether.resources.model.parse`` and keeps only what outbound policy needs,
already checked: annotations read (``annotations``), route filters and matches
the proxy can act on.  Problems are ``Problem``s naming the object and field:

* an annotation group that does not read (say a bad ``retry.linkerd.io/http``)
  is dropped and the rest of the object kept, as Linkerd does;
* a route with something Linkerd's controller refuses to convert (a
  ``RequestMirror``, ``URLRewrite`` or ``ExtensionRef`` filter, a regular
  expression gRPC method match, a bad retry or timeout annotation) is kept out
  of every policy: ``RouteFacts.problem`` says why;
* an object that does not parse at all is skipped.

Pure (no wire messages: the translator builds those).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from tether.policy.outbound import annotations as ann
from tether.ports import PortSet, parse_port_set
from tether.resources import kinds
from tether.resources.errors import ValidationError
from tether.resources.model import Resource, parse
from tether.resources.core import ServiceSpec
from tether.resources.meta import ConditionsStatus
from tether.resources.policy import EgressNetworkSpec, Network
from tether.resources.references import ParentRef
from tether.resources.routes import (
    BackendRef,
    GRPCRouteMatch,
    GRPCRouteRule,
    GRPCRouteSpec,
    HTTPRouteMatch,
    HTTPRouteRule,
    HTTPRouteSpec,
    HTTPRouteTimeouts,
    RouteFilter,
    RouteStatus,
    TCPRouteSpec,
    TLSRouteSpec,
)

log = logging.getLogger(__name__)

OPAQUE_PORTS_ANNOTATION = "config.linkerd.io/opaque-ports"
_T = TypeVar("_T")

# appProtocol values Linkerd gives a meaning to; any other value is kept (as "unknown") and treated as opaque.
APP_PROTOCOLS = {
    "http": "http1",
    "kubernetes.io/h2c": "http2",
    "linkerd.io/tcp": "opaque",
    "linkerd.io/opaque": "opaque",
}
HTTP_ROUTE_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect")
GRPC_ROUTE_FILTERS = ("RequestHeaderModifier",)


@dataclass(frozen=True, slots=True)
class Problem:
    """Something of an object the index could not use, named by object and field."""

    kind: str
    namespace: str
    name: str
    reason: str  # a short label for metrics: invalid_annotation, unsupported_filter, parent_not_found, ...
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}: {self.message}"


@dataclass(frozen=True, slots=True)
class Settings:
    """What a parent's annotations set for its policies (also the defaults of its routes' rules)."""

    timeouts: ann.Timeouts = ann.Timeouts()
    http_retry: ann.Retry | None = None
    grpc_retry: ann.Retry | None = None
    accrual: ann.FailureAccrual | None = None
    load_biaser: ann.LoadBiaser | None = None


def app_protocol(value: str) -> str:
    """``http1``, ``http2``, ``opaque`` or ``unknown:<value>`` for a Service port's ``appProtocol``."""
    return APP_PROTOCOLS.get(value.lower(), f"unknown:{value.lower()}")


@dataclass(frozen=True, slots=True)
class ServiceFacts:
    namespace: str
    name: str
    cluster_ips: tuple[str, ...]
    ports: frozenset[int]
    # Port -> appProtocol as declared (``app_protocol`` values); ports without one are absent.
    app_protocols: Mapping[int, str]
    port_names: tuple[tuple[str, int], ...]
    # The Service's own ``config.linkerd.io/opaque-ports`` (None: inherit the namespace's, else the defaults).
    opaque_ports: PortSet | None
    settings: Settings
    problems: tuple[Problem, ...] = ()
    # No cluster IP by design (``clusterIP: None``, or ``type: ExternalName``): no route's parent (Linkerd's
    # status controller, ``valid_parent_service``).  One not allocated yet is not headless.
    headless: bool = False


@dataclass(frozen=True, slots=True)
class EgressNetworkFacts:
    namespace: str
    name: str
    traffic_policy: str  # Allow or Deny
    # None: every address outside the cluster networks (resolved by the index, which knows them).
    networks: tuple[Network, ...] | None
    created: datetime | None
    opaque_ports: PortSet | None
    settings: Settings
    problems: tuple[Problem, ...] = ()
    # Its status says Accepted (read back): only then is it a route's parent (Linkerd's status controller,
    # ``parent_condition_egress_network``).  Addresses resolve to it either way, as in Linkerd.
    accepted: bool = False


@dataclass(frozen=True, slots=True)
class NamespaceFacts:
    name: str
    opaque_ports_annotation: str | None


@dataclass(frozen=True, slots=True)
class RuleFacts:
    """One rule; ``matches`` are HTTP or gRPC matches by the route's kind."""

    matches: tuple[HTTPRouteMatch, ...] | tuple[GRPCRouteMatch, ...]
    filters: tuple[RouteFilter, ...]
    backends: tuple[BackendRef, ...]
    timeouts: HTTPRouteTimeouts | None = None


@dataclass(frozen=True, slots=True)
class RouteFacts:
    """An HTTPRoute (either group), GRPCRoute, TLSRoute or TCPRoute with outbound parents; ``problem`` set: it
    applies nowhere.  TLSRoutes and TCPRoutes have one rule without matches or filters; ``hostnames`` of a
    TLSRoute are SNI names."""

    group: str
    kind: str  # HTTPRoute, GRPCRoute, TLSRoute or TCPRoute
    namespace: str
    name: str
    created: datetime | None
    parents: tuple[ParentRef, ...]
    hostnames: tuple[str, ...]
    rules: tuple[RuleFacts, ...]
    timeouts: ann.Timeouts = ann.Timeouts()
    retry: ann.Retry | None = None
    problem: Problem | None = None
    warnings: tuple[Problem, ...] = field(default=(), compare=False)
    # (kind, name, port or None) of each Service or EgressNetwork parent the route's status says accepted it.
    accepted: frozenset[tuple[str, str, int | None]] = frozenset()

    def accepted_by(self, ref: ParentRef, kind: str, name: str, port: int) -> bool:
        """Whether the status says the parent ``ref`` names accepted the route, as Linkerd's outbound index reads
        it back (``outbound/index/http.rs``: ``route_accepted_by_resource_port``, ``route_accepted_by_service``):
        with a port in ``ref``, an ``Accepted: True`` entry of that kind and name with that port or none; without
        one, such an entry for a Service of that name.  Whoever wrote the entry (Linkerd does not check)."""
        if ref.port is not None:
            return any((k, n) == (kind, name) and p in (None, port) for k, n, p in self.accepted)
        return any(k == kinds.SERVICE.kind and n == name for k, n, _ in self.accepted)

    @property
    def is_grpc(self) -> bool:
        return self.kind == "GRPCRoute"

    @property
    def is_stream(self) -> bool:
        """A TLSRoute or TCPRoute: it routes connections, not requests."""
        return self.kind in (kinds.TLS_ROUTE.kind, kinds.TCP_ROUTE.kind)

    def order_key(self) -> tuple[int, datetime | None, str]:
        """Linkerd's route order: by creation time (routes with one first), then name."""
        return (self.created is None, self.created, self.name)


Facts = ServiceFacts | EgressNetworkFacts | NamespaceFacts | RouteFacts


def facts_of(obj: Mapping[str, Any]) -> Facts | None:
    """The facts of one watched object, or None when it can't be read (logged) or is of another kind."""
    try:
        resource = parse(obj)
    except ValidationError as exc:
        log.warning("outbound policy ignores an object it can't read: %s", exc)
        return None
    rtype = resource.type
    if rtype is kinds.SERVICE:
        return _service(resource)
    if rtype is kinds.EGRESS_NETWORK:
        return _egress_network(resource)
    if rtype is kinds.NAMESPACE:
        return NamespaceFacts(resource.name, resource.annotations.get(OPAQUE_PORTS_ANNOTATION))
    if rtype in (kinds.POLICY_HTTP_ROUTE, kinds.GATEWAY_HTTP_ROUTE, kinds.GRPC_ROUTE, kinds.TLS_ROUTE,
                 kinds.TCP_ROUTE):
        # Routes whose parents are all Servers are the inbound index's business.
        parents = resource.spec.parent_refs  # type: ignore[union-attr]
        if not any(_outbound_parent(ref) for ref in parents):
            return None
        return _stream_route(resource) if rtype in (kinds.TLS_ROUTE, kinds.TCP_ROUTE) else _route(resource)
    return None


def _outbound_parent(ref: ParentRef) -> bool:
    return ref.targets(kinds.SERVICE) or ref.targets(kinds.EGRESS_NETWORK)


def _accepted(resource: Resource) -> frozenset[tuple[str, str, int | None]]:
    """The outbound parents a route's ``status.parents`` says accepted it (see ``RouteFacts.accepted_by``)."""
    status = resource.status
    if not isinstance(status, RouteStatus):
        return frozenset()
    return frozenset((p.parent_ref.kind, p.parent_ref.name, p.parent_ref.port) for p in status.parents
                     if p.accepted and _outbound_parent(p.parent_ref))


def _read(
    reader: Callable[[Mapping[str, str]], _T], annotations: Mapping[str, str], default: _T,
    problems: list[Problem], resource: Resource,
) -> _T:
    try:
        return reader(annotations)
    except ann.AnnotationError as exc:
        problems.append(Problem(resource.type.kind, resource.namespace or "", resource.name, "invalid_annotation",
                                str(exc)))
        return default


def _settings(resource: Resource, problems: list[Problem]) -> Settings:
    a = resource.annotations
    return Settings(
        timeouts=_read(ann.parse_timeouts, a, ann.Timeouts(), problems, resource),
        http_retry=_read(ann.parse_http_retry, a, None, problems, resource),
        grpc_retry=_read(ann.parse_grpc_retry, a, None, problems, resource),
        accrual=_read(ann.parse_failure_accrual, a, None, problems, resource),
        load_biaser=_read(ann.parse_load_biaser, a, None, problems, resource),
    )


def _opaque_ports(resource: Resource, names: Mapping[str, int], problems: list[Problem]) -> PortSet | None:
    text = resource.annotations.get(OPAQUE_PORTS_ANNOTATION)
    if text is None:
        return None
    ports, bad = parse_port_set(text, names)
    for item in bad:
        problems.append(Problem(resource.type.kind, resource.namespace or "", resource.name, "invalid_annotation",
                                f"annotation {OPAQUE_PORTS_ANNOTATION}: skipped invalid item {item!r}"))
    return ports


def _log(problems: list[Problem]) -> tuple[Problem, ...]:
    for problem in problems:
        log.warning("outbound policy: %s", problem)
    return tuple(problems)


def _service(resource: Resource) -> ServiceFacts:
    spec = resource.spec
    assert isinstance(spec, ServiceSpec)
    problems: list[Problem] = []
    ports = spec.ports
    names = {p.name: p.port for p in ports if p.name}
    ips = tuple(ip for ip in (spec.cluster_ips or ((spec.cluster_ip,) if spec.cluster_ip else ())) if ip != "None")
    return ServiceFacts(
        namespace=resource.namespace or "",
        name=resource.name,
        cluster_ips=ips,
        ports=frozenset(p.port for p in ports),
        app_protocols={p.port: app_protocol(p.app_protocol) for p in ports if p.app_protocol},
        port_names=tuple(sorted(names.items())),
        opaque_ports=_opaque_ports(resource, names, problems),
        settings=_settings(resource, problems),
        problems=_log(problems),
        headless=spec.cluster_ip == "None" or spec.type == "ExternalName",
    )


def _egress_network(resource: Resource) -> EgressNetworkFacts:
    spec = resource.spec
    assert isinstance(spec, EgressNetworkSpec)
    problems: list[Problem] = []
    settings = _settings(resource, problems)
    if settings.load_biaser is not None:
        # Linkerd's rule: the biaser penalises endpoints of a balancer; an EgressNetwork forwards to one address.
        problems.append(Problem("EgressNetwork", resource.namespace or "", resource.name,
                                "annotation_without_effect",
                                f"annotation {ann.PENALIZE_FAILURES} has no effect on an EgressNetwork"))
        settings = Settings(settings.timeouts, settings.http_retry, settings.grpc_retry, settings.accrual, None)
    return EgressNetworkFacts(
        namespace=resource.namespace or "",
        name=resource.name,
        traffic_policy=spec.traffic_policy,
        networks=spec.networks,
        created=resource.metadata.creation_timestamp,
        opaque_ports=_opaque_ports(resource, {}, problems),
        settings=settings,
        problems=_log(problems),
        accepted=isinstance(resource.status, ConditionsStatus) and any(
            c.type == "Accepted" and c.is_true for c in resource.status.conditions),
    )


def _route(resource: Resource) -> RouteFacts:
    spec = resource.spec
    assert isinstance(spec, (HTTPRouteSpec, GRPCRouteSpec))
    grpc = isinstance(spec, GRPCRouteSpec)
    ns = resource.namespace or ""
    kind = resource.type.kind

    def problem(reason: str, message: str) -> Problem:
        return Problem(kind, ns, resource.name, reason, message)

    errors: list[Problem] = []
    timeouts = _read(ann.parse_timeouts, resource.annotations, ann.Timeouts(), errors, resource)
    retry_reader = ann.parse_grpc_retry if grpc else ann.parse_http_retry
    retry = _read(retry_reader, resource.annotations, None, errors, resource)
    allowed = GRPC_ROUTE_FILTERS if grpc else HTTP_ROUTE_FILTERS
    warnings: list[Problem] = []
    spec_rules: tuple[HTTPRouteRule | GRPCRouteRule, ...] = spec.rules
    for i, rule in enumerate(spec_rules):
        for f in rule.filters:
            if f.type == "ResponseHeaderModifier" and grpc:
                # Linkerd converts the route but the gRPC route proto has no such filter: it is dropped.
                warnings.append(problem("filter_without_effect", f"spec.rules[{i}].filters: ResponseHeaderModifier "
                                        "has no effect on a GRPCRoute's outbound policy"))
            elif f.type not in allowed and f.type != "ResponseHeaderModifier":
                errors.append(problem("unsupported_filter",
                                      f"spec.rules[{i}].filters: {f.type} filter is not supported"))
        if isinstance(rule, GRPCRouteRule):
            for j, m in enumerate(rule.matches):
                if m.method is not None and m.method.type == "RegularExpression":
                    errors.append(problem("unsupported_match", f"spec.rules[{i}].matches[{j}].method: unsupported "
                                          "GRPCRoute method match type RegularExpression"))
    rules = tuple(
        RuleFacts(
            matches=rule.matches,
            filters=tuple(f for f in rule.filters if f.type in allowed),
            backends=rule.backend_refs,
            timeouts=getattr(rule, "timeouts", None),
        )
        for rule in spec.rules
    )
    for w in warnings:
        log.warning("outbound policy: %s", w)
    if not spec.rules:
        # The proxy API wants at least one rule per route; a route without rules matches nothing anyway.
        errors.append(problem("no_rules", "spec.rules: a route without rules matches no request"))
    first = errors[0] if errors else None
    if first is not None:
        log.warning("outbound policy ignores route: %s", first)
    return RouteFacts(
        group=resource.type.group,
        kind=kind,
        namespace=ns,
        name=resource.name,
        created=resource.metadata.creation_timestamp,
        parents=spec.parent_refs,
        hostnames=spec.hostnames,
        rules=rules,
        timeouts=timeouts,
        retry=retry,
        problem=first,
        warnings=tuple(warnings),
        accepted=_accepted(resource),
    )


def _stream_route(resource: Resource) -> RouteFacts:
    """A TLSRoute or TCPRoute: its one rule's backends (and a TLSRoute's SNI names); Linkerd reads no
    retry or timeout annotations on these."""
    spec = resource.spec
    assert isinstance(spec, (TLSRouteSpec, TCPRouteSpec))
    return RouteFacts(
        group=resource.type.group,
        kind=resource.type.kind,
        namespace=resource.namespace or "",
        name=resource.name,
        created=resource.metadata.creation_timestamp,
        parents=spec.parent_refs,
        hostnames=spec.hostnames if isinstance(spec, TLSRouteSpec) else (),
        rules=tuple(RuleFacts(matches=(), filters=(), backends=rule.backend_refs) for rule in spec.rules),
        accepted=_accepted(resource),
    )
