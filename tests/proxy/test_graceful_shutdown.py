"""The proxy's graceful shutdown (SIGTERM, ``POST /shutdown``), as linkerd2-proxy drains (hyper's graceful shutdown).

End to end, on loopback with a real control plane (``proxy_harness.Mesh``): proxies in-process
(``Proxy.stop(grace)``, ``Proxy.run`` and ``POST /shutdown``) and as processes (``python -m tether.proxy`` and
SIGTERM). HTTP/1 connections from the app (outbound) close at once when idle and after the response in hand
otherwise (``connection: close``); a grpcio channel's call in flight completes; an
HTTP/2 connection from a peer (inbound, mTLS and the transport header) gets the two GOAWAYs of RFC 9113 §6.8:
a stream sent before the client saw the first is served, one sent after the second is ignored, the streams in
flight complete and the connection closes; the proxy stops once everything has drained, long before the grace
period (which is ten minutes in those tests: the tests' 60 s deadline would fail a proxy that waited for it);
a stream still open when the grace period ends is reset and the process exits. The sans-IO parts (the HTTP/2
codec's GOAWAY rules, the HTTP/1 and HTTP/2 cores' drain and cut) are tested without sockets at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import h2_playbook as h2p
from playbook import (Checkin, Checkout, Close, Connected, DownData, Playbook, Run, SendDown, SendUp, Steps, UpData,
                      exchange)
from proxy_harness import App, Mesh, Pod, closed_without_answer, connection, proxy_process, read_request, run
from test_http1_proxy import ADDR, GET, OK, router, settings
from test_http2_protocol import pair
from test_http2_proxy import ADDRS, Router, http_settings

from tether.proxy.app import Proxy
from tether.proxy.codec import http2_events as ev
from tether.proxy.codec.http2 import MAX_STREAM_ID, ErrorCodes, H2Endpoint
from tether.proxy.codec.transport_header import SessionProtocol, TransportHeader, encode
from tether.proxy.core.config import ProxyConfig
from tether.proxy.core.http1_proxy import Http1Proxy
from tether.proxy.core.http2_proxy import DRAIN_PING, Http2Proxy

TRANSPORT_ALPN = "transport.l5d.io/v1"
PEER = "client.emojivoto.serviceaccount.identity.linkerd.cluster.local"
GOAWAY, PING = 0x7, 0x6


class SlowWeb(App):
    """An HTTP/1.1 app answering each request with its path; ``/slow`` only once ``release`` is set (``held``
    says it arrived)."""

    def __init__(self, ip: str, port: int) -> None:
        super().__init__(ip, port)
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            if request.path == "/slow":
                self.held.set()
                await self.release.wait()
            body = request.path.encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()


async def h1_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One response (with Content-Length) from a proxy: (head, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each whole frame in ``data``."""
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + length]))
        data = data[9 + length:]
    return out


class PeerH2:
    """A peer proxy's HTTP/2 connection to an inbound proxy (mTLS, transport header), its frames kept raw too, so
    the test decides when the codec's answers (the PING's ACK) go out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ep = H2Endpoint(client=True)
        self.events: list[ev.Event] = []
        self.raw = b""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, mesh: Mesh, server: Pod, port: int) -> AsyncIterator[PeerH2]:
        ctx = mesh.ca.client_context(PEER, alpn=[TRANSPORT_ALPN])
        async with connection(server.ip, 4143, ssl=ctx, server_hostname=server.identity) as (reader, writer):
            peer = cls(reader, writer)
            writer.write(encode(TransportHeader(port=port, protocol=SessionProtocol.HTTP2)))
            peer.ep.initiate()
            peer.send()
            yield peer

    def request(self, path: str) -> tuple[int, bytes]:
        """A downgraded GET (as a linkerd2-proxy upgrades HTTP/1): its stream and its bytes, not yet sent."""
        sid = self.ep.next_stream_id()
        self.ep.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"web:8080"),
                                   (b":path", path.encode()), (b"l5d-orig-proto", b"HTTP/1.1")], end_stream=True)
        return sid, self.ep.data_to_send()

    def send(self, data: bytes = b"") -> None:
        self.writer.write(data + self.ep.data_to_send())

    async def read(self) -> bool:
        """One read into the codec (what it answers is left queued); False at EOF."""
        chunk = await self.reader.read(65536)
        if not chunk:
            return False
        self.raw += chunk
        self.events += self.ep.receive_data(chunk)
        return True

    async def goaway(self) -> int:
        """Read until a GOAWAY comes; its last stream ID (NO_ERROR asserted)."""
        while True:
            for event in self.events:
                if isinstance(event, ev.GoAway):
                    self.events.remove(event)
                    assert event.error_code == ErrorCodes.NO_ERROR
                    return event.last_stream_id
            assert await self.read(), "closed before a GOAWAY"

    async def pinged(self) -> None:
        """Read until a PING (not an ACK) has come."""
        while not any(kind == PING and not flags & 1 for kind, flags, _, _ in frames(self.raw)):
            assert await self.read(), "closed before a PING"

    async def until_closed(self) -> None:
        while await self.read():
            self.send()

    def responses(self) -> dict[int, tuple[bytes, bytes]]:
        """(status, body) of each stream that got a whole response."""
        status: dict[int, bytes] = {}
        bodies: dict[int, bytes] = {}
        ended = set()
        for event in self.events:
            if isinstance(event, ev.ResponseReceived):
                status[event.stream_id] = dict(event.headers)[b":status"]
            elif isinstance(event, ev.DataReceived):
                bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
            elif isinstance(event, ev.StreamEnded):
                ended.add(event.stream_id)
        return {sid: (status[sid], bodies.get(sid, b"")) for sid in ended if sid in status}

    def resets(self) -> dict[int, int]:
        return {e.stream_id: e.error_code for e in self.events if isinstance(e, ev.StreamReset)}


# -- end to end ---------------------------------------------------------------------------------------------------


def test_sigterm_closes_idle_http1_connections_finishes_the_request_in_hand_and_exits(tmp_path: Path) -> None:
    """The outbound side, the client's proxy a process: SIGTERM closes an idle keep-alive connection from the
    app at once, lets a request in hand finish (``connection: close``, then the connection closes), refuses new
    connections (the admin's too: ``/ready`` is not answered, as linkerd2-proxy's admin server stops accepting
    when the drain begins), and the process exits once drained."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc = mesh.one_served_pod("web", 8080)
            await mesh.start_proxy(server)
            env = {**mesh.proxy_env(client, outbound_to=[f"{svc}:8080"]),
                   "LINKERD2_PROXY_SHUTDOWN_GRACE_PERIOD": "10m"}
            async with (SlowWeb(server.ip, 8080) as app, proxy_process(env) as proc,
                        connection(svc, 8080) as (idle_r, idle_w), connection(svc, 8080) as (busy_r, busy_w)):
                idle_w.write(b"GET /warm HTTP/1.1\r\nhost: web\r\n\r\n")
                head, body = await h1_response(idle_r)
                assert head.startswith(b"HTTP/1.1 200") and body == b"/warm"
                assert b"connection: close" not in head.lower()  # kept alive, now idle
                busy_w.write(b"GET /slow HTTP/1.1\r\nhost: web\r\n\r\n")
                await app.held.wait()
                proc.send_signal(signal.SIGTERM)
                assert await closed_without_answer(idle_r)  # the idle connection: closed at once
                # Draining: no new connection is accepted, on the outbound listener nor the admin one.
                for port in (8080, 4191):
                    try:
                        _, writer = await asyncio.open_connection(svc if port == 8080 else client.ip, port)
                    except ConnectionRefusedError:
                        continue
                    writer.close()
                    raise AssertionError(f"port {port} accepted a connection while draining")
                assert proc.returncode is None  # a request is in hand: the proxy waits for it
                app.release.set()
                head, body = await h1_response(busy_r)
                assert head.startswith(b"HTTP/1.1 200") and body == b"/slow"
                assert b"connection: close" in head.lower()
                assert await busy_r.read() == b""  # then the connection is closed
                assert await proc.wait() == 0  # drained: no waiting for the 10 minutes

    run(scenario())


def test_post_shutdown_drains_the_same_way(tmp_path: Path) -> None:
    """``POST /shutdown`` (enabled) begins the same drain as SIGTERM: an idle keep-alive connection from the app
    is closed at once and ``Proxy.run`` returns once drained, long before the 10-minute grace period."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc = mesh.one_served_pod("web", 8080)
            await mesh.start_proxy(server)
            env = mesh.proxy_env(client, outbound_to=[f"{svc}:8080"], LINKERD2_PROXY_SHUTDOWN_GRACE_PERIOD="10m",
                                 LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED="true")
            serving = asyncio.Event()
            proxy = Proxy(ProxyConfig.from_env(env), env, on_serving=serving.set)
            running = asyncio.create_task(proxy.run())
            try:
                await serving.wait()
                async with SlowWeb(server.ip, 8080), connection(svc, 8080) as (reader, writer):
                    writer.write(b"GET /warm HTTP/1.1\r\nhost: web\r\n\r\n")
                    assert (await h1_response(reader))[1] == b"/warm"
                    async with connection(client.ip, 4191) as (admin_r, admin_w):
                        admin_w.write(b"POST /shutdown HTTP/1.1\r\nhost: admin\r\ncontent-length: 0\r\n\r\n")
                        assert (await admin_r.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
                    assert await closed_without_answer(reader)
                    await running
            finally:
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running

    run(scenario())


def test_http2_peer_connection_gets_two_goaways_and_its_streams_finish(tmp_path: Path) -> None:
    """The inbound side, a peer proxy's HTTP/2 connection: GOAWAY(2^31-1) and a PING; a stream the peer sent
    before it answered the PING is served; GOAWAY naming the last stream taken; a stream sent after that is
    ignored (RFC 9113 §6.8: the peer knows from the last stream ID that it was not processed, and may send it
    again elsewhere); the streams in flight complete, then the connection closes and the proxy stops."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server = mesh.pod("web-0", app="web", ports=[8080])
            proxy = await mesh.start_proxy(server)
            async with SlowWeb(server.ip, 8080) as app, PeerH2.open(mesh, server, 8080) as peer:
                slow, data = peer.request("/slow")
                peer.send(data)
                await app.held.wait()
                on_the_wire, early = peer.request("/early")
                late, too_late = peer.request("/late")
                stopping = asyncio.create_task(proxy.stop(600.0))
                assert await peer.goaway() == MAX_STREAM_ID
                await peer.pinged()
                peer.send(early)  # sent before the PING's ACK: the proxy has not said it stops taking streams
                assert await peer.goaway() == on_the_wire
                peer.send(too_late)
                app.release.set()
                await peer.until_closed()
                assert peer.responses() == {slow: (b"200", b"/slow"), on_the_wire: (b"200", b"/early")}
                assert late not in peer.resets()  # ignored, not answered (its number says so)
                await stopping  # drained: it stops without waiting for the 600 s

    run(scenario())


def test_a_connection_that_becomes_http_during_the_drain_is_drained_at_once(tmp_path: Path) -> None:
    """Peers' connections (mTLS, transport header, HTTP/1): one idle after a request, and one accepted before the
    drain (its TLS handshake done) whose header and request come after the first was closed, the sign that the
    drain has begun: that request is served with ``connection: close``, then the connection closes."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server = mesh.pod("web-0", app="web", ports=[8080])
            proxy = await mesh.start_proxy(server)
            ctx = mesh.ca.client_context(PEER, alpn=[TRANSPORT_ALPN])
            header = encode(TransportHeader(port=8080, protocol=SessionProtocol.HTTP1))
            peer = {"ssl": ctx, "server_hostname": server.identity}
            async with (SlowWeb(server.ip, 8080), connection(server.ip, 4143, **peer) as (idle_r, idle_w),
                        connection(server.ip, 4143, **peer) as (late_r, late_w)):
                idle_w.write(header + b"GET /warm HTTP/1.1\r\nhost: web\r\n\r\n")
                assert (await h1_response(idle_r))[1] == b"/warm"
                stopping = asyncio.create_task(proxy.stop(600.0))
                assert await closed_without_answer(idle_r)
                late_w.write(header + b"GET /late HTTP/1.1\r\nhost: web\r\n\r\n")
                head, body = await h1_response(late_r)
                assert body == b"/late" and b"connection: close" in head.lower()
                assert await late_r.read() == b""
                await stopping

    run(scenario())


def test_grace_period_resets_a_stream_still_open_and_the_process_exits(tmp_path: Path) -> None:
    """SIGTERM with an HTTP/2 stream whose response never comes: once the grace period is over the stream is
    reset (CANCEL), the connection closed, and the process exits."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server = mesh.pod("web-0", app="web", ports=[8080])
            env = {**mesh.proxy_env(server), "LINKERD2_PROXY_SHUTDOWN_GRACE_PERIOD": "1s"}
            async with (SlowWeb(server.ip, 8080) as app, proxy_process(env) as proc,
                        PeerH2.open(mesh, server, 8080) as peer):
                slow, data = peer.request("/slow")
                peer.send(data)
                await app.held.wait()
                proc.send_signal(signal.SIGTERM)
                assert await peer.goaway() == MAX_STREAM_ID
                await peer.until_closed()  # the PING answered, the second GOAWAY, then the cut
                assert peer.resets() == {slow: ErrorCodes.CANCEL}
                assert slow not in peer.responses()
                assert await proc.wait() == 0

    run(scenario())


def test_a_grpc_call_in_flight_completes_while_the_apps_proxy_drains(tmp_path: Path) -> None:
    """The outbound side with a real HTTP/2 client (grpcio, one channel): its proxy drains while a call is in
    flight; grpcio answers the PING, the call completes, and the proxy stops once the channel's connection has
    closed."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc = mesh.one_served_pod("names", 9090)
            await mesh.start_proxy(server)
            proxy = await mesh.start_proxy(client, outbound_to=[f"{svc}:9090"])
            held, release = asyncio.Event(), asyncio.Event()

            async def slow(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                held.set()
                await release.wait()
                return request[::-1]

            app = grpc.aio.server()
            app.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                "test.Names", {"Slow": grpc.unary_unary_rpc_method_handler(slow)}),))
            app.add_insecure_port(f"{server.ip}:9090")
            await app.start()
            try:
                async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                    call = channel.unary_unary("/test.Names/Slow")(b"drained")
                    await held.wait()
                    stopping = asyncio.create_task(proxy.stop(600.0))
                    release.set()
                    assert await call == b"deniard"
                    await stopping  # drained: no waiting for the 600 s
            finally:
                await app.stop(None)

    run(scenario())


# -- sans-IO ------------------------------------------------------------------------------------------------------


def _get(client: H2Endpoint, path: bytes) -> tuple[int, bytes]:
    sid = client.next_stream_id()
    client.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"web"),
                              (b":path", path)], end_stream=True)
    return sid, client.data_to_send()


def test_codec_takes_streams_up_to_the_last_goaway_and_never_raises_it() -> None:
    client, server = pair()
    one, first = _get(client, b"/1")
    _, second = _get(client, b"/3")
    five, third = _get(client, b"/5")
    server.goaway(ErrorCodes.NO_ERROR, MAX_STREAM_ID)
    assert [type(e) for e in server.receive_data(first)] == [ev.RequestReceived, ev.StreamEnded]  # still taken
    server.goaway(ErrorCodes.NO_ERROR)  # the last stream taken: 1
    assert [type(e) for e in server.receive_data(second)] == []  # above it: ignored
    server.goaway(ErrorCodes.NO_ERROR, five)  # a later GOAWAY cannot raise it again
    assert server.receive_data(third) == []
    sent = [int.from_bytes(p[:4], "big") for kind, _, _, p in frames(server.data_to_send()) if kind == GOAWAY]
    assert sent == [MAX_STREAM_ID, one, one]


def test_http1_core_drain_closes_when_idle_else_after_the_response() -> None:
    idle = Playbook(router([]), settings())
    assert (idle
            >> DownData(GET)
            >> exchange(ADDR, 0, GET, OK)
            >> Run(lambda: _core(idle).drain())  # between requests: closed at once
            << Close())
    waiting = Playbook(router([]), settings())
    assert (waiting
            >> DownData(GET)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, GET)
            >> Run(lambda: _core(waiting).drain())  # no response head yet: it will say so
            >> UpData(0, OK)
            << SendDown(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: close\r\n\r\nok")
            << Checkin(0, reuse=True)
            << Close())
    relaying = Playbook(router([]), settings())
    assert (relaying
            >> DownData(GET)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, GET)
            >> UpData(0, OK[:-1])
            << SendDown(OK[:-1])
            >> Run(lambda: _core(relaying).drain())  # the head is out: the connection closes after the body
            >> UpData(0, OK[-1:])
            << SendDown(OK[-1:])
            << Checkin(0, reuse=True)
            << Close())


def _core(play: Playbook) -> Http1Proxy:
    assert play.core is not None
    return play.core


H2_GET = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"web"), (b":path", b"/")]
H2_OK = [(b":status", b"200")]


def test_http2_core_drain_two_goaways_then_the_end_once_its_streams_are_done() -> None:
    play = h2p.H2Playbook(Router(ADDRS[:1]), http_settings())
    assert (play
            >> _one_stream_then_drain(play)
            >> h2p.Down(h2p.Headers(3, H2_GET, end=True))  # sent before the client saw the GOAWAY: taken
            << h2p.SendUp(0, h2p.Headers(3, H2_GET, end=True))
            >> h2p.Down(h2p.Ping(ack=True))  # the answer to another PING (a keep-alive's): not the drain's
            >> h2p.Down(h2p.Ping(ack=True, data=DRAIN_PING))
            << h2p.SendDown(h2p.GoAway(ErrorCodes.NO_ERROR, 3))
            >> h2p.Down(h2p.Headers(5, H2_GET, end=True))  # above the last stream taken: ignored
            >> h2p.Up(0, h2p.Headers(1, H2_OK, end=True))
            << h2p.SendDown(h2p.Headers(1, H2_OK, end=True))
            >> h2p.Up(0, h2p.Headers(3, H2_OK, end=True))
            << h2p.SendDown(h2p.Headers(3, H2_OK, end=True))  # the last stream done: no third GOAWAY
            << h2p.Checkin(0, reuse=False)
            << h2p.Close())


def test_http2_core_cut_resets_the_streams_left() -> None:
    play = h2p.H2Playbook(Router(ADDRS[:1]), http_settings())
    assert (play
            >> _one_stream_then_drain(play)
            >> h2p.Do(lambda: _h2_core(play).cut())  # the PING never answered, the grace period over
            << h2p.SendDown(h2p.Rst(1, ErrorCodes.CANCEL), h2p.GoAway(ErrorCodes.NO_ERROR, 1))
            << h2p.Checkin(0, reuse=False)
            << h2p.Close())


def _one_stream_then_drain(play: h2p.H2Playbook) -> Steps:
    """Stream 1 goes up, then the drain begins: GOAWAY(2^31-1) and a PING to the client."""
    return Steps((("in", h2p.Down(h2p.Headers(1, H2_GET, end=True))), ("out", h2p.Connect(ADDRS[0])),
                  ("in", h2p.Connected()), ("out", h2p.SendUp(0, h2p.Headers(1, H2_GET, end=True))),
                  ("in", h2p.Do(lambda: _h2_core(play).drain())),
                  ("out", h2p.SendDown(h2p.GoAway(ErrorCodes.NO_ERROR, MAX_STREAM_ID), h2p.Ping()))))


def _h2_core(play: h2p.H2Playbook) -> Http2Proxy:
    core = play.core
    assert isinstance(core, Http2Proxy)
    return core
