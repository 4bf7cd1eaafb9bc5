"""tether.proxy.core.http2_proxy without sockets: an h2 client in, scripted servers out (proxy.md §7.3, §7.7-7.9, §9.2)."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Sequence
from typing import Any

import hpack
import hyperframe.frame as hf
from h2.errors import ErrorCodes
from h2_fakes import Client, H1App, H2Server, Harness, RawClient, respond
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.proxy.core import commands as cmd
from tether.proxy.core import labels
from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.core.config import DefaultPolicy
from tether.proxy.core import errors
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http2_proxy import http2
from tether.proxy.core.http import HttpSettings, InFlight, Pick
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.core import inbound as inbound
from tether.proxy.core import outbound as outbound
from tether.proxy.core.resolution import FORWARD
from tether.ports import PortSet
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.codec.detect import Http2
from tether.proxy.codec.http2 import PREFACE

ADDRS = [SocketAddr(parse_ip(f"10.0.0.{i}"), 8080) for i in range(1, 4)]
LABELS = 'direction="outbound",target_addr="10.0.0.9:80"'
GET = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"web"), (b":path", b"/")]
GRPC = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"web"), (b":path", b"/pkg.Svc/Call"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


class Router:
    """Picks the addresses in turn (or answers ``error``), keeping a log of the balancer callbacks."""

    def __init__(self, addrs: list[SocketAddr], error: ProxyError | None = None, wait: bool = False) -> None:
        self.cycle = itertools.cycle(addrs)
        self.error = error
        self.wait = wait
        self.log: list[str] = []
        self.requests: list[RequestHead] = []

    def __call__(self, request: RequestHead) -> Generator[cmd.Command, Any, Pick | ProxyError]:
        self.requests.append(request)
        if self.wait:
            yield cmd.Wait(object(), 1.0)  # type: ignore[arg-type]
        if self.error is not None:
            return self.error
        addr = next(self.cycle)
        return Pick(cmd.Connect(addr, None, 1.0, "x"), None, LABELS, b"web:80",
                    observe=lambda rtt: self.log.append("rtt"), failed=lambda: self.log.append(f"failed {addr}"),
                    release=lambda: self.log.append("release"))


def http_settings(direction: str = "outbound", **kw: Any) -> HttpSettings:
    return HttpSettings(direction, Clock(), HttpMetrics(lambda: 0.0, 600), error_labels=LABELS, **kw)


def responses(settings: HttpSettings) -> dict[str, int]:
    assert settings.metrics is not None
    series = settings.metrics.snapshot().get(LABELS)
    return dict(series.responses) if series is not None else {}


def test_each_stream_is_routed_on_its_own_and_shares_a_connection_per_endpoint() -> None:
    client = Client()
    sids = [client.request([*GET[:3], (b":path", b"/%d" % i)]) for i in range(6)]
    router = Router(ADDRS)
    servers: list[H2Server] = []

    def server() -> H2Server:
        servers.append(H2Server(respond(body=b"hi %d" % len(servers))))
        return servers[-1]

    settings = http_settings()
    harness = Harness(client, {addr: server for addr in ADDRS})
    harness.run(http2(router, settings))
    assert [r.target for r in router.requests] == [b"/%d" % i for i in range(6)]
    assert router.requests[0].version == b"2" and (b"host", b"web") in router.requests[0].headers
    assert harness.opened == [("h2", a) for a in ADDRS]  # one connection per endpoint, two streams on each
    assert [len(s.requests) for s in servers] == [2, 2, 2]
    assert all(client.status(sid) == b"200" for sid in sids) and client.ended >= set(sids)
    assert {client.bodies[sid] for sid in sids} == {b"hi 0", b"hi 1", b"hi 2"}
    assert router.log.count("release") == 6 and router.log.count("rtt") == 6
    assert settings.metrics is not None
    assert settings.metrics.snapshot()[LABELS].requests == 6
    assert responses(settings) == {'status_code="200",classification="success",grpc_status="",error=""': 6}
    assert {reuse for _, reuse in harness.checkins} == {False}  # closed with the client's connection


def test_bodies_and_trailers_both_ways_beyond_the_windows() -> None:
    client = Client()
    big = bytes(range(256)) * 1200  # 300 KiB: several windows' worth each way
    sid = client.request(GRPC, end=False)
    rest = [big]

    def send_rest(c: Client) -> None:
        while rest and c.conn.local_flow_control_window(sid) > 0:
            n = min(c.conn.local_flow_control_window(sid), c.conn.max_outbound_frame_size, len(rest[0]))
            c.conn.send_data(sid, rest[0][:n])
            rest[0] = rest[0][n:]
            if not rest[0]:
                rest.clear()
                c.conn.send_headers(sid, [(b"x-client-trailer", b"1")], end_stream=True)

    def echo(server: H2Server, stream: int, request: list[tuple[bytes, bytes]], body: bytes) -> None:
        server.conn.send_headers(stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        server.pending = body  # type: ignore[attr-defined]

    upstream = H2Server(echo)
    upstream.pending = None  # type: ignore[attr-defined]

    def server_send(c: Client) -> None:
        up = upstream.conn
        data: bytes | None = upstream.pending  # type: ignore[attr-defined]
        if data is None:
            return  # the request is not complete yet
        while data and up.local_flow_control_window(1) > 0:
            n = min(up.local_flow_control_window(1), up.max_outbound_frame_size, len(data))
            up.send_data(1, data[:n])
            data = data[n:]
        upstream.pending = data  # type: ignore[attr-defined]
        if not data and not getattr(upstream, "done", False):
            upstream.done = True  # type: ignore[attr-defined]
            up.send_headers(1, [(b"grpc-status", b"0")], end_stream=True)

    settings = http_settings()
    script = [send_rest if i % 2 == 0 else server_send for i in range(200)]
    harness = Harness(client, {ADDRS[0]: lambda: upstream}, script)
    harness.run(http2(Router(ADDRS), settings))
    assert upstream.bodies[1] == big and upstream.trailers[1] == [(b"x-client-trailer", b"1")]
    assert client.bodies[sid] == big and client.trailers[sid] == [(b"grpc-status", b"0")]
    assert responses(settings) == {'status_code="200",classification="success",grpc_status="0",error=""': 1}


def test_flow_control_holds_at_most_the_window() -> None:
    """An upstream that never hands its window back: the client is stopped, not buffered for."""
    client = Client()
    sid = client.request([(b":method", b"POST"), *GET[1:]], end=False)
    upstream = H2Server(respond())
    upstream.ack = False
    sent = [0]

    def push(c: Client) -> None:
        while (room := min(c.conn.local_flow_control_window(sid), c.conn.max_outbound_frame_size)) > 0:
            c.conn.send_data(sid, b"x" * room)
            sent[0] += room

    harness = Harness(client, {ADDRS[0]: lambda: upstream}, [push] * 20)
    harness.run(http2(Router(ADDRS), http_settings()))
    received = len(upstream.bodies[1])
    assert received == 65535  # the upstream's stream window
    # What the client could send beyond that is what the proxy advertised: its own stream window.
    assert sent[0] - received <= 65535
    assert client.conn.local_flow_control_window(sid) == 0


def test_no_data_for_a_connection_whose_buffer_is_full() -> None:
    """While the driver says the client's write buffer is full, its data waits (unacknowledged upstream)."""
    client = Client()
    sid = client.request(GET)
    upstream = H2Server(respond(body=b"z" * 50_000))
    checked = []

    def still_nothing(c: Client) -> None:
        assert 0x0 not in _frame_types(c.raw)  # no DATA frame yet
        assert upstream.conn.local_flow_control_window(1) < 65535 - 40_000  # and nothing handed back upstream
        checked.append(True)
        harness.blocked = frozenset()

    harness = Harness(client, {ADDRS[0]: lambda: upstream}, [still_nothing])
    harness.blocked = frozenset({None})
    harness.run(http2(Router(ADDRS), http_settings()))
    assert checked and client.bodies[sid] == b"z" * 50_000


def _frame_types(data: bytes) -> list[int]:
    types = []
    while len(data) >= 9:
        types.append(data[3])
        data = data[9 + int.from_bytes(data[:3], "big"):]
    return types


def test_resets_are_passed_on_with_their_code() -> None:
    client = Client()
    a = client.request([*GET[:3], (b":path", b"/a")], end=False)
    b = client.request([*GET[:3], (b":path", b"/b")], end=False)
    upstream = H2Server(respond())

    def reset_both(c: Client) -> None:
        c.conn.reset_stream(a, ErrorCodes.CANCEL)
        upstream.conn.reset_stream(3, ErrorCodes.REFUSED_STREAM)  # the upstream's id for /b

    harness = Harness(client, {ADDRS[0]: lambda: upstream}, [reset_both])
    router = Router(ADDRS[:1])
    harness.run(http2(router, http_settings()))
    assert upstream.resets == {1: ErrorCodes.CANCEL}
    assert client.resets == {b: ErrorCodes.REFUSED_STREAM}
    assert router.log.count("release") == 2


def test_grpc_and_http_errors_as_linkerd_gives_them() -> None:
    client = Client()
    grpc_sid = client.request(GRPC)
    http_sid = client.request(GET)
    settings = http_settings()
    harness = Harness(client, {}, waits=lambda command: None)
    harness.run(http2(Router(ADDRS, error=errors.failfast("web:80"), wait=True), settings))
    grpc = dict(client.responses[grpc_sid])
    assert grpc[b":status"] == b"200" and grpc[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED (proxy.md §7.9)
    assert grpc[b"content-type"] == b"application/grpc" and b"fail-fast" in grpc[b"l5d-proxy-error"]
    assert grpc[b"grpc-message"] == grpc[b"l5d-proxy-error"].replace(b"%", b"%25")
    http = dict(client.responses[http_sid])
    assert http[b":status"] == b"504" and b"connection" not in http
    assert [c.name for c in harness.counts] == ["outbound_http_errors_total"] * 2
    assert responses(settings) == {
        'status_code="200",classification="failure",grpc_status="4",error=""': 1,
        'status_code="504",classification="failure",grpc_status="",error=""': 1,
    }
    assert sum(1 for s in harness.started if isinstance(s, cmd.Wait)) == 2  # each stream waited on its own


def test_streams_over_the_in_flight_limit_are_shed() -> None:
    client = Client()
    sids = [client.request([*GRPC[:3], (b":path", b"/%d" % i), *GRPC[4:]]) for i in range(2)]
    sids.append(client.request(GET))
    limit = InFlight(2)
    limit.count = 1  # one request of another connection is in flight: room for one more
    settings = http_settings(in_flight=limit)
    harness = Harness(client, {addr: (lambda: H2Server(respond(body=b"ok"))) for addr in ADDRS})
    harness.run(http2(Router(ADDRS), settings))
    grpc, http = dict(client.responses[sids[1]]), dict(client.responses[sids[2]])
    assert client.status(sids[0]) == b"200" and client.bodies[sids[0]] == b"ok"
    assert grpc[b":status"] == b"200" and grpc[b"grpc-status"] == b"14"  # UNAVAILABLE (proxy.md §7.9)
    assert http[b":status"] == b"503"
    assert all(b"too many requests in flight" in r[b"l5d-proxy-error"] for r in (grpc, http))
    assert limit.count == 1  # the admitted stream gave its place back


def test_connect_failures_try_other_endpoints_then_answer_unavailable() -> None:
    client = Client()
    sid = client.request(GRPC)
    router = Router(ADDRS)
    settings = http_settings()
    harness = Harness(client, {})  # nobody listens anywhere
    harness.run(http2(router, settings))
    assert [x for x in router.log if x.startswith("failed")] == [f"failed {a}" for a in ADDRS]
    answer = dict(client.responses[sid])
    assert answer[b"grpc-status"] == b"14" and b"ECONNREFUSED" in answer[b"l5d-proxy-error"]
    assert responses(settings) == {'status_code="200",classification="failure",grpc_status="14",error=""': 1}


def test_upstream_lost_mid_response() -> None:
    client = Client()
    grpc_sid = client.request(GRPC)
    http_sid = client.request(GET)

    def half(server: H2Server, sid: int, request: list[tuple[bytes, bytes]], body: bytes) -> None:
        server.conn.send_headers(sid, [(b":status", b"200")])
        server.conn.send_data(sid, b"part")

    upstream = H2Server(half)

    def lose(c: Client) -> None:
        upstream.conn.close_connection(ErrorCodes.INTERNAL_ERROR)

    harness = Harness(client, {ADDRS[0]: lambda: upstream}, [lose])
    harness.run(http2(Router(ADDRS[:1]), http_settings()))
    # gRPC: the error in the trailers; plain HTTP/2: a reset. Both after the data that came.
    assert client.bodies[grpc_sid] == b"part" and dict(client.trailers[grpc_sid])[b"grpc-status"] == b"14"
    assert client.resets.get(http_sid) == ErrorCodes.INTERNAL_ERROR


def test_client_goaway_lets_streams_in_flight_finish() -> None:
    client = Client()
    sid = client.request(GET)
    held: list[int] = []
    upstream = H2Server(lambda server, stream, request, body: held.append(stream))

    def goaway(c: Client) -> None:
        c.extra += hf.GoAwayFrame(0, last_stream_id=0).serialize()  # h2 would receive nothing after its own

    def answer(c: Client) -> None:
        upstream.conn.send_headers(held[0], [(b":status", b"200")], end_stream=True)

    harness = Harness(client, {ADDRS[0]: lambda: upstream}, [goaway, answer])
    harness.run(http2(Router(ADDRS), http_settings()))
    assert client.status(sid) == b"200"  # answered after the client's GOAWAY
    assert client.goaway is not None and client.goaway.error_code == ErrorCodes.NO_ERROR


def test_an_endpoint_going_away_gets_no_new_streams() -> None:
    """GOAWAY(NO_ERROR) from an endpoint: its streams finish, the next ones open a new connection."""
    client = Client()
    first = client.request(GET)
    servers: list[H2Server] = []
    later: list[int] = []

    def server() -> H2Server:
        servers.append(H2Server(respond(body=b"from %d" % len(servers))))
        return servers[-1]

    def go_away(c: Client) -> None:
        servers[0].conn.close_connection(ErrorCodes.NO_ERROR, last_stream_id=1)
        later.append(c.request(GET))

    harness = Harness(client, {ADDRS[0]: server}, [go_away])
    harness.run(http2(Router(ADDRS[:1]), http_settings()))
    assert client.bodies[first] == b"from 0" and client.bodies[later[0]] == b"from 1"
    assert harness.opened == [("h2", ADDRS[0])] * 2
    assert harness.checkins[0][0] in harness.conns and not harness.checkins[0][1]  # the old one closed


def test_protocol_error_from_the_client_is_a_goaway() -> None:
    client = Client()
    client.conn.data_to_send()  # the test writes the bytes itself
    data = PREFACE + hf.SettingsFrame(0).serialize() + _raw_frame(0x0, 0, 0, b"x")  # DATA on stream 0
    layer = http2(Router(ADDRS), http_settings())
    seen = _feed(layer, [data])
    assert seen[-1] == "goaway PROTOCOL_ERROR"


def test_headers_the_proxies_add_and_remove() -> None:
    client = Client()
    sid = client.request([*GET, (b"l5d-client-id", b"forged")])
    upstream = H2Server(respond(headers=((b"l5d-proxy-error", b"far away"), (b"l5d-proxy-connection", b"close"),
                                         (b"x-app", b"1"))))
    Harness(client, {ADDRS[0]: lambda: upstream}).run(
        http2(Router(ADDRS), http_settings("inbound", client_id="me.ns.serviceaccount", strip_proxy_errors=True)))
    assert (b"l5d-client-id", b"me.ns.serviceaccount") in upstream.requests[1]
    assert (b"l5d-client-id", b"forged") not in upstream.requests[1]
    assert dict(client.responses[sid]) == {b":status": b"200", b"x-app": b"1"}
    # Without strip_proxy_errors (inbound: a remote proxy's errors are for the client's proxy) they go on as they
    # came: the core looks for them in its one pass over the head, and strips only when it found one.
    client = Client()
    sid = client.request(GET)
    upstream = H2Server(respond(headers=((b"x-app", b"1"), (b"l5d-proxy-error", b"far away"))))
    Harness(client, {ADDRS[0]: lambda: upstream}).run(http2(Router(ADDRS), http_settings("inbound")))
    assert dict(client.responses[sid]) == {b":status": b"200", b"x-app": b"1", b"l5d-proxy-error": b"far away"}


def test_orig_proto_requests_are_downgraded_to_http1() -> None:
    client = Client()
    get = client.request([*GET[:3], (b":path", b"/a"), (b"l5d-orig-proto", b"HTTP/1.1")])
    post = client.request([(b":method", b"POST"), *GET[1:3], (b":path", b"/b"), (b"l5d-orig-proto", b"HTTP/1.1")],
                          end=False)
    client.conn.send_data(post, b"x" * 1000, end_stream=True)
    plain = client.request(GET)
    apps: list[H1App] = []

    def answer(head: RequestHead, body: bytes) -> tuple[int, tuple[tuple[bytes, bytes], ...], bytes]:
        # Connection naming only what is hop-by-hop anyway (the core's fast path: /a), or an app's header too (/b).
        hop: tuple[tuple[bytes, bytes], ...] = ((b"Connection", b"keep-alive"),) if head.target == b"/a" else (
            (b"Connection", b"keep-alive, X-Hop"), (b"X-Hop", b"1"))
        return 200, ((b"Content-Length", b"%d" % len(body)), *hop, (b"X-App", b"2")), body

    def app() -> H1App:
        apps.append(H1App(answer))
        return apps[-1]

    upstream = H2Server(respond(body=b"h2"))
    peers = {ADDRS[0]: app, ADDRS[1]: lambda: upstream}
    router = Router([ADDRS[0], ADDRS[0], ADDRS[1]])
    harness = Harness(client, peers)
    harness.run(http2(router, http_settings("inbound", client_id="peer"), downgrade=True))
    heads = [h for a in apps for h in a.heads]
    assert sorted(h.target for h in heads) == [b"/a", b"/b"]
    for head in heads:
        names = [n for n, _ in head.headers]
        assert b"l5d-orig-proto" not in names and (b"l5d-client-id", b"peer") in head.headers
        assert head.version == b"1.1" and (b"host", b"web") in head.headers
    assert client.bodies[post] == b"x" * 1000 and dict(client.responses[post])[b"l5d-orig-proto"] == b"HTTP/1.1"
    assert b"connection" not in dict(client.responses[get]) and client.status(get) == b"200"
    assert [n for n, _ in client.responses[get]] == [b":status", b"content-length", b"x-app", b"l5d-orig-proto"]
    assert [n for n, _ in client.responses[post]] == [b":status", b"content-length", b"x-app", b"l5d-orig-proto"]
    assert client.bodies[plain] == b"h2" and b"l5d-orig-proto" not in dict(client.responses[plain])
    assert sorted(k for k, _ in harness.opened) == ["h1", "h1", "h2"]
    assert sorted(reuse for _, reuse in harness.checkins) == [False, True, True]  # the h2 one closes at the end


# -- fuzzing: whatever the client sends, the layer ends cleanly ------------------------------------------------


def _feed(layer: cmd.Layer, chunks: list[bytes]) -> list[str]:
    """Run ``layer`` on the client's ``chunks`` then EOF; every connect fails. What the core ended with."""
    client = RawClient(chunks)
    Harness(client, {}).run(layer)
    return _goaways(client.raw) or ["closed"]


def _goaways(data: bytes) -> list[str]:
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        if data[3] == 0x7:
            out.append(f"goaway {ErrorCodes(int.from_bytes(data[13:17], 'big')).name}")
        data = data[9 + length:]
    return out


def _entry(inbound_side: bool) -> cmd.Layer:
    """The ``Http2`` entry of either direction's ``PROTOCOL_LAYERS``, as detection hands a connection to it."""
    target = SocketAddr(parse_ip("10.0.0.9"), 8080)
    if inbound_side:
        session = inbound.Session(target, labels.tls_accepted("client.ns.serviceaccount.identity"), True,
                                  "client.ns.serviceaccount.identity")
        config = inbound.InboundSettings(
            local_name="web.ns.serviceaccount.identity", inbound_port=4143, detect_timeout=1.0,
            connect_timeout=0.3, opaque_ports=PortSet.parse(""), ips=frozenset(),
            default_policy=DefaultPolicy.ALL_UNAUTHENTICATED, cluster_networks=(), http=http_settings("inbound"))
        return inbound.PROTOCOL_LAYERS[type(Http2())](session, config)
    config = outbound.OutboundSettings(detect_timeout=1.0, connect_timeout=1.0, failfast=1.0, profile_networks=(),
                                       local_ips=frozenset(), own_addrs=frozenset(), refuse_loopback=False,
                                       http=http_settings())
    return outbound.PROTOCOL_LAYERS[type(Http2())](target, FORWARD, config)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(min_size=0, max_size=200), min_size=1, max_size=4), st.booleans())
def test_fuzz_random_bytes_after_the_preface(chunks: list[bytes], inbound_side: bool) -> None:
    chunks = [c for c in chunks if c]
    seen = _feed(_entry(inbound_side), [PREFACE + hf.SettingsFrame(0).serialize(), *chunks])
    assert seen[-1] == "closed" or seen[-1].startswith("goaway")


def _raw_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


@st.composite
def _sessions(draw: st.DrawFn) -> bytes:
    """A client's frames after the preface: mostly a plausible session (requests on increasing stream ids, data,
    trailers and resets on open ones), with arbitrary frames (any type, flags, stream, payload) mixed in, so
    that the h2 state machine and the layer's stream bookkeeping get exercised, not only the frame parser."""
    requests = [GET, GRPC, [*GET, (b"l5d-orig-proto", b"HTTP/1.1")], [*GRPC[:4], (b"l5d-orig-proto", b"HTTP/1.1")]]
    junk = st.one_of(st.binary(max_size=40), st.integers(0, 2**32 - 1).map(lambda n: n.to_bytes(4, "big")),
                     st.sampled_from([[(b":status", b"200")], [(b"grpc-status", b"0")], []]).map(
                         lambda h: hpack.Encoder().encode(h)))
    encoder = hpack.Encoder()  # one per connection, as the client's
    out = []
    opened: list[int] = []
    next_id = 1
    for _ in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from(["request", "request", "data", "data", "trailers", "reset", "window", "any"]))
        if op == "request":
            end = draw(st.booleans())
            out.append(_raw_frame(0x1, 0x4 | (0x1 if end else 0), next_id,
                                  encoder.encode(draw(st.sampled_from(requests)))))
            opened.append(next_id)
            next_id += 2 * draw(st.integers(1, 3))
        elif op in ("data", "trailers", "reset", "window") and opened:
            sid = draw(st.sampled_from(opened))
            if op == "data":
                out.append(_raw_frame(0x0, 0x1 if draw(st.booleans()) else 0, sid, draw(st.binary(max_size=300))))
            elif op == "trailers":
                out.append(_raw_frame(0x1, 0x5, sid, encoder.encode([(b"x-trailer", b"1")])))
            elif op == "reset":
                out.append(_raw_frame(0x3, 0, sid, draw(st.integers(0, 13)).to_bytes(4, "big")))
            else:
                out.append(_raw_frame(0x8, 0, draw(st.sampled_from([0, sid])),
                                      draw(st.integers(0, 2**31 - 1)).to_bytes(4, "big")))
        else:
            out.append(_raw_frame(draw(st.integers(0, 10)), draw(st.sampled_from([0, 1, 4, 5, 8, 0x20, 0xFF])),
                                  draw(st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1])), draw(junk)))
    return b"".join(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_sessions(), st.booleans(), st.booleans())
def test_fuzz_frame_sequences(frames: bytes, inbound_side: bool, split: bool) -> None:
    """Against working upstreams (HTTP/2 servers, and an HTTP/1 app for downgraded requests)."""
    data = PREFACE + hf.SettingsFrame(0).serialize() + frames
    client = RawClient([data[:30], data[30:]] if split else [data])
    target = SocketAddr(parse_ip("10.0.0.9"), 8080)
    h2_server = respond(body=b"ok", trailers=[(b"grpc-status", b"0")])
    harness = Harness(client, {target: lambda: H2Server(h2_server)},
                      h1_peers={target: lambda: H1App(lambda head, body: (200, ((b"content-length", b"2"),), b"ok"))})
    harness.run(_entry(inbound_side))
    seen = _goaways(client.raw)
    assert not seen or seen[-1].startswith("goaway")


class Observed:
    """A ``StreamObserver`` and a ``RequestPolicy`` (core.http's hooks) that write down what they are told."""

    def __init__(self, refuse: bytes = b"") -> None:
        self.refuse = refuse
        self.seen: list[tuple[str, object]] = []
        self.clients: list[tuple[str, int] | None] = []
        self.response_headers: list[list[tuple[bytes, bytes]]] = []
        self.ends: list[tuple[int, list[tuple[bytes, bytes]]]] = []  # (response_bytes, trailers) of each end
        self.resets: list[int | None] = []  # the reset code of each end (None: not reset)

    def check(self, request: RequestHead) -> ProxyError | None:
        self.seen.append(("check", request.target))
        return errors.load_shed() if request.target == self.refuse else None

    def begin(self, stream: object, request: RequestHead, client: tuple[str, int] | None,
              client_id: str | None) -> None:
        self.seen.append(("begin", request.target))

    def request(self, stream: object, request: RequestHead, labels: str, client: tuple[str, int] | None) -> None:
        self.seen.append(("request", request.target))
        self.clients.append(client)

    def response(self, stream: object, status: int, headers: Sequence[tuple[bytes, bytes]]) -> None:
        self.seen.append(("response", status))
        self.response_headers.append(list(headers))

    def end(self, stream: object, status: int | None, error: ProxyError | None, grpc_status: int | None = None,
            response_bytes: int = 0, trailers: Sequence[tuple[bytes, bytes]] = (),
            reset_code: int | None = None) -> None:
        self.seen.append(("end", status))
        self.ends.append((response_bytes, list(trailers)))
        self.resets.append(reset_code)


def test_the_policy_and_tap_hooks_see_each_stream() -> None:
    client = Client()
    ok = client.request([*GET[:3], (b":path", b"/ok")])
    refused = client.request([*GET[:3], (b":path", b"/no")])
    hooks = Observed(refuse=b"/no")
    settings = http_settings(policy=hooks, observer=hooks)
    harness = Harness(client, {addr: lambda: H2Server(respond(body=b"hi")) for addr in ADDRS})
    harness.run(http2(Router(ADDRS), settings))
    assert client.status(ok) == b"200" and client.status(refused) == b"503"
    assert ("check", b"/ok") in hooks.seen and ("check", b"/no") in hooks.seen
    told = [e for e in hooks.seen if e[0] != "check"]
    assert ("end", 503) in told and ("request", b"/no") not in told  # refused: never routed, but it ended
    assert told.index(("begin", b"/no")) < told.index(("end", 503))  # begun before anything was decided
    assert hooks.seen.index(("begin", b"/no")) < hooks.seen.index(("check", b"/no"))
    told.remove(("end", 503))
    told.remove(("begin", b"/no"))
    assert told == [("begin", b"/ok"), ("request", b"/ok"), ("response", 200), ("end", 200)]
    assert [h for h in hooks.response_headers[0] if h[0] == b":status"] == [(b":status", b"200")]  # as relayed
    assert (2, []) in hooks.ends and (0, []) in hooks.ends  # b"hi" relayed; the refusal relayed no body
    assert hooks.resets == [None, None]  # neither stream was reset


def test_a_refused_stream_is_sent_again_once() -> None:
    """REFUSED_STREAM before any response: the server did not process it (RFC 9113 §8.7), so a bodiless request
    goes to another pick; a second refusal reaches the client."""
    from h2.errors import ErrorCodes as Codes

    def refuse_first(server: H2Server, sid: int, request: list[tuple[bytes, bytes]], body: bytes) -> None:
        if not getattr(server, "refused", False):
            server.refused = True  # type: ignore[attr-defined]
            server.conn.reset_stream(sid, Codes.REFUSED_STREAM)
            return
        respond(body=b"second")(server, sid, request, body)

    client = Client()
    sid = client.request(GET)
    router = Router(ADDRS[:1])
    settings = http_settings()
    harness = Harness(client, {ADDRS[0]: lambda: H2Server(refuse_first)})
    harness.run(http2(router, settings))
    assert client.status(sid) == b"200" and client.bodies[sid] == b"second"
    assert router.log.count("release") == 2  # two picks
    assert settings.metrics is not None and settings.metrics.snapshot()[LABELS].requests == 1

    always = Client()
    sid = always.request(GET)

    def refuse(server: H2Server, stream: int, request: list[tuple[bytes, bytes]], body: bytes) -> None:
        server.conn.reset_stream(stream, Codes.REFUSED_STREAM)

    hooks = Observed(refuse=b"/never")
    Harness(always, {ADDRS[0]: lambda: H2Server(refuse)}).run(http2(Router(ADDRS[:1]), http_settings(observer=hooks)))
    assert always.resets.get(sid) == Codes.REFUSED_STREAM
    assert hooks.resets == [Codes.REFUSED_STREAM]  # tap's response_end says how the stream ended


def test_a_stream_beyond_the_upstreams_goaway_is_sent_again() -> None:
    """A GOAWAY whose last stream ID is below a stream's: the server did not process it (RFC 9113 §6.8; a server
    shutting down with one GOAWAY, not hyper's two), so it is sent again, as a refused one, on a new pick (here a
    new connection to the one endpoint) -- not answered 502 when the client proxy could send it elsewhere."""
    served: list[int] = []

    def going_away_first(server: H2Server, sid: int, request: list[tuple[bytes, bytes]], body: bytes) -> None:
        if not served:
            served.append(0)
            server.conn.close_connection(last_stream_id=0)  # this stream (1) was not taken
            return
        served.append(sid)
        respond(body=b"elsewhere")(server, sid, request, body)

    client = Client()
    sid = client.request(GET)
    router = Router(ADDRS[:1])
    settings = http_settings()
    Harness(client, {ADDRS[0]: lambda: H2Server(going_away_first)}).run(http2(router, settings))
    assert client.status(sid) == b"200" and client.bodies[sid] == b"elsewhere"
    assert served == [0, 1]  # the second connection's first stream
    assert router.log.count("release") == 2  # two picks
    assert settings.metrics is not None and settings.metrics.snapshot()[LABELS].requests == 1
