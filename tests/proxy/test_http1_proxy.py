"""tether.proxy.core.http1_proxy as playbooks: client and upstream bytes in, sink calls out, no sockets
(proxy.md §7.3, §7.5, §7.6, §7.8, §7.9, §9.2)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from playbook import (
    CallLater,
    Checkin,
    Checkout,
    Close,
    ConnectFailed,
    Connected,
    Count,
    DownData,
    DownEof,
    DownLost,
    Fire,
    PauseDown,
    Playbook,
    ResumeDown,
    SendDown,
    SendUp,
    Tunnel,
    UpData,
    UpEof,
    Wait,
    Waited,
    exchange,
)

from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.codec.http1 import Http1Connection, RequestHead, ResponseHead, Role
from tether.proxy.core import commands as cmd
from tether.proxy.core import errors
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import HttpSettings, InFlight, Pick
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.core.profiles import MATCH_ALL, Profile, ResponseClass, Route, Split, StatusRange
from tether.proxy.core.retries import RetryBudget

ADDR = SocketAddr(parse_ip("10.0.0.7"), 8080)
CONNECT = cmd.Connect(ADDR, None, 1.0, "x")
LABELS = 'direction="outbound",target_addr="10.0.0.7:8080"'
RT = 'direction="outbound",dst="web:80",rt_route="r"'

GET = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
FAIL = b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\noops"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def router(events: list[str], route: Route | None = None, answers: list[Any] | None = None) -> Any:
    """Answers every request with ADDR (``route`` on it); ``answers`` first: a ProxyError, or "wait" to wait
    for discovery (the reply is what the test gives: None means fail-fast)."""
    pending = list(answers or [])

    def route_request(request: RequestHead) -> Generator[cmd.Command, Any, Pick | ProxyError]:
        events.append("route")
        if pending:
            answer = pending.pop(0)
            if answer == "wait":
                slot = yield cmd.Wait(None, 3.0)  # type: ignore[arg-type]
                if slot is None:
                    return errors.failfast("web:80")
            else:
                return answer
        pick = Pick(CONNECT, None, LABELS, b"web:80", observe=lambda rtt: events.append("rtt"),
                    failed=lambda: events.append("failed"), release=lambda: events.append("release"))
        pick.route = route
        return pick

    return route_request


def settings(metrics: HttpMetrics | None = None, **kw: Any) -> HttpSettings:
    return HttpSettings("outbound", Clock(), metrics, strip_proxy_errors=True, **kw)


def budget() -> RetryBudget:
    return RetryBudget(ttl=10.0, min_per_second=10, ratio=1.0, clock=lambda: 0.0)


def make_route(**kwargs: Any) -> Route:
    """A profile route as discovery would hand it over (with its metric series)."""
    return Profile("web:80", [Route(MATCH_ALL, labels='rt_route="r"', **kwargs)], Split([])).routes[0]


def test_a_plain_request_goes_up_as_it_came_and_its_connection_is_pooled() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    play = Playbook(router(events), settings(metrics))
    assert (play
            >> DownData(GET)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, GET)  # nothing to rewrite: the head's own bytes
            >> UpData(0, OK)
            << SendDown(OK)
            << Checkin(0, reuse=True)
            >> DownData(GET)  # the next request takes the pooled connection, within the callback
            << Checkout(ADDR, pooled=True)
            << SendUp(0, GET)
            >> UpData(0, b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
                      b"Content-Length: 2\r\n\r\nok")
            << SendDown(OK)  # hop-by-hop dropped (Connection: keep-alive alone would pass: test_http1_fast_paths.py)
            << Checkin(0, reuse=True)
            >> DownEof()
            << Close())
    assert events == ["route", "rtt", "release"] * 2
    assert metrics.snapshot()[LABELS].requests == 2


def test_hop_by_hop_headers_are_dropped_and_an_unframed_response_is_chunked() -> None:
    events: list[str] = []
    request = b"GET / HTTP/1.1\r\nHost: web\r\nConnection: keep-alive, x-trace\r\nX-Trace: 1\r\nA: b\r\n\r\n"
    assert (Playbook(router(events), settings())
            >> DownData(request)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, b"GET / HTTP/1.1\r\nHost: web\r\nA: b\r\n\r\n")
            >> UpData(0, b"HTTP/1.1 200 OK\r\nl5d-proxy-error: remote\r\n\r\nabc")
            << SendDown(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
            >> UpEof(0)
            << SendDown(b"0\r\n\r\n")
            << Checkin(0, reuse=False))


def test_the_response_starts_before_the_request_body_ends() -> None:
    """Full duplex: the response head and body go down while the client is still sending."""
    events: list[str] = []
    head = b"POST /up HTTP/1.1\r\nHost: web\r\nContent-Length: 6\r\n\r\n"
    assert (Playbook(router(events), settings())
            >> DownData(head + b"abc")
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, head + b"abc")
            >> UpData(0, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")
            << SendDown(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")
            >> DownData(b"def")
            << SendUp(0, b"def")
            >> UpData(0, b"lo")
            << SendDown(b"lo")
            << Checkin(0, reuse=True))


def test_failed_connects_try_three_times_then_502() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    play = Playbook(router(events), HttpSettings("outbound", Clock(), metrics, error_labels="e"))
    assert (play
            >> DownData(GET)
            << Checkout(ADDR)
            >> ConnectFailed()
            << Checkout(ADDR)
            >> ConnectFailed()
            << Checkout(ADDR)
            >> ConnectFailed(timed_out=True)
            << Count("outbound_http_errors_total", 'error="i/o"')
            << SendDown(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: endpoint 10.0.0.7:8080: connect timed out\r\nconnection: close\r\n\r\n")
            << Close())
    assert events == ["route", "failed", "release"] * 3
    assert metrics.snapshot()["e"].requests == 1


def test_no_endpoint_within_failfast_is_504_after_a_discovery_wait() -> None:
    events: list[str] = []
    assert (Playbook(router(events, answers=["wait"]), settings())
            >> DownData(GET)
            << Wait()
            >> Waited(None)
            << Count("outbound_http_errors_total", 'error="failfast"')
            << SendDown(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: logical service web:80: service in fail-fast\r\nconnection: close\r\n\r\n")
            << Close())


def test_requests_over_the_in_flight_limit_are_shed_with_503() -> None:
    events: list[str] = []
    limit = InFlight(1)
    limit.count = 1  # another connection's request
    assert (Playbook(router(events), settings(in_flight=limit))
            >> DownData(GET)
            << Count("outbound_http_errors_total", 'error="loadshed"')
            << SendDown(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: service unavailable: too many requests in flight\r\n"
                        b"connection: close\r\n\r\n")
            << Close())
    assert events == [] and limit.count == 1


def test_a_stale_pooled_connection_is_tried_again_on_a_new_one() -> None:
    events: list[str] = []
    play = Playbook(router(events), settings())
    play.sink.idle.append(play.sink.new_up())
    assert (play
            >> DownData(GET)
            << Checkout(ADDR, pooled=True)
            << SendUp(0, GET)
            >> UpEof(0)  # the server had closed it while idle
            << Checkin(0, reuse=False)
            >> exchange(ADDR, 1, GET, OK))


def test_a_stale_connections_resend_that_cannot_connect_is_routed_again() -> None:
    """The endpoint went away meanwhile (a server proxy shutting down ends its connections and stops listening; an
    upgraded request's stream refused or above its GOAWAY ends its leg the same way): the new connection fails, the
    endpoint goes to the balancer's backoff and the request to another pick, as after any failed connect -- not
    a 502 for a request another endpoint can serve."""
    events: list[str] = []
    play = Playbook(router(events), settings())
    play.sink.idle.append(play.sink.new_up())
    assert (play
            >> DownData(GET)
            << Checkout(ADDR, pooled=True)
            << SendUp(0, GET)
            >> UpEof(0)  # ended before any response
            << Checkin(0, reuse=False)
            << Checkout(ADDR)  # sent again on a new connection
            >> ConnectFailed()  # refused: nobody listens there any more
            >> exchange(ADDR, 1, GET, OK))  # the router's next pick (another endpoint, in a real balancer)
    assert events == ["route", "failed", "release", "route", "rtt", "release"]


def test_an_upstream_closing_before_its_head_is_502() -> None:
    events: list[str] = []
    assert (Playbook(router(events), settings())
            >> DownData(GET)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, GET)
            >> UpData(0, b"HTTP/1.1 20")
            >> UpEof(0)
            << Checkin(0, reuse=False)
            << Count("outbound_http_errors_total", 'error="i/o"')
            << SendDown(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nl5d-proxy-error: endpoint 10.0.0.7:8080: "
                        b"connection closed before the response\r\nconnection: close\r\n\r\n")
            << Close())
    assert events == ["route", "release"]


def test_a_smuggling_attempt_is_400_counted_and_closed() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    smuggle = b"POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
    play = Playbook(router(events), HttpSettings("inbound", Clock(), metrics, error_labels="e"))
    assert (play
            >> DownData(smuggle)
            << Count("inbound_http_errors_total", 'error="unexpected"')
            << SendDown(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: both Transfer-Encoding and Content-Length\r\nconnection: close\r\n\r\n")
            << Close())
    series = metrics.snapshot()["e"]
    assert series.requests == 1
    assert series.responses == {'status_code="400",classification="failure",grpc_status="",error="unexpected"': 1}
    assert events == []


def test_a_head_over_the_limit_is_431() -> None:
    events: list[str] = []
    play = Playbook(router(events), settings(max_head_size=64))
    assert (play
            >> DownData(b"GET / HTTP/1.1\r\nHost: w\r\nX: " + b"a" * 100)
            << Count("outbound_http_errors_total", 'error="unexpected"')
            << SendDown(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: head too large\r\nconnection: close\r\n\r\n")
            << Close())


def test_inbound_sets_client_id_and_drops_a_forged_one() -> None:
    events: list[str] = []
    client = HttpSettings("inbound", Clock(), client_id="web.ns.serviceaccount.identity")
    assert (Playbook(router(events), client)
            >> DownData(b"GET / HTTP/1.1\r\nHost: web\r\nl5d-client-id: forged\r\n\r\n")
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, b"GET / HTTP/1.1\r\nHost: web\r\nl5d-client-id: web.ns.serviceaccount.identity\r\n\r\n")
            >> UpData(0, OK)
            << SendDown(OK)
            << Checkin(0, reuse=True))
    plain = HttpSettings("inbound", Clock(), client_id="web.ns.serviceaccount.identity")
    assert (Playbook(router([]), plain)
            >> DownData(GET)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, GET[:-2] + b"l5d-client-id: web.ns.serviceaccount.identity\r\n\r\n"))  # appended


def test_a_client_that_leaves_has_its_upstream_closed_at_once() -> None:
    events: list[str] = []
    head = b"POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 100\r\n\r\n"
    assert (Playbook(router(events), settings())
            >> DownData(head + b"x" * 10)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, head + b"x" * 10)
            >> DownLost()
            << Checkin(0, reuse=False)
            << Close())
    assert events == ["route", "release"]


def test_pipelined_requests_are_served_one_after_the_other() -> None:
    events: list[str] = []
    assert (Playbook(router(events), settings())
            >> DownData(GET + GET)
            >> exchange(ADDR, 0, GET, OK)
            << Checkout(ADDR, pooled=True)  # the second, already read
            << SendUp(0, GET)
            >> UpData(0, OK)
            << SendDown(OK)
            << Checkin(0, reuse=True))


def test_a_body_held_while_connecting_stops_reading_the_client() -> None:
    events: list[str] = []
    head = b"POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 100000\r\n\r\n"
    body = b"x" * 70000
    assert (Playbook(router(events), settings())
            >> DownData(head + body)
            << Checkout(ADDR)
            << PauseDown()
            >> Connected()
            << SendUp(0, head + body)
            << ResumeDown())


def test_an_upgrade_joins_the_connections() -> None:
    events: list[str] = []
    ask = b"GET /ws HTTP/1.1\r\nHost: w\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"
    assert (Playbook(router(events), settings())
            >> DownData(ask + b"early")
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, b"GET /ws HTTP/1.1\r\nHost: w\r\nUpgrade: websocket\r\nconnection: upgrade\r\n\r\n")
            >> UpData(0, b"HTTP/1.1 101 Switching\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\nhi")
            << SendDown(b"HTTP/1.1 101 Switching\r\nUpgrade: websocket\r\nconnection: upgrade\r\n\r\n")
            << Tunnel(0, b"early", b"hi"))
    assert events == ["route", "rtt"]  # the endpoint is held until the tunnel ends


def test_a_first_line_that_is_not_http_is_carried_as_opaque_bytes() -> None:
    events: list[str] = []
    assert (Playbook(router(events), settings())
            >> DownData(b"GET\x00 nonsense\r\n\r\n")
            << Checkout(ADDR)
            >> Connected()
            << Tunnel(0, b"GET\x00 nonsense\r\n\r\n", b""))


# -- profile routes: timeout, retries within the budget, route metrics ------------------------------------------


def test_no_head_within_the_route_timeout_is_504_and_closes() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    assert (Playbook(router(events, make_route(timeout=0.3)), settings(metrics))
            >> DownData(GET + GET)
            << CallLater(0.3)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, GET[:-2] + b"l5d-dst-canonical: web:80\r\n\r\n")
            >> Fire()
            << Checkin(0, reuse=False)
            << Count("outbound_http_errors_total", 'error="response timeout"')
            << SendDown(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: HTTP response timeout after 300ms\r\nconnection: close\r\n\r\n")
            << Close())
    assert events == ["route", "release"]
    series = metrics.routes.snapshot()[RT]
    assert series.requests == 1
    assert series.responses == {'classification="failure",grpc_status="",error="timeout"': 1}


def test_failfast_on_a_profile_route_is_an_unclassified_error_without_a_status() -> None:
    """The proxy's own 504 for a route's service in fail-fast: linkerd2-proxy's route metrics see the error
    below them (``error="unclassified"``, no ``status_code``), as its profile stack wraps the balancer's queue."""
    from dataclasses import replace

    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    answer = replace(errors.failfast("web:80"), route=make_route())
    assert (Playbook(router(events, answers=[answer]), settings(metrics))
            >> DownData(GET)
            << Count("outbound_http_errors_total", 'error="failfast"')
            << SendDown(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: logical service web:80: service in fail-fast\r\nconnection: close\r\n\r\n")
            << Close())
    assert metrics.routes.snapshot()[RT].responses == {
        'classification="failure",grpc_status="",error="unclassified"': 1}


def test_a_failure_is_retried_on_another_pick_within_the_budget() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    post = b"POST /r HTTP/1.1\r\nHost: web\r\nContent-Length: 5\r\n\r\n"
    sent = post[:-2] + b"l5d-dst-canonical: web:80\r\n\r\nhello"
    assert (Playbook(router(events, make_route(budget=budget())), settings(metrics))
            >> DownData(post + b"hello")
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, sent)
            >> UpData(0, FAIL)
            << Checkin(0, reuse=False)  # the failed response is not read on
            << Checkout(ADDR)
            >> Connected()
            << SendUp(1, sent)  # the body, again
            >> UpData(1, OK)
            << SendDown(OK)
            << Checkin(1, reuse=True))
    assert events == ["route", "rtt", "release", "route", "rtt", "release"]
    series = metrics.routes.snapshot()[RT]
    assert (series.requests, series.actual_requests, series.retryable_total, series.no_budget) == (1, 2, 1, 0)
    assert series.responses == {'status_code="200",classification="success",grpc_status="",error=""': 1}
    endpoint = metrics.snapshot()[LABELS]
    assert endpoint.requests == 2 and sum(endpoint.responses.values()) == 2


def test_response_classes_decide_and_a_route_without_budget_does_not_retry() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    classes = (ResponseClass(StatusRange(200, 299), is_failure=True),)
    assert (Playbook(router(events, make_route(classes=classes)), settings(metrics))
            >> DownData(GET)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, GET[:-2] + b"l5d-dst-canonical: web:80\r\n\r\n")
            >> UpData(0, OK)
            << SendDown(OK)
            << Checkin(0, reuse=True))
    assert metrics.routes.snapshot()[RT].responses == {
        'status_code="200",classification="failure",grpc_status="",error=""': 1}


# -- fuzzing -------------------------------------------------------------------------------------------------------

CLIENT_BYTES = st.lists(st.binary(max_size=64) | st.sampled_from([
    GET, b"POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 3\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: w\r\nUpgrade: ws\r\nConnection: upgrade\r\n\r\n", b"\r\n", b"HTTP/1.1 200 OK\r\n",
    b"GET / HTTP/1.0\r\n\r\n", b"X: y\r\n", b"Content-Length: 99999999999999999999\r\n"]), max_size=8)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CLIENT_BYTES, st.booleans())
def test_fuzz_client_bytes_end_in_answers_or_a_close(chunks: list[bytes], eof: bool) -> None:
    """Whatever a client sends, the core never raises, answers only well-formed HTTP/1, and gives back every
    endpoint it took (each upstream answering OK at once)."""
    from playbook import FakeSink

    from tether.proxy.core.http1_proxy import Http1Proxy

    events: list[str] = []
    sink = FakeSink(pooling=False)  # every request on a new connection, answered at once
    core = Http1Proxy(router(events), settings(), sink)
    for chunk in [*chunks, *([b""] if eof else [])]:
        core.down_data(chunk)
        while sink.checkouts:
            sink.checkouts.pop(0)(sink.new_up())
            core.up_data(sink.ups[-1], OK)
    core.down_lost()  # whatever is still in hand is given back
    written = b"".join(c.data for c in sink.calls if isinstance(c, SendDown))
    for head in _responses(written):
        assert head.status in (101, 200, 400, 431, 502)
    tunnels = sum(isinstance(c, Tunnel) for c in sink.calls)
    assert events.count("route") == events.count("release") + tunnels


def _responses(data: bytes) -> list[ResponseHead]:
    """Every response head the client got, parsed as a client would (raises if the bytes are not HTTP/1)."""
    client = Http1Connection(Role.CLIENT)
    heads = []
    for _ in range(16):
        if not data:
            break
        client.send_head(RequestHead(b"GET", b"/", ((b"host", b"w"),)))
        client.send_end()
        events = client.receive_data(data)
        data = b""
        heads += [e for e in events if isinstance(e, ResponseHead)]
        if not (client.our_state.value == client.their_state.value == "DONE" and client.keep_alive):
            break
        leftover = client.trailing_data
        client.start_next_cycle()
        data = leftover
    return heads


def test_latency_buckets_render_linkerd_style() -> None:
    metrics = HttpMetrics(lambda: 0.0, 600)
    metrics.request("a")
    metrics.response("a", 200, True, 7)
    out: list[str] = []
    metrics.render(out)
    assert 'response_latency_ms_bucket{a,status_code="200",le="5"} 0' in out
    assert 'response_latency_ms_bucket{a,status_code="200",le="10"} 1' in out
    assert 'response_latency_ms_sum{a,status_code="200"} 7' in out
    assert 'request_total{a} 1' in out


def test_the_policy_and_tap_hooks_see_each_request() -> None:
    from test_http2_proxy import Observed

    events: list[str] = []
    hooks = Observed(refuse=b"/no")
    play = Playbook(router(events), settings(policy=hooks, observer=hooks))
    assert (play
            >> DownData(GET)
            >> exchange(ADDR, 0, GET, OK)
            >> DownData(b"GET /no HTTP/1.1\r\nHost: web\r\n\r\n")
            << Count("outbound_http_errors_total", 'error="loadshed"')
            << SendDown(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n"
                        b"l5d-proxy-error: service unavailable: too many requests in flight\r\n"
                        b"connection: close\r\n\r\n")
            << Close())
    assert hooks.seen == [("begin", b"/r"), ("check", b"/r"), ("request", b"/r"), ("response", 200), ("end", 200),
                          ("begin", b"/no"), ("check", b"/no"), ("end", 503)]
    assert hooks.ends == [(2, []), (0, [])]  # the relayed body's bytes ("ok"); the refusal relayed none
    assert [[(n.lower(), v) for n, v in h] for h in hooks.response_headers] == [[(b"content-length", b"2")]]
