"""Profile routes in the HTTP/1 layer without sockets: timeouts, retries and their budget, route metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

from layer_helpers import drive, kinds
from test_http1_layer import CONNECT, LABELS, Clock, Fake, fixed_router
from test_proxy_driver import TARGET, accepted_pair, new_driver

from tether.proxy.core import commands as cmd
from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core import errors
from tether.proxy.core.http_commands import Checkin, Checkout, RecvUp, Upstream
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http1_layer import MAX_REPLAY, HttpSettings, Pick, http1
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.core.profiles import MATCH_ALL, Profile, ResponseClass, Route, Split, StatusRange
from tether.proxy.core.retries import RetryBudget
from tether.proxy.codec.http1 import RequestHead

RT = 'direction="outbound",dst="web:80",rt_route="r"'
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
FAIL = b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\noops"
GET = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"


def budget(ratio: float = 1.0, min_per_second: int = 10) -> RetryBudget:
    return RetryBudget(ttl=10.0, min_per_second=min_per_second, ratio=ratio, clock=lambda: 0.0)


def make_route(**kwargs: Any) -> Route:
    """A profile route as discovery would hand it over (with its metric series)."""
    return Profile("web:80", [Route(MATCH_ALL, labels='rt_route="r"', **kwargs)], Split([])).routes[0]


def routed(events: list[str], route: Route, errors_first: list[ProxyError] = ()) -> Any:
    """A router answering every request with ``route`` (after the given errors)."""
    pending_errors = list(errors_first)

    def router(request: RequestHead) -> Generator[cmd.Command, Any, Pick | ProxyError]:
        events.append("route")
        if pending_errors:
            return pending_errors.pop(0)
        pick = Pick(CONNECT, None, LABELS, b"web:80", observe=lambda rtt: events.append("rtt"),
                    failed=lambda: events.append("failed"), release=lambda: events.append("release"))
        pick.route = route
        return pick
        yield

    return router


def run(fake: Fake, router: Any, metrics: HttpMetrics) -> list[cmd.Command]:
    return fake.drive(router, HttpSettings("outbound", Clock(), metrics, strip_proxy_errors=True))


def test_no_head_within_the_route_timeout_is_504_and_closes() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    fake = Fake(down=[GET, GET], ups=[[None]])
    seen = run(fake, routed(events, make_route(timeout=0.3)), metrics)
    reads = [c for c in seen if isinstance(c, RecvUp)]
    assert len(reads) == 1 and 0 < reads[0].timeout < 0.3  # what is left of the deadline
    assert fake.to_down.startswith(b"HTTP/1.1 504 Gateway Timeout\r\n")
    assert b"l5d-proxy-error: HTTP response timeout after 300ms\r\n" in fake.to_down
    assert b"connection: close\r\n" in fake.to_down
    assert fake.to_down.count(b"HTTP/1.1") == 1  # the second request is never read
    assert fake.checkins == [False]
    assert events == ["route", "release"]
    assert any(isinstance(c, cmd.Count) and c.labels == 'error="response timeout"' for c in seen)
    series = metrics.routes.snapshot()[RT]
    assert series.requests == 1
    assert series.responses == {'classification="failure",grpc_status="",error="timeout"': 1}


def test_a_route_without_timeout_reads_without_deadline() -> None:
    events: list[str] = []
    fake = Fake(down=[GET], ups=[[OK]])
    seen = run(fake, routed(events, make_route()), HttpMetrics(lambda: 0.0, 600))
    assert [c.timeout for c in seen if isinstance(c, RecvUp)] == [None]
    assert fake.to_down.startswith(b"HTTP/1.1 200 OK")


def test_a_failure_is_retried_on_another_pick_within_the_budget() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    b = budget()
    fake = Fake(down=[b"POST /r HTTP/1.1\r\nHost: web\r\nContent-Length: 5\r\n\r\nhello"], ups=[[FAIL], [OK]])
    run(fake, routed(events, make_route(budget=b)), metrics)
    assert fake.to_down.startswith(b"HTTP/1.1 200 OK")
    assert b"oops" not in fake.to_down
    assert all(up.endswith(b"\r\n\r\nhello") for up in fake.to_up) and len(fake.to_up) == 2  # the body, again
    assert all(b"\r\nl5d-dst-canonical: web:80\r\n" in up for up in fake.to_up)  # the profile's service
    assert events == ["route", "rtt", "release", "route", "rtt", "release"]
    assert fake.checkins == [False, True]  # the failed response is not read on: its connection closes
    series = metrics.routes.snapshot()[RT]
    assert (series.requests, series.actual_requests, series.retryable_total, series.no_budget) == (1, 2, 1, 0)
    assert series.responses == {'status_code="200",classification="success",grpc_status="",error=""': 1}
    assert series.actual_responses == {'status_code="500",classification="failure",grpc_status="",error=""': 1,
                                       'status_code="200",classification="success",grpc_status="",error=""': 1}
    endpoint = metrics.snapshot()[LABELS]
    assert endpoint.requests == 2 and sum(endpoint.responses.values()) == 2


def test_retries_go_on_until_the_budget_is_spent() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    b = budget(ratio=0.0, min_per_second=0)
    b.reserve = 3  # three retries, then none
    fake = Fake(down=[GET], ups=[[FAIL]] * 5)
    run(fake, routed(events, make_route(budget=b)), metrics)
    assert len(fake.to_up) == 4
    assert fake.to_down.startswith(b"HTTP/1.1 500 Oops") and fake.to_down.endswith(b"oops")
    series = metrics.routes.snapshot()[RT]
    assert (series.actual_requests, series.retryable_total, series.no_budget) == (4, 4, 1)
    assert b.balance() == 0  # no deposit when the budget said no


def test_a_success_deposits_and_a_non_retryable_route_does_not_retry() -> None:
    b = budget(ratio=1.0, min_per_second=0)
    fake = Fake(down=[GET], ups=[[OK]])
    run(fake, routed([], make_route(budget=b)), HttpMetrics(lambda: 0.0, 600))
    assert b.balance() == 1
    fake = Fake(down=[GET], ups=[[FAIL], [OK]])
    metrics = HttpMetrics(lambda: 0.0, 600)
    run(fake, routed([], make_route()), metrics)  # not retryable: no budget
    assert len(fake.to_up) == 1 and fake.to_down.startswith(b"HTTP/1.1 500")
    assert not metrics.routes.snapshot()[RT].retryable


def test_response_classes_decide_what_is_a_failure() -> None:
    classes = (ResponseClass(StatusRange(500, 500), False), ResponseClass(StatusRange(429, 429), True))
    b = budget()
    fake = Fake(down=[GET, GET], ups=[[FAIL, b"HTTP/1.1 429 Slow\r\nContent-Length: 0\r\n\r\n"], [OK]])
    metrics = HttpMetrics(lambda: 0.0, 600)
    run(fake, routed([], make_route(budget=b, classes=classes)), metrics)
    # The 500 is a success here (relayed, not retried); the 429 a failure (retried on a new connection).
    assert fake.to_down.count(b"HTTP/1.1 500 Oops") == 1 and fake.to_down.endswith(OK)
    assert len(fake.to_up) == 2
    series = metrics.routes.snapshot()[RT]
    assert series.responses == {'status_code="500",classification="success",grpc_status="",error=""': 1,
                                'status_code="200",classification="success",grpc_status="",error=""': 1}


def test_a_body_over_64_kib_is_not_retried() -> None:
    b = budget()
    body = b"x" * (MAX_REPLAY + 1)
    head = b"POST /r HTTP/1.1\r\nHost: web\r\nContent-Length: %d\r\n\r\n" % len(body)
    fake = Fake(down=[head, body[:40000], body[40000:]], ups=[[FAIL], [OK]])
    run(fake, routed([], make_route(budget=b)), HttpMetrics(lambda: 0.0, 600))
    assert len(fake.to_up) == 1 and fake.to_up[0].endswith(body)  # streamed, not held back
    assert fake.to_down.startswith(b"HTTP/1.1 500")
    assert b.balance() == b.reserve + 1  # not retryable: the request deposits


def test_an_upstream_that_breaks_before_its_head_is_retried_as_a_502() -> None:
    b = budget()
    metrics = HttpMetrics(lambda: 0.0, 600)
    fake = Fake(down=[GET], ups=[[b""], [OK]])
    run(fake, routed([], make_route(budget=b)), metrics)
    assert fake.to_down.startswith(b"HTTP/1.1 200 OK")
    series = metrics.routes.snapshot()[RT]
    assert series.actual_responses['status_code="502",classification="failure",grpc_status="",error=""'] == 1


def test_failfast_is_answered_not_retried() -> None:
    events: list[str] = []
    b = budget()
    metrics = HttpMetrics(lambda: 0.0, 600)
    route = make_route(budget=b)
    failfast = errors.failfast("web:80")
    fake = Fake(down=[GET], ups=[])
    run(fake, routed(events, route, [ProxyError(failfast.kind, failfast.message, route=route)]), metrics)
    assert fake.to_down.startswith(b"HTTP/1.1 504")
    assert events == ["route"]
    series = metrics.routes.snapshot()[RT]
    assert series.retryable_total == 0
    assert series.responses == {'status_code="504",classification="failure",grpc_status="",error=""': 1}


def test_failed_connects_count_as_one_attempt_each_and_are_retried() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    fake = Fake(down=[GET], ups=[[OK]])
    refused = [3]

    def answer(command: cmd.Command) -> Any:
        if isinstance(command, Checkin):
            return None
        if isinstance(command, Checkout) and refused[0]:
            refused[0] -= 1
            return cmd.Failed("i/o", "ECONNREFUSED")
        return fake(command)

    seen = drive(http1(routed(events, make_route(budget=budget())), HttpSettings("outbound", Clock(), metrics)),
                 answer)
    assert kinds(seen).count("Checkout") == 4  # three refused (one attempt), then the retry
    assert fake.to_down.startswith(b"HTTP/1.1 200 OK")
    assert events.count("failed") == 3
    series = metrics.routes.snapshot()[RT]
    assert series.actual_responses['status_code="502",classification="failure",grpc_status="",error=""'] == 1
    assert series.responses == {'status_code="200",classification="success",grpc_status="",error=""': 1}


def test_requests_without_a_route_leave_the_route_families_alone() -> None:
    metrics = HttpMetrics(lambda: 0.0, 600)
    fake = Fake(down=[GET], ups=[[OK]])
    fake.drive(fixed_router([]), HttpSettings("outbound", Clock(), metrics))
    assert metrics.routes.snapshot() == {}
    assert fake.to_down.startswith(b"HTTP/1.1 200 OK")


# -- the driver's side: RecvUp with a deadline, on a real socket ---------------------------------------------------


def test_the_driver_answers_none_when_an_upstream_read_passes_its_deadline() -> None:
    async def scenario() -> None:
        driver, _ = new_driver()
        release = asyncio.Event()

        async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await release.wait()
            writer.write(b"late")
            await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(late, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        replies: list[Any] = []

        def layer() -> cmd.Layer:
            up = yield Checkout(cmd.Connect(parse_socket_addr(f"127.0.0.1:{port}"), None, 1.0, "x"))
            assert isinstance(up, Upstream)
            replies.append((yield RecvUp(up, 0.05)))  # nothing comes: None
            release.set()
            replies.append((yield RecvUp(up, 5.0)))  # then the bytes
            yield Checkin(up, reuse=False)

        async with accepted_pair() as (_, server):
            await asyncio.wait_for(driver.run("outbound", server, TARGET, layer()), 10)
        upstream.close()
        await upstream.wait_closed()
        assert replies == [None, b"late"]

    asyncio.run(scenario())


def test_a_failure_after_the_deadline_is_not_retried_but_timed_out() -> None:
    clock = Clock()
    b = budget()
    metrics = HttpMetrics(lambda: 0.0, 600)
    fake = Fake(down=[GET], ups=[[FAIL], [OK]])
    answer = fake.__call__

    def slow_upstream(command: cmd.Command) -> Any:
        reply = answer(command)
        if isinstance(command, RecvUp):
            clock.now += 1.0  # the failed response came, but a second late
        return reply

    fake.__call__ = slow_upstream  # type: ignore[method-assign]
    balance = b.balance()
    drive(http1(routed([], make_route(budget=b, timeout=0.5)), HttpSettings("outbound", clock, metrics)),
          lambda c: None if isinstance(c, Checkin) else slow_upstream(c))
    assert fake.to_down.startswith(b"HTTP/1.1 504 Gateway Timeout\r\n")
    assert len(fake.to_up) == 1  # no other attempt
    assert b.balance() == balance  # nothing withdrawn, nothing deposited
    series = metrics.routes.snapshot()[RT]
    assert series.responses == {'classification="failure",grpc_status="",error="timeout"': 1}
    assert series.actual_responses == {'status_code="500",classification="failure",grpc_status="",error=""': 1}


def test_a_client_that_leaves_mid_body_releases_the_endpoint() -> None:
    events: list[str] = []
    fake = Fake(down=[b"POST /r HTTP/1.1\r\nHost: web\r\nContent-Length: 10\r\n\r\nabc"], ups=[[OK]])
    run(fake, routed(events, make_route(budget=budget())), HttpMetrics(lambda: 0.0, 600))
    assert events == ["route", "release"]
    assert fake.to_down.startswith(b"HTTP/1.1 400 ")  # as for any request that breaks off
