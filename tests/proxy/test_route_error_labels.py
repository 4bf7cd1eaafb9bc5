"""The ``error`` label of a client policy route's ``outbound_{http,grpc}_route_request_statuses_total``: what
linkerd2-proxy's route metrics call the error that ended a request (its ``labels::Error``, proxy.md §9.5) --
which timeout passed, how the upstream reset the stream, whether the connection broke under it; that a client
policy rule's timeouts run to the response's end; and that its retries take a fail-fast as retryable.

Playbooks of both cores (tests/proxy/playbook.py, tests/proxy/h2_playbook.py): no sockets.
"""

from __future__ import annotations

from typing import Any

import pytest
from h2.errors import ErrorCodes
from h2_fakes import FakeClock
from h2_playbook import Checkin as H2Checkin
from h2_playbook import Connect, Connected, Count, Down, Fire, H2Playbook, Headers, Rst, SendDown, SendUp, Up
from playbook import CallLater, Checkin, Checkout, DownData, UpEof
from playbook import Connected as H1Connected
from playbook import Count as H1Count
from playbook import SendDown as H1SendDown
from playbook import SendUp as H1SendUp
from test_http2_playbook import OK, POLICY_GET, grpc_call_headed, policy_playbook

import test_client_policy as cp
from tether.proxy.core import errors
from tether.proxy.core.balancer import FULL
from tether.proxy.core.errors import RouteError
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_metrics import PolicyMetrics


def statuses(registry: Registry) -> list[str]:
    """The route's status series that counted a request: their ``http_status`` and ``error`` labels."""
    prefix = f'outbound_http_route_request_statuses_total{{{cp.PARENT},{cp.ROUTE},hostname="",'
    return [line[len(prefix):] for line in registry.render().splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("annotations, seconds, label", [
    ({"timeout.linkerd.io/request": "1s"}, 1.0, "REQUEST_TIMEOUT"),
    ({"timeout.linkerd.io/response": "1s"}, 1.0, "RESPONSE_STREAM_TIMEOUT"),
    # Both: the shorter one passes first, and names the error.
    ({"timeout.linkerd.io/request": "2s", "timeout.linkerd.io/response": "1s"}, 1.0, "RESPONSE_STREAM_TIMEOUT"),
    ({"timeout.linkerd.io/request": "1s", "timeout.linkerd.io/response": "2s"}, 1.0, "REQUEST_TIMEOUT"),
])
def test_an_http1_route_timeout_is_named_by_the_timeout_that_passed(annotations: dict[str, str], seconds: float,
                                                                   label: str) -> None:
    registry = Registry(retain_idle=600.0, clock=cp.Clock())
    get = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    assert (cp.playbook([cp.http_route("r", "web", [{}], annotations=annotations)], PolicyMetrics(registry),
                        clock=cp.Clock())
            >> DownData(get)
            << CallLater(seconds)
            << Checkout(cp.UP)
            >> H1Connected()
            << H1SendUp(0, get)
            >> Fire()
            << Checkin(0, reuse=False)
            << H1Count("outbound_http_errors_total", 'error="response timeout"')
            << H1SendDown(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                          b"l5d-proxy-error: HTTP response timeout after 1s\r\n\r\n"))
    assert statuses(registry) == [f'http_status="",error="{label}"}} 1']


@pytest.mark.parametrize("annotations, label", [
    ({"timeout.linkerd.io/request": "1s"}, "REQUEST_TIMEOUT"),
    ({"timeout.linkerd.io/response": "1s"}, "RESPONSE_STREAM_TIMEOUT"),
])
def test_an_http2_route_timeout_is_named_by_the_timeout_that_passed(annotations: dict[str, str],
                                                                   label: str) -> None:
    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    error = errors.request_timeout(1.0)
    assert (policy_playbook(annotations, clock, PolicyMetrics(registry))
            >> Down(Headers(1, POLICY_GET, end=True))
            << CallLater(1.0)
            << Connect(cp.UP)
            >> Connected()
            << SendUp(0, Headers(1, POLICY_GET, end=True))
            >> Fire()
            << Count("outbound_http_errors_total", 'error="response timeout"')
            << SendDown(Headers(1, [(b":status", b"504"), (b"content-length", b"0"),
                                    (b"l5d-proxy-error", error.message.encode())], end=True))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL)))
    assert statuses(registry) == [f'http_status="",error="{label}"}} 1']


def headed(registry: Registry) -> H2Playbook:
    """A request on a client policy route without timeouts, up to its response head relayed to the client."""
    return (policy_playbook({}, FakeClock(), PolicyMetrics(registry))
            >> Down(Headers(1, POLICY_GET, end=True))
            << Connect(cp.UP)
            >> Connected()
            << SendUp(0, Headers(1, POLICY_GET, end=True))
            >> Up(0, Headers(1, OK))
            << SendDown(Headers(1, OK)))


@pytest.mark.parametrize("code, label", [
    (ErrorCodes.CANCEL, "CANCEL"),
    (ErrorCodes.REFUSED_STREAM, "REFUSED"),  # after the response head: not sent again, an error
    (ErrorCodes.ENHANCE_YOUR_CALM, "ENHANCE_YOUR_CALM"),
    (ErrorCodes.INTERNAL_ERROR, "RESET"),
])
def test_an_upstream_reset_under_a_response_is_named_by_its_code(code: ErrorCodes, label: str) -> None:
    """The upstream resets a stream whose response began: the client's stream is reset with the same code, and
    the route's metrics keep the status that came with the error the reset was."""
    registry = Registry(retain_idle=600.0, clock=FakeClock())
    assert (headed(registry)
            >> Up(0, Rst(1, code))
            << SendDown(Rst(1, code)))
    assert statuses(registry) == [f'http_status="200",error="{label}"}} 1']


def test_an_upstream_connection_lost_under_a_response_is_io() -> None:
    registry = Registry(retain_idle=600.0, clock=FakeClock())
    assert (headed(registry)
            >> UpEof(0)
            << H2Checkin(0, reuse=False)
            << SendDown(Rst(1, ErrorCodes.INTERNAL_ERROR)))
    assert statuses(registry) == ['http_status="200",error="IO"} 1']


def test_every_reset_code_has_a_route_error() -> None:
    assert {code: errors.reset_error(code) for code in ErrorCodes} == {
        code: {ErrorCodes.CANCEL: RouteError.CANCEL, ErrorCodes.REFUSED_STREAM: RouteError.REFUSED,
               ErrorCodes.ENHANCE_YOUR_CALM: RouteError.ENHANCE_YOUR_CALM}.get(code, RouteError.RESET)
        for code in ErrorCodes}


# -- a client policy route's timeouts run to the response's end ------------------------------------------------


@pytest.mark.parametrize("annotations, label", [
    ({"timeout.linkerd.io/request": "1s"}, "REQUEST_TIMEOUT"),
    ({"timeout.linkerd.io/response": "1s"}, "RESPONSE_STREAM_TIMEOUT"),
])
def test_an_http1_response_still_streaming_at_the_timeout_is_broken_off(annotations: dict[str, str],
                                                                       label: str) -> None:
    """linkerd2-proxy's stream deadline and response-end timeout bound the response's body too: the head came in
    time, the body did not end, so the response is broken off (both connections closed) and recorded with its
    status and the timeout's error."""
    from playbook import Close, UpData

    registry = Registry(retain_idle=600.0, clock=cp.Clock())
    get = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    assert (cp.playbook([cp.http_route("r", "web", [{}], annotations=annotations)], PolicyMetrics(registry),
                        clock=cp.Clock())
            >> DownData(get)
            << CallLater(1.0)
            << Checkout(cp.UP)
            >> H1Connected()
            << H1SendUp(0, get)
            >> UpData(0, head + b"hello")
            << H1SendDown(head + b"hello")
            >> Fire()
            << Checkin(0, reuse=False)
            << Close())
    assert statuses(registry) == [f'http_status="200",error="{label}"}} 1']


def test_an_http2_response_still_streaming_at_the_timeout_is_reset() -> None:
    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    assert (policy_playbook({"timeout.linkerd.io/request": "1s"}, clock, PolicyMetrics(registry))
            >> Down(Headers(1, POLICY_GET, end=True))
            << CallLater(1.0)
            << Connect(cp.UP)
            >> Connected()
            << SendUp(0, Headers(1, POLICY_GET, end=True))
            >> Up(0, Headers(1, OK))
            << SendDown(Headers(1, OK))
            >> Fire()
            << SendDown(Rst(1, ErrorCodes.INTERNAL_ERROR))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL)))
    assert statuses(registry) == ['http_status="200",error="REQUEST_TIMEOUT"} 1']


def test_a_grpc_response_still_streaming_at_the_timeout_ends_with_deadline_exceeded() -> None:
    assert (grpc_call_headed({"timeout.linkerd.io/request": "1s"}, FakeClock())
            >> Fire()
            << SendDown(Headers(1, [(b"grpc-status", b"4"),
                                    (b"grpc-message", b"HTTP response timeout after 1s")], end=True))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL)))


def test_a_response_that_ended_in_time_is_not_touched_by_the_timeout() -> None:
    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    book = (policy_playbook({"timeout.linkerd.io/request": "1s"}, clock, PolicyMetrics(registry))
            >> Down(Headers(1, POLICY_GET, end=True))
            << CallLater(1.0)
            << Connect(cp.UP)
            >> Connected()
            << SendUp(0, Headers(1, POLICY_GET, end=True))
            >> Up(0, Headers(1, OK, end=True))
            << SendDown(Headers(1, OK, end=True)))
    assert book
    assert book.sink.timers and all(timer.cancelled for timer in book.sink.timers)
    assert statuses(registry) == ['http_status="200",error=""} 1']


def test_a_service_profile_routes_timeout_stops_at_the_response_head() -> None:
    """A ServiceProfile route's timeout bounds the response head only: a response streaming past it goes on."""
    from test_http2_profiles import GRPC as CALL, Router as ProfileRouter, http_settings as profile_settings, profile
    from test_http2_proxy import ADDRS

    book = (H2Playbook(ProfileRouter(ADDRS[:1], profile(timeout=0.3)), profile_settings(FakeClock()))
            >> Down(Headers(1, CALL, end=True))
            << CallLater(0.3)
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, [*CALL, (b"l5d-dst-canonical", b"names:9090")], end=True))
            >> Up(0, Headers(1, OK))
            << SendDown(Headers(1, OK)))
    assert book
    assert book.sink.timers and all(timer.cancelled for timer in book.sink.timers)  # nothing can fire now


@pytest.mark.parametrize("reply, status, label, retried", [(None, b"504", "failfast", True),
                                                           (FULL, b"503", "loadshed", False)])
def test_a_fail_fast_is_retried_on_a_client_policy_route_and_load_shedding_is_not(
        reply: Any, status: bytes, label: str, retried: bool) -> None:
    """linkerd2-proxy's policy retries take a fail-fast error as retryable, whatever the rule's conditions (the
    next attempt may draw another backend), and a load-shed one as final: a route with one retry tries a request
    that failed fast once more after the backoff, then answers; the route's metrics count the retry and one
    request, ``error="FAIL_FAST"``."""
    from h2_playbook import Wait, Waited

    from tether.proxy.core.balancer_queue import Queue
    from tether.proxy.core.http import HttpSettings
    from tether.proxy.core.http_metrics import HttpMetrics
    from tether.proxy.core.routes import outbound_router

    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    balancers = cp.Balancers({cp.WEB: "10.0.0.7"})
    route = cp.http_route("r", "web", [{}], annotations={"retry.linkerd.io/http": "5xx",
                                                         "retry.linkerd.io/limit": "1"})
    policy = cp.policy_of(route, balancers=balancers)
    for balancer in balancers.by_path.values():
        balancer.reset([])
    router = outbound_router(cp.ORIG, cp.Resolution(authority=cp.WEB), local_ips=frozenset(), connect_timeout=1.0,
                             queue=Queue(), loop_addrs=frozenset(), draw=lambda: 0.0,
                             policies=cp.PolicyWatch(policy), policy_metrics=PolicyMetrics(registry))
    book = H2Playbook(router, HttpSettings("outbound", clock, HttpMetrics(clock, 600.0), strip_proxy_errors=True))
    error = (errors.failfast if reply is None else errors.queue_full)(cp.WEB)
    book >> Down(Headers(1, POLICY_GET, end=True)) << Wait() >> Waited(reply)
    if retried:
        book << CallLater(0.025) >> Fire() << Wait() >> Waited(reply)  # the backoff, then the second attempt
    assert (book
            << Count("outbound_http_errors_total", f'error="{label}"')
            << SendDown(Headers(1, [(b":status", status), (b"content-length", b"0"),
                                    (b"l5d-proxy-error", error.message.encode())], end=True)))
    name = {"failfast": "FAIL_FAST", "loadshed": "LOAD_SHED"}[label]
    assert statuses(registry) == [f'http_status="",error="{name}"}} 1']
    retries = f'outbound_http_route_retry_requests_total{{{cp.PARENT},{cp.ROUTE},hostname=""}} 1'
    assert (retries in registry.render()) is retried
