"""The HTTP/1 core after an answer the proxy makes without closing (proxy.md §7.9, §8.4): 403, 404, 429, a
redirect, a client policy route's timeout. Linkerd keeps the client's connection open after these; the core
reads the rest of the request body (bounded by ``DRAIN_LIMIT``) and serves the next request on it.

Playbooks (tests/proxy/playbook.py): bytes in, sink calls out, no sockets.
"""

from __future__ import annotations

from typing import Any

from playbook import (
    CallLater,
    Checkin,
    Checkout,
    Close,
    Connected,
    Count,
    DownData,
    DownEof,
    FakeSink,
    Fire,
    Playbook,
    SendDown,
    SendUp,
    exchange,
)
from test_http1_proxy import ADDR, GET, OK, router

from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core import errors
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import HttpSettings
from tether.proxy.core.http1_proxy import DRAIN_LIMIT, Http1Proxy

FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n"


class Deny:
    """A ``RequestPolicy`` answering 403 for every path under ``/deny`` (others go on to the router)."""

    def check(self, request: RequestHead) -> ProxyError | None:
        return errors.unauthorized() if request.target.startswith(b"/deny") else None


def inbound(**kw: Any) -> HttpSettings:
    return HttpSettings("inbound", lambda: 0.0, policy=Deny(), informational=False, **kw)


def test_a_403_keeps_the_connection_and_the_next_request_is_served_on_it() -> None:
    events: list[str] = []
    assert (Playbook(router(events), inbound())
            >> DownData(b"GET /deny HTTP/1.1\r\nHost: web\r\n\r\n")
            << SendDown(FORBIDDEN)
            >> DownData(GET)
            >> exchange(ADDR, 0, GET, OK))
    assert events.count("route") == 1  # the refused request never reached the router


def test_the_refused_requests_body_is_read_and_dropped_before_the_next_request() -> None:
    events: list[str] = []
    post = b"POST /deny HTTP/1.1\r\nHost: web\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    assert (Playbook(router(events), inbound())
            >> DownData(post)
            << SendDown(FORBIDDEN)
            >> DownData(b"4\r\ndefg\r\n")  # dropped: nothing goes anywhere
            >> DownData(b"0\r\n\r\n" + GET)  # the body's end and, pipelined behind it, the next request
            >> exchange(ADDR, 0, GET, OK))


def test_a_body_over_the_drain_limit_closes_the_connection() -> None:
    size = DRAIN_LIMIT + 10
    head = b"POST /deny HTTP/1.1\r\nHost: web\r\nContent-Length: %d\r\n\r\n" % size
    assert (Playbook(router([]), inbound())
            >> DownData(head)
            << SendDown(FORBIDDEN)
            >> DownData(b"x" * DRAIN_LIMIT)  # up to the limit: still read
            >> DownData(b"x" * 10)
            << Close())


def test_a_client_that_will_not_go_on_or_a_connect_is_closed_after_the_answer() -> None:
    assert (Playbook(router([]), inbound())
            >> DownData(b"GET /deny HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
            << SendDown(FORBIDDEN)
            << Close())
    assert (Playbook(router([]), inbound())
            >> DownData(b"GET /deny HTTP/1.0\r\n\r\n")
            << SendDown(FORBIDDEN)
            << Close())
    # What follows a CONNECT is the tunnel's bytes by the client's intent, not an HTTP request.
    assert (Playbook(router([]), inbound())
            >> DownData(b"CONNECT /deny HTTP/1.1\r\nHost: web\r\n\r\n")
            << SendDown(FORBIDDEN)
            << Close())


def test_a_client_leaving_while_its_body_is_drained_is_closed() -> None:
    assert (Playbook(router([]), inbound())
            >> DownData(b"POST /deny HTTP/1.1\r\nHost: web\r\nContent-Length: 10\r\n\r\nab")
            << SendDown(FORBIDDEN)
            >> DownEof()
            << Close())


def test_fatal_answers_still_close() -> None:
    class Shed:
        def check(self, request: RequestHead) -> ProxyError | None:
            return errors.load_shed()

    settings = HttpSettings("inbound", lambda: 0.0, policy=Shed(), informational=False)
    assert (Playbook(router([]), settings)
            >> DownData(GET)
            << Count("inbound_http_errors_total", 'error="loadshed"')
            << SendDown(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            << Close())


def test_a_profile_route_timeout_closes_but_a_client_policy_timeout_does_not() -> None:
    from test_client_policy import UP, Clock, http_route, playbook
    from test_http1_proxy import make_route

    events: list[str] = []
    assert (Playbook(router(events, make_route(timeout=0.5)), HttpSettings("outbound", lambda: 0.0))
            >> DownData(GET)
            << CallLater(0.5)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, b"GET /r HTTP/1.1\r\nHost: web\r\nl5d-dst-canonical: web:80\r\n\r\n")
            >> Fire()
            << Checkin(0, reuse=False)
            << Count("outbound_http_errors_total", 'error="response timeout"')
            << SendDown(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: HTTP response timeout after 500ms\r\nconnection: close\r\n\r\n")
            << Close())
    route = http_route("r", "web", [{}], annotations={"timeout.linkerd.io/request": "1s"})
    get = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    assert (playbook([route], clock=Clock())
            >> DownData(get)
            << CallLater(1.0)
            << Checkout(UP)
            >> Connected()
            << SendUp(0, get)
            >> Fire()
            << Checkin(0, reuse=False)
            << Count("outbound_http_errors_total", 'error="response timeout"')
            << SendDown(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: HTTP response timeout after 1s\r\n\r\n")
            >> DownData(get)  # the same connection serves the next request
            << CallLater(1.0)
            << Checkout(UP)
            >> Connected()
            << SendUp(1, get))


def test_many_pipelined_refusals_are_answered_in_a_loop_not_nested_calls() -> None:
    sink = FakeSink()
    core = Http1Proxy(router([]), inbound(), sink)
    count = 3000  # far more than the interpreter's recursion limit allows of nested frames per request
    request = b"GET /deny HTTP/1.1\r\nHost: web\r\n\r\n"
    core.down_data(request * count)
    answered = b"".join(c.data for c in sink.calls if isinstance(c, SendDown))
    assert answered == FORBIDDEN * count
    assert not core.over and not core.paused
