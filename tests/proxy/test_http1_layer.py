"""tether.proxy.core.http1_layer without sockets: requests in, commands out, replies made up (proxy.md §7.8, §7.9, §9.2)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from layer_helpers import drive, kinds

from tether.proxy.core import commands as cmd
from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.core import errors
from tether.proxy.core.http_commands import Checkin, Checkout, RecvDown, RecvUp, SendDown, SendUp, Tunnel, Upstream
from tether.proxy.core.http1_layer import HttpSettings, InFlight, Pick, http1
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.codec.http1 import Http1Connection, RequestHead, ResponseHead, Role

ADDR = SocketAddr(parse_ip("10.0.0.7"), 8080)
CONNECT = cmd.Connect(ADDR, None, 1.0, "x")
LABELS = 'direction="outbound",target_addr="10.0.0.7:8080"'


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.004
        return self.now


class Fake:
    """Answers the HTTP commands: scripted client bytes, scripted upstream bytes per connection."""

    def __init__(self, down: list[bytes], ups: list[list[bytes]], *, reused: tuple[bool, ...] = ()) -> None:
        self.down = list(down)
        self.ups = [list(u) for u in ups]
        self.reused = list(reused)
        self.to_down = b""
        self.to_up: list[bytes] = []
        self.checkins: list[bool] = []
        self.idle: Upstream | None = None

    def __call__(self, command: cmd.Command) -> Any:
        if isinstance(command, RecvDown):
            return self.down.pop(0) if self.down else b""
        if isinstance(command, SendDown):
            self.to_down += command.data
            return True
        if isinstance(command, Checkout):
            if self.idle is not None:  # the pool's idle connection
                up, self.idle = self.idle, None
                up.reused = True
                return up
            n = len(self.to_up)
            self.to_up.append(b"")
            return Upstream(n, None, 0.001, self.reused[n] if n < len(self.reused) else False)
        if isinstance(command, SendUp):
            self.to_up[command.up.key] += command.data
            return True
        if isinstance(command, RecvUp):
            queue = self.ups[command.up.key]
            return queue.pop(0) if queue else b""
        raise AssertionError(f"unexpected {command!r}")

    def drive(self, router: Any, settings: HttpSettings) -> list[cmd.Command]:
        def answer(command: cmd.Command) -> Any:
            if isinstance(command, Checkin):
                self.checkins.append(command.reuse)
                if command.reuse:
                    self.idle = command.up
                return None
            return self(command)

        seen = []
        layer = http1(router, settings)
        reply: Any = None
        while True:
            try:
                command = layer.send(reply)
            except StopIteration:
                return seen
            seen.append(command)
            reply = answer(command) if command.blocking or isinstance(command, Checkin) else None


def fixed_router(events: list[str]) -> Any:
    def route(request: RequestHead) -> Generator[cmd.Command, Any, Pick]:
        events.append("route")
        return Pick(CONNECT, None, LABELS, b"web:80", observe=lambda rtt: events.append("rtt"),
                    failed=lambda: events.append("failed"), release=lambda: events.append("release"))
        yield

    return route


def settings(metrics: HttpMetrics | None = None, **kw: Any) -> HttpSettings:
    return HttpSettings("outbound", Clock(), metrics, **kw)


def test_keep_alive_requests_reuse_the_upstream_and_strip_hop_by_hop() -> None:
    events: list[str] = []
    metrics = HttpMetrics(lambda: 0.0, 600)
    fake = Fake(
        down=[b"GET /a HTTP/1.1\r\nHost: web\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\n\r\n",
              b"POST /b HTTP/1.1\r\nHost: web\r\nContent-Length: 3\r\n\r\nabc"],
        ups=[[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
              b"HTTP/1.1 503 No\r\nTransfer-Encoding: chunked\r\nl5d-proxy-error: far away\r\n\r\n1\r\nx\r\n0\r\n\r\n"],
             ],
    )
    seen = fake.drive(fixed_router(events), settings(metrics, strip_proxy_errors=True))
    assert kinds(seen).count("Checkout") == 2
    assert fake.checkins == [True, True]
    up = b"".join(fake.to_up)
    assert up.startswith(b"GET /a HTTP/1.1\r\nHost: web\r\n\r\n")  # Connection, its tokens and Keep-Alive gone
    assert b"POST /b HTTP/1.1\r\nHost: web\r\nContent-Length: 3\r\n\r\nabc" in up
    assert fake.to_down == (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                            b"HTTP/1.1 503 No\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n")
    assert events == ["route", "rtt", "release", "route", "rtt", "release"]
    series = metrics.snapshot()[LABELS]
    assert series.requests == 2
    assert series.responses == {'status_code="200",classification="success",grpc_status="",error=""': 1,
                                'status_code="503",classification="failure",grpc_status="",error=""': 1}


def test_failed_connects_try_three_times_then_502() -> None:
    events: list[str] = []
    fake = Fake(down=[b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"], ups=[])
    answer_checkout = fake.__call__

    def answer(command: cmd.Command) -> Any:
        if isinstance(command, Checkout):
            return cmd.Failed("i/o", "ECONNREFUSED")
        return answer_checkout(command)

    fake.__call__ = answer  # type: ignore[method-assign]
    seen = drive(http1(fixed_router(events), settings()), lambda c: answer(c))
    assert kinds(seen).count("Checkout") == 3
    assert events.count("failed") == 3
    assert fake.to_down.startswith(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nl5d-proxy-error: endpoint "
                                   b"10.0.0.7:8080: i/o (ECONNREFUSED)\r\nconnection: close\r\n")
    assert cmd.Count("outbound_http_errors_total", 'error="i/o"') in seen


def test_no_endpoint_is_504_failfast() -> None:
    def route(request: RequestHead) -> Generator[cmd.Command, Any, Any]:
        return errors.failfast("web.ns.svc.cluster.local:80")
        yield

    fake = Fake(down=[b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"], ups=[])
    drive(http1(route, settings()), fake)
    assert fake.to_down.startswith(b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\n"
                                   b"l5d-proxy-error: logical service web.ns.svc.cluster.local:80: service in "
                                   b"fail-fast\r\n")


def test_requests_over_the_in_flight_limit_are_shed_with_503() -> None:
    limit = InFlight(2)
    limit.count = 2  # two requests of other connections are waiting for their responses
    events: list[str] = []
    fake = Fake(down=[b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"], ups=[])
    drive(http1(fixed_router(events), settings(in_flight=limit)), fake)
    assert fake.to_down.startswith(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n"
                                   b"l5d-proxy-error: service unavailable: too many requests in flight\r\n"
                                   b"connection: close\r\n")
    assert events == [] and limit.count == 2  # never routed, nothing taken

    limit.count = 1  # room for one: it goes through, and gives its place back when its response has ended
    fake = Fake(down=[b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"], ups=[[b"HTTP/1.1 204 No Content\r\n\r\n"]])
    drive(http1(fixed_router(events), settings(in_flight=limit)), fake)
    assert fake.to_down.startswith(b"HTTP/1.1 204 No Content\r\n")
    assert limit.count == 1


def test_stale_pooled_connection_is_retried_for_a_bodiless_request() -> None:
    events: list[str] = []
    fake = Fake(down=[b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"],
                ups=[[b""], [b"HTTP/1.1 204 No Content\r\n\r\n"]], reused=(True, False))
    fake.drive(fixed_router(events), settings())
    assert fake.checkins == [False, True]
    assert fake.to_up[1] == b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"
    assert fake.to_down == b"HTTP/1.1 204 No Content\r\n\r\n"


def test_upstream_closing_before_its_head_is_502_and_bad_requests_are_400() -> None:
    events: list[str] = []
    fake = Fake(down=[b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"], ups=[[b"HTTP/1.1 2"]])
    fake.drive(fixed_router(events), settings())
    assert fake.to_down.startswith(b"HTTP/1.1 502 ")
    fake = Fake(down=[b"GET / HTTP/1.1\r\nHost: web\r\nBad Header: 1\r\n\r\n"], ups=[])
    seen = fake.drive(fixed_router(events), settings())
    assert fake.to_down.startswith(b"HTTP/1.1 400 Bad Request\r\n") and "Checkout" not in kinds(seen)


def test_inbound_sets_client_id_and_drops_a_forged_one() -> None:
    events: list[str] = []
    fake = Fake(down=[b"GET / HTTP/1.1\r\nHost: web\r\nl5d-client-id: forged\r\n\r\n"],
                ups=[[b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]])
    fake.drive(fixed_router(events), HttpSettings("inbound", Clock(), client_id="web.ns.serviceaccount.identity"))
    assert b"forged" not in fake.to_up[0]
    assert b"l5d-client-id: web.ns.serviceaccount.identity\r\n" in fake.to_up[0]


def test_latency_buckets_render_linkerd_style() -> None:
    metrics = HttpMetrics(lambda: 0.0, 600)
    metrics.request("a")
    metrics.response("a", 200, True, 7)
    out: list[str] = []
    metrics.render(out)
    assert 'response_latency_ms_bucket{a,status_code="200",le="5"} 0' in out
    assert 'response_latency_ms_bucket{a,status_code="200",le="10"} 1' in out
    assert 'response_latency_ms_bucket{a,status_code="200",le="+Inf"} 1' in out
    assert 'response_latency_ms_sum{a,status_code="200"} 7' in out
    assert 'request_total{a} 1' in out


def test_pool_reuses_open_connections_and_sweeps_idle_ones() -> None:
    import asyncio

    from tether.proxy.io.pool import Pool

    class Transport:
        def __init__(self) -> None:
            self.closed = False

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

    class Stream:
        def __init__(self) -> None:
            self.lost = self.eof = False
            self.buffer = bytearray()
            self.transport = Transport()

    async def scenario() -> None:
        pool = Pool(idle_timeout=0.0)  # every idle connection is due at the sweeper's first run
        a, b, c = (Upstream("k", Stream(), 0.01, False) for _ in range(3))
        pool.put(a)
        pool.put(b)
        b.io.eof = True  # the server closed it while idle
        assert pool.take("k") is a and a.reused and b.io.transport.closed
        assert pool.take("k") is None and pool.take("other") is None
        pool.put(c)
        while not c.io.transport.closed:  # the sweeper runs on a coming loop iteration
            await asyncio.sleep(0)
        assert c.io.transport.closed and pool.take("k") is None
        pool.close()

    asyncio.run(scenario())


# -- fuzzing the entry points -------------------------------------------------------------------------------------

VALID_REQUEST = b"GET /a HTTP/1.1\r\nHost: web\r\n\r\n"


class TunnelingFake(Fake):
    """Also takes the end of HTTP: a switch, or a first line that is not HTTP/1 after all (opaque)."""

    def __call__(self, command: cmd.Command) -> Any:
        if isinstance(command, Tunnel):
            return None  # the driver would now copy bytes both ways
        return super().__call__(command)
CLIENT_BYTES = st.lists(st.binary(max_size=64) | st.sampled_from([
    VALID_REQUEST, b"POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 3\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: w\r\nUpgrade: ws\r\nConnection: upgrade\r\n\r\n", b"\r\n", b"HTTP/1.1 200 OK\r\n",
    b"GET / HTTP/1.0\r\n\r\n", b"X: y\r\n", b"Content-Length: 99999999999999999999\r\n"]), max_size=8)


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


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CLIENT_BYTES)
def test_fuzz_client_bytes_end_in_answers_or_a_close(chunks: list[bytes]) -> None:
    """Whatever a client sends, the layer ends without raising and writes only well-formed HTTP/1 responses."""
    events: list[str] = []
    response = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    fake = TunnelingFake(down=chunks, ups=[[response] * 16 for _ in range(16)])
    fake.drive(fixed_router(events), settings())
    for head in _responses(fake.to_down):
        assert head.status in (101, 200, 400, 431, 502)
    assert events.count("route") == events.count("release")  # every routed request gave its endpoint back


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=64) | st.sampled_from([b"HTTP/1.1 200 OK\r\n", b"content-length: 5\r\n",
                                                           b"\r\n", b"hello", b"HTTP/1.1 100 Continue\r\n\r\n",
                                                           b"transfer-encoding: chunked\r\n"]), max_size=6))
def test_fuzz_upstream_bytes_end_in_its_answer_or_a_502(chunks: list[bytes]) -> None:
    """Whatever an upstream answers, the client gets that answer re-framed, or a 502, or a close mid-body."""
    events: list[str] = []
    fake = TunnelingFake(down=[VALID_REQUEST], ups=[list(chunks)] + [[] for _ in range(3)])
    fake.drive(fixed_router(events), settings())
    if fake.to_down:
        # Only the head needs to be well formed: a body cut short by the upstream is cut short for the client.
        head = fake.to_down.split(b"\r\n", 1)[0]
        assert head.startswith(b"HTTP/1.1 ")
    assert events.count("route") == events.count("release")
