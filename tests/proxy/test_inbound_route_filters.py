"""Inbound route filters (proxy.md §8.3): header modifiers, redirects, failure injection, as linkerd2-proxy applies
them after authorization and before the rate limit.

Socket-free: ``core.route_filters`` and ``core.inbound_authz`` are pure; the
``Server`` messages are the generated protobuf classes, as the policy
controller's translator fills them; the HTTP/1 core is driven through its
sink (``test_http1_proxy``'s playbook helpers).
"""

from __future__ import annotations

import ipaddress

import pytest
from test_inbound_authz import WEB, identities_authz, request, server_message

from tether.api import http_route_pb2, http_types_pb2
from tether.api import inbound_pb2 as pb
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core import errors
from tether.proxy.core.errors import ErrorKind, ProxyError
from tether.proxy.core.http1_headers import edited
from tether.proxy.core.inbound_authz import ConnectionFacts, InboundRequestPolicy
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_translation import InvalidPolicy, translate
from tether.proxy.core.route_filters import FailureInjector, HeaderModifier, InvalidRedirect, Redirect


def routed(*filters: pb.HttpRoute.Filter, prefix: str = "/api") -> pb.Server:
    message = server_message(route_authz=[identities_authz("web-only", WEB)], path_prefix=prefix)
    message.protocol.detect.http_routes[0].rules[0].filters.extend(filters)
    return message


def modifier(**kwargs: object) -> pb.HttpRoute.Filter:
    mod = http_route_pb2.RequestHeaderModifier()
    for field in ("add", "set"):
        for name, value in kwargs.get(field, {}).items():  # type: ignore[attr-defined]
            getattr(mod, field).headers.add(name=name, value=value)
    mod.remove.extend(kwargs.get("remove", ()))  # type: ignore[arg-type]
    return pb.HttpRoute.Filter(request_header_modifier=mod)


def checker(message: pb.Server, *, client_id: str | None = WEB, draw: float = 0.0,
            registry: Registry | None = None) -> InboundRequestPolicy:
    policy = translate(message)
    facts = ConnectionFacts(port=8080, client_ip=ipaddress.ip_address("10.0.0.7"), mesh_tls=client_id is not None,
                            client_id=client_id, target_labels='target_port="8080"', tls_labels='tls="true"',
                            registry=registry)
    return InboundRequestPolicy(lambda: policy, facts, clock=lambda: 0.0, draw=lambda: draw)


# -- header modifiers ----------------------------------------------------------------------------------------

def test_add_then_set_then_remove() -> None:
    mod = HeaderModifier(add=((b"x-a", b"2"), (b"x-b", b"added")), set=((b"x-b", b"new"),), remove=frozenset({b"x-c"}))
    out = mod.apply(((b"X-A", b"1"), (b"X-B", b"old"), (b"x-b", b"older"), (b"X-C", b"gone"), (b"keep", b"k")))
    assert out == ((b"X-A", b"1"), (b"keep", b"k"), (b"x-a", b"2"), (b"x-b", b"new"))  # set replaces what add added


def test_a_route_header_modifier_edits_the_request_after_authorization() -> None:
    policy = checker(routed(modifier(add={"x-route": b"api"}, set={"x-env": b"prod"}, remove=["x-debug"])))
    edit = policy.check(RequestHead(b"GET", b"/api/vote", ((b"host", b"voting"), (b"x-debug", b"1"),
                                                           (b"x-env", b"dev"))))
    assert callable(edit)
    assert edit(((b"host", b"voting"), (b"x-debug", b"1"), (b"x-env", b"dev"))) == (
        (b"host", b"voting"), (b"x-route", b"api"), (b"x-env", b"prod"))
    denied = checker(routed(modifier(add={"x-route": b"api"})), client_id=None).check(request(b"/api/vote"))
    assert isinstance(denied, ProxyError) and denied.status == 403  # authorization first


@pytest.mark.parametrize("edit", [{"set": {"l5d-client-id": b"admin.forged"}}, {"add": {"L5D-Dst-Canonical": b"x"}},
                                  {"remove": ["l5d-client-id"]}, {"set": {"content-length": b"0"}}])
def test_header_modifiers_cannot_touch_l5d_or_framing_headers(edit: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicy, match=r"request_header_modifier: (l5d|content)"):
        translate(routed(modifier(**edit)))  # the invalid policy then: every request 403


def test_framing_headers_stay_the_connections() -> None:
    head = RequestHead(b"POST", b"/api", ((b"host", b"h"), (b"transfer-encoding", b"chunked"), (b"x", b"1")))
    out = edited(head, HeaderModifier(set=((b"transfer-encoding", b"identity"), (b"content-length", b"0")),
                                      remove=frozenset({b"x"})).apply)
    assert out.headers == ((b"host", b"h"), (b"transfer-encoding", b"chunked"))
    assert out.raw is None and out.rewrite  # serialised anew


@pytest.mark.parametrize("field, value", [("name", "bad name"), ("name", ":authority"), ("value", b"a\r\nb")])
def test_a_bad_header_makes_the_policy_invalid(field: str, value: object) -> None:
    mod = http_route_pb2.RequestHeaderModifier()
    header = mod.set.headers.add(name="x-ok", value=b"v")
    setattr(header, field, value)
    with pytest.raises(InvalidPolicy, match=r"request_header_modifier\.set\.headers\[0\]"):
        translate(routed(pb.HttpRoute.Filter(request_header_modifier=mod)))


# -- redirects -----------------------------------------------------------------------------------------------

def redirect_filter(**kwargs: object) -> pb.HttpRoute.Filter:
    return pb.HttpRoute.Filter(redirect=http_route_pb2.RequestRedirect(**kwargs))  # type: ignore[arg-type]


def test_a_redirect_answers_its_status_and_location() -> None:
    answer = checker(routed(redirect_filter(host="new.example.com", status=302))).check(
        RequestHead(b"GET", b"/api/vote?x=1", ((b"host", b"voting.emojivoto:8080"),)))
    assert isinstance(answer, ProxyError) and answer.kind is ErrorKind.REDIRECT
    assert answer.status == 302 and answer.headers == ((b"location", b"http://new.example.com:8080/api/vote?x=1"),)
    head = errors.response(answer, meshed_client=True)
    assert head.status == 302 and (b"location", b"http://new.example.com:8080/api/vote?x=1") in head.headers
    assert answer.kind.grpc == 5  # NOT_FOUND for a gRPC client


@pytest.mark.parametrize("redirect, target, location", [
    (Redirect(scheme="https"), "/a", "https://web:8080/a"),
    (Redirect(port=80), "/a", "http://web/a"),
    (Redirect(port=9090), "/a", "http://web:9090/a"),
    (Redirect(host="other", port=80), "/a", "http://other:80/a"),
    (Redirect(full_path="/b"), "/a?q=1", "http://web:8080/b"),
    (Redirect(prefix="/v2"), "/api/vote?q=1", "http://web:8080/v2/vote?q=1"),
    (Redirect(prefix="/v2"), "/apivote", "http://web:8080/v2/vote"),
])
def test_redirect_locations(redirect: Redirect, target: str, location: str) -> None:
    assert redirect.location("http", "web:8080", target, "/api") == location


def test_a_redirect_to_where_the_request_is_is_no_redirect_and_a_prefix_needs_a_prefix_match() -> None:
    assert Redirect(port=8080).location("http", "web:8080", "/a", None) is None
    with pytest.raises(InvalidRedirect):
        Redirect(prefix="/v2").location("http", "web:8080", "/a", None)
    message = routed(redirect_filter(path=http_route_pb2.PathModifier(prefix="/v2")))
    message.protocol.detect.http_routes[0].rules[0].matches[0].path.exact = "/api/vote"
    answer = checker(message).check(request(b"/api/vote"))
    assert isinstance(answer, ProxyError) and answer.status == 500  # linkerd2-proxy: an invalid redirect is a 500
    assert checker(routed(redirect_filter(port=8080))).check(request(b"/api/vote")) is None


def test_a_relative_redirect_path_makes_the_policy_invalid() -> None:
    with pytest.raises(InvalidPolicy, match=r"redirect\.path\.full"):
        translate(routed(redirect_filter(path=http_route_pb2.PathModifier(full="relative"))))
    with pytest.raises(InvalidPolicy, match=r"redirect\.scheme"):
        translate(routed(redirect_filter(scheme=http_types_pb2.Scheme(unregistered="not a scheme"))))


# -- failure injection ---------------------------------------------------------------------------------------

def failing(numerator: int = 0, denominator: int = 0, status: int = 503) -> pb.HttpRoute.Filter:
    injector = http_route_pb2.HttpFailureInjector(status=status, message="chaos")
    if denominator:
        injector.ratio.numerator, injector.ratio.denominator = numerator, denominator
    return pb.HttpRoute.Filter(failure_injector=injector)


def test_an_injected_failure_is_an_unexpected_error_inbound() -> None:
    answer = checker(routed(failing())).check(request(b"/api/vote"))
    assert isinstance(answer, ProxyError) and answer.kind is ErrorKind.UNEXPECTED
    assert answer.status == 500 and answer.message == "unexpected error" and errors.grpc_status(answer) == 13


def test_the_ratio_decides_which_requests_fail() -> None:
    half = routed(failing(1, 2))
    assert isinstance(checker(half, draw=0.25).check(request(b"/api/vote")), ProxyError)
    assert checker(half, draw=0.75).check(request(b"/api/vote")) is None
    assert FailureInjector(500, "", 0, 5).hits(0.0) is False
    zero = failing()
    zero.failure_injector.ratio.numerator = 1  # denominator 0
    with pytest.raises(InvalidPolicy, match=r"ratio\.denominator"):
        translate(routed(zero))


def test_filters_apply_in_order_and_before_the_rate_limit() -> None:
    message = routed(modifier(add={"x-a": b"1"}), failing())
    message.protocol.detect.http_local_rate_limit.total.requestsPerSecond = 1
    policy = checker(message)
    first = policy.check(request(b"/api/vote"))
    assert isinstance(first, ProxyError) and first.kind is ErrorKind.UNEXPECTED
    second = policy.check(request(b"/api/vote"))
    assert isinstance(second, ProxyError) and second.kind is ErrorKind.UNEXPECTED  # the limit never consumed


def test_the_invalid_policys_filter_is_never_reached_authorization_comes_first() -> None:
    from tether.proxy.core.server_policy import INVALID

    facts = ConnectionFacts(port=8080, client_ip=ipaddress.ip_address("127.0.0.1"), mesh_tls=False, client_id=None,
                            target_labels="", tls_labels="", registry=None)
    policy = InboundRequestPolicy(lambda: INVALID, facts, clock=lambda: 0.0)
    answer = policy.check(request(b"/"))
    assert isinstance(answer, ProxyError) and answer.status == 403


# -- informational headers -----------------------------------------------------------------------------------

def test_informational_headers_only_when_allowed() -> None:
    error = errors.unauthorized()
    plain = dict(errors.response(error, meshed_client=False, informational=False).headers)
    assert b"l5d-proxy-error" not in plain and b"l5d-proxy-connection" not in plain
    meshed = dict(errors.response(error, meshed_client=True, informational=True).headers)
    assert meshed[b"l5d-proxy-error"] == b"unauthorized request on route"
    grpc = dict(errors.grpc_headers(error, informational=False))
    assert grpc[b"grpc-status"] == b"7" and b"grpc-message" not in grpc and b"l5d-proxy-error" not in grpc


# -- through the HTTP/1 core (a playbook: bytes in, sink calls out) ------------------------------------------

def test_the_http1_core_sends_the_edited_request_and_answers_redirects_keeping_the_connection() -> None:
    from playbook import Checkin, Checkout, Close, Connected, Count, DownData, Playbook, SendDown, SendUp, UpData
    from test_http1_proxy import ADDR, OK, router

    from tether.proxy.core.http import HttpSettings

    policy = checker(routed(modifier(set={"x-env": b"prod"}, remove=["x-debug"])))
    redirecting = checker(routed(redirect_filter(host="new.example.com", status=307)))
    inbound = HttpSettings("inbound", lambda: 0.0, policy=policy, informational=False)
    events: list[str] = []
    assert (Playbook(router(events), inbound)
            >> DownData(b"GET /api/vote HTTP/1.1\r\nHost: web\r\nX-Debug: 1\r\nX-Env: dev\r\n\r\n")
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, b"GET /api/vote HTTP/1.1\r\nHost: web\r\nx-env: prod\r\n\r\n")
            >> UpData(0, OK)
            << SendDown(OK)
            << Checkin(0, reuse=True))
    unmeshed = HttpSettings("inbound", lambda: 0.0, policy=redirecting, informational=False)
    moved = (b"HTTP/1.1 307 Temporary Redirect\r\ncontent-length: 0\r\n"
             b"location: http://new.example.com/api/vote\r\n\r\n")
    assert (Playbook(router(events), unmeshed)
            >> DownData(b"GET /api/vote HTTP/1.1\r\nHost: web\r\n\r\n")
            << Count("inbound_http_errors_total", 'error="unexpected"')  # as linkerd2-proxy counts a redirect
            << SendDown(moved)
            >> DownData(b"GET /api/vote HTTP/1.1\r\nHost: web\r\n\r\n")  # the connection goes on
            << Count("inbound_http_errors_total", 'error="unexpected"')
            << SendDown(moved))
    failing_policy = checker(routed(failing()))
    assert (Playbook(router(events), HttpSettings("inbound", lambda: 0.0, policy=failing_policy, informational=False))
            >> DownData(b"GET /api/vote HTTP/1.1\r\nHost: web\r\n\r\n")
            << Count("inbound_http_errors_total", 'error="unexpected"')
            << SendDown(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            << Close())  # an inbound injected failure is Linkerd's unexpected error: the connection is closed
