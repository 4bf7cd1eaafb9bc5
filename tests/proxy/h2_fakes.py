"""Drive the HTTP/2 core without sockets: an h2 client downstream, scripted HTTP/2 or HTTP/1 servers upstream.

``Harness.run`` takes the layer's one command (``ServeHttp2``), makes the
push-driven ``Http2Proxy`` over itself as the sink, and plays the transports:
what the client and each peer have to say is fed in (``down_data``,
``up_data``), what the core writes is delivered to them, and connects and
discovery waits it asks for are answered before the next read (a new fake
connection to the peer the test put at that address; ``Wait`` with what the
test says). When nothing is left to say, the client's next scripted step
runs; when the script is done, time passes on the test's ``clock`` (a
``FakeClock``) to the earliest timer (a route's timeout), which fires; else
the client closes (EOF).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events

from tether.proxy.core import commands as cmd
from tether.proxy.core.http2_proxy import Http2Proxy
from tether.proxy.core.http_commands import ServeHttp2, Upstream
from tether.proxy.codec.http1 import Body, EndOfMessage, Http1Connection, RequestHead, ResponseHead, Role

Handler = Callable[["H2Server", int, list[tuple[bytes, bytes]], bytes], None]


class FakeClock:
    """Time that passes only when the harness says so (a timer is due) or a test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Client:
    """The downstream HTTP/2 client: an h2 connection and what it saw per stream."""

    def __init__(self) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.responses: dict[int, list[tuple[bytes, bytes]]] = {}
        self.bodies: dict[int, bytes] = {}
        self.trailers: dict[int, list[tuple[bytes, bytes]]] = {}
        self.ended: set[int] = set()
        self.resets: dict[int, int] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False
        self.raw = b""
        self.extra = b""  # raw bytes to send after what h2 has (a GOAWAY h2 would not let us receive after)

    def data_to_send(self) -> bytes:
        data = self.conn.data_to_send() + self.extra
        self.extra = b""
        return data

    def receive(self, data: bytes) -> None:
        self.raw += data
        if self.goaway is not None:
            return
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                self.responses[event.stream_id] = list(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id] = self.bodies.get(event.stream_id, b"") + event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived):
                self.trailers[event.stream_id] = list(event.headers)
            elif isinstance(event, h2.events.StreamEnded):
                self.ended.add(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.resets[event.stream_id] = event.error_code
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = event

    def request(self, headers: list[tuple[bytes, bytes]], body: bytes = b"", *, end: bool = True) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, headers, end_stream=end and not body)
        if body:
            self.conn.send_data(sid, body, end_stream=end)
        return sid

    def status(self, sid: int) -> bytes:
        return dict(self.responses[sid])[b":status"]


class RawClient:
    """A downstream client that sends the given chunks as they are (fuzzing), then nothing."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.raw = b""
        self.conn = None

    def data_to_send(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def receive(self, data: bytes) -> None:
        self.raw += data


class H2Server:
    """An upstream HTTP/2 server; ``handler(server, stream_id, headers, body)`` answers each complete request."""

    def __init__(self, handler: Handler) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.conn.initiate_connection()
        self.handler = handler
        self.requests: dict[int, list[tuple[bytes, bytes]]] = {}
        self.bodies: dict[int, bytes] = {}
        self.trailers: dict[int, list[tuple[bytes, bytes]]] = {}
        self.resets: dict[int, int] = {}
        self.ack = True  # acknowledge received data (False: let the windows fill)
        self.closed = False

    def receive(self, data: bytes) -> None:
        if self.conn.state_machine.state is h2.connection.ConnectionState.CLOSED:
            return  # it sent GOAWAY (``close_connection``): h2 takes no frame then, and the fake reads none
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.requests[event.stream_id] = list(event.headers)
                self.bodies[event.stream_id] = b""
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id] += event.data
                if self.ack:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived):
                self.trailers[event.stream_id] = list(event.headers)
            elif isinstance(event, h2.events.StreamEnded):
                sid = event.stream_id
                self.handler(self, sid, self.requests[sid], self.bodies[sid])
            elif isinstance(event, h2.events.StreamReset):
                self.resets[event.stream_id] = event.error_code


class H1App:
    """An upstream HTTP/1.1 app: answers each request with ``answer(head, body)`` -> (status, headers, body)."""

    def __init__(self, answer: Callable[[RequestHead, bytes], tuple[int, tuple[tuple[bytes, bytes], ...], bytes]]):
        self.codec = Http1Connection(Role.SERVER)
        self.answer = answer
        self.heads: list[RequestHead] = []
        self.body = b""
        self.out = b""
        self.closed = False

    def receive(self, data: bytes) -> None:
        for event in self.codec.receive_data(data):
            if isinstance(event, RequestHead):
                self.heads.append(event)
                self.body = b""
            elif isinstance(event, Body):
                self.body += event.data
            elif isinstance(event, EndOfMessage):
                status, headers, body = self.answer(self.heads[-1], self.body)
                self.out += self.codec.send_head(ResponseHead(status, headers, b"OK"))
                self.out += self.codec.send_body(body) + self.codec.send_end()
                self.codec.start_next_cycle()

    def data_to_send(self) -> bytes:
        out, self.out = self.out, b""
        return out


def respond(status: bytes = b"200", body: bytes = b"", trailers: list[tuple[bytes, bytes]] | None = None,
            headers: tuple[tuple[bytes, bytes], ...] = ()) -> Handler:
    def handler(server: H2Server, sid: int, request: list[tuple[bytes, bytes]], data: bytes) -> None:
        server.conn.send_headers(sid, [(b":status", status), *headers], end_stream=not body and not trailers)
        for i in range(0, len(body), 16384):  # within the default window: bodies up to 64 KiB
            server.conn.send_data(sid, body[i:i + 16384], end_stream=not trailers and i + 16384 >= len(body))
        if trailers:
            server.conn.send_headers(sid, trailers, end_stream=True)

    return handler


class _Timer:
    def __init__(self, due: float, delay: float, callback: Callable[[], None]) -> None:
        self.due, self.delay, self.callback = due, delay, callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Harness:
    """Runs the core to its end against ``client`` and the peers at each address (see the module docstring);
    also the core's sink."""

    def __init__(self, client: Client | RawClient, peers: dict[Any, Callable[[], H2Server | H1App | None]],
                 script: list[Callable[[Client], None]] | None = None, *,
                 waits: Callable[[cmd.Wait], Any] | None = None, limit: int = 10_000,
                 h1_peers: dict[Any, Callable[[], H2Server | H1App | None]] | None = None,
                 clock: FakeClock | None = None) -> None:
        self.client = client
        self.clock = clock  # moved on to the earliest timer once nothing else is left to happen
        self.timeouts: list[float] = []  # the delays of the timers that fired
        self.peers = peers  # address -> a new peer per connection (None: connection refused)
        self.h1_peers = h1_peers if h1_peers is not None else peers  # the same for checkout (HTTP/1)
        self.script = list(script or [])
        self.waits = waits or (lambda command: None)
        self.blocked: frozenset[Any] = frozenset()  # connections whose write buffer is full (a script sets it)
        self._told_blocked: frozenset[Any] = frozenset()
        self.limit = limit
        self.conns: dict[Upstream, H2Server | H1App] = {}
        self.opened: list[tuple[str, Any]] = []  # ("h2"|"h1", address) per connection made
        self.checkins: list[tuple[Upstream, bool]] = []
        self.counts: list[cmd.Count] = []
        self.started: list[cmd.Command] = []  # the blocking commands the core had run (Connect, Wait)
        self.paused: set[Upstream] = set()  # not read (read_up)
        self.timers: list[_Timer] = []
        self.closed = False
        self._jobs: list[Callable[[], None]] = []
        self.prepare: Callable[[Http2Proxy], None] | None = None  # called with the core before it starts

    # -- the sink ---------------------------------------------------------------------------------------------

    def send_down(self, data: bytes) -> None:
        self.client.receive(data)

    def close(self) -> None:
        self.closed = True

    def _open(self, connect: cmd.Connect, kind: str) -> Upstream | cmd.Failed:
        make = (self.peers if kind == "h2" else self.h1_peers).get(connect.addr)
        peer = make() if make is not None else None
        if peer is None:
            return cmd.Failed("i/o", "ECONNREFUSED")
        up = Upstream((connect.addr, connect.tls), None, 0.001, reused=False)
        self.conns[up] = peer
        self.opened.append((kind, connect.addr))
        return up

    def connect(self, connect: cmd.Connect, header: bytes | None, done: Callable[[Any], None]) -> None:
        self.started.append(connect)
        self._jobs.append(lambda: done(self._open(connect, "h2")))

    def checkout(self, connect: cmd.Connect, header: bytes | None, done: Callable[[Any], None]) -> None:
        self.started.append(connect)
        self._jobs.append(lambda: done(self._open(connect, "h1")))

    def send_up(self, up: Upstream, data: bytes) -> None:
        peer = self.conns[up]
        if not peer.closed:
            peer.receive(data)

    def checkin(self, up: Upstream, reuse: bool) -> None:
        self.checkins.append((up, reuse))
        self.paused.discard(up)
        peer = self.conns.get(up)
        if peer is not None:
            peer.closed = True

    def read_up(self, up: Upstream, reading: bool) -> None:
        if reading:
            self.paused.discard(up)
        else:
            self.paused.add(up)

    def wait(self, command: cmd.Command, done: Callable[[Any], None]) -> None:
        assert isinstance(command, cmd.Wait)
        self.started.append(command)
        self._jobs.append(lambda: done(self.waits(command)))

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        now = self.clock.now if self.clock is not None else 0.0
        timer = _Timer(now + delay, delay, callback)
        self.timers.append(timer)
        return timer

    def count(self, name: str, labels: str) -> None:
        self.counts.append(cmd.Count(name, labels))

    # -- the transports ---------------------------------------------------------------------------------------

    def run(self, layer: cmd.Layer) -> None:
        command = next(layer)
        assert isinstance(command, ServeHttp2), command
        core = Http2Proxy(command.router, command.settings, self, downgrade=command.downgrade)
        if self.prepare is not None:
            self.prepare(core)
        core.start()
        for _ in range(self.limit):
            if self.closed:
                return
            if self.blocked != self._told_blocked:
                for target in self._told_blocked - self.blocked:
                    core.writable(target, True)
                for target in self.blocked - self._told_blocked:
                    core.writable(target, False)
                self._told_blocked = self.blocked
                continue
            if self._jobs:
                self._jobs.pop(0)()
                continue
            moved = False
            for up, peer in list(self.conns.items()):
                if up in self.paused or peer.closed:
                    continue
                out = peer.data_to_send() if isinstance(peer, H1App) else peer.conn.data_to_send()
                if out:
                    core.up_data(up, out)
                    moved = True
                    break
            if moved:
                continue
            data = self.client.data_to_send()
            if data:
                core.down_data(data)
                continue
            if self.script:
                self.script.pop(0)(self.client)  # type: ignore[arg-type]
                continue
            live = [t for t in self.timers if not t.cancelled]
            if live and self.clock is not None:
                timer = min(live, key=lambda t: t.due)
                self.timers.remove(timer)
                self.timeouts.append(timer.delay)
                self.clock.now = max(self.clock.now, timer.due)
                timer.callback()
                continue
            core.down_lost()  # the client is done: EOF
        if not self.closed:
            raise AssertionError("the core did not end")
