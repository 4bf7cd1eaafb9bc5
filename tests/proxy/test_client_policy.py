"""Outbound client policy in the proxy, without sockets: the policy controller's own OutboundPolicy messages
(its index and encoder, fed Linkerd-shaped resources) translated by the proxy, then each request's decision
(route, filters, backend) and the router that follows it."""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "policy" / "outbound"))
from outbound_helpers import CONFIG, backend, egress_network, feed, grpc_route, http_route, service  # noqa: E402

from tether.api import outbound_pb2 as pb  # noqa: E402
from tether.policy.outbound import OutboundIndex  # noqa: E402
from tether.policy.outbound.translator import encode  # noqa: E402
from tether.proxy.codec.addrs import SocketAddr, parse_ip  # noqa: E402
from tether.proxy.codec.http1 import RequestHead  # noqa: E402
from tether.proxy.core.balancer_queue import Queue
from tether.proxy.core import commands as cmd  # noqa: E402
from tether.proxy.core.balancer import Balancer  # noqa: E402
from tether.proxy.core.client_policy import ClientPolicy  # noqa: E402
from tether.proxy.core.client_policy_translation import invalid_policy, translate  # noqa: E402
from tether.proxy.core.endpoint import Endpoint  # noqa: E402
from tether.proxy.core.errors import ErrorKind, ProxyError, grpc_status, response  # noqa: E402
from tether.proxy.core.http import Pick  # noqa: E402
from tether.proxy.core.metrics import Registry  # noqa: E402
from tether.proxy.core.policy_metrics import PolicyMetrics  # noqa: E402
from tether.proxy.core.policy_routes import Decision, PolicyRoute, decide  # noqa: E402
from tether.proxy.core.policy_translation import InvalidPolicy  # noqa: E402
from tether.proxy.core.profiles import Method, Profile, Route, Split  # noqa: E402
from tether.proxy.core.resolution import Resolution  # noqa: E402
from tether.proxy.core.retries import Settled, settle  # noqa: E402
from tether.proxy.core.routes import outbound_router  # noqa: E402

WEB = "web.emojivoto.svc.cluster.local:80"
API = "api.emojivoto.svc.cluster.local:80"
API_V2 = "api-v2.emojivoto.svc.cluster.local:80"
ORIG = SocketAddr(parse_ip("10.96.0.10"), 80)
IPS = {WEB: "10.1.0.1", API: "10.1.0.2", API_V2: "10.1.0.3"}


def balancer(ip: str) -> Balancer:
    b = Balancer(failfast=3.0, clock=lambda: 0.0)
    b.reset([Endpoint(SocketAddr(parse_ip(ip), 8080))])
    return b


class Balancers:
    """Stands for discovery's Destination.Get watches: one balancer per path the policy names."""

    def __init__(self, ips: dict[str, str] = IPS) -> None:
        self.by_path: dict[str, Balancer] = {}
        self.ips = ips

    def __call__(self, path: str) -> Balancer:
        if path not in self.by_path:
            self.by_path[path] = balancer(self.ips.get(path, "10.1.0.9"))
        return self.by_path[path]


def controller(*objs: dict[str, Any]) -> OutboundIndex:
    index = OutboundIndex(CONFIG)
    feed(index, service("web", "10.96.0.10"), service("api", "10.96.0.11"), service("api-v2", "10.96.0.12"), *objs)
    return index


def served(index: OutboundIndex, ip: str = "10.96.0.10", port: int = 80) -> pb.OutboundPolicy:
    """What the policy controller streams to a proxy in emojivoto connecting to ``ip:port``."""
    target = index.address_target(ip, port, "emojivoto")
    return encode(target, index.state(target), CONFIG)


def policy_of(*objs: dict[str, Any], balancers: Balancers | None = None) -> ClientPolicy:
    return translate(served(controller(*objs)), balancers or Balancers())


def get(path: str, method: bytes = b"GET", headers: tuple[tuple[bytes, bytes], ...] = ()) -> RequestHead:
    return RequestHead(method, path.encode(), ((b"host", b"web.emojivoto.svc.cluster.local"), *headers))


def draws(*values: float) -> Any:
    it = iter(values)
    return lambda: next(it)


# -- translation and precedence ----------------------------------------------------------------------------


def test_a_service_without_routes_has_the_default_route_so_its_profile_applies() -> None:
    policy = policy_of()
    assert policy.parent.kind == "Service" and policy.parent.name == "web" and policy.parent.port == 80
    assert policy.default_routes(False) and policy.default_routes(True)
    assert 'parent_kind="Service"' in policy.parent_labels and 'parent_port="80"' in policy.parent_labels
    with_route = policy_of(http_route("split", "web", [{"backendRefs": [backend("api")]}]))
    assert not with_route.default_routes(False)
    assert with_route.http1[0].meta.name == "split" and with_route.http1[0].meta.kind == "HTTPRoute"


def test_an_undefined_port_and_a_denied_egress_network_forbid_opaque_connections() -> None:
    undefined = translate(served(controller(), port=9999), Balancers())
    assert undefined.opaque[0].forbidden and undefined.opaque[0].meta.name == "undefined-port"
    index = controller(egress_network("deny-all", "Deny"))
    denied = translate(served(index, "8.8.8.8", 443), Balancers())
    assert denied.parent.kind == "EgressNetwork" and denied.opaque[0].forbidden
    answer = decide(denied, get("/"), False, draws(0.0))
    assert isinstance(answer, ProxyError) and answer.status == 403  # the controller's failure injector


def test_egress_fallback_forwards_to_the_original_destination() -> None:
    policy = translate(served(controller(), "93.184.216.34", 80), Balancers())
    decision = decide(policy, get("/"), False, draws(0.0))
    assert isinstance(decision, Decision)
    assert decision.backend.endpoint is not None and str(decision.backend.endpoint.addr) == "93.184.216.34:80"
    assert decision.backend.authority == ""  # no service: the request metrics name no authority


def test_the_outbound_layer_refuses_denied_egress_and_forwards_allowed_egress() -> None:
    from layer_helpers import drive, kinds, replies

    from tether.proxy.codec import detect
    from tether.proxy.core.outbound import OutboundSettings, outbound

    target = SocketAddr(parse_ip("8.8.8.8"), 443)
    denied = translate(served(controller(egress_network("deny-all", "Deny")), "8.8.8.8", 443), Balancers())
    allowed = translate(served(controller(egress_network("allow-all", "Allow")), "8.8.8.8", 443), Balancers())

    registry = Registry(retain_idle=600.0, clock=lambda: 0.0)
    metrics = PolicyMetrics(registry)

    def settings(policy: ClientPolicy) -> OutboundSettings:
        return OutboundSettings(detect_timeout=10.0, connect_timeout=1.0, failfast=3.0, profile_networks=(),
                                local_ips=frozenset(), own_addrs=frozenset(), refuse_loopback=True,
                                client_policies=lambda addr: PolicyWatch(policy),  # type: ignore[arg-type,return-value]
                                policy_metrics=metrics)

    seen = drive(outbound(target, settings(denied), None), replies({cmd.Detect: detect.Opaque()}))
    assert kinds(seen) == ["SetLabels", "Detect", "Refuse"] and seen[-1] == cmd.Refuse("forbidden")
    seen = drive(outbound(target, settings(allowed), None),
                 replies({cmd.Detect: detect.Opaque(), cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    connect = next(c for c in seen if isinstance(c, cmd.Connect))
    assert connect.addr == target and kinds(seen)[-1] == "Forward"
    # Metered under the EgressNetwork's name.
    text = registry.render()
    assert 'outbound_tcp_protocol_connections_total{protocol="detect",parent_group="policy.linkerd.io",' \
           'parent_kind="EgressNetwork",parent_namespace="linkerd-egress",parent_name="deny-all"' in text
    deny = ('parent_group="policy.linkerd.io",parent_kind="EgressNetwork",parent_namespace="linkerd-egress",'
            'parent_name="deny-all"')
    allow = deny.replace("deny-all", "allow-all")
    assert any(line.startswith("outbound_tcp_route_close_total{" + deny) and 'route_name="tcp-egress-deny"' in line
               and 'error="forbidden"' in line and line.endswith(" 1") for line in text.splitlines()), text
    assert any(line.startswith("outbound_tcp_route_close_total{" + allow) and 'target_ip="8.8.8.8"' in line
               and 'error=""' in line for line in text.splitlines()), text


def test_http_detection_is_counted_under_the_parent_as_linkerd_names_its_results() -> None:
    from layer_helpers import drive, replies

    from tether.proxy.codec import detect
    from tether.proxy.core.outbound import OutboundSettings, outbound

    target = SocketAddr(parse_ip("8.8.8.8"), 443)
    allowed = translate(served(controller(egress_network("allow-all", "Allow")), "8.8.8.8", 443), Balancers())
    registry = Registry(retain_idle=600.0, clock=lambda: 0.0)
    ticks = iter([10.0, 10.05, 20.0, 20.5])  # detection took 50 ms, then 500 ms
    settings = OutboundSettings(detect_timeout=10.0, connect_timeout=1.0, failfast=3.0, profile_networks=(),
                                local_ips=frozenset(), own_addrs=frozenset(), refuse_loopback=True,
                                client_policies=lambda addr: PolicyWatch(allowed),  # type: ignore[arg-type,return-value]
                                policy_metrics=PolicyMetrics(registry), clock=lambda: next(ticks))
    drive(outbound(target, settings, None),
          replies({cmd.Detect: detect.Opaque(), cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    drive(outbound(target, settings, None), replies({cmd.Detect: detect.ReadTimeout(),
                                                     cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    text = registry.render()
    parent = ('parent_group="policy.linkerd.io",parent_kind="EgressNetwork",parent_namespace="linkerd-egress",'
              'parent_name="allow-all"')
    results = {line.split('result="')[1].split('"')[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
               if line.startswith("outbound_tcp_detect_http_results_total{") and parent in line}
    assert results == {"not_http": "1", "http/1": "0", "http/2": "0", "read_timeout": "1", "error": "0"}
    buckets = [line for line in text.splitlines() if line.startswith("outbound_tcp_detect_http_duration_seconds")
               and parent in line]
    assert any('le="0.1"} 1' in line for line in buckets) and any('le="+Inf"} 2' in line for line in buckets), buckets


@pytest.mark.parametrize("mutate, field", [
    (lambda m: m.ClearField("metadata"), "metadata"),
    (lambda m: m.protocol.ClearField("kind"), "protocol"),
    (lambda m: m.protocol.detect.http1.routes[0].ClearField("rules"), "protocol.detect.http1.routes[0].rules"),
    (lambda m: m.protocol.detect.http1.routes[0].rules[0].filters.add(), "filters[0]: unknown filter"),
    (lambda m: m.protocol.detect.http1.routes[0].rules[0].matches[0].path.__setattr__("regex", "(["),
     "matches[0].path.regex"),
])
def test_an_invalid_message_names_its_field(mutate: Any, field: str) -> None:
    message = served(controller(http_route("r", "web", [{"matches": [{"path": {"type": "PathPrefix",
                                                                               "value": "/"}}]}])))
    mutate(message)
    with pytest.raises(InvalidPolicy, match=field.replace("[", r"\[").replace("]", r"\]")):
        translate(message, Balancers())


@pytest.mark.parametrize("name", ["l5d-client-id", "L5D-Dst-Canonical", "content-length", "transfer-encoding"])
def test_header_modifiers_cannot_forge_l5d_headers_or_reframe_the_message(name: str) -> None:
    modifier = {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": name, "value": "x"}]}}
    message = served(controller(http_route("r", "web", [{"filters": [modifier]}])))
    with pytest.raises(InvalidPolicy, match="header_modifier"):
        translate(message, Balancers())
    # The proxy replaces such a message with the invalid policy: every request 500, opaque refused.
    answer = decide(invalid_policy(), get("/"), False, draws(0.0))
    assert isinstance(answer, ProxyError) and answer.status == 500 and answer.kind is ErrorKind.INVALID_POLICY
    assert invalid_policy().opaque[0].forbidden


def test_what_the_proxy_does_not_apply_is_named() -> None:
    message = served(controller(http_route("r", "web", [{}])))
    message.protocol.detect.http1.routes[0].rules[0].backends.first_available.backends[0].requestTimeout.FromSeconds(1)
    policy = translate(message, Balancers())
    assert any("requestTimeout" in note for note in policy.unapplied), policy.unapplied
    applied = policy_of(http_route("r", "web", [{}], annotations={"retry.linkerd.io/http": "5xx",
                                                                   "retry.linkerd.io/timeout": "1s",
                                                                   "timeout.linkerd.io/idle": "1m"}))
    assert applied.unapplied == ()


# -- each request's decision -------------------------------------------------------------------------------


def test_the_best_match_wins_path_headers_query_and_method() -> None:
    rules = [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}], "backendRefs": [backend("api")]},
        {"matches": [{"path": {"type": "Exact", "value": "/api/vote"}, "method": "POST",
                      "headers": [{"name": "x-canary", "value": "1"}], "queryParams": [{"name": "d", "value": "1"}]}],
         "backendRefs": [backend("api-v2")]},
    ]
    policy = policy_of(http_route("r", "web", rules))

    def backend_of(request: RequestHead) -> str:
        decision = decide(policy, request, False, draws(0.0))
        assert isinstance(decision, Decision)
        return decision.backend.authority

    assert backend_of(get("/api/vote?d=1", b"POST", ((b"x-canary", b"1"),))) == API_V2
    assert backend_of(get("/api/vote?d=1", b"GET", ((b"x-canary", b"1"),))) == API  # method differs
    assert backend_of(get("/api/vote?d=2", b"POST", ((b"x-canary", b"1"),))) == API  # query differs
    assert backend_of(get("/api/votes", b"POST")) == API
    nothing = decide(policy, get("/other"), False, draws(0.0))
    assert isinstance(nothing, ProxyError) and nothing.status == 404 and grpc_status(nothing) == 5


def test_hostnames_select_routes() -> None:
    policy = policy_of(http_route("a", "web", [{"backendRefs": [backend("api")]}], hostnames=["a.example.com"]),
                       http_route("b", "web", [{"backendRefs": [backend("api-v2")]}], hostnames=["*.example.com"]))
    exact = decide(policy, RequestHead(b"GET", b"/", ((b"host", b"a.example.com:80"),)), False, draws(0.0))
    suffix = decide(policy, RequestHead(b"GET", b"/", ((b"host", b"b.example.com"),)), False, draws(0.0))
    assert isinstance(exact, Decision) and exact.route.meta.name == "a"
    assert isinstance(suffix, Decision) and suffix.route.meta.name == "b"


def test_grpc_routes_match_service_and_method() -> None:
    rules = [{"matches": [{"method": {"service": "emojivoto.v1.VotingService", "method": "VoteDoughnut"}}],
              "backendRefs": [backend("api-v2")]},
             {"matches": [{"method": {"service": "emojivoto.v1.VotingService"}}], "backendRefs": [backend("api")]}]
    policy = policy_of(grpc_route("voting", "web", rules))
    assert policy.http2[0].grpc

    def to(path: str) -> str:
        decision = decide(policy, RequestHead(b"POST", path.encode(), ((b":authority", b"web"),)), True, draws(0.0))
        assert isinstance(decision, Decision)
        return decision.backend.authority

    assert to("/emojivoto.v1.VotingService/VoteDoughnut") == API_V2
    assert to("/emojivoto.v1.VotingService/VotePoop") == API


def test_a_rule_that_reads_nothing_of_the_request_is_decided_once_and_its_requests_still_counted() -> None:
    def never() -> float:
        raise AssertionError("a kept decision draws nothing")

    registry = Registry(retain_idle=600.0, clock=lambda: 0.0)
    metrics = PolicyMetrics(registry)
    policy = policy_of()  # the Service's default route: one rule, one backend, no filters, no retries
    first, second = (decide(policy, get(path), False, never, metrics) for path in ("/a", "/b"))
    assert isinstance(first, Decision) and first is second and first.backend.authority == WEB
    requests = [line for line in registry.render().splitlines()
                if line.startswith("outbound_http_route_backend_requests_total{")]
    assert len(requests) == 1 and requests[0].endswith(" 2"), requests  # each request counted all the same
    # The same rule with the hostname label: each request's own report, so its own decision.
    by_host = PolicyMetrics(Registry(retain_idle=600.0, clock=lambda: 0.0), hostname_labels=True)
    first, second = (decide(policy, get("/"), False, draws(0.0), by_host) for _ in range(2))
    assert isinstance(first, Decision) and isinstance(second, Decision) and first is not second
    assert first.request_route.report is not None and first.request_route.report.hostname == \
        "web.emojivoto.svc.cluster.local"
    # A header modifier reads nothing of the request: decided once too...
    modified = policy_of(http_route("r", "web", [{"filters": [{"type": "RequestHeaderModifier",
                                                              "requestHeaderModifier": {"remove": ["x"]}}]}]))
    assert decide(modified, get("/"), False, never) is decide(modified, get("/"), False, never)
    # ...a redirect does (and answers for the proxy), and a choice between two backends draws per request.
    redirect = policy_of(http_route("r", "web", [{"filters": [{"type": "RequestRedirect",
                                                              "requestRedirect": {"hostname": "other"}}]}]))
    answer = decide(redirect, get("/"), False, never)
    assert isinstance(answer, ProxyError) and answer.status == 302
    split = policy_of(http_route("r", "web", [{"backendRefs": [backend("api"), backend("api-v2")]}]))
    chosen = [decide(split, get("/"), False, draws(d)) for d in (0.1, 0.9)]
    assert [c.backend.authority for c in chosen if isinstance(c, Decision)] == [API, API_V2]


def test_weights_split_requests_by_the_draw_and_a_backend_without_endpoints_gives_its_share_away() -> None:
    balancers = Balancers()
    policy = policy_of(http_route("split", "web", [{"backendRefs": [backend("api", weight=90),
                                                                   backend("api-v2", weight=10)]}]),
                       balancers=balancers)

    def to(draw: float) -> str:
        decision = decide(policy, get("/"), False, draws(draw))
        assert isinstance(decision, Decision)
        return decision.backend.authority

    assert [to(d) for d in (0.0, 0.5, 0.89, 0.9, 0.99)] == [API, API, API, API_V2, API_V2]
    balancers.by_path[API_V2].reset([])
    assert to(0.99) == API


def test_header_modifiers_rewrite_request_and_response() -> None:
    rule = {"filters": [
        {"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": "x-set", "value": "s"}], "add": [{"name": "x-add", "value": "a"}], "remove": ["x-gone"]}},
        {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x-resp", "value": "r"}]}}]}
    policy = policy_of(http_route("r", "web", [rule]))
    decision = decide(policy, get("/"), False, draws(0.0))
    assert isinstance(decision, Decision) and decision.rewrite is not None and decision.respond is not None
    headers = decision.rewrite(((b"x-set", b"old"), (b"x-gone", b"1"), (b"x-add", b"first")))
    assert headers == ((b"x-add", b"first"), (b"x-add", b"a"), (b"x-set", b"s"))  # add, then set, then remove
    assert decision.respond(((b"x-resp", b"upstream"),)) == ((b"x-resp", b"r"),)


def test_a_redirect_is_answered_by_the_proxy_with_its_location() -> None:
    redirect = {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
                "filters": [{"type": "RequestRedirect", "requestRedirect": {
                    "scheme": "https", "hostname": "new.example.com", "port": 8443, "statusCode": 301,
                    "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}]}
    plain = {"matches": [{"path": {"type": "Exact", "value": "/moved"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "other"}}]}
    policy = policy_of(http_route("r", "web", [redirect, plain]))
    answer = decide(policy, get("/old/page?x=1"), False, draws(0.0))
    assert isinstance(answer, ProxyError) and answer.status == 301
    head = response(answer, meshed_client=False)
    assert (b"location", b"https://new.example.com:8443/new/page?x=1") in head.headers and head.status == 301
    moved = decide(policy, RequestHead(b"GET", b"/moved", ((b"host", b"web:80"),)), False, draws(0.0))
    assert isinstance(moved, ProxyError) and moved.status == 302
    assert moved.headers == ((b"location", b"http://other/moved"),)


def test_a_missing_backend_fails_its_share_of_requests() -> None:
    policy = policy_of(http_route("r", "web", [{"backendRefs": [backend("api", weight=1),
                                                               backend("missing", weight=1)]}]))
    ok = decide(policy, get("/"), False, draws(0.2))
    failed = decide(policy, get("/"), False, draws(0.7, 0.0))
    assert isinstance(ok, Decision) and ok.backend.authority == API
    assert isinstance(failed, ProxyError) and failed.status == 500 and failed.kind is ErrorKind.INJECTED


def test_timeouts_and_retries_become_the_requests_route() -> None:
    annotations = {"retry.linkerd.io/http": "5xx,429", "retry.linkerd.io/limit": "2"}
    policy = policy_of(http_route("r", "web", [{"timeouts": {"request": "3s"}}], annotations=annotations))
    decision = decide(policy, get("/"), False, draws(0.0))
    assert isinstance(decision, Decision)
    route = decision.request_route
    assert isinstance(route, PolicyRoute) and route.timeout == 3.0 and route.metric_labels == ""
    assert route.is_failure(503) and route.is_failure(429) and not route.is_failure(404)
    # Two retries for this request, then its last answer stands.
    outcomes = [settle(route.budget, True, False, None, "", 503) for _ in range(3)]
    assert outcomes == [Settled.RETRY, Settled.RETRY, Settled.FINAL]
    # Each request has its own count.
    again = decide(policy, get("/"), False, draws(0.0))
    assert isinstance(again, Decision)
    assert settle(again.request_route.budget, True, False, None, "", 503) is Settled.RETRY


def test_grpc_retries_on_the_listed_codes() -> None:
    annotations = {"retry.linkerd.io/grpc": "unavailable"}
    policy = policy_of(grpc_route("g", "web", [{}], annotations=annotations))
    decision = decide(policy, RequestHead(b"POST", b"/svc/m", ((b":authority", b"web"),)), True, draws(0.0))
    assert isinstance(decision, Decision)
    route = decision.request_route
    assert route.is_failure(200, 14) and not route.is_failure(200, 13)


# -- the router: policy beside the profile -----------------------------------------------------------------


class PolicyWatch:
    def __init__(self, policy: ClientPolicy | None) -> None:
        self.policy = policy
        self.ready = True
        self.failed = None

    def release(self) -> None:
        pass

    async def wait(self, timeout: float) -> Any:
        return self.policy


def ask(route: Any, request: RequestHead) -> Pick | ProxyError:
    gen: Generator[cmd.Command, Any, Pick | ProxyError] = route(request)
    try:
        command = gen.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise AssertionError(f"the router waited: {command}")


def router(resolution: Resolution, watch: PolicyWatch, draw: float = 0.0) -> Any:
    return outbound_router(ORIG, resolution, local_ips=frozenset(), connect_timeout=1.0, queue=Queue(),
                           loop_addrs=frozenset(), draw=lambda: draw, policies=watch)


def test_the_router_follows_the_policy_and_its_updates_per_request() -> None:
    balancers = Balancers()
    watch = PolicyWatch(None)
    r = router(Resolution(balancer=balancers(WEB), authority=WEB), watch)
    before = ask(r, get("/"))
    assert isinstance(before, Pick) and before.route is None  # no policy yet: the service as it is
    watch.policy = policy_of(http_route("r", "web", [{"backendRefs": [backend("api-v2")]}]), balancers=balancers)
    after = ask(r, get("/"))
    assert isinstance(after, Pick) and isinstance(after.route, PolicyRoute)
    assert after.connect.addr == SocketAddr(parse_ip(IPS[API_V2]), 8080)
    assert 'authority="api-v2.emojivoto.svc.cluster.local:80"' in after.labels


def test_a_serviceprofile_with_routes_wins_over_the_policy_never_both() -> None:
    balancers = Balancers()
    profile = Profile(WEB, [Route(Method(b"POST"), labels='rt_route="post"')], Split([]))
    policy = policy_of(http_route("r", "web", [{"backendRefs": [backend("api-v2")]}]), balancers=balancers)
    r = router(Resolution(balancer=balancers(WEB), authority=WEB, profile=profile), PolicyWatch(policy))
    pick = ask(r, get("/"))
    assert isinstance(pick, Pick) and pick.route is profile.default and pick.rewrite is None
    assert pick.connect.addr == SocketAddr(parse_ip(IPS[WEB]), 8080)


def test_a_policy_error_carries_the_requests_route() -> None:
    policy = policy_of(http_route("r", "web", [{"matches": [{"path": {"type": "Exact", "value": "/x"}}]}],
                                  annotations={"timeout.linkerd.io/request": "2s"}))
    r = router(Resolution(authority=WEB), PolicyWatch(policy))
    assert isinstance(ask(r, get("/x")), Pick)
    missing = ask(r, get("/y"))
    assert isinstance(missing, ProxyError) and missing.status == 404


# -- in the HTTP/1 layer: the layer applies what the decision says -----------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def playbook(policy_objs: list[dict[str, Any]], metrics: PolicyMetrics | None = None,
             clock: Any = lambda: 100.0) -> Any:
    from playbook import Playbook  # tests/proxy's playbook harness

    from tether.proxy.core.http import HttpSettings

    balancers = Balancers({WEB: "10.0.0.7", API: "10.0.0.7", API_V2: "10.0.0.7"})
    policy = policy_of(*policy_objs, balancers=balancers)
    r = outbound_router(ORIG, Resolution(authority=WEB), local_ips=frozenset(), connect_timeout=1.0, queue=Queue(),
                        loop_addrs=frozenset(), draw=lambda: 0.0, policies=PolicyWatch(policy),
                        policy_metrics=metrics)
    return Playbook(r, HttpSettings("outbound", clock, None, strip_proxy_errors=True))


UP = SocketAddr(parse_ip("10.0.0.7"), 8080)


def test_the_http1_layer_rewrites_headers_both_ways() -> None:
    from playbook import Checkin, Checkout, Connected, DownData, SendDown, SendUp, UpData

    rule = {"filters": [
        {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-set", "value": "s"}],
                                                                    "remove": ["x-gone"]}},
        {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "x-resp", "value": "r"}],
                                                                      "remove": ["server"]}}]}
    assert (playbook([http_route("r", "web", [rule])])
            >> DownData(b"GET /r HTTP/1.1\r\nHost: web\r\nX-Gone: 1\r\n\r\n")
            << Checkout(UP)
            >> Connected()
            << SendUp(0, b"GET /r HTTP/1.1\r\nHost: web\r\nx-set: s\r\n\r\n")
            >> UpData(0, b"HTTP/1.1 200 OK\r\nServer: app\r\nContent-Length: 2\r\n\r\nok")
            << SendDown(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-resp: r\r\n\r\nok")
            << Checkin(0, reuse=True))


def test_the_http1_layer_answers_a_redirect_itself_and_keeps_the_connection() -> None:
    from playbook import Count, DownData, SendDown

    redirect = {"filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "new.example.com",
                                                                            "statusCode": 301}}]}
    answer = (b"HTTP/1.1 301 Moved Permanently\r\ncontent-length: 0\r\nl5d-proxy-error: redirected to "
              b"http://new.example.com/a?b=1\r\nlocation: http://new.example.com/a?b=1\r\n\r\n")
    counted = Count("outbound_http_errors_total", 'error="unexpected"')  # Linkerd's error metric has no other name
    assert (playbook([http_route("r", "web", [redirect])])
            >> DownData(b"POST /a?b=1 HTTP/1.1\r\nHost: web\r\nContent-Length: 6\r\n\r\nab")
            << counted
            << SendDown(answer)
            >> DownData(b"cdef")  # the rest of the body is read and dropped: the connection goes on
            >> DownData(b"GET /a?b=1 HTTP/1.1\r\nHost: web\r\n\r\n")
            << counted
            << SendDown(answer))


PARENT = ('parent_group="core",parent_kind="Service",parent_namespace="emojivoto",parent_name="web",'
          'parent_port="80",parent_section_name=""')
ROUTE = 'route_group="policy.linkerd.io",route_kind="HTTPRoute",route_namespace="emojivoto",route_name="r"'


def test_a_retry_hides_a_failure_and_the_route_metrics_say_so() -> None:
    from playbook import CallLater, Checkin, Checkout, Connected, DownData, Fire, SendDown, SendUp, UpData

    registry = Registry(retain_idle=600.0, clock=lambda: 100.0)
    metrics = PolicyMetrics(registry)
    route = http_route("r", "web", [{"backendRefs": [backend("api")]}],
                       annotations={"retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "1"})
    get_ = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert (playbook([route], metrics)
            >> DownData(get_)
            << Checkout(UP)
            >> Connected()
            << SendUp(0, get_)
            >> UpData(0, b"HTTP/1.1 503 Flaky\r\nContent-Length: 0\r\n\r\n")
            << Checkin(0, reuse=False)
            << CallLater(0.025)  # the backoff
            >> Fire()
            << Checkout(UP)  # the rule's one retry
            >> Connected()
            << SendUp(1, get_)
            >> UpData(1, ok)
            << SendDown(ok)
            << Checkin(1, reuse=True))
    text = registry.render()
    backend_ = ('backend_group="core",backend_kind="Service",backend_namespace="emojivoto",backend_name="api",'
                'backend_port="80",backend_section_name=""')
    assert f"outbound_http_route_backend_requests_total{{{PARENT},{ROUTE},{backend_}}} 2" in text
    assert f'outbound_http_route_retry_requests_total{{{PARENT},{ROUTE},hostname=""}} 1' in text
    assert f'outbound_http_route_retry_successes_total{{{PARENT},{ROUTE},hostname=""}} 1' in text
    # The route's four retry series come together, as Linkerd creates them; a retry here waits for its backend
    # instead of overflowing, so overflow stays 0.
    assert f'outbound_http_route_retry_overflow_total{{{PARENT},{ROUTE},hostname=""}} 0' in text
    assert f'outbound_http_route_retry_limit_exceeded_total{{{PARENT},{ROUTE},hostname=""}} 0' in text
    assert f'outbound_http_route_request_statuses_total{{{PARENT},{ROUTE},hostname="",http_status="200",error=""}} 1' \
        in text
    assert f'outbound_http_route_request_duration_seconds_count{{{PARENT},{ROUTE},hostname=""}} 1' in text
    # Each attempt, as the backend answered it.
    statuses = f"outbound_http_route_backend_response_statuses_total{{{PARENT},{ROUTE},{backend_}"
    assert f'{statuses},http_status="503",error=""}} 1' in text and f'{statuses},http_status="200",error=""}} 1' in text
    assert f"outbound_http_route_backend_response_duration_seconds_count{{{PARENT},{ROUTE},{backend_}}} 2" in text


def test_the_frame_size_histograms_count_each_body_chunk_once_on_the_route_and_per_backend() -> None:
    """outbound_http_route_request_frame_size_bytes counts the client's body chunks (128, 1024, 10240), once
    though a retry sends them twice; ..._backend_response_frame_size_bytes the relayed response's chunks."""
    from playbook import CallLater, Checkin, Checkout, Connected, DownData, Fire, SendDown, SendUp, UpData

    registry = Registry(retain_idle=600.0, clock=lambda: 100.0)
    route = http_route("r", "web", [{"backendRefs": [backend("api")]}],
                       annotations={"retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "1"})
    head = b"POST /r HTTP/1.1\r\nHost: web\r\nContent-Length: 2100\r\n\r\n"
    first, rest = b"a" * 100, b"b" * 2000
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 300\r\n\r\n"
    assert (playbook([route], PolicyMetrics(registry))
            >> DownData(head + first)
            << Checkout(UP)
            >> DownData(rest)  # comes while the route's connection is being made
            >> Connected()
            << SendUp(0, head + first + rest)
            >> UpData(0, b"HTTP/1.1 503 Flaky\r\nContent-Length: 0\r\n\r\n")
            << Checkin(0, reuse=False)
            << CallLater(0.025)
            >> Fire()
            << Checkout(UP)
            >> Connected()
            << SendUp(1, head + first + rest)  # the replay: not counted again
            >> UpData(1, ok + b"c" * 20)
            << SendDown(ok + b"c" * 20)
            >> UpData(1, b"d" * 280)
            << SendDown(b"d" * 280)
            << Checkin(1, reuse=True))
    text = registry.render()
    frames = f'outbound_http_route_request_frame_size_bytes_bucket{{{PARENT},{ROUTE},hostname=""'
    assert f'{frames},le="128.0"}} 1' in text and f'{frames},le="1024.0"}} 1' in text
    assert f'{frames},le="10240.0"}} 2' in text
    assert f'outbound_http_route_request_frame_size_bytes_sum{{{PARENT},{ROUTE},hostname=""}} 2100' in text
    backend_ = ('backend_group="core",backend_kind="Service",backend_namespace="emojivoto",backend_name="api",'
                'backend_port="80",backend_section_name=""')
    backend_frames = f"outbound_http_route_backend_response_frame_size_bytes_bucket{{{PARENT},{ROUTE},{backend_}"
    assert f'{backend_frames},le="128.0"}} 1' in text and f'{backend_frames},le="1024.0"}} 2' in text
    assert f"outbound_http_route_backend_response_frame_size_bytes_count{{{PARENT},{ROUTE},{backend_}}} 2" in text
    assert "outbound_grpc_route_request_frame_size_bytes_bucket" not in text


def test_the_retry_limit_is_counted_when_it_is_reached() -> None:
    from playbook import CallLater, Checkin, Checkout, Connected, DownData, Fire, SendUp, UpData, exchange

    registry = Registry(retain_idle=600.0, clock=lambda: 100.0)
    route = http_route("r", "web", [{}], annotations={"retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "1"})
    get_ = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    fail = b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"
    assert (playbook([route], PolicyMetrics(registry))
            >> DownData(get_)
            << Checkout(UP)
            >> Connected()
            << SendUp(0, get_)
            >> UpData(0, fail)
            << Checkin(0, reuse=False)
            << CallLater(0.025)
            >> Fire()
            >> exchange(UP, 1, get_, fail))
    text = registry.render()
    assert f'outbound_http_route_retry_limit_exceeded_total{{{PARENT},{ROUTE},hostname=""}} 1' in text
    assert f'http_status="500",error=""}} 1' in text
    assert f'outbound_http_route_retry_successes_total{{{PARENT},{ROUTE},hostname=""}} 0' in text


def test_a_per_attempt_timeout_drops_the_attempt_and_retries_after_the_backoff() -> None:
    from playbook import CallLater, Checkin, Checkout, Connected, DownData, Fire, SendDown, SendUp, UpData

    annotations = {"retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "1", "retry.linkerd.io/timeout": "300ms"}
    route = http_route("r", "web", [{}], annotations=annotations)
    get_ = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert (playbook([route])
            >> DownData(get_)
            << Checkout(UP)
            >> Connected()
            << SendUp(0, get_)
            << CallLater(0.3)  # the per-attempt timeout
            >> Fire()
            << Checkin(0, reuse=False)  # the slow attempt is dropped
            << CallLater(0.025)  # the backoff (25 ms, draw 0: no jitter)
            >> Fire()
            << Checkout(UP)
            >> Connected()
            << SendUp(1, get_)  # the last attempt has no per-attempt timeout (Linkerd removes it)
            >> UpData(1, ok)
            << SendDown(ok)
            << Checkin(1, reuse=True))


def test_without_retries_left_a_per_attempt_timeout_is_not_armed() -> None:
    policy = policy_of(http_route("r", "web", [{}], annotations={"retry.linkerd.io/http": "5xx",
                                                                  "retry.linkerd.io/limit": "1",
                                                                  "retry.linkerd.io/timeout": "1s"}))
    decision = decide(policy, get("/"), False, lambda: 0.5)
    assert isinstance(decision, Decision)
    route = decision.request_route
    assert route.attempt_timeout() == 1.0
    assert route.budget is not None and route.budget.withdraw()
    assert route.attempt_timeout() is None and route.retry_delay() == pytest.approx(0.0375)  # 25 ms + half (jitter)


def test_l5d_request_headers_tune_retries_and_timeouts_where_the_route_allows_them() -> None:
    from dataclasses import replace as with_

    index = controller(http_route("r", "web", [{}]))
    target = index.address_target("10.96.0.10", 80, "emojivoto")
    allowing = translate(encode(target, index.state(target), with_(CONFIG, allow_l5d_request_headers=True)),
                         Balancers())
    asked = get("/", headers=((b"l5d-retry-http", b"gateway-error,429"), (b"L5D-Retry-Limit", b"3"),
                              (b"l5d-retry-timeout", b"200ms"), (b"l5d-timeout", b"2s"), (b"x-kept", b"1")))
    decision = decide(allowing, asked, False, lambda: 0.0)
    assert isinstance(decision, Decision) and decision.rewrite is not None
    route = decision.request_route
    assert route.timeout == 2.0 and route.attempt_timeout() == 0.2
    assert route.is_failure(503) and route.is_failure(429) and not route.is_failure(500)
    assert [route.budget.withdraw() for _ in range(4)] == [True, True, True, False]  # type: ignore[union-attr]
    # Consumed: they do not go on (the others do).
    assert decision.rewrite(asked.headers) == ((b"host", b"web.emojivoto.svc.cluster.local"), (b"x-kept", b"1"))
    # A value that does not parse is ignored; on a route that does not allow them they pass through untouched.
    bad = decide(allowing, get("/", headers=((b"l5d-retry-limit", b"many"),)), False, lambda: 0.0)
    assert isinstance(bad, Decision) and bad.request_route.retry is not None
    assert bad.request_route.retry.limit == 1  # Linkerd's default when the headers make the policy
    plain = decide(policy_of(http_route("r", "web", [{}])), asked, False, lambda: 0.0)
    assert isinstance(plain, Decision) and plain.rewrite is None and plain.request_route.timeout is None


def test_an_idle_timeout_ends_a_request_on_which_nothing_moves() -> None:
    from playbook import CallLater, Checkin, Checkout, Close, Connected, DownData, Fire, Run, SendDown, SendUp, UpData

    route = http_route("r", "web", [{}], annotations={"timeout.linkerd.io/idle": "1s"})
    get_ = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    clock = Clock()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    assert (playbook([route], clock=clock)
            >> DownData(get_)
            << CallLater(1.0)
            << Checkout(UP)
            >> Connected()
            << SendUp(0, get_)
            >> Run(lambda: setattr(clock, "now", 100.6))
            >> UpData(0, head + b"hel")  # bytes moved: the timer is pushed back
            << SendDown(head + b"hel")
            >> Fire()
            << CallLater(1.0)
            >> Run(lambda: setattr(clock, "now", 101.7))
            >> Fire()  # nothing since 100.6: the response is broken off
            << Checkin(0, reuse=False)
            << Close())


def test_an_idle_request_before_its_response_head_gets_504() -> None:
    from playbook import CallLater, Checkin, Checkout, Connected, Count, DownData, Fire, Run, SendDown, SendUp

    route = http_route("r", "web", [{}], annotations={"timeout.linkerd.io/idle": "1s"})
    get_ = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    clock = Clock()
    assert (playbook([route], clock=clock)
            >> DownData(get_)
            << CallLater(1.0)
            << Checkout(UP)
            >> Connected()
            << SendUp(0, get_)
            >> Run(lambda: setattr(clock, "now", 101.0))
            >> Fire()
            << Checkin(0, reuse=False)
            << Count("outbound_http_errors_total", 'error="response timeout"')
            << SendDown(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: HTTP stream idle for 1s\r\n\r\n"))  # non-fatal: the connection stays


def balancer_lines(policy: ClientPolicy) -> list[str]:
    """What discovery's balancer collector renders while ``policy`` is the one client policy watched."""
    from datetime import timedelta

    from tether.proxy.core.config import Backoff
    from tether.proxy.io.discovery import Discovery

    class Watched:
        def __init__(self, policy: ClientPolicy) -> None:
            self.policy = policy

    discovery = Discovery(context_token="", idle_timeout=60.0,
                          backoff=Backoff(timedelta(seconds=1), timedelta(seconds=1), 0.0), failfast=3.0,
                          clock=lambda: 0.0)
    discovery.policies["10.96.0.10:80"] = Watched(policy)  # type: ignore[assignment]
    out: list[str] = []
    discovery.collect_balancers(out)
    return out


def test_the_balancer_families_count_each_backends_endpoints() -> None:
    balancers = Balancers()
    policy = translate(served(controller(http_route("r", "web", [{"backendRefs": [backend("api")]}]))), balancers)
    api = next(b.balancer for b in policy.backends() if b.balancer is not None and 'backend_name="api"' in b.labels)
    api.reset([*api.endpoints, Endpoint(SocketAddr(parse_ip("10.1.0.10"), 8080))])  # two endpoints now
    out = balancer_lines(policy)
    p2c = [line for line in out if line.startswith("outbound_http_balancer_p2c_endpoints{") and 'backend_name="api"'
           in line]
    ready = [line for line in out if line.startswith("outbound_http_balancer_endpoints{") and 'backend_name="api"'
             in line and 'state="ready"' in line]
    assert [line.rsplit(" ", 1)[1] for line in p2c] == ["2"] and [line.rsplit(" ", 1)[1] for line in ready] == ["2"]
    queue = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in out
             if line.startswith("outbound_http_balancer_queue_") and 'backend_name="api"' in line}
    assert queue["outbound_http_balancer_queue_gate_timeout_seconds"] == "3"
    assert queue["outbound_http_balancer_queue_length"] == "0"
    assert queue["outbound_http_balancer_queue_gate_shut_total"] == "0"
    assert "outbound_http_balancer_queue_latency_seconds_bucket" in queue
    updates = {line.split('op="')[1].split('"')[0]: line.rsplit(" ", 1)[1] for line in out
               if line.startswith("outbound_http_balancer_p2c_updates_total{") and 'backend_name="api"' in line}
    assert updates == {"Reset": "2", "Add": "0", "Remove": "0"}  # the balancer's first answer, then the test's
    # The HTTP route's backend is the HTTP family's alone; the Service's own opaque route (its connections that
    # are not HTTP) goes to the Service itself, counted in the TCP family.
    tcp = [line for line in out if line.startswith(("outbound_tcp_balancer_", "outbound_tls_balancer_"))]
    assert tcp and all(line.startswith("outbound_tcp_balancer_") and 'backend_name="web"' in line for line in tcp)


def test_each_route_and_each_backend_counts_on_series_of_its_own() -> None:
    """The route metrics' series are bound once per route and backend and updated in place: two routes (and two
    backends of one route) never share one."""
    from playbook import DownData, exchange

    registry = Registry(retain_idle=600.0, clock=lambda: 100.0)
    metrics = PolicyMetrics(registry)
    prefix = lambda path: [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],  # noqa: E731
                            "backendRefs": [backend("api" if path == "/a" else "web")]}]
    get_a, get_b = (f"GET {p} HTTP/1.1\r\nHost: web\r\n\r\n".encode() for p in ("/a", "/b"))
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    failed = b"HTTP/1.1 503 Down\r\nContent-Length: 1\r\n\r\nx"
    for request, response in ((get_a, ok), (get_a, ok), (get_b, failed)):
        assert playbook([http_route("a", "web", prefix("/a")), http_route("b", "web", prefix("/b"))], metrics) \
            >> DownData(request) >> exchange(UP, 0, request, response)
    text = registry.render().splitlines()
    route_ = {name: ROUTE.replace('route_name="r"', f'route_name="{name}"') for name in "ab"}
    backend_ = {name: f'backend_group="core",backend_kind="Service",backend_namespace="emojivoto",backend_name="{name}",'
                      'backend_port="80",backend_section_name=""' for name in ("api", "web")}
    a, b = f'{PARENT},{route_["a"]},hostname=""', f'{PARENT},{route_["b"]},hostname=""'
    a_api, b_web = f'{PARENT},{route_["a"]},{backend_["api"]}', f'{PARENT},{route_["b"]},{backend_["web"]}'
    family = "outbound_http_route_"
    assert sorted(line for line in text if line.startswith(f"{family}request_statuses_total{{")) == sorted([
        f'{family}request_statuses_total{{{a},http_status="200",error=""}} 2',
        f'{family}request_statuses_total{{{b},http_status="503",error=""}} 1'])
    assert sorted(line for line in text if line.startswith(f"{family}request_duration_seconds_count{{")) == sorted([
        f"{family}request_duration_seconds_count{{{a}}} 2", f"{family}request_duration_seconds_count{{{b}}} 1"])
    assert sorted(line for line in text if line.startswith(f"{family}backend_requests_total{{")) == sorted([
        f"{family}backend_requests_total{{{a_api}}} 2", f"{family}backend_requests_total{{{b_web}}} 1"])
    assert sorted(line for line in text if line.startswith(f"{family}backend_response_statuses_total{{")) == sorted([
        f'{family}backend_response_statuses_total{{{a_api},http_status="200",error=""}} 2',
        f'{family}backend_response_statuses_total{{{b_web},http_status="503",error=""}} 1'])
    assert sorted(line for line in text if line.startswith(f"{family}backend_response_frame_size_bytes_sum{{")) == \
        sorted([f"{family}backend_response_frame_size_bytes_sum{{{a_api}}} 4",
                f"{family}backend_response_frame_size_bytes_sum{{{b_web}}} 1"])
    # Two backends of one route, drawn by weight: each counted under its own labels.
    split = policy_of(http_route("r", "web", [{"backendRefs": [backend("api", weight=1), backend("web", weight=1)]}]))
    for draw in (0.1, 0.9, 0.9):
        assert isinstance(decide(split, get("/"), False, draws(draw), metrics), Decision)
    requests = {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in registry.render().splitlines()
                if line.startswith(f"{family}backend_requests_total{{{PARENT},{ROUTE},")}
    assert requests == {f"{family}backend_requests_total{{{PARENT},{ROUTE},{backend_['api']}}}": "1",
                        f"{family}backend_requests_total{{{PARENT},{ROUTE},{backend_['web']}}}": "2"}


def test_a_route_without_retries_or_attempt_timeouts_is_not_asked_about_them() -> None:
    """``exchange.settle_attempt`` and ``exchange.attempt_timeout`` answer for a plain policy route (no retry
    budget, no per-attempt timeout: most) without classifying its attempt or asking its retry state; a route
    with retries and one with a per-attempt timeout are still asked (their retries and timeouts: the playbooks
    above)."""
    from tether.proxy.core import exchange
    from tether.proxy.core.client_policy import Retry
    from tether.proxy.core.http import HttpSettings
    from tether.proxy.core.policy_routes import Attempts
    from tether.proxy.core.profiles import MATCH_ALL

    asked: list[str] = []

    class Asked(PolicyRoute):
        __slots__ = ()

        def is_failure(self, status: int, grpc_status: int | None = None) -> bool:
            asked.append("is_failure")
            return PolicyRoute.is_failure(self, status, grpc_status)

        def attempt_timeout(self) -> float | None:
            asked.append("attempt_timeout")
            return PolicyRoute.attempt_timeout(self)

    settings = HttpSettings("outbound", lambda: 100.0, None)
    retry = Retry(limit=1, max_request_bytes=64 * 1024, statuses=((500, 599),))
    plain, with_retries = Asked(MATCH_ALL, timeout=5.0), Asked(MATCH_ALL, budget=Attempts(1), retry=retry)
    timed = Asked(MATCH_ALL, budget=Attempts(1), retry=Retry(1, 64 * 1024, ((500, 599),), timeout=0.5))
    assert exchange.settle_attempt(settings, plain, "", 100.0, 503, None, None, True) is Settled.FINAL
    assert exchange.attempt_timeout(plain) is None and exchange.attempt_timeout(with_retries) is None
    assert asked == []  # the short path: nothing asked
    assert exchange.settle_attempt(settings, with_retries, "", 100.0, 503, None, None, True) is Settled.RETRY
    assert exchange.attempt_timeout(timed) == 0.5
    assert asked == ["is_failure", "attempt_timeout"]


def test_a_routes_series_expire_together_once_no_request_begins_on_them() -> None:
    from tether.proxy.core import exchange
    from tether.proxy.core.http import HttpSettings
    from tether.proxy.core.policy_routes import RouteReport
    from tether.proxy.core.profiles import MATCH_ALL

    clock = Clock()
    registry = Registry(retain_idle=600.0, clock=clock)
    report = RouteReport(PolicyMetrics(registry), False, f"{PARENT},{ROUTE}")
    backend_ = report.of_backend(policy_of().only[False][1].backends[0])  # type: ignore[index]
    route = PolicyRoute(MATCH_ALL, report=report)
    settings = HttpSettings("outbound", clock, None)

    def one_request() -> None:
        _, frames, _ = exchange.route_begun(settings, route)
        assert frames is not None
        frames(100)
        backend_.series().requests += 1
        exchange.record_route(settings, "", 200, True, clock.now, route=route)

    def lines() -> list[str]:
        return [line for line in registry.render().splitlines() if line.startswith("outbound_http_route_")
                and ("_count{" in line or "_total{" in line)]

    one_request()
    assert len(lines()) == 4  # the route's statuses, duration and request frames; the backend's requests
    clock.now += 500
    one_request()  # moved since the last scrape: touched now
    clock.now += 500
    assert len(lines()) == 4 and f'request_statuses_total{{{PARENT},{ROUTE},hostname="",http_status="200",error=""}} 2' \
        in "\n".join(lines())
    clock.now += 601
    assert lines() == []  # nothing begun for retain_idle: the route's and its backend's series go together
