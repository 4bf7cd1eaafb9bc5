"""One end of an HTTP/2 connection for a proxy: h2's state machine plus what forwarding needs (sans-IO).

``H2Endpoint(client=...)`` wraps ``h2.connection.H2Connection`` (the
library does the framing, HPACK, stream states, windows and the GOAWAY
for a protocol error). On top, three things a proxy needs and h2 leaves to
its caller:

- **Send buffers per stream, flushed as windows open** (the split
  mitmproxy's ``BufferedH2Connection`` uses). ``queue_data`` / ``queue_end``
  never fail for lack of window; ``flush`` sends what the windows allow and
  says how many bytes of each stream went out, so the caller can
  acknowledge exactly those to the connection they came from
  (``ack``). A source's window thus reopens only when its bytes have gone on:
  what the proxy holds for a stream is bounded by the window it advertised.
- **GOAWAY without closing.** h2 moves its whole connection to CLOSED on a
  received GOAWAY, after which nothing can be sent -- not even the responses
  of the streams in flight, which a GOAWAY lets finish (RFC 9113 §6.8). So
  well-formed GOAWAY frames are taken out of the byte stream before h2 sees
  them and reported in order as ``GoAway`` events; a malformed one goes on to
  h2, which treats it as the protocol error it is.
- **Less per header block.** A proxy forwards headers h2 has validated on
  the way in (or that it wrote itself), so h2's outbound validation and
  normalization are off, and header blocks are HPACK-encoded without Huffman
  coding (a few bytes more per block, against a pure-Python Huffman pass per
  header; measured in docs/proxy.md). Inbound validation stays on: it is what
  keeps a peer's malformed headers out. And a received frame's ``repr``,
  which h2 formats for every frame it receives for a trace log that is never
  on, says only its type and stream (see ``_frame_repr``).
- **Errors with whose fault and a wire code.** A frame the peer should not
  have sent raises ``H2ProtocolError`` (a ``RemoteProtocolError``) carrying
  h2's error code; h2 has already queued the GOAWAY, so the caller writes
  ``data_to_send()`` and closes. Sends on a stream the peer has reset return
  False instead of raising.

Callers: ``tether.proxy.core.http2_proxy`` (the HTTP/2 core), and tests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import Event
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes, Settings
from hpack import Encoder
from hyperframe.frame import Frame

from tether.proxy.codec.common import RemoteProtocolError

Headers = list[tuple[bytes, bytes]]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
GOAWAY_TYPE = 0x7
HEADER_BLOCK_TYPES = (0x1, 0x5, 0x9)  # HEADERS, PUSH_PROMISE, CONTINUATION
END_HEADERS = 0x4
DEFAULT_MAX_FRAME = 16384

# Linkerd's defaults for both its HTTP/2 servers and clients (proxy.md §2.7).
STREAM_WINDOW = 65_535
CONNECTION_WINDOW = 1_048_576
# Streams a peer may open at once: hyper's server default, so Linkerd's. Body bytes are bounded by the
# connection window whatever the number of streams; this bounds the heads held (up to 64 KiB each).
MAX_CONCURRENT_STREAMS = 200


class H2ProtocolError(RemoteProtocolError):
    """The peer broke HTTP/2; ``error_code`` is the one in the GOAWAY h2 queued."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class GoAway:
    """The peer sent GOAWAY: streams above ``last_stream_id`` were not (and will not be) processed."""

    last_stream_id: int
    error_code: int
    debug: bytes = b""


class _Outbox:
    """What is waiting to be sent on one stream: data, then the end (with trailers or not)."""

    __slots__ = ("chunks", "size", "end", "trailers")

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.end = False
        self.trailers: Headers | None = None


def _frame_repr(frame: Frame) -> str:
    return f"{type(frame).__name__}(stream_id={frame.stream_id})"


# h2 (4.4, H2Connection._receive_frame) passes repr(frame) of every frame it receives to a trace log, formatted
# whether the log is on or not, and hyperframe's repr serialises the frame's body again to render its bytes:
# about a fifth of the CPU of receiving a gRPC response (bench in docs/proxy.md). The proxy never logs frames.
Frame.__repr__ = _frame_repr  # type: ignore[method-assign]


class _PlainEncoder(Encoder):
    """HPACK without Huffman coding: the same header table and indexing, no per-character Huffman pass."""

    def encode(self, headers, huffman=False):  # type: ignore[no-untyped-def]  # hpack's own signature
        return super().encode(headers, huffman=False)


class _GoAwayFilter:
    """Splits incoming bytes around well-formed connection-level GOAWAY frames (see the module docstring)."""

    __slots__ = ("_skip", "_buf", "_left", "_in_block")

    def __init__(self, *, server: bool) -> None:
        self._skip = len(PREFACE) if server else 0  # the client preface is not a frame: passed through as is
        self._buf = bytearray()  # the start of a frame, not yet passed on
        self._left = 0  # bytes of the current frame still to pass through
        self._in_block = False  # inside HEADERS/PUSH_PROMISE + CONTINUATION: any other frame is h2's to refuse

    def feed(self, data: bytes) -> list[bytes | GoAway]:
        parts: list[bytes | GoAway] = []
        out = bytearray()
        if self._skip:
            n = min(self._skip, len(data))
            out += data[:n]
            data = data[n:]
            self._skip -= n
        buf = self._buf
        buf += data
        while buf:
            if self._left:
                n = min(self._left, len(buf))
                out += buf[:n]
                del buf[:n]
                self._left -= n
                continue
            if len(buf) < FRAME_HEADER:
                break
            length = int.from_bytes(buf[0:3], "big")
            kind, flags = buf[3], buf[4]
            stream_id = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            if kind == GOAWAY_TYPE and stream_id == 0 and 8 <= length <= DEFAULT_MAX_FRAME and not self._in_block:
                if len(buf) < FRAME_HEADER + length:
                    break
                payload = bytes(buf[FRAME_HEADER:FRAME_HEADER + length])
                del buf[:FRAME_HEADER + length]
                if out:
                    parts.append(bytes(out))
                    out.clear()
                parts.append(GoAway(int.from_bytes(payload[:4], "big") & 0x7FFFFFFF,
                                    int.from_bytes(payload[4:8], "big"), payload[8:]))
                continue
            if kind in HEADER_BLOCK_TYPES:
                self._in_block = not flags & END_HEADERS
            self._left = FRAME_HEADER + length
        if out:
            parts.append(bytes(out))
        return parts


class H2Endpoint:
    """One end of an HTTP/2 connection (``client=True``: we open the streams); see the module docstring."""

    def __init__(self, *, client: bool, stream_window: int = STREAM_WINDOW,
                 connection_window: int = CONNECTION_WINDOW,
                 max_concurrent_streams: int = MAX_CONCURRENT_STREAMS) -> None:
        self.client = client
        config = H2Configuration(client_side=client, header_encoding=None, validate_outbound_headers=False,
                                 normalize_outbound_headers=False)
        self.conn = conn = H2Connection(config)
        conn.encoder = _PlainEncoder()
        local = {SettingCodes.MAX_CONCURRENT_STREAMS: max_concurrent_streams,
                 SettingCodes.INITIAL_WINDOW_SIZE: stream_window,
                 SettingCodes.MAX_HEADER_LIST_SIZE: conn.DEFAULT_MAX_HEADER_LIST_SIZE}
        if client:
            local[SettingCodes.ENABLE_PUSH] = 0  # a proxy has nowhere to deliver a pushed stream
        conn.local_settings = Settings(client=client, initial_values=local)
        self._connection_window = connection_window
        self._filter = _GoAwayFilter(server=not client)
        self._outboxes: dict[int, _Outbox] = {}
        self.failed = False

    def initiate(self) -> None:
        """The preface (client) and SETTINGS, then the connection window raised to Linkerd's 1 MiB."""
        conn = self.conn
        conn.initiate_connection()
        extra = self._connection_window - conn.inbound_flow_control_window
        if extra > 0:
            conn.increment_flow_control_window(extra)

    # -- receiving --------------------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event | GoAway]:
        """Bytes from the peer in; h2's events (and ``GoAway``) out. Raises ``H2ProtocolError``."""
        if self.failed:
            raise H2ProtocolError("connection already failed", ErrorCodes.PROTOCOL_ERROR)
        events: list[Event | GoAway] = []
        for part in self._filter.feed(data):
            if isinstance(part, GoAway):
                events.append(part)
                continue
            try:
                events.extend(self.conn.receive_data(part))
            except ProtocolError as exc:
                self.failed = True
                self._outboxes.clear()
                code = getattr(exc, "error_code", ErrorCodes.PROTOCOL_ERROR)
                raise H2ProtocolError(str(exc) or type(exc).__name__, int(code)) from exc
        return events

    def ack(self, stream_id: int, n: int) -> None:
        """``n`` bytes received on ``stream_id`` have been dealt with: give the peer its window back."""
        if n > 0 and not self.failed:
            self.conn.acknowledge_received_data(n, stream_id)

    # -- sending ----------------------------------------------------------------------------------------------

    def can_open_stream(self) -> bool:
        conn = self.conn
        return conn.open_outbound_streams < conn.remote_settings.max_concurrent_streams

    def next_stream_id(self) -> int:
        return self.conn.get_next_available_stream_id()

    def send_headers(self, stream_id: int, headers: Iterable[tuple[bytes, bytes]], *,
                     end_stream: bool = False) -> bool:
        """Headers (a request, a response, a 1xx); False if the stream is gone."""
        try:
            self.conn.send_headers(stream_id, list(headers), end_stream=end_stream)
        except ProtocolError:
            # A stream the peer reset meanwhile (StreamClosedError), or a connection that is closing.
            return False
        return True

    def queue_data(self, stream_id: int, data: bytes) -> None:
        box = self._outboxes.get(stream_id)
        if box is None:
            box = self._outboxes[stream_id] = _Outbox()
        if data:
            box.chunks.append(data)
            box.size += len(data)

    def queue_end(self, stream_id: int, trailers: Headers | None = None) -> None:
        box = self._outboxes.get(stream_id)
        if box is None:
            box = self._outboxes[stream_id] = _Outbox()
        box.end = True
        box.trailers = trailers or None

    def buffered(self, stream_id: int) -> int:
        box = self._outboxes.get(stream_id)
        return box.size if box is not None else 0

    def pending(self, stream_id: int) -> bool:
        """Whether anything (data or the end) is still waiting to go out on ``stream_id``."""
        return stream_id in self._outboxes

    def flush(self, stream_id: int | None = None) -> dict[int, int]:
        """Send what the windows allow (one stream or all); returns the data bytes sent per stream, and 0 for
        a stream left with nothing to send without data going (its end went, or it was reset meanwhile)."""
        sent: dict[int, int] = {}
        ids = [stream_id] if stream_id is not None else list(self._outboxes)
        for sid in ids:
            box = self._outboxes.get(sid)
            if box is not None:
                n = self._flush_one(sid, box)
                if n or sid not in self._outboxes:  # data went, or the stream is through
                    sent[sid] = n
        return sent

    def _flush_one(self, sid: int, box: _Outbox) -> int:
        conn = self.conn
        sent = 0
        try:
            while box.chunks:
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if room <= 0:
                    return sent
                chunk = box.chunks[0]
                if len(chunk) <= room:
                    box.chunks.popleft()
                else:
                    box.chunks[0] = chunk[room:]
                    chunk = chunk[:room]
                last = box.end and not box.chunks and not box.trailers  # the end rides on the last data frame
                conn.send_data(sid, chunk, end_stream=last)
                sent += len(chunk)
                box.size -= len(chunk)
                if last:
                    del self._outboxes[sid]
                    return sent
            if box.end:
                if box.trailers:
                    conn.send_headers(sid, box.trailers, end_stream=True)
                else:
                    conn.end_stream(sid)
                del self._outboxes[sid]
        except ProtocolError:
            # The stream was reset or closed under us: nothing more goes out on it.
            self._outboxes.pop(sid, None)
        return sent

    def reset(self, stream_id: int, error_code: int = ErrorCodes.CANCEL) -> int:
        """RST_STREAM (if the stream is still open); returns the queued data bytes dropped with it."""
        box = self._outboxes.pop(stream_id, None)
        try:
            self.conn.reset_stream(stream_id, error_code)
        except ProtocolError:
            pass
        return box.size if box is not None else 0

    def drop(self, stream_id: int) -> int:
        """Forget what is queued on a stream that is over; returns the data bytes dropped."""
        box = self._outboxes.pop(stream_id, None)
        return box.size if box is not None else 0

    def ping(self) -> None:
        """A PING for the peer to answer (keep-alive)."""
        if not self.failed:
            self.conn.ping(b"tether\x00\x00")

    def goaway(self, error_code: int = ErrorCodes.NO_ERROR, last_stream_id: int | None = None) -> None:
        try:
            self.conn.close_connection(error_code, last_stream_id=last_stream_id)
        except ProtocolError:
            pass

    def data_to_send(self) -> bytes:
        return self.conn.data_to_send()


def error_name(code: int) -> str:
    """``CANCEL``, ``PROTOCOL_ERROR``... (the ``h2(...)`` metric label); the number for an unknown code."""
    try:
        return ErrorCodes(code).name
    except ValueError:
        return str(code)
