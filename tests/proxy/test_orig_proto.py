"""The outbound ``l5d-orig-proto`` upgrade, sans-IO (proxy.md §7.7): which requests take it (an HTTP/1 core
playbook), and ``core.orig_proto``'s legs driven with bytes, the peer proxy played by the HTTP/2 codec in the
server role and the HTTP/1 core by the HTTP/1 codec in the client role."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

from playbook import Checkout, Connected, DownData, Playbook, SendDown, SendUp, UpEof

from tether.proxy.codec import http2_events as h2e
from tether.proxy.codec.addrs import SocketAddr, parse_ip
import pytest

from tether.proxy.codec.http1 import BadMessage, Body, EndOfMessage, RequestHead, ResponseHead, State
from tether.proxy.codec.http2 import ErrorCodes, H2Endpoint, Http2Params
from tether.proxy.core import commands as cmd
from tether.proxy.core.endpoint import Endpoint, upgrade_plan
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import HttpSettings, Pick
from tether.proxy.core.orig_proto import UpgradeConnection, h1_response, h2_request, upgradable

IP = parse_ip("10.0.0.7")
ADDR = SocketAddr(IP, 8080)
H2_ADDR = SocketAddr(IP, 4143)
CONNECT = cmd.Connect(ADDR, None, 1.0, "x")
UPGRADE = cmd.Connect(H2_ADDR, None, 1.0, "x", upgrade=True)


def router(request: RequestHead) -> Generator[cmd.Command, Any, Pick | ProxyError]:
    pick = Pick(CONNECT, None, 'direction="outbound"', b"web:80")
    pick.upgrade = (UPGRADE, None)
    return pick
    yield  # a generator that never waits


def settings() -> HttpSettings:
    return HttpSettings("outbound", lambda: 0.0, strip_proxy_errors=True)


def test_requests_to_an_h2_hinted_endpoint_take_its_upgrade_unless_they_switch_protocols() -> None:
    get = b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"
    assert (Playbook(router, settings())
            >> DownData(get)
            << Checkout(H2_ADDR)
            >> Connected()
            << SendUp(0, get))
    h2c = b"GET /r HTTP/1.1\r\nHost: web\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n"
    assert Playbook(router, settings()) >> DownData(h2c) << Checkout(H2_ADDR)
    websocket = b"GET /ws HTTP/1.1\r\nHost: web\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"
    assert Playbook(router, settings()) >> DownData(websocket) << Checkout(ADDR)
    tunnel = b"CONNECT web:443 HTTP/1.1\r\nHost: web:443\r\n\r\n"
    assert Playbook(router, settings()) >> DownData(tunnel) << Checkout(ADDR)


def test_only_h2_hinted_remote_endpoints_are_upgraded() -> None:
    hinted = Endpoint(ADDR, server_id="web.ns.serviceaccount.identity.linkerd.cluster.local",
                      sni="web.ns.serviceaccount.identity.linkerd.cluster.local", h2=True)
    plan = upgrade_plan(hinted, local_ips=frozenset(), timeout=1.0)
    assert plan is not None and plan.connect.upgrade and plan.connect.tls is not None
    assert plan.connect.pool_key != CONNECT.pool_key and plan.connect.pool_key.endswith(" h2")
    assert upgrade_plan(hinted, local_ips=frozenset({IP}), timeout=1.0) is None  # our own pod
    assert upgrade_plan(Endpoint(ADDR), local_ips=frozenset(), timeout=1.0) is None  # no hint


def test_the_request_is_marked_and_stripped_of_hop_by_hop_headers() -> None:
    head = RequestHead(b"POST", b"/a?b", ((b"Host", b"web:80"), (b"Connection", b"keep-alive, x-hop"),
                                          (b"X-Hop", b"1"), (b"Keep-Alive", b"5"), (b"TE", b"trailers"),
                                          (b"Transfer-Encoding", b"chunked"), (b"X-App", b"v")))
    assert h2_request(head) == [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"web:80"),
                                (b":path", b"/a?b"), (b"te", b"trailers"), (b"x-app", b"v"),
                                (b"l5d-orig-proto", b"HTTP/1.1")]
    absolute = RequestHead(b"GET", b"http://web:80/x", ((b"host", b"other"),), b"1.0")
    assert h2_request(absolute) == [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"web:80"),
                                    (b":path", b"/x"), (b"l5d-orig-proto", b"HTTP/1.0; absolute-form")]
    assert upgradable(RequestHead(b"GET", b"/", ((b"upgrade", b"h2c"),)))
    assert not upgradable(RequestHead(b"GET", b"/", ((b"upgrade", b"websocket"),)))


class Peer:
    """The peer proxy's inbound side: an HTTP/2 server over the same bytes."""

    def __init__(self, conn: UpgradeConnection, max_streams: int = 100) -> None:
        from tether.proxy.codec.http2 import Http2Params

        self.conn = conn
        self.h2 = H2Endpoint(client=False, params=Http2Params(max_concurrent_streams=max_streams))
        self.h2.initiate()
        self.pump()

    def pump(self) -> list[h2e.Event]:
        events = self.h2.receive_data(self.conn.data_to_send())
        self.conn.receive(self.h2.data_to_send())
        return [e for e in events if not isinstance(e, (h2e.RemoteSettingsChanged, h2e.WindowUpdated))]

    def respond(self, sid: int, headers: list[tuple[bytes, bytes]], body: bytes = b"", end: bool = True,
                trailers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.h2.send_headers(sid, headers, end_stream=end and not body and not trailers)
        if body:
            self.h2.queue_data(sid, body)
        if end and (body or trailers):
            self.h2.queue_end(sid, trailers)
        self.h2.flush()
        self.conn.receive(self.h2.data_to_send())


def send(leg: Any, head: RequestHead, body: bytes = b"") -> None:
    """What the HTTP/1 core does with its upstream codec for one request."""
    assert leg.send_head(head) == b""  # nothing for the core to write: the connection writes the frames
    if body:
        leg.send_body(body)
    leg.send_end()


def received(leg: Any) -> list[object]:
    return leg.receive_data(b"\x00")


def test_requests_of_several_legs_share_the_connection_and_legs_are_reused() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn)
    a, b = conn.leg(), conn.leg()
    send(a, RequestHead(b"POST", b"/a", ((b"host", b"web"), (b"content-length", b"5"))), b"hello")
    send(b, RequestHead(b"GET", b"/b", ((b"host", b"web"),)))
    events = peer.pump()
    # A request without a body ends with its HEADERS; a body's end rides on its last DATA frame.
    assert [(type(e).__name__, e.stream_id) for e in events] == [
        ("RequestReceived", 1), ("RequestReceived", 3), ("StreamEnded", 3), ("DataReceived", 1), ("StreamEnded", 1)]
    assert (b"l5d-orig-proto", b"HTTP/1.1") in events[0].headers  # type: ignore[attr-defined]
    # Answered out of order: each leg gets its own response, as the HTTP/1 codec's events.
    peer.respond(3, [(b":status", b"404"), (b"content-length", b"1"), (b"l5d-orig-proto", b"HTTP/1.1")], b"n")
    peer.respond(1, [(b":status", b"200"), (b"l5d-orig-proto", b"HTTP/1.1")], b"world",
                 trailers=[(b"x-sum", b"1")])
    assert set(conn.take_touched()) == {a, b}
    assert received(b) == [ResponseHead(404, ((b"content-length", b"1"),), b"Not Found"), Body(b"n"),
                           EndOfMessage()]
    assert received(a) == [ResponseHead(200, ((b"transfer-encoding", b"chunked"),), b"OK"), Body(b"world"),
                           EndOfMessage(((b"x-sum", b"1"),))]
    assert a.our_state is State.DONE and a.their_state is State.DONE and a.keep_alive
    # The leg is free for its core's next request: a new stream.
    a.start_next_cycle()
    send(a, RequestHead(b"GET", b"/again", ((b"host", b"web"),)))
    assert [(type(e).__name__, e.stream_id) for e in peer.pump()] == [("RequestReceived", 5), ("StreamEnded", 5)]
    assert not a.broken and not b.broken


def test_a_reset_stream_ends_its_leg_alone_and_a_lost_connection_every_leg() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn)
    a, b, d = conn.leg(), conn.leg(), conn.leg()
    for leg, path in ((a, b"/a"), (b, b"/b"), (d, b"/d")):
        send(leg, RequestHead(b"GET", path, ((b"host", b"web"),)))
    peer.pump()
    conn.take_touched()
    peer.h2.reset(1, ErrorCodes.INTERNAL_ERROR)
    conn.receive(peer.h2.data_to_send())
    assert conn.take_touched() == [a] and a.broken and not b.broken
    assert a.reset == ErrorCodes.INTERNAL_ERROR  # for the core's 502 (``upstream_failed``)
    assert a.receive_data(b"") == []  # before its response: the core sees the connection closed (502)
    # A GOAWAY: the streams it took may finish, no new one is opened (the I/O side drops the idle legs); one it
    # did not take fails with its code.
    peer.h2.goaway(last_stream_id=3)
    conn.receive(peer.h2.data_to_send())
    assert not conn.usable and not b.broken and d.broken and d.reset == ErrorCodes.NO_ERROR
    c = conn.leg()
    send(c, RequestHead(b"GET", b"/c", ((b"host", b"web"),)))
    assert c.broken and c.reset is None  # it never had a stream
    # A connection error during b's response: the core's read of it fails (a broken-off response).
    peer.respond(3, [(b":status", b"200")], b"part", end=False)
    peer.h2.goaway(ErrorCodes.ENHANCE_YOUR_CALM, last_stream_id=3)
    conn.receive(peer.h2.data_to_send())
    assert b.broken and b.reset == ErrorCodes.ENHANCE_YOUR_CALM and not conn.usable
    with pytest.raises(BadMessage):
        b.receive_data(b"")


def test_requests_over_the_peers_stream_limit_wait_for_a_slot() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn, max_streams=1)
    a, b = conn.leg(), conn.leg()
    send(a, RequestHead(b"GET", b"/a", ((b"host", b"web"),)))
    send(b, RequestHead(b"POST", b"/b", ((b"host", b"web"), (b"content-length", b"2"))), b"hi")
    assert [type(e).__name__ for e in peer.pump()] == ["RequestReceived", "StreamEnded"]  # /a only
    peer.respond(1, [(b":status", b"200"), (b"content-length", b"0")])
    events = peer.pump()
    assert [(type(e).__name__, e.stream_id) for e in events] == [("RequestReceived", 3), ("DataReceived", 3),
                                                                  ("StreamEnded", 3)]
    assert (b":path", b"/b") in events[0].headers  # type: ignore[attr-defined]


def test_a_client_that_cannot_take_more_holds_the_streams_window() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn)
    leg = conn.leg()
    send(leg, RequestHead(b"GET", b"/big", ((b"host", b"web"),)))
    peer.pump()
    leg.pause()
    peer.respond(1, [(b":status", b"200")], b"x" * 40000, end=False)
    peer.h2.queue_data(1, b"y" * 40000)
    peer.h2.flush()
    conn.receive(peer.h2.data_to_send())
    # 64 KiB - 1 went (the stream window), nothing acknowledged while the client is paused.
    got = b"".join(e.data for e in received(leg) if isinstance(e, Body))  # type: ignore[attr-defined]
    assert len(got) == 65535 and not conn.data_to_send()
    leg.resume()
    peer.h2.receive_data(conn.data_to_send())  # the window handed back
    peer.h2.flush()
    conn.receive(peer.h2.data_to_send())
    assert b"y" * 1000 in b"".join(e.data for e in received(leg) if isinstance(e, Body))  # type: ignore[attr-defined]


def test_keep_alive_pings_are_counted_until_answered() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn)
    conn.ping()
    assert conn.pings == 1
    peer.pump()  # the peer answers
    assert conn.pings == 0


def test_discoverys_http2_settings_besides_the_keep_alive_are_warned_about(caplog: Any) -> None:
    from tether.api import destination_pb2 as pb
    from tether.proxy.core import endpoint

    weighted = pb.WeightedAddr()
    weighted.addr.ip.ipv4 = 0x0A000007
    weighted.addr.port = 8080
    weighted.http2.flow_control.initial_stream_window_size = 1000
    weighted.http2.keep_alive.interval.seconds = 10
    weighted.http2.keep_alive.timeout.seconds = 3
    endpoint._UNAPPLIED_HTTP2.clear()
    with caplog.at_level("WARNING", logger="tether.proxy.core.endpoint"):
        assert Endpoint.from_proto(weighted).h2_keep_alive == (10.0, 3.0, False)
        Endpoint.from_proto(weighted)  # once per field, not per update
    assert [r.getMessage() for r in caplog.records] == [
        "endpoint 10.0.0.7:8080: discovery's http2.flow_control.initial_stream_window_size not applied "
        "(only http2.keep_alive is)"]
    endpoint._UNAPPLIED_HTTP2.clear()


def test_the_response_head_is_what_the_http1_codec_would_have_found() -> None:
    # Framed by its length, nothing hop-by-hop, no l5d-*: the core forwards it as it is (not scanned again).
    plain = h1_response([(b":status", b"200"), (b"content-length", b"3"), (b"x-app", b"v"),
                         (b"l5d-orig-proto", b"HTTP/1.1")], b"GET")
    assert plain == ResponseHead(200, ((b"content-length", b"3"), (b"x-app", b"v")), b"OK")
    assert not plain.rewrite and plain.found == {b"content-length": [b"3"]}
    # Chunked for the core: a hop-by-hop field, so the core re-frames it; a peer's l5d-proxy-error is removed by it.
    chunked = h1_response([(b":status", b"200")], b"GET")
    assert chunked.headers == ((b"transfer-encoding", b"chunked"),)
    assert chunked.rewrite and chunked.found == {b"transfer-encoding": [b"chunked"]}
    failed = h1_response([(b":status", b"502"), (b"content-length", b"0"), (b"l5d-proxy-error", b"x")], b"GET")
    assert failed.rewrite and failed.reason == b"Bad Gateway"
    assert not h1_response([(b":status", b"204")], b"GET").found  # no body: not framed
    assert h1_response([(b":status", b"599")], b"HEAD").reason == b""  # no phrase for it


def test_a_request_is_cut_short_only_when_its_response_comes_before_all_of_it() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn)
    get, post, whole = conn.leg(), conn.leg(), conn.leg()
    send(get, RequestHead(b"GET", b"/g", ((b"host", b"web"),)))
    # A body the core is still sending, and one sent whole but waiting for the peer's window (64 KiB).
    post.send_head(RequestHead(b"POST", b"/p", ((b"host", b"web"), (b"content-length", b"10"))))
    post.send_body(b"12345")
    send(whole, RequestHead(b"POST", b"/w", ((b"host", b"web"), (b"content-length", b"70000"))), b"x" * 70000)
    peer.pump()
    assert whole.buffered > 0
    for sid in (1, 3, 5):
        peer.respond(sid, [(b":status", b"200"), (b"content-length", b"0")])
    resets = [e.stream_id for e in peer.pump() if isinstance(e, h2e.StreamReset)]  # type: ignore[attr-defined]
    assert resets == [3, 5]  # the GET went whole with its HEADERS: nothing of it to cut
    assert received(get)[-1] == received(post)[-1] == received(whole)[-1] == EndOfMessage()
    assert not conn.streams and whole.buffered == 0


def test_the_connection_asks_the_io_side_to_write_once_until_it_writes() -> None:
    conn = UpgradeConnection()
    asked: list[None] = []
    conn.on_output = lambda: asked.append(None)
    peer = Peer(conn)
    a, b = conn.leg(), conn.leg()
    send(a, RequestHead(b"GET", b"/a", ((b"host", b"web"),)))
    send(b, RequestHead(b"POST", b"/b", ((b"host", b"web"), (b"content-length", b"2"))), b"hi")
    assert len(asked) == 1 and conn.woken
    assert [type(e).__name__ for e in peer.pump()] == ["RequestReceived", "StreamEnded", "RequestReceived",
                                                        "DataReceived", "StreamEnded"]
    assert not conn.woken  # written: the next request asks again
    send(a, RequestHead(b"GET", b"/a2", ((b"host", b"web"),)))
    assert len(asked) == 2


class CoreWithLegs:
    """An HTTP/1 core (a playbook's) whose checkouts are answered with legs of ``conn``, as the pool does."""

    def __init__(self, conn: UpgradeConnection) -> None:
        self.conn = conn
        self.pb = Playbook(router, settings())
        self.pb.start()
        self.legs: list[Any] = []

    def connected(self, reused: bool = False) -> None:
        up = self.pb.sink.new_up(reused)
        up.codec = self.conn.leg()
        self.legs.append(up.codec)
        self.pb.sink.checkouts.pop(0)(up)

    def sent_down(self) -> bytes:
        return b"".join(c.data for c in self.pb.sink.calls if isinstance(c, SendDown))


def test_a_stream_the_peer_resets_fails_the_request_with_linkerds_words() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn)
    core = CoreWithLegs(conn)
    core.pb.apply(DownData(b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"))
    core.connected(reused=True)  # a pooled leg: its request may be sent once more
    peer.pump()
    peer.h2.reset(1, ErrorCodes.REFUSED_STREAM)
    conn.receive(peer.h2.data_to_send())
    core.pb.apply(UpEof(0))  # the I/O side tells the core its leg ended
    core.connected()  # sent again, on a new leg
    assert [type(e).__name__ for e in peer.pump()] == ["RequestReceived", "StreamEnded"]
    peer.h2.reset(3, ErrorCodes.INTERNAL_ERROR)
    conn.receive(peer.h2.data_to_send())
    assert core.legs[1].broken and core.legs[1].reset == ErrorCodes.INTERNAL_ERROR
    core.pb.apply(UpEof(1))
    answer = core.sent_down()
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert (b"l5d-proxy-error: endpoint 10.0.0.7:4143: upgraded connection failed with HTTP/2 reset: "
            b"unexpected internal error encountered\r\n") in answer
    # A connection lost without an error code reads as any connection closed before the response.
    lost = UpgradeConnection()
    Peer(lost)
    core = CoreWithLegs(lost)
    core.pb.apply(DownData(b"GET /r HTTP/1.1\r\nHost: web\r\n\r\n"))
    core.connected()
    lost.lost()
    assert core.legs[0].broken and core.legs[0].reset is None
    core.pb.apply(UpEof(0))
    answer = core.sent_down()
    assert b"l5d-proxy-error: endpoint 10.0.0.7:4143: connection closed before the response\r\n" in answer


def test_an_http_1_0_request_is_marked_as_one() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn)
    core = CoreWithLegs(conn)
    core.pb.apply(DownData(b"GET /old HTTP/1.0\r\n\r\n"))
    core.connected()
    request = peer.pump()[0]
    assert (b"l5d-orig-proto", b"HTTP/1.0") in request.headers  # type: ignore[attr-defined]
    assert (b":authority", b"web:80") in request.headers  # type: ignore[attr-defined]


def test_request_bytes_over_the_peers_window_go_when_it_opens_it() -> None:
    conn = UpgradeConnection()
    peer = Peer(conn)
    leg = conn.leg()
    send(leg, RequestHead(b"POST", b"/big", ((b"host", b"web"), (b"content-length", b"70000"))), b"x" * 70000)
    got = [e for e in peer.pump() if isinstance(e, h2e.DataReceived)]
    assert sum(len(e.data) for e in got) == 65535 and leg.buffered == 70000 - 65535
    for event in got:  # the peer takes them: WINDOW_UPDATEs
        peer.h2.ack(event.stream_id, event.flow_controlled_length)
    conn.receive(peer.h2.data_to_send())
    assert conn.unsent and conn.take_touched() == [leg]  # sent as the leg's connection is next written
    rest = peer.h2.receive_data(conn.data_to_send())
    assert sum(len(e.data) for e in rest if isinstance(e, h2e.DataReceived)) == 70000 - 65535
    assert leg.buffered == 0


def test_a_leg_whose_stream_failed_is_closed_so_its_connection_can_idle_out() -> None:
    """``io.upgrade_io`` over a stream whose transport the test plays: the HTTP/1 side does not close a leg
    that ended (it is lost), so the link does, or the connection would count it for ever."""
    from tether.proxy.io.streams import Stream
    from tether.proxy.io.upgrade_io import H2Link, Upgrades

    class Transport:
        def __init__(self) -> None:
            self.written = bytearray()

        def write(self, data: bytes) -> None:
            self.written += data

        def close(self) -> None:
            """Nothing to close."""

    class Handler:
        def __init__(self) -> None:
            self.eof = False

        def on_data(self, stream: Any, data: bytes) -> None:
            """No response comes."""

        def on_eof(self, stream: Any) -> None:
            self.eof = True

    async def scenario() -> None:
        transport = Transport()
        stream = Stream(asyncio.get_running_loop())
        stream.connection_made(transport)  # type: ignore[arg-type]
        link = H2Link(Upgrades(None), "web", stream, 0.0, Http2Params())  # type: ignore[arg-type]
        peer = H2Endpoint(client=False)
        peer.initiate()
        leg = link.leg()
        leg.handler = handler = Handler()  # type: ignore[assignment]
        send(leg.leg, RequestHead(b"GET", b"/", ((b"host", b"web"),)))
        link.after()  # as at the next loop iteration
        peer.receive_data(bytes(transport.written))
        peer.reset(1, ErrorCodes.INTERNAL_ERROR)
        link.on_data(stream, peer.data_to_send())
        assert handler.eof and leg.lost and leg.leg.closed
        assert link.core.legs == 0 and link.idle_timer is not None  # it idles out as any unused connection
        link.close()

    asyncio.run(scenario())
