"""Drive the HTTP/2 layer without sockets: an h2 client downstream, scripted HTTP/2 or HTTP/1 servers upstream.

``Harness.run`` answers the layer's commands as the driver would: ``Poll``
delivers each write to its peer and hands back what the peers have to say;
``Start``-ed commands are answered at the next ``Poll`` (``OpenUp`` and
``Checkout`` with a new fake connection to the peer the test put at that
address, ``Wait`` with what the test says). When nothing is left to say,
the client's next scripted step runs; when the script is done, time passes
on the test's ``clock`` (a ``FakeClock``) up to a ``Poll``'s timeout (a
route's deadline), else the client closes (EOF).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events

from tether.proxy.core import commands as cmd
from tether.proxy.core.http_commands import Checkin, Checkout, OpenUp, Poll, Polled, SendDown, Start, Upstream
from tether.proxy.codec.http1 import Body, EndOfMessage, Http1Connection, RequestHead, ResponseHead, Role

Handler = Callable[["H2Server", int, list[tuple[bytes, bytes]], bytes], None]


class FakeClock:
    """Time that passes only when the harness says so (a ``Poll`` timeout) or a test moves it."""

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


class Harness:
    """Runs the layer to its end against ``client`` and the peers at each address (see the module docstring)."""

    def __init__(self, client: Client | RawClient, peers: dict[Any, Callable[[], H2Server | H1App | None]],
                 script: list[Callable[[Client], None]] | None = None, *,
                 waits: Callable[[cmd.Wait], Any] | None = None, limit: int = 10_000,
                 h1_peers: dict[Any, Callable[[], H2Server | H1App | None]] | None = None,
                 clock: FakeClock | None = None) -> None:
        self.client = client
        self.clock = clock  # moved on by a Poll's timeout once nothing else is left to happen
        self.timeouts: list[float] = []  # the Poll timeouts that passed
        self.peers = peers  # address -> a new peer per connection (None: connection refused)
        self.h1_peers = h1_peers if h1_peers is not None else peers  # the same for Checkout (HTTP/1)
        self.script = list(script or [])
        self.waits = waits or (lambda command: None)
        self.blocked: frozenset[Any] = frozenset()  # connections whose write buffer is full (a script sets it)
        self._told_blocked: frozenset[Any] = frozenset()
        self.limit = limit
        self.conns: dict[Upstream, H2Server | H1App] = {}
        self.opened: list[tuple[str, Any]] = []  # ("h2"|"h1", address) per connection made
        self.checkins: list[tuple[Upstream, bool]] = []
        self.counts: list[cmd.Count] = []
        self.started: list[cmd.Command] = []
        self.polls = 0
        self._jobs: list[tuple[object, Any]] = []

    def _open(self, command: OpenUp | Checkout, kind: str) -> Upstream | cmd.Failed:
        make = (self.peers if kind == "h2" else self.h1_peers).get(command.connect.addr)
        peer = make() if make is not None else None
        if peer is None:
            return cmd.Failed("i/o", "ECONNREFUSED")
        up = Upstream((command.connect.addr, command.connect.tls), None, 0.001, reused=False)
        self.conns[up] = peer
        self.opened.append((kind, command.connect.addr))
        return up

    def _answer(self, command: cmd.Command) -> Any:
        if isinstance(command, OpenUp):
            return self._open(command, "h2")
        if isinstance(command, Checkout):
            return self._open(command, "h1")
        if isinstance(command, cmd.Wait):
            return self.waits(command)
        raise AssertionError(f"unexpected started command {command!r}")

    def run(self, layer: cmd.Layer) -> None:
        reply: Any = None
        for _ in range(self.limit):
            try:
                command = layer.send(reply)
            except StopIteration:
                return
            reply = None
            if isinstance(command, Start):
                self.started.append(command.command)
                self._jobs.append((command.tag, self._answer(command.command)))
            elif isinstance(command, Checkin):
                self.checkins.append((command.up, command.reuse))
                peer = self.conns.get(command.up)
                if peer is not None:
                    peer.closed = True
            elif isinstance(command, cmd.Count):
                self.counts.append(command)
            elif isinstance(command, SendDown):
                self.client.receive(command.data)
                reply = True
            elif isinstance(command, Poll):
                reply = self._poll(command)
            else:
                raise AssertionError(f"unexpected {command!r}")
        raise AssertionError("the layer did not end")

    def _poll(self, command: Poll) -> Polled:
        self.polls += 1
        for target, data in command.writes:
            if target is None:
                self.client.receive(data)
            else:
                peer = self.conns[target]
                if not peer.closed:
                    peer.receive(data)
        while True:
            polled = Polled(done=self._jobs, blocked=self.blocked)
            self._jobs = []
            data = self.client.data_to_send()
            if data:
                polled.down = data
            for up in command.ups:
                peer = self.conns[up]
                out = peer.data_to_send() if isinstance(peer, H1App) else peer.conn.data_to_send()
                if out:
                    polled.ups.append((up, out))
            if polled.down is not None or polled.ups or polled.done or self.blocked != self._told_blocked:
                self._told_blocked = self.blocked
                return polled
            if self.script:
                self.script.pop(0)(self.client)
                continue
            if command.timeout is not None and self.clock is not None:
                self.timeouts.append(command.timeout)
                self.clock.now += max(command.timeout, 1e-6)
                return Polled(blocked=self.blocked)
            return Polled(down=b"", blocked=self.blocked)  # the client is done: EOF
