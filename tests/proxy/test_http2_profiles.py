"""ServiceProfile routes for HTTP/2 streams without sockets: route metrics, timeouts, retries (proxy.md §7.5, §7.6).

The h2 client and scripted servers of ``h2_fakes``; a router that hands out
a profile route with each pick, and a fake clock the harness moves on to
the earliest timer (a route's timeout) once nothing else happens.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator
from typing import Any

import pytest

from h2.errors import ErrorCodes
from h2_fakes import Client, FakeClock, H2Server, Harness, respond

from tether.proxy import native
from tether.proxy.core import commands as cmd
from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http2_proxy import Http2Proxy, http2
from tether.proxy.core.http import MAX_REPLAY, HttpSettings, Pick
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.core.profiles import PathRegex, Profile, ResponseClass, Route, Split, StatusRange
from tether.proxy.core.retries import RetryBudget
from tether.proxy.codec.http1 import RequestHead

ADDRS = [SocketAddr(parse_ip(f"10.0.0.{i}"), 8080) for i in range(1, 3)]
LABELS = 'direction="outbound",target_addr="10.0.0.9:80"'
DST = 'direction="outbound",dst="names:9090"'
RT = DST + ',rt_route="call"'
GRPC = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"names"), (b":path", b"/pkg.Svc/Call"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")]
GET = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"names"), (b":path", b"/get")]
OK_TRAILERS = [(b"grpc-status", b"0")]
GRPC_HEAD = ((b"content-type", b"application/grpc"),)


def grpc_answer(code: int) -> Callable[[H2Server, int, list[tuple[bytes, bytes]], bytes], None]:
    """A gRPC server's answer: OK with a message and trailers, or another code trailers-only (END_STREAM)."""
    if code == 0:
        return respond(body=b"\x00\x00\x00\x00\x02hi", trailers=OK_TRAILERS, headers=GRPC_HEAD)

    def handler(server: H2Server, sid: int, request: list[tuple[bytes, bytes]], data: bytes) -> None:
        server.conn.send_headers(sid, [(b":status", b"200"), *GRPC_HEAD, (b"grpc-status", str(code).encode())],
                                 end_stream=True)

    return handler


def silent(server: H2Server, sid: int, request: list[tuple[bytes, bytes]], data: bytes) -> None:
    """A server that never answers."""


def budget(ratio: float = 1.0, min_per_second: int = 10) -> RetryBudget:
    return RetryBudget(ttl=10.0, min_per_second=min_per_second, ratio=ratio, clock=lambda: 0.0)


def profile(**call: Any) -> Profile:
    """Routes as discovery hands them over: ``call`` for ``/pkg.Svc/Call`` (the given settings), ``lenient``
    for ``/pkg.Svc/Lenient`` (a 200 is a success whatever its grpc-status), then the default route."""
    return Profile("names:9090", [
        Route(PathRegex("/pkg.Svc/Call"), labels='rt_route="call"', **call),
        Route(PathRegex("/pkg.Svc/Lenient"), (ResponseClass(StatusRange(200, 200), False),),
              labels='rt_route="lenient"'),
    ], Split([]))


class Router:
    """Picks the addresses in turn, each pick with the request's route of ``profile``."""

    def __init__(self, addrs: list[SocketAddr], prof: Profile) -> None:
        self.cycle = itertools.cycle(addrs)
        self.profile = prof
        self.log: list[str] = []
        self.requests: list[RequestHead] = []

    def __call__(self, request: RequestHead) -> Generator[cmd.Command, Any, Pick | ProxyError]:
        self.requests.append(request)
        addr = next(self.cycle)
        pick = Pick(cmd.Connect(addr, None, 1.0, "x"), None, LABELS, b"names:9090",
                    failed=lambda: self.log.append(f"failed {addr}"),
                    release=lambda: self.log.append(f"release {addr}"))
        pick.route = self.profile.route_for(request.method, request.target)
        return pick
        yield  # a generator, like every router


def http_settings(clock: FakeClock) -> HttpSettings:
    return HttpSettings("outbound", clock, HttpMetrics(clock, 600), strip_proxy_errors=True, error_labels=LABELS)


def routes(settings: HttpSettings, labels: str = RT) -> Any:
    assert settings.metrics is not None
    return settings.metrics.routes.snapshot()[labels]


# The tests that count acks replace the codec's ack on the core's endpoint, which a compiled class does not allow:
# under the compiled modules they run interpreted, in tests/proxy/test_native.py.
patches_the_codec = pytest.mark.skipif(native.status.startswith("compiled"),
                                       reason="replaces a compiled method: run interpreted by test_native.py")


def counting_acks(router: Router, settings: HttpSettings, harness: Harness) -> tuple[cmd.Layer, dict[int, int]]:
    """The layer, and the request bytes its core acknowledges to the client per stream (its window handed back)."""
    acked: dict[int, int] = {}

    def prepare(core: Http2Proxy) -> None:
        ack = core.down.ack

        def counted(sid: int, n: int) -> None:
            if n > 0:  # what the endpoint acknowledges (it ignores the rest)
                acked[sid] = acked.get(sid, 0) + n
            ack(sid, n)

        core.down.ack = counted  # type: ignore[method-assign]

    harness.prepare = prepare
    return http2(router, settings), acked


def send_body(sid: int, body: bytes) -> Callable[[Client], None]:
    """A client step: ``body`` on ``sid`` as the windows allow, then the end (repeat the step until it is out)."""
    rest = [body]

    def step(c: Client) -> None:
        while rest and c.conn.local_flow_control_window(sid) > 0:
            n = min(c.conn.local_flow_control_window(sid), c.conn.max_outbound_frame_size, len(rest[0]))
            c.conn.send_data(sid, rest[0][:n], end_stream=n == len(rest[0]))
            rest[0] = rest[0][n:]
            if not rest[0]:
                rest.clear()

    return step


def test_route_metrics_follow_the_route_classes_and_grpc_status() -> None:
    clock = FakeClock()
    client = Client()
    ok = client.request(GRPC)
    failed = client.request(GRPC)
    lenient = client.request([*GRPC[:3], (b":path", b"/pkg.Svc/Lenient"), *GRPC[4:]])
    other = client.request(GET)
    answers = iter([grpc_answer(0), grpc_answer(5), grpc_answer(5), respond(b"503")])
    server = H2Server(lambda s, sid, req, body: next(answers)(s, sid, req, body))
    settings = http_settings(clock)
    harness = Harness(client, {ADDRS[0]: lambda: server}, clock=clock)
    harness.run(http2(Router(ADDRS[:1], profile()), settings))
    assert client.trailers[ok] == OK_TRAILERS and dict(client.responses[failed])[b"grpc-status"] == b"5"
    assert dict(client.responses[lenient])[b"grpc-status"] == b"5"
    assert client.status(other) == b"503"
    # The profile's service is named to the peer (l5d-dst-canonical), as over HTTP/1.
    assert all((b"l5d-dst-canonical", b"names:9090") in headers for headers in server.requests.values())
    call = routes(settings)
    assert (call.requests, call.actual_requests, call.retryable) == (2, 2, False)
    assert call.responses == {'status_code="200",classification="success",grpc_status="0",error=""': 1,
                              'status_code="200",classification="failure",grpc_status="5",error=""': 1}
    assert call.actual_responses == call.responses
    assert call.latency[200][-1] == 2
    # A response class matching the status decides before grpc-status does.
    assert routes(settings, DST + ',rt_route="lenient"').responses == {
        'status_code="200",classification="success",grpc_status="5",error=""': 1}
    # The default route (no rt_ labels) counts the rest, by the default rule.
    assert routes(settings, DST).responses == {
        'status_code="503",classification="failure",grpc_status="",error=""': 1}
    assert harness.timeouts == []  # no route with a timeout: no timer


def test_no_head_within_the_route_timeout_is_deadline_exceeded_and_cancels_upstream() -> None:
    clock = FakeClock()
    client = Client()
    call = client.request(GRPC)
    plain = client.request([*GET[:3], (b":path", b"/pkg.Svc/Call")])
    servers: list[H2Server] = []

    def server() -> H2Server:
        servers.append(H2Server(silent))
        return servers[-1]

    settings = http_settings(clock)
    harness = Harness(client, {ADDRS[0]: server}, clock=clock)
    harness.run(http2(Router(ADDRS[:1], profile(timeout=0.3)), settings))
    head = dict(client.responses[call])
    assert head[b":status"] == b"200" and head[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED, trailers-only
    assert head[b"l5d-proxy-error"] == b"HTTP response timeout after 300ms"
    assert call in client.ended and call not in client.resets
    assert client.status(plain) == b"504"
    assert servers[0].resets == {1: ErrorCodes.CANCEL, 3: ErrorCodes.CANCEL}  # the upstream streams are cancelled
    assert 0.29 <= harness.timeouts[0] <= 0.3 and clock.now >= 100.3
    assert [c.labels for c in harness.counts] == ['error="response timeout"'] * 2
    series = routes(settings)
    assert series.requests == 2
    # The route saw no response (Linkerd's timeout is an error there), gRPC or not.
    assert series.responses == {'classification="failure",grpc_status="",error="timeout"': 2}
    assert series.actual_responses == {}
    assert settings.metrics is not None
    assert settings.metrics.snapshot()[LABELS].responses == {
        'status_code="200",classification="failure",grpc_status="4",error=""': 1,
        'status_code="504",classification="failure",grpc_status="",error=""': 1}


def test_an_answer_in_time_is_not_timed_out() -> None:
    clock = FakeClock()
    client = Client()
    call = client.request(GRPC)
    settings = http_settings(clock)
    harness = Harness(client, {ADDRS[0]: lambda: H2Server(grpc_answer(0))}, clock=clock)
    harness.run(http2(Router(ADDRS[:1], profile(timeout=0.3)), settings))
    assert client.trailers[call] == OK_TRAILERS
    assert harness.timeouts == [] and clock.now == 100.0
    assert list(routes(settings).responses) == ['status_code="200",classification="success",grpc_status="0",error=""']


@patches_the_codec
def test_a_failing_endpoint_is_hidden_by_retries_on_the_other() -> None:
    clock = FakeClock()
    client = Client()
    body = b"\x00\x00\x00\x50\x00" + bytes(range(256)) * 80  # 20 KiB, over several DATA frames
    calls = [client.request(GRPC, end=False) for _ in range(3)]
    for sid in calls:
        for i in range(0, len(body), 8192):
            client.conn.send_data(sid, body[i:i + 8192], end_stream=i + 8192 >= len(body))
    servers = {ADDRS[0]: H2Server(grpc_answer(14)), ADDRS[1]: H2Server(grpc_answer(0))}
    settings = http_settings(clock)
    b = budget()
    router = Router(ADDRS, profile(budget=b))
    harness = Harness(client, {addr: (lambda s=s: s) for addr, s in servers.items()}, clock=clock)
    layer, acked = counting_acks(router, settings, harness)
    harness.run(layer)
    assert all(client.trailers[sid] == OK_TRAILERS and client.bodies[sid] == b"\x00\x00\x00\x00\x02hi"
               for sid in calls)
    assert all(b"grpc-status" not in dict(client.responses[sid]) for sid in calls)  # the failure never showed
    good, bad = servers[ADDRS[1]], servers[ADDRS[0]]
    assert list(good.bodies.values()) == [body] * 3  # the body, sent again whole
    assert list(bad.bodies.values()) == [body] * len(bad.requests)
    retries = len(bad.requests)  # every attempt there failed, and was retried
    assert retries >= 2 and len(router.requests) == 3 + retries
    assert set(bad.resets.values()) <= {ErrorCodes.CANCEL}
    series = routes(settings)
    assert (series.requests, series.actual_requests, series.retryable_total, series.no_budget) == (
        3, 3 + retries, retries, 0)
    assert series.responses == {'status_code="200",classification="success",grpc_status="0",error=""': 3}
    assert series.actual_responses == {
        'status_code="200",classification="success",grpc_status="0",error=""': 3,
        'status_code="200",classification="failure",grpc_status="14",error=""': retries}
    assert settings.metrics is not None
    endpoint = settings.metrics.snapshot()[LABELS]
    assert endpoint.requests == 3 + retries  # every attempt, under its endpoint
    assert endpoint.responses == {'status_code="200",classification="success",grpc_status="0",error=""': 3,
                                  'status_code="200",classification="failure",grpc_status="14",error=""': retries}
    assert router.log.count(f"release {ADDRS[0]}") == retries and router.log.count(f"release {ADDRS[1]}") == 3
    assert b.balance() == b.reserve + 3 - retries  # three deposits, a withdrawal per retry
    # Every request byte was acknowledged to the client once, the ones sent again included.
    assert {sid: acked[sid] for sid in calls} == {sid: len(body) for sid in calls}


class EarlyFailure(H2Server):
    """Answers UNAVAILABLE trailers-only as soon as a request's headers come (as a gRPC server may)."""

    def __init__(self) -> None:
        super().__init__(silent)

    def receive(self, data: bytes) -> None:
        before = set(self.requests)
        super().receive(data)
        for sid in set(self.requests) - before:
            if sid not in self.resets:
                self.conn.send_headers(sid, [(b":status", b"200"), *GRPC_HEAD, (b"grpc-status", b"14")],
                                       end_stream=True)


@patches_the_codec
def test_a_failure_before_the_request_ends_is_retried_with_the_rest_to_come() -> None:
    clock = FakeClock()
    client = Client()
    sid = client.request(GRPC, b"\x00\x00\x00\x00\x05", end=False)  # the message's prefix, then a wait

    def rest(c: Client) -> None:
        c.conn.send_data(sid, b"hello", end_stream=True)

    early, good = EarlyFailure(), H2Server(grpc_answer(0))
    settings = http_settings(clock)
    harness = Harness(client, {ADDRS[0]: lambda: early, ADDRS[1]: lambda: good}, [rest], clock=clock)
    layer, acked = counting_acks(Router(ADDRS, profile(budget=budget())), settings, harness)
    harness.run(layer)
    assert client.trailers[sid] == OK_TRAILERS
    assert good.bodies == {1: b"\x00\x00\x00\x00\x05hello"}  # what was kept, then the rest as it came
    assert early.resets == {1: ErrorCodes.CANCEL}
    assert acked[sid] == 10
    assert routes(settings).retryable_total == 1


def test_retries_stop_when_the_budget_is_spent() -> None:
    clock = FakeClock()
    client = Client()
    calls = [client.request(GRPC, b"\x00\x00\x00\x00\x01x") for _ in range(2)]
    settings = http_settings(clock)
    b = budget(ratio=0.0, min_per_second=0)
    b.reserve = 3  # three retries, then none
    router = Router(ADDRS, profile(budget=b))
    harness = Harness(client, {addr: (lambda: H2Server(grpc_answer(14))) for addr in ADDRS}, clock=clock)
    harness.run(http2(router, settings))
    assert all(dict(client.responses[sid])[b"grpc-status"] == b"14" for sid in calls)  # the last failure, as it is
    assert len(router.requests) == 5  # 3 retries for one call (whichever came first), none for the other
    series = routes(settings)
    assert (series.actual_requests, series.retryable_total, series.no_budget) == (5, 5, 2)
    assert series.responses == {'status_code="200",classification="failure",grpc_status="14",error=""': 2}
    assert b.balance() == 0  # no deposit when the budget said no


@patches_the_codec
def test_a_body_over_64k_is_not_retried() -> None:
    clock = FakeClock()
    client = Client()
    sid = client.request(GRPC, end=False)
    body = b"y" * (MAX_REPLAY + 1000)
    settings = http_settings(clock)
    b = budget()
    router = Router(ADDRS, profile(budget=b))
    servers = [H2Server(grpc_answer(14)), H2Server(grpc_answer(0))]
    harness = Harness(client, {addr: (lambda s=s: s) for addr, s in zip(ADDRS, servers, strict=True)},
                      [send_body(sid, body)] * 20, clock=clock)
    before = b.balance()
    layer, acked = counting_acks(router, settings, harness)
    harness.run(layer)
    assert dict(client.responses[sid])[b"grpc-status"] == b"14"
    assert servers[0].bodies == {1: body} and servers[1].requests == {}
    series = routes(settings)
    assert (series.actual_requests, series.retryable_total) == (1, 0)
    assert b.balance() == before + 1  # it ended without a retry: a deposit
    assert acked[sid] == len(body)


def test_an_endpoint_lost_before_its_head_is_retried_as_its_error() -> None:
    clock = FakeClock()
    client = Client()
    sid = client.request(GRPC, b"\x00\x00\x00\x00\x01x")
    settings = http_settings(clock)
    router = Router(ADDRS, profile(budget=budget()))

    def going(server: H2Server, stream: int, request: list[tuple[bytes, bytes]], data: bytes) -> None:
        server.conn.close_connection(error_code=ErrorCodes.INTERNAL_ERROR)  # the connection fails

    harness = Harness(client, {ADDRS[0]: lambda: H2Server(going), ADDRS[1]: lambda: H2Server(grpc_answer(0))},
                      clock=clock)
    harness.run(http2(router, settings))
    assert client.trailers[sid] == OK_TRAILERS
    series = routes(settings)
    assert (series.actual_requests, series.retryable_total) == (2, 1)
    assert series.actual_responses == {  # the UNAVAILABLE Linkerd answers for a lost endpoint, then the answer
        'status_code="200",classification="failure",grpc_status="14",error=""': 1,
        'status_code="200",classification="success",grpc_status="0",error=""': 1}
    assert harness.counts == []  # the proxy's error was never answered: not counted


def test_a_plain_http2_failure_status_is_retried_and_its_body_dropped() -> None:
    clock = FakeClock()
    client = Client()
    sid = client.request([*GET[:3], (b":path", b"/pkg.Svc/Call")])
    servers = {ADDRS[0]: H2Server(respond(b"503", body=b"busy")), ADDRS[1]: H2Server(respond(body=b"fine"))}
    settings = http_settings(clock)
    harness = Harness(client, {addr: (lambda s=s: s) for addr, s in servers.items()}, clock=clock)
    harness.run(http2(Router(ADDRS, profile(budget=budget())), settings))
    assert client.status(sid) == b"200" and client.bodies[sid] == b"fine"
    assert routes(settings).actual_responses == {
        'status_code="503",classification="failure",grpc_status="",error=""': 1,
        'status_code="200",classification="success",grpc_status="",error=""': 1}


def test_a_failure_after_the_deadline_ends_with_the_timeout_not_a_retry() -> None:
    clock = FakeClock()
    client = Client()
    sid = client.request(GRPC, b"\x00\x00\x00\x00\x01x")
    server = H2Server(silent)

    def late_failure(c: Client) -> None:
        clock.now += 1.0  # past the deadline, and the failure comes with it: the head is seen first
        server.conn.send_headers(1, [(b":status", b"200"), *GRPC_HEAD, (b"grpc-status", b"14")], end_stream=True)

    settings = http_settings(clock)
    b = budget()
    before = b.balance()
    harness = Harness(client, {ADDRS[0]: lambda: server}, [late_failure], clock=clock)
    harness.run(http2(Router(ADDRS[:1], profile(timeout=0.3, budget=b)), settings))
    head = dict(client.responses[sid])
    assert head[b"grpc-status"] == b"4" and head[b"l5d-proxy-error"] == b"HTTP response timeout after 300ms"
    series = routes(settings)
    assert (series.actual_requests, series.retryable_total) == (1, 0)
    assert series.actual_responses == {'status_code="200",classification="failure",grpc_status="14",error=""': 1}
    assert series.responses == {'classification="failure",grpc_status="",error="timeout"': 1}
    assert b.balance() == before  # neither a withdrawal nor a deposit
    assert [c.labels for c in harness.counts] == ['error="response timeout"']
    assert harness.timeouts == []  # the late head came before the route's timer fired
    assert settings.metrics is not None
    assert settings.metrics.snapshot()[LABELS].responses == {  # the attempt, under its endpoint, once
        'status_code="200",classification="failure",grpc_status="14",error=""': 1}
