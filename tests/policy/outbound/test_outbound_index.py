"""The outbound index and translator, pure: resources in through ResourceEvents, OutboundPolicy messages out."""

from __future__ import annotations

import pytest
from outbound_helpers import (
    CONFIG,
    EGRESS_NS,
    NS,
    backend,
    egress_network,
    feed,
    grpc_route,
    http_route,
    namespace,
    remove,
    service,
    stream_route,
)

from tether.api import outbound_pb2 as pb
from tether.policy.outbound import OutboundIndex
from tether.policy.outbound.client import describe, policy_dict
from tether.policy.outbound.annotations import AnnotationError, parse_duration, parse_failure_accrual
from tether.policy.outbound.index import (
    AddressTarget,
    EgressFallback,
    InvalidTarget,
    ServiceTarget,
    TargetNotFound,
    UndefinedPort,
)
from tether.policy.outbound.translator import encode

WEB = "web.emojivoto.svc.cluster.local:80"


def policy_for(index: OutboundIndex, authority: str = WEB, source_ns: str = NS) -> pb.OutboundPolicy:
    target = index.service_target(authority, source_ns)
    return encode(target, index.state(target), CONFIG)


def policy_at(index: OutboundIndex, ip: str, port: int, source_ns: str = NS) -> pb.OutboundPolicy:
    target = index.address_target(ip, port, source_ns)
    return encode(target, index.state(target), CONFIG)


def http_routes(policy: pb.OutboundPolicy) -> list[pb.HttpRoute]:
    kind = policy.protocol.WhichOneof("kind")
    if kind == "detect":
        assert list(policy.protocol.detect.http1.routes) == list(policy.protocol.detect.http2.routes)
        return list(policy.protocol.detect.http1.routes)
    return list(getattr(policy.protocol, kind).routes)


def route_names(policy: pb.OutboundPolicy) -> list[str]:
    return [r.metadata.resource.name or f"default:{r.metadata.default}" for r in http_routes(policy)]


@pytest.fixture
def index() -> OutboundIndex:
    idx = OutboundIndex(CONFIG)
    feed(idx, service("web", "10.96.0.10"), service("api", "10.96.0.11"), service("api-v2", "10.96.0.12"))
    return idx


# -- targets -------------------------------------------------------------------------------------------


def test_a_service_without_routes_gets_the_default_route_the_proxy_replaces_with_its_profile(index) -> None:
    policy = policy_for(index)
    assert policy.metadata.resource.kind == "Service" and policy.metadata.resource.port == 80
    detect = policy.protocol.detect
    assert detect.timeout.seconds == 10
    (route,) = http_routes(policy)
    assert route.metadata.default == "http"
    (rule,) = route.rules
    assert rule.matches[0].path.prefix == "/"
    balancer = rule.backends.first_available.backends[0].backend.balancer
    assert balancer.discovery.dst.path == WEB and balancer.HasField("peak_ewma")
    assert detect.opaque.routes[0].metadata.default == "opaq"
    assert not detect.http1.HasField("failure_accrual")


@pytest.mark.parametrize(
    ("authority", "error"),
    [
        ("web.emojivoto.svc.cluster.local", None),  # port 80
        ("web.emojivoto.svc", None),
        ("web.emojivoto.svc.cluster.local.:80", None),
        ("web.emojivoto.svc.cluster.local:0", InvalidTarget),
        ("web.emojivoto.svc.cluster.local:http", InvalidTarget),
        (":80", InvalidTarget),
        ("web.emojivoto:80", TargetNotFound),
        ("example.com:443", TargetNotFound),
        ("web.emojivoto.pod.cluster.local:80", TargetNotFound),
    ],
)
def test_authorities(index, authority: str, error: type[Exception] | None) -> None:
    if error is None:
        assert index.service_target(authority, NS) == ServiceTarget(NS, "web", 80, NS)
    else:
        with pytest.raises(error):
            index.service_target(authority, NS)


def test_a_cluster_ip_resolves_to_its_service_and_an_undefined_port_is_forbidden(index) -> None:
    assert policy_at(index, "10.96.0.10", 80).metadata.resource.name == "web"
    target = index.address_target("10.96.0.10", 8080, NS)
    assert index.state(target) == UndefinedPort(NS, "web", 8080)
    policy = encode(target, index.state(target), CONFIG)
    (route,) = policy.protocol.opaque.routes
    assert route.metadata.default == "undefined-port"
    assert route.rules[0].backends.HasField("empty")
    assert route.rules[0].filters[0].HasField("forbidden")


def test_addresses_outside_the_cluster_fall_back_to_egress_and_unknown_ones_inside_are_not_found(index) -> None:
    target = index.address_target("93.184.216.34", 443, NS)
    assert index.state(target) == EgressFallback()
    policy = encode(target, index.state(target), CONFIG)
    assert policy.metadata.default == "egress-fallback"
    forward = policy.protocol.detect.opaque.routes[0].rules[0].backends.first_available.backends[0].backend.forward
    assert forward.addr.port == 443
    with pytest.raises(TargetNotFound):
        index.address_target("10.1.2.3", 80, NS)
    with pytest.raises(InvalidTarget):
        index.address_target("10.96.0.10", 0, NS)


# -- routes ----------------------------------------------------------------------------------------------


def test_producer_routes_apply_to_every_client_and_consumer_routes_to_their_namespace(index) -> None:
    feed(index, namespace("other"), namespace("third"))
    feed(index, http_route("producer", "web", [{"backendRefs": [backend("api")]}], created="2024-01-01T00:00:00Z"))
    feed(index, http_route("consumer", "web", [{"backendRefs": [backend("api-v2")]}], ns="other", parent_ns=NS,
                           created="2024-01-02T00:00:00Z"))
    assert route_names(policy_for(index, source_ns=NS)) == ["producer"]
    assert route_names(policy_for(index, source_ns="third")) == ["producer"]
    assert route_names(policy_for(index, source_ns="other")) == ["producer", "consumer"]


def test_a_route_without_a_parent_namespace_in_another_namespace_attaches_to_nothing_here(index) -> None:
    feed(index, http_route("stray", "web", [{}], ns="other"))  # parent is other/web, which does not exist
    assert route_names(policy_for(index, source_ns="other")) == ["default:http"]


def test_routes_order_by_creation_time_then_name_and_a_port_scoped_route_only_on_its_port(index) -> None:
    feed(index, service("multi", "10.96.0.20", [{"name": "a", "port": 80}, {"name": "b", "port": 81}]))
    feed(index,
         http_route("b-late", "multi", [{}], created="2024-02-01T00:00:00Z", port=None),
         http_route("a-early", "multi", [{}], created="2024-01-01T00:00:00Z"),
         http_route("z-same", "multi", [{}], created="2024-01-01T00:00:00Z"),
         http_route("untimed", "multi", [{}], port=None))
    assert route_names(policy_for(index, "multi.emojivoto.svc.cluster.local:80")) == [
        "a-early", "z-same", "b-late", "untimed"]
    assert route_names(policy_for(index, "multi.emojivoto.svc.cluster.local:81")) == ["b-late", "untimed"]


def test_rule_matches_filters_and_weighted_backends(index) -> None:
    rule = {
        "matches": [{"path": {"type": "Exact", "value": "/api/vote"}, "method": "POST",
                     "headers": [{"name": "x-canary", "value": "1"},
                                 {"name": "x-user", "value": "a.*", "type": "RegularExpression"}],
                     "queryParams": [{"name": "debug", "value": "true"}]}],
        "filters": [
            {"type": "RequestHeaderModifier", "requestHeaderModifier": {
                "set": [{"name": "x-set", "value": "s"}], "add": [{"name": "x-add", "value": "a"}],
                "remove": ["x-remove"]}},
            {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x-resp", "value": "r"}]}},
        ],
        "backendRefs": [backend("api", weight=90), backend("api-v2", weight=10)],
    }
    redirect = {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
                "filters": [{"type": "RequestRedirect", "requestRedirect": {
                    "scheme": "https", "hostname": "new.example.com", "port": 8443, "statusCode": 301,
                    "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}]}
    feed(index, http_route("split", "web", [rule, redirect], hostnames=["web.example.com", "*.example.com"]))
    (route,) = http_routes(policy_for(index))
    assert route.metadata.resource.group == "policy.linkerd.io" and route.metadata.resource.kind == "HTTPRoute"
    assert route.hosts[0].exact == "web.example.com"
    assert list(route.hosts[1].suffix.reverse_labels) == ["com", "example"]
    first, second = route.rules
    match = first.matches[0]
    assert match.path.exact == "/api/vote" and match.method.registered == 1  # POST
    assert match.headers[0].exact == b"1" and match.headers[1].regex == "a.*"
    assert match.query_params[0].exact == "true"
    req, resp = first.filters
    assert [h.name for h in req.request_header_modifier.set.headers] == ["x-set"]
    assert req.request_header_modifier.add.headers[0].value == b"a"
    assert list(req.request_header_modifier.remove) == ["x-remove"]
    assert resp.response_header_modifier.set.headers[0].name == "x-resp"
    weighted = first.backends.random_available.backends
    assert [(b.weight, b.backend.backend.balancer.discovery.dst.path) for b in weighted] == [
        (90, "api.emojivoto.svc.cluster.local:80"), (10, "api-v2.emojivoto.svc.cluster.local:80")]
    r = second.filters[0].redirect
    assert (r.scheme.registered, r.host, r.port, r.status, r.path.prefix) == (1, "new.example.com", 8443, 301, "/new")
    # No backendRefs: the traffic goes to the parent Service.
    assert second.backends.first_available.backends[0].backend.balancer.discovery.dst.path == WEB


def test_a_gateway_route_with_a_filter_linkerd_cannot_apply_is_ignored_and_reported(index) -> None:
    mirror = {"filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "api", "port": 80}}}]}
    feed(index, http_route("mirror", "web", [mirror], gateway=True))
    assert route_names(policy_for(index)) == ["default:http"]
    assert any("RequestMirror" in p.message and p.name == "mirror" for p in index.problems())


def test_timeouts_from_the_rule_the_route_and_the_service(index) -> None:
    feed(index, service("web", "10.96.0.10", annotations={"timeout.linkerd.io/response": "2s"}))
    feed(index,
         http_route("rule-timeouts", "web", [{"timeouts": {"request": "5s", "backendRequest": "1s"}},
                                             {"timeouts": {"request": "0s"}}],
                    created="2024-01-01T00:00:00Z"),
         http_route("annotated", "web", [{}], annotations={"timeout.linkerd.io/idle": "30s",
                                                           "timeout.linkerd.io/request": "7s"},
                    created="2024-01-02T00:00:00Z"))
    timed, annotated = http_routes(policy_for(index))
    with_request, disabled = timed.rules
    # backendRequest bounds the only attempt when nothing retries: the request timeout becomes 1s.
    assert with_request.timeouts.request.seconds == 1 and with_request.requestTimeout.seconds == 1
    # 0 disables the rule timeout; the Service's annotation fills in.
    assert not disabled.timeouts.HasField("request") and disabled.timeouts.response.seconds == 2
    assert annotated.rules[0].timeouts.idle.seconds == 30 and annotated.rules[0].timeouts.request.seconds == 7
    assert not annotated.rules[0].timeouts.HasField("response")


def test_retries_from_route_and_service_annotations(index) -> None:
    feed(index, service("web", "10.96.0.10", annotations={
        "retry.linkerd.io/http": "5xx,429,gateway-error,400-403", "retry.linkerd.io/limit": "3",
        "retry.linkerd.io/timeout": "500ms"}))
    feed(index, http_route("plain", "web", [{"timeouts": {"backendRequest": "2s"}}], created="2024-01-01T00:00:00Z"),
         http_route("own", "web", [{}], annotations={"retry.linkerd.io/http": "503"}, created="2024-01-02T00:00:00Z"))
    plain, own = http_routes(policy_for(index))
    retry = plain.rules[0].retry
    assert retry.max_retries == 3 and retry.timeout.nanos == 500_000_000
    assert [(r.start, r.end) for r in retry.conditions.status_ranges] == [(500, 599), (429, 429), (502, 504),
                                                                          (400, 403)]
    assert retry.backoff.min_backoff.nanos == 25_000_000 and retry.max_request_bytes == 65536
    assert not plain.rules[0].timeouts.HasField("request")  # backendRequest went nowhere: the retry has a timeout
    own_retry = own.rules[0].retry
    assert own_retry.max_retries == 1 and [(r.start, r.end) for r in own_retry.conditions.status_ranges] == [
        (503, 503)]


def test_backend_request_becomes_the_retry_timeout_when_the_rule_retries(index) -> None:
    feed(index, http_route("r", "web", [{"timeouts": {"backendRequest": "2s", "request": "10s"}}],
                           annotations={"retry.linkerd.io/http": "5xx"}))
    (rule,) = http_routes(policy_for(index))[0].rules
    assert rule.retry.timeout.seconds == 2 and rule.timeouts.request.seconds == 10


def test_a_bad_annotation_drops_only_its_group_and_is_reported(index) -> None:
    feed(index, service("web", "10.96.0.10", annotations={
        "retry.linkerd.io/http": "6xx", "timeout.linkerd.io/request": "1.5s",
        "balancer.linkerd.io/failure-accrual": "consecutive"}))
    policy = policy_for(index)
    rule = http_routes(policy)[0].rules[0]
    assert not rule.HasField("retry") and not rule.timeouts.HasField("request")
    assert policy.protocol.detect.http1.failure_accrual.HasField("consecutive_failures")
    keys = {p.message.split(":")[0] for p in index.problems()}
    assert keys == {"annotation retry.linkerd.io/http", "annotation timeout.linkerd.io/request"}


def test_failure_accrual_annotations(index) -> None:
    feed(index, service("web", "10.96.0.10", annotations={
        "balancer.linkerd.io/failure-accrual": "consecutive",
        "balancer.linkerd.io/failure-accrual-consecutive-max-failures": "3",
        "balancer.linkerd.io/failure-accrual-consecutive-min-penalty": "2s",
        "balancer.linkerd.io/failure-accrual-consecutive-max-penalty": "1m",
        "balancer.linkerd.io/failure-accrual-consecutive-jitter-ratio": "1.5"}))
    accrual = policy_for(index).protocol.detect.http1.failure_accrual.consecutive_failures
    assert accrual.max_failures == 3 and accrual.backoff.min_backoff.seconds == 2
    assert accrual.backoff.max_backoff.seconds == 60 and accrual.backoff.jitter_ratio == 1.5
    feed(index, service("web", "10.96.0.10", annotations={
        "balancer.linkerd.io/failure-accrual": "unified",
        "balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold": "0.9",
        "balancer.alpha.linkerd.io/failure-accrual-success-rate-window": "30s",
        "balancer.alpha.linkerd.io/failure-accrual-honor-retry-after": "true",
        "balancer.alpha.linkerd.io/penalize-failures": "true"}))
    policy = policy_for(index)
    unified = policy.protocol.detect.http2.failure_accrual.unified
    assert unified.success_rate_threshold == pytest.approx(0.9) and unified.decay.seconds == 30
    assert unified.min_requests == 5 and unified.max_consecutive_failures == 7
    assert unified.backoff.respect_retry_after_hint
    penalty = http_routes(policy)[0].rules[0].backends.first_available.backends[0].backend.balancer.penalty_peak_ewma
    assert penalty.penalty.seconds == 5 and penalty.max_retry_after.seconds == 300


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"balancer.linkerd.io/failure-accrual": "sometimes"}, "unsupported failure accrual mode"),
        ({"balancer.linkerd.io/failure-accrual": "consecutive",
          "balancer.linkerd.io/failure-accrual-consecutive-min-penalty": "2m",
          "balancer.linkerd.io/failure-accrual-consecutive-max-penalty": "1m"}, "exceeds max-penalty"),
        ({"balancer.linkerd.io/failure-accrual": "unified",
          "balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold": "1.5"}, "outside 0.0-1.0"),
        ({"balancer.linkerd.io/failure-accrual": "unified",
          "balancer.alpha.linkerd.io/failure-accrual-success-rate-window": "5ms"}, "at least 10ms"),
    ],
)
def test_failure_accrual_refusals_name_the_annotation(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(AnnotationError, match=message):
        parse_failure_accrual(annotations)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("250ms", 0.25), ("10s", 10.0), ("2m", 120.0), ("1h", 3600.0), ("1d", 86400.0), ("1.5s", None),
     ("5", None), ("-1s", None), ("10us", None), ("", None)],
)
def test_annotation_durations_are_whole_numbers_with_a_unit(text: str, seconds: float | None) -> None:
    if seconds is None:
        with pytest.raises(ValueError):
            parse_duration(text)
    else:
        assert parse_duration(text) == seconds


# -- protocols ---------------------------------------------------------------------------------------------


def test_app_protocols_and_opaque_ports(index) -> None:
    feed(index, service("svc", "10.96.0.30", [
        {"name": "h1", "port": 80, "appProtocol": "http"},
        {"name": "h2", "port": 81, "appProtocol": "kubernetes.io/h2c"},
        {"name": "tcp", "port": 82, "appProtocol": "linkerd.io/tcp"},
        {"name": "odd", "port": 83, "appProtocol": "example.com/custom"},
        {"name": "mysql", "port": 3306},
        {"name": "plain", "port": 84}]))

    def kind(port: int) -> str:
        return policy_for(index, f"svc.emojivoto.svc.cluster.local:{port}").protocol.WhichOneof("kind")

    assert [kind(p) for p in (80, 81, 82, 83, 3306, 84)] == ["http1", "http2", "opaque", "opaque", "opaque",
                                                              "detect"]
    # The namespace's opaque ports apply to a Service without its own annotation.
    feed(index, namespace(NS, {"config.linkerd.io/opaque-ports": "plain"}))
    assert kind(84) == "opaque" and kind(3306) == "detect"
    feed(index, service("svc", "10.96.0.30", [{"name": "plain", "port": 84}],
                        annotations={"config.linkerd.io/opaque-ports": "9999"}))
    assert kind(84) == "detect"


def test_grpc_routes_win_and_carry_rpc_matches_and_grpc_retries(index) -> None:
    feed(index, service("web", "10.96.0.10", [{"name": "grpc", "port": 80, "appProtocol": "kubernetes.io/h2c"}],
                        annotations={"retry.linkerd.io/grpc": "unavailable,deadline-exceeded"}))
    feed(index, http_route("http", "web", [{}]))
    feed(index, grpc_route("rpc", "web", [{
        "matches": [{"method": {"service": "emojivoto.v1.VotingService", "method": "VoteDoughnut"},
                     "headers": [{"name": "x-tenant", "value": "a"}]}],
        "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x", "value": "y"}]}}],
        "backendRefs": [backend("api", weight=1)]}]))
    policy = policy_for(index)
    (route,) = policy.protocol.grpc.routes
    assert route.metadata.resource.kind == "GRPCRoute"
    (rule,) = route.rules
    assert rule.matches[0].rpc.service == "emojivoto.v1.VotingService"
    assert rule.matches[0].rpc.method == "VoteDoughnut" and rule.matches[0].headers[0].exact == b"a"
    assert rule.filters[0].request_header_modifier.set.headers[0].name == "x"
    assert rule.retry.conditions.unavailable and rule.retry.conditions.deadine_exceeded
    assert not rule.retry.conditions.internal


# -- TLSRoute and TCPRoute ----------------------------------------------------------------------------------


def weighted(rule) -> list[tuple[str, int]]:
    return [(b.backend.backend.metadata.resource.name, b.weight) for b in rule.backends.random_available.backends]


def test_the_first_tcp_route_takes_an_opaque_port_and_splits_by_weight(index) -> None:
    feed(index, service("db", "10.96.0.40", [{"name": "pg", "port": 5432, "appProtocol": "linkerd.io/tcp"}]))
    db = "db.emojivoto.svc.cluster.local:5432"
    assert policy_for(index, db).protocol.opaque.routes[0].metadata.default == "opaq"
    first = stream_route("TCPRoute", "split", "db", [backend("api", 5432, 9), backend("api-v2", 5432, 1)], port=5432,
                         created="2024-01-01T00:00:00Z")
    later = stream_route("TCPRoute", "later", "db", [backend("web", 5432)], port=5432, created="2024-02-01T00:00:00Z")
    feed(index, later, first)
    policy = policy_for(index, db)
    (route,) = policy.protocol.opaque.routes  # Linkerd's MAXIMUM_ALLOWED_TCP_ROUTES: the oldest only
    assert (route.metadata.resource.kind, route.metadata.resource.name) == ("TCPRoute", "split")
    (rule,) = route.rules
    assert weighted(rule) == [("api", 9), ("api-v2", 1)] and not rule.filters
    balancer = rule.backends.random_available.backends[0].backend.backend.balancer
    assert balancer.discovery.dst.path == "api.emojivoto.svc.cluster.local:5432" and balancer.HasField("peak_ewma")
    remove(index, first)
    assert policy_for(index, db).protocol.opaque.routes[0].metadata.resource.name == "later"


def test_detect_ports_take_grpc_then_http_then_tls_then_tcp_routes(index) -> None:
    def kinds_served() -> tuple[str, list[str]]:
        policy = policy_for(index)
        kind = policy.protocol.WhichOneof("kind")
        section = policy.protocol.detect.http1 if kind == "detect" else getattr(policy.protocol, kind)
        return kind, [r.metadata.resource.kind or r.metadata.default for r in section.routes]

    assert kinds_served() == ("detect", ["http"])
    feed(index, stream_route("TCPRoute", "tcp", "web", [backend("api")]))
    assert kinds_served() == ("opaque", ["TCPRoute"])
    feed(index, stream_route("TLSRoute", "tls", "web", [backend("api")], hostnames=["web.example.com"]))
    assert kinds_served() == ("tls", ["TLSRoute"])
    feed(index, http_route("http", "web", [{}], gateway=True))
    assert kinds_served() == ("detect", ["HTTPRoute"])
    feed(index, grpc_route("rpc", "web", [{}]))
    assert kinds_served() == ("grpc", ["GRPCRoute"])
    # An HTTP port ignores TLS and TCP routes, as Linkerd's http1/http2 branches do.
    feed(index, service("h1", "10.96.0.41", [{"name": "h", "port": 80, "appProtocol": "http"}]),
         stream_route("TLSRoute", "h1-tls", "h1", [backend("api")]))
    h1 = policy_for(index, "h1.emojivoto.svc.cluster.local:80")
    assert h1.protocol.http1.routes[0].metadata.default == "http"


def test_tls_routes_match_sni_and_carry_invalid_backends_as_filters(index) -> None:
    feed(index, stream_route("TLSRoute", "b-names", "web", [backend("api", 443, 3), backend("ghost", 443, 1),
                                                            {"name": "x", "kind": "Pod", "group": "core"}],
                             hostnames=["web.example.com", "*.example.org"], created="2024-01-02T00:00:00Z"),
         stream_route("TLSRoute", "a-any", "web", [], created="2024-01-02T00:00:00Z"))
    policy = policy_for(index)
    routes = policy.protocol.tls.routes
    assert [r.metadata.resource.name for r in routes] == ["a-any", "b-names"]  # same age: by name
    any_name, names = routes
    assert not any_name.snis
    default = any_name.rules[0].backends.first_available.backends[0].backend  # no backendRefs: the parent
    assert default.balancer.discovery.dst.path == WEB
    assert [m.exact for m in names.snis] == ["web.example.com", ""]
    assert list(names.snis[1].suffix.reverse_labels) == ["org", "example"]
    good, missing, unsupported = names.rules[0].backends.random_available.backends
    assert good.weight == 3 and not good.backend.filters and good.backend.backend.HasField("balancer")
    assert missing.backend.filters[0].invalid.message == "Service not found ghost"
    assert not missing.backend.backend.WhichOneof("kind")
    assert unsupported.backend.filters[0].invalid.message == "unsupported backend type core Pod"
    assert any("tls route" in line and "*.example.org" in line for line in describe(policy))


def test_tls_and_tcp_routes_on_an_egress_network(index) -> None:
    feed(index, egress_network("ext", "Deny", [{"cidr": "1.2.3.0/24"}]))
    own = {"name": "ext", "kind": "EgressNetwork", "group": "policy.linkerd.io"}
    feed(index, stream_route("TLSRoute", "allow-api", "ext", [own], ns=EGRESS_NS, port=443, parent_kind="EgressNetwork",
                             hostnames=["api.example.com"]))
    routes = policy_at(index, "1.2.3.4", 443).protocol.tls.routes
    assert [r.metadata.resource.name or r.metadata.default for r in routes] == ["allow-api", "tls-egress-deny"]
    forward = routes[0].rules[0].backends.random_available.backends[0].backend.backend.forward
    assert forward.addr.port == 443
    assert routes[1].rules[0].filters[0].HasField("forbidden")
    # A TCPRoute is sent alone: Linkerd adds the EgressNetwork's route only to an empty list.
    feed(index, stream_route("TCPRoute", "db", "ext", [own], ns=EGRESS_NS, port=5432, parent_kind="EgressNetwork"))
    routes = policy_at(index, "1.2.3.4", 5432).protocol.opaque.routes
    assert [r.metadata.resource.name for r in routes] == ["db"]


# -- egress -------------------------------------------------------------------------------------------------


def test_egress_networks_allow_deny_most_specific_and_client_namespace_first(index) -> None:
    feed(index, egress_network("all-external", "Allow"),
         egress_network("blocked", "Deny", [{"cidr": "93.184.0.0/16", "except": ["93.184.1.0/24"]}]))
    target = index.address_target("93.184.216.34", 80, NS)
    policy = encode(target, index.state(target), CONFIG)
    assert policy.metadata.resource.kind == "EgressNetwork" and policy.metadata.resource.name == "blocked"
    http = http_routes(policy)
    assert http[-1].metadata.default == "http-egress-deny"
    assert http[-1].rules[0].filters[0].failure_injector.status == 403
    assert policy.protocol.detect.opaque.routes[0].rules[0].filters[0].HasField("forbidden")
    # The except hole and everything else outside the cluster: the default EgressNetwork (cluster networks out).
    assert policy_at(index, "93.184.1.1", 80).metadata.resource.name == "all-external"
    allow = policy_at(index, "8.8.8.8", 53)
    assert http_routes(allow)[-1].metadata.default == "http-egress-allow"
    fwd = http_routes(allow)[-1].rules[0].backends.first_available.backends[0].backend.forward
    assert fwd.addr.port == 53
    # In-cluster addresses are not covered by a network without `networks`.
    with pytest.raises(TargetNotFound):
        index.address_target("10.1.1.1", 80, NS)
    # A namespace with EgressNetworks of its own uses only those.
    feed(index, egress_network("mine", "Allow", [{"cidr": "8.8.8.0/24"}], ns=NS))
    assert policy_at(index, "8.8.8.8", 53).metadata.resource.name == "mine"
    assert index.state(AddressTarget("93.184.216.34", 80, NS)) == EgressFallback()
    assert policy_at(index, "93.184.216.34", 80, source_ns="other").metadata.resource.name == "blocked"


def test_egress_ties_go_to_the_oldest_then_by_name(index) -> None:
    feed(index, egress_network("b", "Allow", [{"cidr": "1.2.3.0/24"}], created="2024-01-01T00:00:00Z"),
         egress_network("a", "Deny", [{"cidr": "1.2.3.0/24"}], created="2024-02-01T00:00:00Z"),
         egress_network("c", "Deny", [{"cidr": "1.2.3.0/24"}], created="2024-01-01T00:00:00Z"))
    assert policy_at(index, "1.2.3.4", 443).metadata.resource.name == "b"


def test_routes_on_an_egress_network(index) -> None:
    feed(index, egress_network("ext", "Deny", [{"cidr": "1.2.3.0/24"}], ns=EGRESS_NS))
    feed(index, http_route("allow-get", "ext", [{"matches": [{"method": "GET"}],
                                                 "backendRefs": [{"name": "ext", "kind": "EgressNetwork",
                                                                  "group": "policy.linkerd.io"}]}],
                           ns=EGRESS_NS, port=443, parent_kind="EgressNetwork"))
    routes = http_routes(policy_at(index, "1.2.3.4", 443))
    assert [r.metadata.resource.name or r.metadata.default for r in routes] == ["allow-get", "http-egress-deny"]
    forward = routes[0].rules[0].backends.random_available.backends[0].backend.backend.forward
    assert forward.addr.port == 443
    # On another port the route does not apply.
    assert [r.metadata.default for r in http_routes(policy_at(index, "1.2.3.4", 80))] == ["http-egress-deny"]


# -- dangling references ------------------------------------------------------------------------------------


def test_dangling_references_grant_nothing_and_never_crash(index) -> None:
    feed(index, http_route("to-nowhere", "ghost", [{"backendRefs": [backend("api")]}]))
    feed(index, http_route("missing-backend", "web", [{"backendRefs": [backend("ghost", weight=3),
                                                                       backend("api", weight=1)]}]))
    # A route whose parent Service does not exist changes no policy; a named lookup still answers.
    assert route_names(policy_for(index, "ghost.emojivoto.svc.cluster.local:80")) == ["to-nowhere"]
    ghost_backend, api_backend = http_routes(policy_for(index))[0].rules[0].backends.random_available.backends
    assert ghost_backend.weight == 3 and not ghost_backend.backend.backend.HasField("balancer")
    assert ghost_backend.backend.filters[0].failure_injector.status == 500
    assert api_backend.backend.backend.balancer.discovery.dst.path.startswith("api.")
    # The backend Service appears: the route's backend becomes real.
    feed(index, service("ghost", "10.96.0.40"))
    ghost_backend = http_routes(policy_for(index))[0].rules[0].backends.random_available.backends[0]
    assert ghost_backend.backend.backend.HasField("balancer") and not ghost_backend.backend.filters


# -- watches ----------------------------------------------------------------------------------------------------


def test_watchers_hear_only_real_changes_once_per_flush() -> None:
    calls: list[object] = []
    scheduled: list = []
    index = OutboundIndex(CONFIG, schedule=scheduled.append)
    feed(index, service("web", "10.96.0.10"))
    target = index.service_target(WEB, NS)
    first = index.subscribe(target, lambda state, at: calls.append(state))
    feed(index, http_route("a", "web", [{}]), http_route("b", "web", [{}]))
    assert len(scheduled) == 1 and not calls  # coalesced: one flush for the burst
    scheduled.pop()()
    assert len(calls) == 1 and calls[0] != first
    feed(index, http_route("a", "web", [{}]))  # the same object again (a relist)
    scheduled.pop()()
    assert len(calls) == 1
    remove(index, http_route("a", "web", [{}]))
    scheduled.pop()()
    assert len(calls) == 2 and [r.name for r in calls[1].http_routes] == ["b"]
    index.unsubscribe(target, calls.append)  # not subscribed: no effect
    assert index.watched_targets == 1


def test_the_cli_summary_reads_every_kind_of_policy(index) -> None:
    feed(index, service("rpc", "10.96.0.60", [{"name": "grpc", "port": 80, "appProtocol": "kubernetes.io/h2c"}],
                        annotations={"retry.linkerd.io/grpc": "unavailable",
                                     "balancer.linkerd.io/failure-accrual": "consecutive"}),
         grpc_route("rpc", "rpc", [{"matches": [{"method": {"service": "a.B", "method": "C"}}]}]),
         egress_network("deny", "Deny", [{"cidr": "1.2.3.0/24"}]),
         http_route("get", "web", [{"matches": [{"method": "GET", "path": {"type": "Exact", "value": "/x"}}]}],
                    annotations={"retry.linkerd.io/http": "5xx"}))
    grpc_lines = describe(policy_for(index, "rpc.emojivoto.svc.cluster.local:80"))
    assert "protocol: grpc" in grpc_lines and "    match:    a.B/C" in grpc_lines
    assert any(line.startswith("failure accrual: consecutive_failures") for line in grpc_lines)
    assert any("retry:    up to 1 on unavailable" in line for line in grpc_lines)
    http_lines = describe(policy_for(index))
    assert "    match:    GET exact /x" in http_lines and "    retry:    up to 1 on 500-599" in http_lines
    deny = describe(policy_at(index, "1.2.3.4", 443))
    assert "target:   egressnetwork/linkerd-egress/deny:443" in deny
    assert "    backends: 1.2.3.4:443 (forward) (forbidden)" in deny
    assert "protocol: opaque" in describe(policy_at(index, "10.96.0.10", 81))
    fallback = policy_at(index, "93.184.216.34", 80)
    assert describe(fallback)[0] == "target:   default:egress-fallback"
    assert policy_dict(fallback)["metadata"] == {"default": "egress-fallback"}


def test_a_change_recomputes_only_the_watches_it_can_reach(index, monkeypatch) -> None:
    """Each kind of change recomputes exactly the watches whose policy it can alter (``Reach``): not its
    namespace's others, and no address a Service's cluster IP or another namespace's networks decide."""
    feed(index, namespace(NS), namespace("shop"), service("cart", "10.96.1.1", ns="shop"),
         http_route("cross", "web", [{"backendRefs": [backend("pay", namespace="shop")]}]))
    heard: dict[str, list[object]] = {}
    targets = {
        "web": index.service_target(WEB, NS),
        "web from shop": index.service_target(WEB, "shop"),
        "api": index.service_target("api.emojivoto.svc.cluster.local:80", NS),
        "cart": index.service_target("cart.shop.svc.cluster.local:80", "shop"),
        "web's ip": index.address_target("10.96.0.10", 80, NS),
        "egress": index.address_target("8.8.8.8", 53, NS),
        "egress from shop": index.address_target("8.8.8.8", 53, "shop"),
    }
    names = {target: name for name, target in targets.items()}
    for name, target in targets.items():
        index.subscribe(target, lambda state, at, name=name: heard.setdefault(name, []).append(state))
    resolved: list[str] = []
    real = index._resolve
    monkeypatch.setattr(index, "_resolve", lambda target: resolved.append(names[target]) or real(target))

    def change(*objs: dict, gone: dict | None = None) -> set[str]:
        resolved.clear()
        heard.clear()
        feed(index, *objs)
        if gone is not None:
            remove(index, gone)
        assert len(resolved) == len(set(resolved))  # once per flush
        return set(resolved)

    assert change(namespace("unrelated")) == set()
    # A Namespace's annotations: its Services' watches (their opaque ports), whoever the client.
    assert change(namespace(NS, {"config.linkerd.io/opaque-ports": "80"})) == {"web", "web from shop", "api",
                                                                               "web's ip"}
    assert set(heard) == {"web", "web from shop", "api", "web's ip"}
    # A Service: its own watches (by name and by cluster IP), not its namespace's other Services.
    assert change(service("api", "10.96.0.11", annotations={"timeout.linkerd.io/idle": "1s"})) == {"api"}
    assert set(heard) == {"api"}
    # A Service named as a backend: the watches whose routes have it, not the Services of its namespace.
    assert change(service("pay", "10.96.1.2", ns="shop")) == {"web", "web from shop", "web's ip"}
    backend_ = heard["web"][-1].http_routes[0].rules[0].backends[0]
    assert backend_.message is None and backend_.authority == "pay.shop.svc.cluster.local:80"
    # A consumer route: only its namespace's clients of the parent.
    consumer = http_route("shop-view", "web", [{}], ns="shop", parent_ns=NS)
    assert change(consumer) == {"web from shop"}
    assert [r.name for r in heard["web from shop"][-1].http_routes] == ["cross", "shop-view"]
    # A producer route: every client of its parent, no other Service.
    assert change(http_route("api-route", "api", [{}])) == {"api"}
    assert change(gone=consumer) == {"web from shop"}
    # An EgressNetwork of the global namespace: the addresses no cluster IP takes, of clients whose namespace
    # has none of its own; one of "shop": shop's clients only, which then no longer hear the global ones.
    assert change(egress_network("global", "Allow", [{"cidr": "8.8.8.0/24"}])) == {"egress", "egress from shop"}
    assert heard["egress"][-1].parent.name == "global"
    assert change(egress_network("shops", "Deny", [{"cidr": "8.8.0.0/16"}], ns="shop")) == {"egress from shop"}
    assert heard["egress from shop"][-1].parent.name == "shops"
    assert change(egress_network("global", "Deny", [{"cidr": "8.8.8.0/24"}])) == {"egress"}
    # A Service taking an address: the watches on that IP, before and after.
    assert change(service("dns", "10.96.9.9", ns="shop"),
                  service("cart", "10.96.0.10", ns="shop")) == {"cart", "web's ip"}
    assert "web's ip" not in heard  # web/emojivoto still sorts first of the two Services on that IP
    assert change(service("web", "10.96.0.20")) == {"web", "web from shop", "web's ip"}
    assert heard["web's ip"][-1].parent.name == "cart"
