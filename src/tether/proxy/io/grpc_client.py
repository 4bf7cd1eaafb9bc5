"""A small gRPC client on the proxy's HTTP/2 codec: what the proxy needs of gRPC for its control-plane calls,
without grpcio.

grpcio's C core is ~16 MB of a proxy's resident memory (``./run bench
proxy_memory``); the proxy's calls to the control plane -- identity's
``Certify`` (unary), destination's ``Get``/``GetProfile`` and policy's watches
(server-streaming) -- need a small part of it. This module speaks the gRPC
over HTTP/2 protocol itself, on the HTTP/2 codec the data path already
loads (``codec.http2.H2Endpoint``):

- ``Channel(target, ssl_context=..., server_name=...)``: one HTTP/2
  connection to ``host:port`` (or a Unix socket, ``unix:/path``: a SPIRE
  agent's Workload API), opened on the first call, shared by every call
  on the channel (one stream each), opened again after it is lost or the
  server sent GOAWAY. With ``ssl_context`` it is TLS: the context carries
  the trust anchors and, for mTLS, the proxy's own certificate (and must
  offer ALPN ``h2``); ``server_name`` is sent as SNI and ``:authority`` and
  must be a DNS SAN of the server's certificate, checked here whatever the
  context's ``check_hostname`` says (the proxy's contexts leave names to
  their callers).
- ``unary(method, request, ResponseType, timeout=...)`` and
  ``server_stream(...)`` (an async iterator): protobuf messages in and out,
  length-prefixed, uncompressed; a deadline is sent as ``grpc-timeout`` and
  enforced here (the stream is reset, ``DEADLINE_EXCEEDED``). Leaving a
  stream early, or cancelling the task that reads it, resets the stream
  (``CANCEL``), which the server sees as a cancelled call.
- Every failure is an ``RpcError`` with a ``Code``: the ``grpc-status`` and
  ``grpc-message`` of the trailers (or of a trailers-only response), or what
  gRPC's HTTP/2 mapping gives for a non-200 status, a reset stream or a lost
  connection (``UNAVAILABLE``: connect failures, TLS failures, a server name
  that does not match, and GOAWAY: the calls the server did not take, or all
  of them for a GOAWAY with an error, end there; the connection takes no new
  call and closes once the others are over; the next call opens a new
  connection).

A channel to a controller that is not on loopback carries the receive limits
of ``LINKERD2_PROXY_CONTROL_STREAM_*`` (``limits``), as linkerd2-proxy applies
them to every destination and policy stream: a stream whose first message
does not come within the initial timeout (else the idle timeout) fails with
``DEADLINE_EXCEEDED``; after that, a stream silent for the idle timeout, or
open for the lifetime, ends as if the server had ended it (the caller opens
it again), and is reset (``CANCEL``) towards the server. Once a stream has
answered and no idle timeout is set, nothing but the lifetime ends it.

Flow control is the server's: received bytes are acknowledged as the caller
takes messages, so a reader that stops reading stops the server at the
stream's window. Messages above ``max_message`` bytes (4 MiB, gRPC's default)
end the call with ``RESOURCE_EXHAUSTED``. Not here: compression, client
streaming, keep-alive PINGs, retries (callers retry with their own backoff).
"""

from __future__ import annotations

import asyncio
import enum
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote

from tether.proxy.codec import http2_events as h2e
from tether.proxy.codec.http2 import ErrorCodes, H2Endpoint, H2ProtocolError, error_name
from tether.proxy.codec.grpc_framing import MAX_MESSAGE, FramingError, MessageReader, frame
from tether.proxy.core.config import ControlStreamLimits

# Seconds a closed TLS connection waits for the server's close_notify before the socket is closed anyway: the
# event loop's default (30 s) kept the certify channel's connection to identity open after every round.
TLS_SHUTDOWN_TIMEOUT = 1.0


class Code(enum.IntEnum):
    """gRPC status codes (names as grpcio's ``StatusCode``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A call that did not end with ``OK``."""

    def __init__(self, code: Code, details: str, trailers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.trailers = tuple(trailers)


class Message(Protocol):
    def SerializeToString(self) -> bytes: ...  # noqa: N802 - protobuf's name


M = TypeVar("M")
M_co = TypeVar("M_co", covariant=True)


class MessageType(Protocol[M_co]):
    """A protobuf message class (its ``FromString`` classmethod)."""

    def FromString(self, data: bytes, /) -> M_co: ...  # noqa: N802 - protobuf's name


# gRPC's mapping of HTTP statuses without a grpc-status (doc/http-grpc-status-mapping.md).
_HTTP_STATUS = {400: Code.INTERNAL, 401: Code.UNAUTHENTICATED, 403: Code.PERMISSION_DENIED, 404: Code.UNIMPLEMENTED,
                429: Code.UNAVAILABLE, 502: Code.UNAVAILABLE, 503: Code.UNAVAILABLE, 504: Code.UNAVAILABLE}
# ... and of RST_STREAM codes (doc/PROTOCOL-HTTP2.md, "Errors").
_RESET = {ErrorCodes.REFUSED_STREAM: Code.UNAVAILABLE, ErrorCodes.CANCEL: Code.CANCELLED,
          ErrorCodes.ENHANCE_YOUR_CALM: Code.RESOURCE_EXHAUSTED, ErrorCodes.INADEQUATE_SECURITY: Code.PERMISSION_DENIED}


def method_path(service: Any, method: str) -> str:
    """``/package.Service/Method`` from a generated module's service descriptor
    (``identity_pb2.DESCRIPTOR.services_by_name["Identity"]``), so a renamed method fails at import."""
    return f"/{service.full_name}/{service.methods_by_name[method].name}"


def grpc_timeout(seconds: float) -> str:
    """A ``grpc-timeout`` value: at most 8 digits, in milliseconds while they fit, else in seconds."""
    ms = max(1, int(seconds * 1000))
    return f"{ms}m" if ms < 100_000_000 else f"{min(int(seconds), 99_999_999)}S"


def status_of(headers: dict[str, str]) -> RpcError | None:
    """The call's end from its trailers (or a trailers-only response): ``None`` for OK, else the error."""
    raw = headers.get("grpc-status")
    if raw is None:
        return RpcError(Code.INTERNAL, "the server ended the call without grpc-status")
    try:
        code = Code(int(raw))
    except ValueError:
        code = Code.UNKNOWN
    if code is Code.OK:
        return None
    return RpcError(code, unquote(headers.get("grpc-message", "")), tuple(headers.items()))


class _Stream:
    """One call's receiving side, filled by the connection, drained by the caller."""

    def __init__(self, stream_id: int, max_message: int) -> None:
        self.id = stream_id
        self.reader = MessageReader(max_message)
        self.messages: deque[bytes] = deque()
        self.unacked = 0  # flow-controlled bytes received, not yet handed back to the server
        self.headers_seen = False
        self.end: RpcError | None = None
        self.ended = False
        self.closed = False  # no more frames either way (ended, reset, or the connection lost)
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def finish(self, error: RpcError | None) -> None:
        if not self.ended:
            self.ended = True
            self.end = error
        self.closed = True
        self.wake()

    def data(self, data: bytes, flow: int) -> None:
        self.unacked += flow
        try:
            self.messages.extend(self.reader.feed(data))
        except FramingError as err:
            self.finish(RpcError(Code(err.code), str(err)))
            return
        self.wake()


class _Connection(asyncio.Protocol):
    def __init__(self, max_message: int) -> None:
        self.h2 = H2Endpoint(client=True)
        self.max_message = max_message
        self.transport: Any = None  # asyncio's or uvloop's transport (uvloop's are not asyncio.Transport)
        self.streams: dict[int, _Stream] = {}
        self.draining = False  # GOAWAY received: no new streams
        self.lost: RpcError | None = None
        self._changed: asyncio.Future[None] | None = None  # window, settings or streams changed

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.h2.initiate()
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except H2ProtocolError as exc:
            self._fail(RpcError(Code.INTERNAL, f"HTTP/2 protocol error from the server: {exc}"))
            if self.transport is not None:
                self._flush()
                self.transport.close()
            return
        for event in events:
            self._event(event)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RpcError(Code.UNAVAILABLE, f"connection lost: {exc}" if exc else "connection closed"))

    # -- events -------------------------------------------------------------------------------------------------

    def _event(self, event: Any) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2e.ResponseReceived) and stream is not None:
            stream.headers_seen = True
            headers = _header_map(event.headers)
            error = _head_error(headers)
            if error is not None or event.stream_ended is not None:
                # A non-gRPC answer, or trailers-only: the call ends with these headers.
                stream.finish(error if error is not None else status_of(headers))
                if not event.stream_ended:
                    self._reset(stream, ErrorCodes.CANCEL)
        elif isinstance(event, h2e.DataReceived):
            if stream is None or stream.ended:  # nobody reads it: hand the connection's window back at once
                self.h2.ack(event.stream_id, event.flow_controlled_length)
            else:
                stream.data(event.data, event.flow_controlled_length)
                if stream.ended:  # a bad message ended it
                    self._reset(stream, ErrorCodes.CANCEL)
        elif isinstance(event, h2e.TrailersReceived) and stream is not None:
            end = status_of(_header_map(event.headers))
            if end is None and stream.reader.partial:
                end = RpcError(Code.INTERNAL, f"the call ended inside a message ({stream.reader.partial} bytes)")
            stream.finish(end)
        elif isinstance(event, h2e.StreamEnded) and stream is not None:
            stream.finish(RpcError(Code.INTERNAL, "the server ended the call without trailers"))
            self._forget(stream)
        elif isinstance(event, h2e.StreamReset) and stream is not None:
            code = _RESET.get(event.error_code, Code.INTERNAL)  # type: ignore[call-overload]
            stream.finish(RpcError(code, f"stream reset by the server ({error_name(event.error_code)})"))
            self._forget(stream)
        elif isinstance(event, h2e.GoAway):
            # No new call here; the calls the server did not take (all, for an error) end UNAVAILABLE, which
            # callers retry on a new connection; the others finish first.
            self.draining = True
            gone = RpcError(Code.UNAVAILABLE, f"the server went away (GOAWAY, {error_name(event.error_code)})")
            for sid, call in list(self.streams.items()):
                if event.error_code or sid > event.last_stream_id:
                    call.finish(gone)
                    self._forget(call)
            self._close_if_drained()
        elif isinstance(event, (h2e.WindowUpdated, h2e.RemoteSettingsChanged)):
            self.h2.flush()  # request bytes waiting for a window
            self._notify()

    def _fail(self, error: RpcError) -> None:
        if self.lost is None:
            self.lost = error
        for stream in list(self.streams.values()):
            stream.finish(error)
        self.streams.clear()
        self._notify()

    def _forget(self, stream: _Stream) -> None:
        stream.closed = True
        self.streams.pop(stream.id, None)
        self._notify()
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        """After a GOAWAY, the connection closes once its last call is over."""
        if self.draining and not self.streams and self.transport is not None and not self.transport.is_closing():
            self._flush()
            self.transport.close()

    def _notify(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._changed = None

    async def _wait_change(self) -> None:
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        await self._changed

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _reset(self, stream: _Stream, code: ErrorCodes) -> None:
        self._ack(stream)  # what nobody will read
        if not stream.closed or stream.id in self.streams:
            self.h2.reset(stream.id, code)  # (nothing, if the codec has the stream closed already)
            self._flush()
        self._forget(stream)

    # -- calls --------------------------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return self.lost is None and not self.draining and self.transport is not None \
            and not self.transport.is_closing()

    async def open(self, headers: list[tuple[str, str]], body: bytes) -> _Stream:
        while self.usable and not self.h2.can_open_stream():
            await self._wait_change()
        if not self.usable:
            raise self.lost or RpcError(Code.UNAVAILABLE, "connection closing")
        stream_id = self.h2.next_stream_id()
        stream = _Stream(stream_id, self.max_message)
        self.streams[stream_id] = stream
        self.h2.send_headers(stream_id, [(k.encode(), v.encode()) for k, v in headers], end_stream=not body)
        if body:  # sent as the server's windows allow (flushed again as they open)
            self.h2.queue_data(stream_id, body)
            self.h2.queue_end(stream_id)
            self.h2.flush(stream_id)
        self._flush()
        return stream

    async def next(self, stream: _Stream) -> bytes | None:
        """The stream's next message; ``None`` when it ended with OK; ``RpcError`` when it failed."""
        while True:
            if stream.messages:
                message = stream.messages.popleft()
                self._ack(stream)
                return message
            if stream.ended:
                self._ack(stream)
                if stream.end is not None:
                    raise stream.end
                return None
            self._ack(stream)  # the caller waits: let the server send more
            stream.waiter = asyncio.get_running_loop().create_future()
            try:
                await stream.waiter
            finally:
                stream.waiter = None

    def _ack(self, stream: _Stream) -> None:
        # Also for a stream that has ended: its bytes count against the connection's window too.
        if stream.unacked:
            self.h2.ack(stream.id, stream.unacked)
            self._flush()
        stream.unacked = 0

    def cancel(self, stream: _Stream) -> None:
        """The caller left: reset the stream unless it already ended."""
        if not stream.ended or stream.id in self.streams:
            self._reset(stream, ErrorCodes.CANCEL)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.h2.goaway()
            self._flush()
            self.transport.close()


def _header_map(headers: Iterable[tuple[bytes | str, bytes | str]]) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode(errors="replace") if isinstance(v, bytes) else v)
            for k, v in headers}


def _head_error(headers: dict[str, str]) -> RpcError | None:
    """Whether a response head is not a gRPC response (gRPC's HTTP status mapping)."""
    status = headers.get(":status", "")
    if status != "200":
        code = _HTTP_STATUS.get(int(status) if status.isdigit() else 0, Code.UNKNOWN)
        return RpcError(code, f"HTTP status {status or 'missing'} from the server")
    if not headers.get("content-type", "").startswith("application/grpc"):
        return RpcError(Code.UNKNOWN, f"content-type {headers.get('content-type')!r} is not gRPC")
    return None


class Channel:
    """Calls to one gRPC server over one (re-opened as needed) HTTP/2 connection."""

    def __init__(
        self,
        target: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_name: str | None = None,
        connect_timeout: float = 10.0,
        max_message: int = MAX_MESSAGE,
        limits: ControlStreamLimits | None = None,
    ) -> None:
        self.path: str | None = None  # a Unix socket (``unix:/path`` or ``unix:///path``), as gRPC names them
        if target.startswith("unix:"):
            self.path = target[len("unix://"):] if target.startswith("unix://") else target[len("unix:"):]
            if not self.path.startswith("/"):
                raise ValueError(f"gRPC target {target!r} is not unix:/absolute/path")
            self.host, self.port = "localhost", 0
        else:
            host, sep, port = target.rpartition(":")
            if not sep or not port.isdigit():
                raise ValueError(f"gRPC target {target!r} is not host:port or unix:/path")
            self.host = host.strip("[]")
            self.port = int(port)
        self.target = target
        self.ssl_context = ssl_context
        self.server_name = server_name
        self.connect_timeout = connect_timeout
        self.max_message = max_message
        self.limits = limits
        self._conn: _Connection | None = None
        self._connecting: asyncio.Lock | None = None
        self._closed = False

    async def unary(self, method: str, request: Message, response_type: MessageType[M], *,
                    timeout: float | None = None, metadata: Sequence[tuple[str, str]] = ()) -> M:
        """Call ``method`` (``/package.Service/Method``) with one message; its one answer."""
        answer: M | None = None
        async for message in self.server_stream(method, request, response_type, timeout=timeout, metadata=metadata):
            if answer is not None:
                raise RpcError(Code.INTERNAL, "a unary call answered with more than one message")
            answer = message
        if answer is None:
            raise RpcError(Code.INTERNAL, "a unary call ended without an answer")
        return answer

    async def server_stream(self, method: str, request: Message, response_type: MessageType[M], *,
                            timeout: float | None = None,
                            metadata: Sequence[tuple[str, str]] = ()) -> AsyncIterator[M]:
        """Call ``method`` with one message; its answers as they come. Leaving early cancels the call."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        framed = frame(request.SerializeToString())
        headers = [(":method", "POST"), (":scheme", "https" if self.ssl_context else "http"),
                   (":path", method), (":authority", self.server_name or (self.host if self.path else self.target)),
                   ("content-type", "application/grpc"), ("te", "trailers"), ("user-agent", "tether-proxy")]
        if timeout is not None:
            headers.append(("grpc-timeout", grpc_timeout(timeout)))
        headers += [(k.lower(), v) for k, v in metadata]
        receive = _ReceiveDeadlines(self.limits, loop.time())
        conn: _Connection | None = None
        stream: _Stream | None = None
        until = receive.earliest(deadline)  # what a TimeoutError means is read from which deadline this was
        try:
            async with asyncio.timeout_at(until):
                conn = await self._connection()
                stream = await conn.open(headers, framed)
            while True:
                until = receive.earliest(deadline)
                async with asyncio.timeout_at(until):
                    raw = await conn.next(stream)
                if raw is None:
                    return
                receive.received(loop.time())
                try:
                    message = response_type.FromString(raw)
                except Exception as exc:  # protobuf's DecodeError, and whatever a broken message raises
                    raise RpcError(Code.INTERNAL, f"cannot decode the answer: {exc}") from None
                yield message
        except TimeoutError:
            # A timer may fire a little before its time: the deadline that ended the wait is the one waited for.
            if until == deadline:
                raise RpcError(Code.DEADLINE_EXCEEDED, f"no answer within {timeout}s (grpc-timeout)") from None
            if receive.first and until == receive.next:
                raise RpcError(Code.DEADLINE_EXCEEDED, "initial item not received within timeout") from None
            return  # idle or past its lifetime: ended, as if by the server
        finally:
            if conn is not None and stream is not None:
                conn.cancel(stream)

    async def _connection(self) -> _Connection:
        if self._closed:
            raise RpcError(Code.CANCELLED, "channel closed")
        if self._conn is not None and self._conn.usable:
            return self._conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._conn is not None and self._conn.usable:
                return self._conn
            self._conn = await self._connect()
            return self._conn

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(self.max_message)
        tls: dict[str, Any] = {}
        if self.ssl_context is not None:
            tls = {"ssl": self.ssl_context, "server_hostname": self.server_name or self.host,
                   "ssl_shutdown_timeout": TLS_SHUTDOWN_TIMEOUT}
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.path is not None:
                    transport, _ = await loop.create_unix_connection(lambda: conn, self.path, **tls)
                else:
                    transport, _ = await loop.create_connection(lambda: conn, self.host, self.port, **tls)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise RpcError(Code.UNAVAILABLE, f"cannot connect to {self.target}: {exc}") from None
        if self.ssl_context is not None:
            problem = _check_tls(transport, self.server_name)
            if problem is not None:
                transport.close()
                raise RpcError(Code.UNAVAILABLE, f"{self.target}: {problem}")
        return conn

    async def close(self) -> None:
        """Close the connection; calls in progress end with ``UNAVAILABLE``, later ones with ``CANCELLED``."""
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _ReceiveDeadlines:
    """When a stream under ``ControlStreamLimits`` must have received its next message, and when it must end."""

    __slots__ = ("idle", "next", "end", "first")

    def __init__(self, limits: ControlStreamLimits | None, now: float) -> None:
        self.first = True
        self.idle: float | None = None
        self.next: float | None = None  # the next message is due by then
        self.end: float | None = None  # the stream's lifetime ends then
        if limits is None:
            return
        self.idle = limits.idle_timeout.total_seconds() if limits.idle_timeout is not None else None
        first = limits.initial_timeout if limits.initial_timeout is not None else limits.idle_timeout
        self.next = now + first.total_seconds() if first is not None else None
        self.end = now + limits.lifetime.total_seconds() if limits.lifetime is not None else None

    def received(self, now: float) -> None:
        self.first = False
        self.next = now + self.idle if self.idle is not None else None

    def earliest(self, deadline: float | None) -> float | None:
        """The first of the call's own deadline and the limits' (None: no deadline)."""
        times = [t for t in (deadline, self.next, self.end) if t is not None]
        return min(times) if times else None


def _check_tls(transport: asyncio.BaseTransport, server_name: str | None) -> str | None:
    """Why the TLS session is not one to send calls on, or None: ALPN ``h2``, and the server's name."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return "no TLS session"
    if ssl_object.selected_alpn_protocol() != "h2":
        return f"the server did not agree to HTTP/2 (ALPN {ssl_object.selected_alpn_protocol()!r})"
    if server_name is not None:
        cert = transport.get_extra_info("peercert") or {}
        names = [value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]
        if server_name not in names:
            return f"the server's certificate names {', '.join(names) or 'nothing'}, not {server_name}"
    return None
