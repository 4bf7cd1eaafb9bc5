"""A small gRPC server on the proxy's own HTTP/2 stack: server-streaming calls over mTLS, without grpcio.

What the proxy serves over gRPC is one method (tap's ``Observe``, proxy.md
§10.2); grpcio's server for it cost ~17 MB of resident memory per tapped
proxy and ran threads in the proxy's process. This serves it on
``codec.http2.H2Endpoint`` (the framing, HPACK, stream states and per-stream
send buffers the data path uses) and ``codec.grpc_framing``:

- ``GrpcServer(handlers, context)`` listens on TCP; each accepted connection
  does a server-side TLS handshake (``loop.connect_accepted_socket``, bounded by
  ``HANDSHAKE_TIMEOUT``) with the context ``context()`` returns *then*, so a
  rotated certificate is used from the next connection on. The context asks
  for a client certificate without requiring one (the proxy's own server
  context): a client without one is still served, and each handler decides
  from ``Call.identity`` (the verified certificate's first SAN, as
  ``io.tls.client_identity`` reads a mesh client's identity; None without
  one) -- so an unauthorized client gets a gRPC status, not a failed
  handshake, as linkerd2-proxy answers.
- A request (``POST``, ``content-type: application/grpc``) for a path not in
  ``handlers`` ends ``UNIMPLEMENTED``; a non-gRPC request gets HTTP 415. The
  handler is called once with the call's first whole message (at most
  ``MAX_MESSAGE`` bytes: above it the call ends ``RESOURCE_EXHAUSTED``), and
  answers through the ``Call``: ``send`` a message, ``finish`` with a status
  (trailers; trailers-only when nothing was sent).
- Flow control: messages go into the stream's send buffer and out as the
  client's windows allow; ``Call.ready`` is False while more than
  ``HIGH_WATER`` bytes wait, and ``on_ready`` is called when the client's
  window reopens -- so a slow reader holds events in the handler's own
  bounded buffer (tap drops beyond 400), never here. ``on_done`` tells the
  handler the client went away (a reset stream, GOAWAY, a lost connection).
- At most ``MAX_CONCURRENT_STREAMS`` (200) calls per connection, as the
  HTTP/2 settings say.

Callers: ``io.tap_server`` and its tests.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from tether.proxy.codec.grpc_framing import MAX_MESSAGE, FramingError, MessageReader, frame
from tether.proxy.codec import http2_events as h2e
from tether.proxy.codec.http2 import DEFAULT_PARAMS, H2Endpoint, H2ProtocolError, Http2Params
from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.core.config import TcpOptions
from tether.proxy.io.grpc_client import Code
from tether.proxy.io.listeners import BACKLOG, Listener, bind
from tether.proxy.io.tls import client_identity

log = logging.getLogger(__name__)

# Generous against linkerd2-proxy's 1 s detection: the tap client and the proxy share loaded nodes.
HANDSHAKE_TIMEOUT = 10.0
HIGH_WATER = 64 * 1024  # bytes waiting on one call beyond which the handler holds its messages
_GRPC = b"application/grpc"
# grpc-message is percent-encoded outside printable ASCII (and '%' itself): gRPC's PROTOCOL-HTTP2.md.
_MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")

Handler = Callable[["Call", bytes], None]


class Call:
    """One server-streaming call, as its handler sees it."""

    __slots__ = ("_conn", "sid", "identity", "handler", "reader", "handled", "headers_sent", "done", "on_ready",
                 "on_done")

    def __init__(self, conn: _Connection, sid: int, identity: str | None) -> None:
        self._conn = conn
        self.sid = sid
        self.identity = identity  # the client's verified identity; None: no client certificate
        self.handler: Handler | None = None
        self.reader = MessageReader(MAX_MESSAGE)
        self.handled = False
        self.headers_sent = False
        self.done = False  # finished, or the client went away
        self.on_ready: Callable[[], None] | None = None
        self.on_done: Callable[[], None] | None = None

    @property
    def ready(self) -> bool:
        """Whether a message sent now goes out without piling up here (the client reads)."""
        return not self.done and self._conn.endpoint.buffered(self.sid) < HIGH_WATER

    def send(self, message: bytes) -> None:
        if self.done:
            return
        endpoint = self._conn.endpoint
        if not self.headers_sent:
            self.headers_sent = True
            endpoint.send_headers(self.sid, [(b":status", b"200"), (b"content-type", _GRPC)])
        endpoint.queue_data(self.sid, frame(message))
        self._conn.flush()

    def finish(self, code: Code, message: str = "") -> None:
        """End the call with ``code`` (and ``message``, for an error)."""
        if self.done:
            return
        self.done = True
        status = [(b"grpc-status", str(int(code)).encode())]
        if message:
            status.append((b"grpc-message", quote(message, safe=_MESSAGE_SAFE).encode()))
        endpoint = self._conn.endpoint
        if self.headers_sent:
            endpoint.queue_end(self.sid, status)
        else:  # trailers-only
            endpoint.send_headers(self.sid, [(b":status", b"200"), (b"content-type", _GRPC), *status],
                                  end_stream=True)
        self._conn.calls.pop(self.sid, None)
        self._conn.flush()

    def _gone(self) -> None:
        """The client went away: no more sends, and the handler is told."""
        if self.done:
            return
        self.done = True
        if self.on_done is not None:
            self.on_done()


class _Connection(asyncio.Protocol):
    """One client's connection, from the end of its TLS handshake."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.endpoint = H2Endpoint(client=False, params=server.h2)
        self.transport: Any = None  # asyncio's or uvloop's TLS transport
        self.identity: str | None = None
        self.calls: dict[int, Call] = {}
        self.closed = False

    # -- asyncio.Protocol (the TLS layer calls these, from the end of the handshake) ---------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.identity = client_identity(transport.get_extra_info("ssl_object"))
        self.server.connections.add(self)
        self.endpoint.initiate()
        self.flush()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            events = self.endpoint.receive_data(data)
        except H2ProtocolError as err:
            log.debug("tap server: HTTP/2 protocol error from %s: %s", self.identity, err)
            self.close()
            return
        for event in events:
            self._event(event)
        self.flush()

    def eof_received(self) -> bool:
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._all_gone()
        self.server.connections.discard(self)

    # -- HTTP/2 events ---------------------------------------------------------------------------------------------

    def _event(self, event: object) -> None:
        if isinstance(event, h2e.RequestReceived):
            self._request(event.stream_id, event.headers or [])
        elif isinstance(event, h2e.DataReceived):
            self.endpoint.ack(event.stream_id, event.flow_controlled_length or 0)  # requests are small; bounded below
            call = self.calls.get(event.stream_id)
            if call is not None and not call.handled:
                self._data(call, event.data or b"")
        elif isinstance(event, h2e.StreamEnded):
            call = self.calls.get(event.stream_id)
            if call is not None and not call.handled:
                call.finish(Code.INTERNAL, "the call ended without a request message"
                            if not call.reader.partial else "the call ended inside the request message")
        elif isinstance(event, h2e.StreamReset):
            call = self.calls.pop(event.stream_id, None)
            if call is not None:
                call._gone()
        elif isinstance(event, h2e.GoAway):
            self.close()
        elif isinstance(event, (h2e.WindowUpdated, h2e.RemoteSettingsChanged)):
            self.flush()
            for call in list(self.calls.values()):
                if call.handled and call.on_ready is not None and call.ready:
                    call.on_ready()

    def _request(self, sid: int, headers: list[tuple[bytes, bytes]]) -> None:
        fields = dict(headers)
        if fields.get(b":method") != b"POST" or not fields.get(b"content-type", b"").startswith(_GRPC):
            self.endpoint.send_headers(sid, [(b":status", b"415")], end_stream=True)
            return
        call = self.calls[sid] = Call(self, sid, self.identity)
        path = fields.get(b":path", b"").decode("latin-1")
        call.handler = self.server.handlers.get(path)
        if call.handler is None:
            call.finish(Code.UNIMPLEMENTED, f"unknown method {path}")

    def _data(self, call: Call, data: bytes) -> None:
        try:
            messages = call.reader.feed(data)
        except FramingError as err:
            call.finish(Code(err.code), str(err))
            return
        if messages and call.handler is not None:
            call.handled = True
            call.handler(call, messages[0])

    # -- writing and closing ---------------------------------------------------------------------------------------

    def flush(self) -> None:
        self.endpoint.flush()
        data = self.endpoint.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.endpoint.goaway()
        self.flush()
        self._all_gone()
        if self.transport is not None:
            self.transport.close()

    def _all_gone(self) -> None:
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call._gone()


class GrpcServer:
    """Server-streaming gRPC methods (``handlers``, by ``/package.Service/Method`` path) over mTLS."""

    def __init__(self, handlers: dict[str, Handler], context: Callable[[], ssl.SSLContext],
                 h2: Http2Params = DEFAULT_PARAMS) -> None:
        self.handlers = handlers
        self.h2 = h2  # the SETTINGS each connection advertises, and holds its client to
        self._context = context
        self._listener: Listener | None = None
        self._accepting: asyncio.Task[None] | None = None
        self.connections: set[_Connection] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int, *, backlog: int = BACKLOG, accept: TcpOptions = TcpOptions()) -> int:
        """Listen on ``host:port`` (0: any free port) with ``backlog``, each accepted connection with ``accept``'s
        socket options (``io.listeners``: the proxy's listeners' one accept loop); raises ``OSError`` when it
        cannot."""
        listener = Listener("tap", bind(SocketAddr(ipaddress.ip_address(host), port), backlog), accept)
        self._listener = listener
        self.port = listener.addr.port
        self._accepting = asyncio.get_running_loop().create_task(listener.serve(self._accepted))
        return self.port

    def _accepted(self, sock: socket.socket) -> None:
        task = asyncio.get_running_loop().create_task(self._handshake(sock))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, sock: socket.socket) -> None:
        """TLS with the context of the moment (a rotated certificate from the next connection on)."""
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _Connection(self), sock, ssl=self._context(), ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as err:
            log.debug("tap server: TLS handshake failed: %s", err)
            sock.close()

    async def stop(self) -> None:
        """Stop listening, end every connection (GOAWAY; the calls' handlers are told) and handshake."""
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._handshakes):
            task.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        for conn in list(self.connections):
            conn.close()
        self.connections.clear()
