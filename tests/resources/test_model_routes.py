"""HTTPRoute in both groups and GRPCRoute: matches, filters, backends, timeouts, parent status."""

import pytest

from tether.resources import kinds
from tether.resources.errors import PolicyRuleViolation, ValidationError
from tether.resources.model import parse
from tether.resources.references import ParentRef
from tether.resources.routes import (
    BackendRef,
    GRPCMethodMatch,
    HeaderModifier,
    HTTPRouteMatch,
    HTTPRouteTimeouts,
    PathMatch,
    PathModifier,
    RequestRedirect,
    ValueMatch,
)

POLICY_ROUTE = ("HTTPRoute.policy.linkerd.io", "web-api")
GATEWAY_ROUTE = ("HTTPRoute.gateway.networking.k8s.io", "web-canary")
GRPC_ROUTE = ("GRPCRoute.gateway.networking.k8s.io", "emoji-grpc")


def test_policy_http_route_on_a_server(manifest):
    route = parse(manifest(*POLICY_ROUTE))
    assert route.type is kinds.POLICY_HTTP_ROUTE
    [parent] = route.spec.parent_refs
    assert parent == ParentRef("policy.linkerd.io", "Server", "web-http")
    assert parent.targets(kinds.SERVER)
    [rule] = route.spec.rules
    assert rule.matches == (
        HTTPRouteMatch(path=PathMatch("PathPrefix", "/api/vote"), method="POST"),
        HTTPRouteMatch(path=PathMatch("Exact", "/api/list"), headers=(ValueMatch("x-canary", "true"),)),
    )
    [header_filter] = rule.filters
    assert header_filter.type == "RequestHeaderModifier"
    assert header_filter.request_header_modifier == HeaderModifier(set=(("l5d-route", "web-api"),), remove=("x-debug",))
    assert header_filter.raw["requestHeaderModifier"]["remove"] == ["x-debug"]
    assert rule.timeouts == HTTPRouteTimeouts(request=10.0, backend_request=2.0)
    assert route.status.parents == ()


def test_gateway_http_route_on_a_service_with_weighted_backends_and_status(manifest):
    route = parse(manifest(*GATEWAY_ROUTE))
    assert route.type is kinds.GATEWAY_HTTP_ROUTE
    [parent] = route.spec.parent_refs
    assert parent == ParentRef("", "Service", "web-svc", port=80)  # group "core" reads as the core group
    assert parent.targets(kinds.SERVICE)
    [rule] = route.spec.rules
    assert rule.matches == (HTTPRouteMatch(),)  # no matches: every path
    assert rule.backend_refs == (BackendRef("web-svc", port=80, weight=90), BackendRef("web-svc-canary", port=80, weight=10))
    assert all(b.targets(kinds.SERVICE) for b in rule.backend_refs)
    [status] = route.status.parents
    assert status.parent_ref == parent
    assert status.controller_name == "linkerd.io/policy-controller"
    assert status.accepted


def test_route_defaults_from_the_crd_schemas(manifest, edits):
    obj = edits.set(manifest(*GATEWAY_ROUTE), "spec", {"parentRefs": [{"name": "gw"}]})
    route = parse(obj)
    assert route.spec.parent_refs == (ParentRef("gateway.networking.k8s.io", "Gateway", "gw"),)
    assert route.spec.rules[0].matches == (HTTPRouteMatch(path=PathMatch("PathPrefix", "/")),)
    policy = parse(edits.set(manifest(*POLICY_ROUTE), "spec", {"parentRefs": [{"name": "web-http", "kind": "Server"}]}))
    assert policy.spec.parent_refs[0].targets(kinds.SERVER)  # group defaults to policy.linkerd.io
    obj = edits.set(manifest(*GATEWAY_ROUTE), "spec.rules[0].matches", [{"headers": [{"name": "x-user", "value": "a.*", "type": "RegularExpression"}]}])
    [match] = parse(obj).spec.rules[0].matches
    assert match == HTTPRouteMatch(path=PathMatch(), headers=(ValueMatch("x-user", "a.*", "RegularExpression"),))


def test_not_accepted_until_a_true_accepted_condition(manifest, edits):
    obj = edits.set(manifest(*GATEWAY_ROUTE), "status.parents[0].conditions[0].status", "False")
    assert not parse(obj).status.parents[0].accepted


def test_redirect_and_gateway_only_filters(manifest, edits, parse_error):
    redirect = {
        "type": "RequestRedirect",
        "requestRedirect": {"scheme": "https", "hostname": "web.example.com", "statusCode": 301, "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}},
    }
    mirror = {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}}
    rewrite = {"type": "URLRewrite", "urlRewrite": {"hostname": "web.internal"}}
    obj = edits.set(manifest(*GATEWAY_ROUTE), "spec.rules[0].filters", [redirect, mirror, rewrite])
    first, second, third = parse(obj).spec.rules[0].filters
    assert first.request_redirect == RequestRedirect("https", "web.example.com", PathModifier("ReplacePrefixMatch", "/v2"), None, 301)
    assert (second.type, second.raw) == ("RequestMirror", mirror)
    assert (third.type, third.raw) == ("URLRewrite", rewrite)
    without_settings = edits.set(obj, "spec.rules[0].filters", [{"type": "URLRewrite"}])
    assert parse_error(without_settings) == "HTTPRoute web-canary: spec.rules[0].filters[0].urlRewrite: required"
    policy = edits.set(manifest(*POLICY_ROUTE), "spec.rules[0].filters", [mirror])
    assert parse_error(policy) == (
        "HTTPRoute web-api: spec.rules[0].filters[0].type: unsupported value 'RequestMirror' "
        "(supported: RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect)"
    )


def test_egress_network_parents_need_a_port(manifest, edits, parse_error):
    parent = {"group": "policy.linkerd.io", "kind": "EgressNetwork", "name": "all-egress-traffic", "namespace": "linkerd-egress"}
    obj = edits.set(manifest(*POLICY_ROUTE), "spec.parentRefs", [parent])
    assert parse_error(obj) == "HTTPRoute web-api: spec.parentRefs[0].port: required for an EgressNetwork parent"
    assert parse(edits.set(obj, "spec.parentRefs[0].port", 443)).spec.parent_refs[0].targets(kinds.EGRESS_NETWORK)


@pytest.mark.parametrize(
    ("key", "path", "value", "expected"),
    [
        (POLICY_ROUTE, "spec.rules[0].matches[0].method", "FETCH", "spec.rules[0].matches[0].method: unsupported value 'FETCH' (supported: GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH)"),
        (POLICY_ROUTE, "spec.rules[0].matches[0].path.value", "api/vote", "spec.rules[0].matches[0].path.value: must be an absolute path starting with '/'"),
        (POLICY_ROUTE, "spec.rules[0].matches[0].path.type", "Prefix", "spec.rules[0].matches[0].path.type: unsupported value 'Prefix' (supported: Exact, PathPrefix, RegularExpression)"),
        (POLICY_ROUTE, "spec.rules[0].matches[1].headers[0].name", "x canary", "spec.rules[0].matches[1].headers[0].name: 'x canary' must be an HTTP header name"),
        (POLICY_ROUTE, "spec.rules[0].matches[1].headers[0].value", None, "spec.rules[0].matches[1].headers[0].value: required"),
        (POLICY_ROUTE, "spec.rules[0].filters[0].requestHeaderModifier", None, "spec.rules[0].filters[0].requestHeaderModifier: required"),
        (POLICY_ROUTE, "spec.rules[0].timeouts.request", "10", "spec.rules[0].timeouts.request: missing unit in duration '10'"),
        (POLICY_ROUTE, "spec.rules[0].timeouts.backendRequest", "11s", "spec.rules[0].timeouts.backendRequest: must not be longer than request"),
        (POLICY_ROUTE, "spec.parentRefs[0].name", None, "spec.parentRefs[0].name: required"),
        (POLICY_ROUTE, "spec.parentRefs[0].port", 0, "spec.parentRefs[0].port: must be between 1 and 65535"),
        (POLICY_ROUTE, "spec.hostnames", ["Web.Example.com"], "spec.hostnames[0]: 'Web.Example.com' must be a lower-case DNS name, optionally starting with '*.'"),
        (GATEWAY_ROUTE, "spec.rules[0].backendRefs[0].port", None, "spec.rules[0].backendRefs[0].port: required for a Service backend"),
        (GATEWAY_ROUTE, "spec.rules[0].backendRefs[0].weight", 1_000_001, "spec.rules[0].backendRefs[0].weight: must be between 0 and 1000000"),
        (GATEWAY_ROUTE, "spec.rules[0].filters", [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 307}}], "spec.rules[0].filters[0].requestRedirect.statusCode: unsupported value 307 (supported: 301, 302)"),
        (GATEWAY_ROUTE, "status.parents[0].controllerName", None, "status.parents[0].controllerName: required"),
        (GRPC_ROUTE, "spec.rules[0].matches[0].method", {"type": "Exact"}, "spec.rules[0].matches[0].method: at least one of service, method must be set"),
        (GRPC_ROUTE, "spec.rules[0].matches[0].method.service", "emojivoto/EmojiService", "spec.rules[0].matches[0].method.service: 'emojivoto/EmojiService' is not a gRPC service name"),
        (GRPC_ROUTE, "spec.rules[0].matches[0].method.method", "List All", "spec.rules[0].matches[0].method.method: 'List All' is not a gRPC method name"),
        (GRPC_ROUTE, "spec.rules[0].filters", [{"type": "RequestRedirect", "requestRedirect": {}}], "spec.rules[0].filters[0].type: unsupported value 'RequestRedirect' (supported: RequestHeaderModifier, ResponseHeaderModifier, RequestMirror, ExtensionRef)"),
    ],
)
def test_route_errors(manifest, edits, key, path, value, expected, parse_error):
    kind = key[0].split(".")[0]
    assert parse_error(edits.change(manifest(*key), path, value)) == f"{kind} {key[1]}: {expected}"


def test_zero_request_timeout_disables_the_backend_limit(manifest, edits):
    obj = edits.set(manifest(*POLICY_ROUTE), "spec.rules[0].timeouts", {"request": "0s", "backendRequest": "5s"})
    assert parse(obj).spec.rules[0].timeouts == HTTPRouteTimeouts(0.0, 5.0)


def test_grpc_route(manifest, edits):
    route = parse(manifest(*GRPC_ROUTE))
    [rule] = route.spec.rules
    assert rule.matches[0].method == GRPCMethodMatch("Exact", "emojivoto.v1.EmojiService", "ListAll")
    assert rule.backend_refs == (BackendRef("emoji-svc", port=8080),)
    assert route.spec.parent_refs[0].targets(kinds.SERVICE)
    anything = parse(edits.delete(manifest(*GRPC_ROUTE), "spec.rules[0].matches")).spec.rules[0]
    assert anything.matches == ()
    regex = edits.set(manifest(*GRPC_ROUTE), "spec.rules[0].matches[0].method", {"type": "RegularExpression", "service": "emojivoto\\..*"})
    assert parse(regex).spec.rules[0].matches[0].method.service == "emojivoto\\..*"


TLS_ROUTE = ("TLSRoute.gateway.networking.k8s.io", "tls-egress")
TCP_ROUTE = ("TCPRoute.gateway.networking.k8s.io", "db-split")


def test_tls_route_on_an_egress_network_with_sni_hostnames(manifest):
    route = parse(manifest(*TLS_ROUTE))
    assert route.type is kinds.TLS_ROUTE
    [parent] = route.spec.parent_refs
    assert parent == ParentRef("policy.linkerd.io", "EgressNetwork", "all-egress-traffic", port=443)
    assert route.spec.hostnames == ("httpbin.org", "*.example.com")
    [rule] = route.spec.rules
    [backend] = rule.backend_refs
    assert backend.targets(kinds.EGRESS_NETWORK) and backend.weight == 1


def test_tcp_route_splits_between_service_backends(manifest):
    route = parse(manifest(*TCP_ROUTE))
    assert route.type is kinds.TCP_ROUTE
    assert route.spec.parent_refs == (ParentRef("", "Service", "db", port=5432),)
    [rule] = route.spec.rules
    assert rule.backend_refs == (BackendRef("db-primary", port=5432, weight=9),
                                 BackendRef("db-replica", port=5432, weight=1))


@pytest.mark.parametrize("key", [TLS_ROUTE, TCP_ROUTE], ids=lambda k: k[0].partition(".")[0])
def test_stream_routes_take_exactly_one_rule_as_linkerd(manifest, edits, key):
    kind = key[0].partition(".")[0]
    for rules in ([], [{}, {}]):
        with pytest.raises(PolicyRuleViolation) as info:
            parse(edits.set(manifest(*key), "spec.rules", rules))
        assert str(info.value) == f"{kind} {key[1]}: spec.rules: {kind} supports a single rule only (Linkerd), " \
                                  f"got {len(rules)}"
    with pytest.raises(ValidationError, match="spec.rules: required"):
        parse(edits.delete(manifest(*key), "spec.rules"))


@pytest.mark.parametrize("key", [TLS_ROUTE, TCP_ROUTE], ids=lambda k: k[0].partition(".")[0])
def test_stream_route_errors_name_the_field(manifest, edits, key, parse_error):
    kind = key[0].partition(".")[0]
    no_port = edits.delete(manifest(*key), "spec.parentRefs[0].port") if key is TLS_ROUTE else edits.set(
        manifest(*key), "spec.parentRefs", [{"name": "n", "kind": "EgressNetwork", "group": "policy.linkerd.io"}])
    with pytest.raises(PolicyRuleViolation, match=r"spec.parentRefs\[0\].port: required for an EgressNetwork parent"):
        parse(no_port)
    service_backend = edits.set(manifest(*key), "spec.rules[0].backendRefs", [{"name": "svc"}])
    assert parse_error(service_backend) == f"{kind} {key[1]}: spec.rules[0].backendRefs[0].port: " \
                                           "required for a Service backend"
    filtered = edits.set(manifest(*key), "spec.rules[0].backendRefs[0].filters",
                         [{"type": "RequestHeaderModifier", "requestHeaderModifier": {}}])
    assert "spec.rules[0].backendRefs[0].filters[0].type" in parse_error(filtered)
    if key is TLS_ROUTE:
        assert "spec.hostnames[0]" in parse_error(edits.set(manifest(*key), "spec.hostnames", ["Not A Host"]))
