"""Typed specs of the route kinds: HTTPRoute (policy.linkerd.io and Gateway API), GRPCRoute, TLSRoute, TCPRoute.

The two HTTPRoute groups share one shape (`HTTPRouteSpec`) and differ in the
CRD defaults of a parent reference's group and in the filters Linkerd accepts:
its own HTTPRoute allows only header modifiers and redirects, while Gateway API
routes take every standard filter (other controllers may own them). Defaults a
Kubernetes API server would fill in from the CRD schema are applied here
(a rule without matches matches every path, a backend's weight is 1, ...).
TLSRoute and TCPRoute (Gateway API v1alpha2) route whole connections: parent
references, TLSRoute's SNI ``hostnames``, and exactly one rule of backends, the
one rule Linkerd allows (a `PolicyRuleViolation`, which its webhook denies even
though it admits Gateway API routes it cannot read).
`model.parse` calls the ``parse_*`` functions; the policy controller's inbound
and outbound indexes read the specs and the ``status.parents`` acceptance.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from tether.resources import formats
from tether.resources.fields import Fields
from tether.resources.kinds import (
    EGRESS_NETWORK,
    GATEWAY_HTTP_ROUTE,
    GRPC_ROUTE,
    POLICY_HTTP_ROUTE,
    SERVICE,
    TCP_ROUTE,
    TLS_ROUTE,
    ResourceType,
)
from tether.resources.meta import Condition, ObjectMeta, parse_conditions
from tether.resources.references import ParentRef, kind_name, parse_parent_ref, read_group, ref_name, refers_to

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
PATH_MATCH_TYPES = ("Exact", "PathPrefix", "RegularExpression")
VALUE_MATCH_TYPES = ("Exact", "RegularExpression")
POLICY_HTTP_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect")
GATEWAY_HTTP_FILTERS = (
    "RequestHeaderModifier",
    "ResponseHeaderModifier",
    "RequestMirror",
    "RequestRedirect",
    "URLRewrite",
    "ExtensionRef",
)
GRPC_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "ExtensionRef")
# Each filter type carries its settings under its own field.
_FILTER_SETTINGS = {
    "RequestHeaderModifier": "requestHeaderModifier",
    "ResponseHeaderModifier": "responseHeaderModifier",
    "RequestMirror": "requestMirror",
    "RequestRedirect": "requestRedirect",
    "URLRewrite": "urlRewrite",
    "ExtensionRef": "extensionRef",
}
# A redirect's path modifier keeps its value under a field named for its type.
_PATH_MODIFIERS = {"ReplaceFullPath": "replaceFullPath", "ReplacePrefixMatch": "replacePrefixMatch"}
MAX_WEIGHT = 1_000_000

_HOSTNAME = re.compile(r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+\-.^_`|~]+")
_GRPC_SERVICE = re.compile(r"\.?[a-zA-Z_][a-zA-Z_0-9]*(\.[a-zA-Z_][a-zA-Z_0-9]*)*")
_GRPC_METHOD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _hostname(value: str) -> str | None:
    if len(value) > formats.SUBDOMAIN_MAX or not _HOSTNAME.fullmatch(value):
        return "must be a lower-case DNS name, optionally starting with '*.'"
    return None


def _header_name(value: str) -> str | None:
    return None if _HEADER_NAME.fullmatch(value) else "must be an HTTP header name"


@dataclass(frozen=True, slots=True)
class PathMatch:
    type: str = "PathPrefix"
    value: str = "/"


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A header or query-parameter match."""

    name: str
    value: str
    type: str = "Exact"


@dataclass(frozen=True, slots=True)
class HTTPRouteMatch:
    path: PathMatch = PathMatch()
    headers: tuple[ValueMatch, ...] = ()
    query_params: tuple[ValueMatch, ...] = ()
    method: str | None = None


@dataclass(frozen=True, slots=True)
class HeaderModifier:
    set: tuple[tuple[str, str], ...] = ()
    add: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PathModifier:
    type: str  # ReplaceFullPath or ReplacePrefixMatch
    value: str


@dataclass(frozen=True, slots=True)
class RequestRedirect:
    scheme: str | None = None
    hostname: str | None = None
    path: PathModifier | None = None
    port: int | None = None
    status_code: int = 302


@dataclass(frozen=True, slots=True)
class RouteFilter:
    """One filter; the types Linkerd acts on are typed, the rest stay in ``raw``."""

    type: str
    request_header_modifier: HeaderModifier | None = None
    response_header_modifier: HeaderModifier | None = None
    request_redirect: RequestRedirect | None = None
    raw: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class BackendRef:
    name: str
    group: str = ""
    kind: str = "Service"
    namespace: str | None = None
    port: int | None = None
    weight: int = 1
    filters: tuple[RouteFilter, ...] = ()

    def targets(self, rtype: ResourceType) -> bool:
        return refers_to(self.group, self.kind, rtype)


@dataclass(frozen=True, slots=True)
class HTTPRouteTimeouts:
    """Seconds; None when unset, 0 disables the timeout."""

    request: float | None = None
    backend_request: float | None = None


@dataclass(frozen=True, slots=True)
class HTTPRouteRule:
    matches: tuple[HTTPRouteMatch, ...] = (HTTPRouteMatch(),)
    filters: tuple[RouteFilter, ...] = ()
    backend_refs: tuple[BackendRef, ...] = ()
    timeouts: HTTPRouteTimeouts | None = None


@dataclass(frozen=True, slots=True)
class HTTPRouteSpec:
    parent_refs: tuple[ParentRef, ...] = ()
    hostnames: tuple[str, ...] = ()
    rules: tuple[HTTPRouteRule, ...] = (HTTPRouteRule(),)


@dataclass(frozen=True, slots=True)
class GRPCMethodMatch:
    type: str = "Exact"
    service: str | None = None
    method: str | None = None


@dataclass(frozen=True, slots=True)
class GRPCRouteMatch:
    method: GRPCMethodMatch | None = None
    headers: tuple[ValueMatch, ...] = ()


@dataclass(frozen=True, slots=True)
class GRPCRouteRule:
    """``matches`` empty means every gRPC request."""

    matches: tuple[GRPCRouteMatch, ...] = ()
    filters: tuple[RouteFilter, ...] = ()
    backend_refs: tuple[BackendRef, ...] = ()


@dataclass(frozen=True, slots=True)
class GRPCRouteSpec:
    parent_refs: tuple[ParentRef, ...] = ()
    hostnames: tuple[str, ...] = ()
    rules: tuple[GRPCRouteRule, ...] = ()


@dataclass(frozen=True, slots=True)
class StreamRouteRule:
    """The rule of a TLSRoute or TCPRoute: where its connections go (no matches, no filters)."""

    backend_refs: tuple[BackendRef, ...] = ()


@dataclass(frozen=True, slots=True)
class TLSRouteSpec:
    """``hostnames``: the SNI names the route takes (``*.`` wildcards allowed); empty takes every name."""

    parent_refs: tuple[ParentRef, ...] = ()
    hostnames: tuple[str, ...] = ()
    rules: tuple[StreamRouteRule, ...] = (StreamRouteRule(),)


@dataclass(frozen=True, slots=True)
class TCPRouteSpec:
    parent_refs: tuple[ParentRef, ...] = ()
    rules: tuple[StreamRouteRule, ...] = (StreamRouteRule(),)


@dataclass(frozen=True, slots=True)
class RouteParentStatus:
    parent_ref: ParentRef
    controller_name: str
    conditions: tuple[Condition, ...] = ()

    @property
    def accepted(self) -> bool:
        return any(c.type == "Accepted" and c.is_true for c in self.conditions)


@dataclass(frozen=True, slots=True)
class RouteStatus:
    """Per parent, what each controller decided (the policy controller writes ``Accepted``)."""

    parents: tuple[RouteParentStatus, ...] = ()


def parse_policy_http_route(doc: Fields, meta: ObjectMeta) -> tuple[HTTPRouteSpec, RouteStatus]:
    return _http_route(doc, POLICY_HTTP_ROUTE.group, POLICY_HTTP_FILTERS)


def parse_gateway_http_route(doc: Fields, meta: ObjectMeta) -> tuple[HTTPRouteSpec, RouteStatus]:
    return _http_route(doc, GATEWAY_HTTP_ROUTE.group, GATEWAY_HTTP_FILTERS)


def parse_grpc_route(doc: Fields, meta: ObjectMeta) -> tuple[GRPCRouteSpec, RouteStatus]:
    spec = doc.child("spec")
    rules = tuple(
        GRPCRouteRule(
            matches=tuple(_grpc_match(m) for m in rule.children("matches")),
            filters=_filters(rule, GRPC_FILTERS),
            backend_refs=_backend_refs(rule, GRPC_FILTERS),
        )
        for rule in spec.children("rules")
    )
    return (
        GRPCRouteSpec(_parent_refs(spec, GRPC_ROUTE.group), spec.strings("hostnames", check=_hostname), rules),
        _route_status(doc, GRPC_ROUTE.group),
    )


def parse_tls_route(doc: Fields, meta: ObjectMeta) -> tuple[TLSRouteSpec, RouteStatus]:
    spec = doc.child("spec")
    return (
        TLSRouteSpec(_parent_refs(spec, TLS_ROUTE.group), spec.strings("hostnames", check=_hostname),
                     _stream_rules(spec, "TLSRoute")),
        _route_status(doc, TLS_ROUTE.group),
    )


def parse_tcp_route(doc: Fields, meta: ObjectMeta) -> tuple[TCPRouteSpec, RouteStatus]:
    spec = doc.child("spec")
    return (
        TCPRouteSpec(_parent_refs(spec, TCP_ROUTE.group), _stream_rules(spec, "TCPRoute")),
        _route_status(doc, TCP_ROUTE.group),
    )


def _stream_rules(spec: Fields, kind: str) -> tuple[StreamRouteRule, ...]:
    # Gateway API's schema asks for 1-16 rules; Linkerd's controller takes exactly one.
    rules = spec.children("rules", required=True)
    if len(rules) != 1:
        raise spec.error("rules", f"{kind} supports a single rule only (Linkerd), got {len(rules)}", rule=True)
    # Their backendRefs take no filters: any ``filters`` given is refused by name.
    return tuple(StreamRouteRule(backend_refs=_backend_refs(rule, ())) for rule in rules)


def _http_route(doc: Fields, parent_group: str, filter_types: tuple[str, ...]) -> tuple[HTTPRouteSpec, RouteStatus]:
    spec = doc.child("spec")
    rules = HTTPRouteSpec().rules
    if spec.has("rules"):
        rules = tuple(
            HTTPRouteRule(
                matches=tuple(_http_match(m) for m in rule.children("matches"))
                if rule.has("matches")
                else HTTPRouteRule().matches,
                filters=_filters(rule, filter_types),
                backend_refs=_backend_refs(rule, filter_types),
                timeouts=_timeouts(rule.child("timeouts", None)),
            )
            for rule in spec.children("rules")
        )
    return (
        HTTPRouteSpec(_parent_refs(spec, parent_group), spec.strings("hostnames", check=_hostname), rules),
        _route_status(doc, parent_group),
    )


def _parent_refs(spec: Fields, default_group: str) -> tuple[ParentRef, ...]:
    refs = []
    for node in spec.children("parentRefs"):
        ref = parse_parent_ref(node, default_group)
        if ref.targets(EGRESS_NETWORK) and ref.port is None:
            raise node.error("port", "required for an EgressNetwork parent", rule=True)
        refs.append(ref)
    return tuple(refs)


def _http_match(node: Fields) -> HTTPRouteMatch:
    path = PathMatch()
    path_node = node.child("path", None)
    if path_node is not None:
        path = PathMatch(
            type=path_node.choice("type", PATH_MATCH_TYPES, "PathPrefix"),
            value=path_node.string("value", "/"),
        )
        if path.type != "RegularExpression" and not path.value.startswith("/"):
            raise path_node.error("value", "must be an absolute path starting with '/'")
    return HTTPRouteMatch(
        path=path,
        headers=_value_matches(node, "headers", header=True),
        query_params=_value_matches(node, "queryParams", header=False),
        method=node.choice("method", HTTP_METHODS, None),
    )


def _value_matches(node: Fields, key: str, *, header: bool) -> tuple[ValueMatch, ...]:
    return tuple(
        ValueMatch(
            name=m.string("name", check=_header_name if header else formats.non_empty),
            value=m.string("value"),
            type=m.choice("type", VALUE_MATCH_TYPES, "Exact"),
        )
        for m in node.children(key)
    )


def _grpc_match(node: Fields) -> GRPCRouteMatch:
    method = None
    method_node = node.child("method", None)
    if method_node is not None:
        method = GRPCMethodMatch(
            type=method_node.choice("type", VALUE_MATCH_TYPES, "Exact"),
            service=method_node.string("service", None),
            method=method_node.string("method", None),
        )
        if method.service is None and method.method is None:
            raise method_node.error(None, "at least one of service, method must be set")
        if method.type == "Exact":
            if method.service is not None and not _GRPC_SERVICE.fullmatch(method.service):
                raise method_node.error("service", f"{method.service!r} is not a gRPC service name")
            if method.method is not None and not _GRPC_METHOD.fullmatch(method.method):
                raise method_node.error("method", f"{method.method!r} is not a gRPC method name")
    return GRPCRouteMatch(method=method, headers=_value_matches(node, "headers", header=True))


def _filters(node: Fields, filter_types: tuple[str, ...]) -> tuple[RouteFilter, ...]:
    return tuple(_filter(f, filter_types) for f in node.children("filters"))


def _filter(node: Fields, filter_types: tuple[str, ...]) -> RouteFilter:
    filter_type = node.choice("type", filter_types)
    settings = node.child(_FILTER_SETTINGS[filter_type])
    return RouteFilter(
        type=filter_type,
        request_header_modifier=_header_modifier(settings) if filter_type == "RequestHeaderModifier" else None,
        response_header_modifier=_header_modifier(settings) if filter_type == "ResponseHeaderModifier" else None,
        request_redirect=_redirect(settings) if filter_type == "RequestRedirect" else None,
        raw=copy.deepcopy(dict(node.data)),
    )


def _header_modifier(node: Fields) -> HeaderModifier:
    def pairs(key: str) -> tuple[tuple[str, str], ...]:
        return tuple((h.string("name", check=_header_name), h.string("value")) for h in node.children(key))

    return HeaderModifier(set=pairs("set"), add=pairs("add"), remove=node.strings("remove", check=_header_name))


def _redirect(node: Fields) -> RequestRedirect:
    path = None
    path_node = node.child("path", None)
    if path_node is not None:
        path_type = path_node.choice("type", tuple(_PATH_MODIFIERS))
        path = PathModifier(path_type, path_node.string(_PATH_MODIFIERS[path_type]))
    return RequestRedirect(
        scheme=node.choice("scheme", ("http", "https"), None),
        hostname=node.string("hostname", None, check=_hostname),
        path=path,
        port=node.port("port", None),
        status_code=_redirect_status(node),
    )


def _redirect_status(node: Fields) -> int:
    code = node.integer("statusCode", 302)
    if code not in (301, 302):
        raise node.error("statusCode", f"unsupported value {code} (supported: 301, 302)")
    return code


def _backend_refs(rule: Fields, filter_types: tuple[str, ...]) -> tuple[BackendRef, ...]:
    refs = []
    for node in rule.children("backendRefs"):
        ref = BackendRef(
            name=node.string("name", check=ref_name),
            group=read_group(node, ""),
            kind=node.string("kind", "Service", check=kind_name),
            namespace=node.string("namespace", None, check=formats.dns1123_label),
            port=node.port("port", None),
            weight=node.integer("weight", 1, minimum=0, maximum=MAX_WEIGHT),
            filters=_filters(node, filter_types),
        )
        if ref.targets(SERVICE) and ref.port is None:
            raise node.error("port", "required for a Service backend")
        refs.append(ref)
    return tuple(refs)


def _timeouts(node: Fields | None) -> HTTPRouteTimeouts | None:
    if node is None:
        return None
    timeouts = HTTPRouteTimeouts(node.duration("request", None), node.duration("backendRequest", None))
    # As Gateway API's rule: a backend request may not outlast the request, unless 0 disables the latter.
    if timeouts.request and timeouts.backend_request is not None and timeouts.backend_request > timeouts.request:
        raise node.error("backendRequest", "must not be longer than request")
    return timeouts


def _route_status(doc: Fields, parent_group: str) -> RouteStatus:
    status = doc.child("status", None)
    if status is None:
        return RouteStatus()
    return RouteStatus(
        tuple(
            RouteParentStatus(
                parent_ref=parse_parent_ref(parent.child("parentRef"), parent_group),
                controller_name=parent.string("controllerName"),
                conditions=parse_conditions(parent),
            )
            for parent in status.children("parents")
        )
    )
