"""One end of an HTTP/2 connection for a proxy (RFC 9113), sans-IO: bytes in, events out, bytes to send.

``H2Endpoint(client=...)`` is the whole connection: framing, HPACK
(``codec.http2_hpack``), stream states, both directions' flow control,
SETTINGS, PING, GOAWAY, RST_STREAM and CONTINUATION, and the errors of RFC
9113. It reports the events of ``codec.http2_events`` (h2's shapes). What it
does on top of a plain connection is what a proxy needs:

- **Send buffers per stream, flushed as windows open.** ``queue_data`` /
  ``queue_end`` never fail for lack of window; ``flush`` sends what the
  windows allow and says how many bytes of each stream went out, so the
  caller can acknowledge exactly those to the connection they came from
  (``ack``). A source's window thus reopens only when its bytes have gone on:
  what the proxy holds for a stream is bounded by the window it advertised.
  The connection's window is given back when the bytes to send are taken
  (``data_to_send``): one WINDOW_UPDATE for the acknowledgements of a
  callback.
- **GOAWAY without closing.** A received GOAWAY is an event; the streams in
  flight may finish (RFC 9113 §6.8). No new stream is opened after it.
- **Little per frame.** Frames are parsed in place from the bytes read (no
  object per frame but the event), header blocks are HPACK-encoded from a
  per-field cache without indexing or Huffman, received header blocks are
  remembered decoded and checked (``_header_block``), and received header
  fields are validated once per distinct field. The frames every stream
  takes are packed inline (``_FRAME_HEAD``), not through a call.
- **Errors with whose fault and a wire code.** A connection error of the
  peer's raises ``H2ProtocolError`` carrying its code, with the GOAWAY
  already queued: the caller writes ``data_to_send()`` and closes. A stream
  error (a malformed message, a frame on a closed stream, a stream's window
  overrun) resets that stream alone (a ``StreamReset`` with
  ``remote_reset=False`` when the caller knew it); a stream over our
  MAX_CONCURRENT_STREAMS is refused (REFUSED_STREAM: safe for the client to
  send again). Sends on a stream that is over return False instead of raising.

The transition table of a stream is RFC 9113 §5.1's, reduced to what the
proxy can observe: a stream is known from its HEADERS until both sides have
ended it or it is reset; then it is closed, and a frame for a closed stream
is ignored (we reset it: frames may still be in flight) or answered with
RST_STREAM(STREAM_CLOSED).

Callers: ``tether.proxy.core.http2_proxy`` (the HTTP/2 core), and tests.
"""

from __future__ import annotations

import re
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from tether.proxy.codec.common import RemoteProtocolError
from tether.proxy.codec.http2_events import (
    DataReceived,
    ErrorCodes,
    Event,
    GoAway,
    Headers,
    InformationalResponseReceived,
    PingAckReceived,
    RemoteSettingsChanged,
    RequestReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
    error_name,
)
from tether.proxy.codec.http2_hpack import Decoder, Encoder, HeaderListTooLarge, HpackError

__all__ = ["CONNECTION_WINDOW", "MAX_CONCURRENT_STREAMS", "PREFACE", "STREAM_WINDOW", "ErrorCodes", "GoAway",
           "H2Endpoint", "H2ProtocolError", "Headers", "Http2Params", "error_name"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
DEFAULT_MAX_FRAME = 16384
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1  # a graceful shutdown's first GOAWAY names it: every stream may still come

# Linkerd's defaults for both its HTTP/2 servers and clients (proxy.md §2.7).
STREAM_WINDOW = 65_535
CONNECTION_WINDOW = 1_048_576
# Streams a peer may open at once: hyper's server default, so Linkerd's. Body bytes are bounded by the
# connection window whatever the number of streams; this bounds the heads held (up to 64 KiB each).
MAX_CONCURRENT_STREAMS = 200
MAX_HEADER_LIST_SIZE = 65_536  # h2's default, advertised
MAX_FRAME_SIZE_LIMIT = 2**24 - 1  # the largest SETTINGS_MAX_FRAME_SIZE (RFC 9113 §6.5.2)
# A header block in more than this many frames is a CONTINUATION flood (CVE-2024-27316 class): h2's bound.
MAX_CONTINUATIONS = 64
# Streams we reset whose late frames are ignored rather than answered (the newest are remembered).
RESET_MEMORY = 1024
# Header blocks remembered decoded and checked (then forgotten all at once): see H2Endpoint._header_block.
BLOCK_MEMORY = 256

# Frame types (RFC 9113 §6) and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS codes (RFC 9113 §6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST = range(1, 7)

_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path"})
_CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                  b"upgrade"})
_NAME = re.compile(rb"^:?[a-z0-9!#$%&'*+\-.^_`|~]+$")
_BAD_VALUE = re.compile(rb"[\r\n\x00]|^[ \t]|[ \t]$")
_GOOD_FIELDS: set[tuple[bytes, bytes]] = set()  # fields that passed _field_error (a memo of a pure function)
_GOOD_FIELDS_MAX = 4096


@dataclass(frozen=True, slots=True)
class Http2Params:
    """What one end advertises and holds the peer to: its SETTINGS and the connection window it opens."""

    stream_window: int = STREAM_WINDOW  # SETTINGS_INITIAL_WINDOW_SIZE
    connection_window: int = CONNECTION_WINDOW  # raised to by a WINDOW_UPDATE after the SETTINGS
    max_concurrent_streams: int = MAX_CONCURRENT_STREAMS  # streams the peer may open (more are refused)
    max_frame_size: int = DEFAULT_MAX_FRAME  # the largest frame the peer may send
    max_header_list_size: int = MAX_HEADER_LIST_SIZE  # a larger header list ends the connection


DEFAULT_PARAMS = Http2Params()  # Linkerd's defaults (proxy.md §2.7)


class H2ProtocolError(RemoteProtocolError):
    """The peer broke HTTP/2; ``error_code`` is the one in the GOAWAY queued for it."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _StreamError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# A builtin's subclass with class-level defaults is not something mypyc compiles (tether.proxy.native): this one
# stays an interpreted class inside the compiled module.
@mypyc_attr(native_class=False)
class _Outbox(deque[bytes]):
    """What is waiting to be sent on one stream: its data (the chunks, in the deque itself), then the end (with
    trailers or not). A deque with class defaults rather than an ``__init__``: one is made per stream that sends
    a body, and making it so is a C call, not a Python one (a Python call less per stream and direction)."""

    size = 0  # bytes of the chunks
    end = False  # the stream's end is queued after them
    trailers: Headers | None = None


class _Stream:
    """A stream neither side has finished with: its windows, which sides ended, what its body must add up to."""

    __slots__ = ("sid", "send_window", "recv_window", "processed", "local_closed", "remote_closed", "head_seen",
                 "expected", "received", "no_body")

    def __init__(self, sid: int, send_window: int, recv_window: int) -> None:
        self.sid = sid
        self.send_window = send_window
        self.recv_window = recv_window
        self.processed = 0  # bytes acknowledged (``ack``), not yet given back in a WINDOW_UPDATE
        self.local_closed = False  # we sent END_STREAM
        self.remote_closed = False  # the peer sent END_STREAM
        self.head_seen = False  # the message head came (further HEADERS are trailers)
        self.expected: int | None = None  # the peer's content-length
        self.received = 0  # body bytes received
        self.no_body = False  # client: the response to a HEAD request has no body whatever it says


# A frame's 9-byte header (RFC 9113 §4.1): the 24-bit length as its high 16 and low 8 bits, the type, the flags,
# the stream. The paths every stream takes pack it inline (a C call, where ``_frame`` is a Python one).
_FRAME_HEAD = struct.Struct(">HBBBL")


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    n = len(payload)
    return _FRAME_HEAD.pack(n >> 8, n & 0xFF, kind, flags, sid) + payload


def _field_error(name: bytes, value: bytes) -> str | None:
    """What is wrong with one received field (RFC 9113 §8.2), None if nothing; good fields are remembered in
    ``_GOOD_FIELDS`` (which callers look in first)."""
    if not _NAME.match(name):
        return f"header name {name[:40]!r} is not a lowercase token"
    if _BAD_VALUE.search(value):
        return f"header {name.decode()!r} has a value with CR, LF, NUL or surrounding whitespace"
    if name in _CONNECTION_SPECIFIC:
        return f"connection-specific header {name.decode()!r}"
    if name == b"te" and value != b"trailers":
        return "te other than 'trailers'"
    if len(_GOOD_FIELDS) >= _GOOD_FIELDS_MAX:
        _GOOD_FIELDS.clear()
    _GOOD_FIELDS.add((name, value))
    return None


def _message_error(headers: Headers, kind: str) -> str | None:
    """What makes a request, response or trailers malformed (RFC 9113 §8.1.1, §8.3), None if nothing."""
    pseudo: dict[bytes, bytes] = {}
    regular = False
    host = False
    good = _GOOD_FIELDS
    for field in headers:
        if field not in good:
            problem = _field_error(*field)
            if problem is not None:
                return problem
        name, value = field
        if name[0] == 0x3A:  # ':'
            if regular:
                return f"pseudo-header {name.decode()} after a regular header"
            if kind == "trailers":
                return f"pseudo-header {name.decode()} in trailers"
            allowed = name in _REQUEST_PSEUDO if kind == "request" else name == b":status"
            if not allowed:
                return f"pseudo-header {name.decode()} not allowed in a {kind}"
            if name in pseudo:
                return f"pseudo-header {name.decode()} twice"
            pseudo[name] = value
        else:
            regular = True
            if name == b"host":
                host = True
    if kind == "request":
        method = pseudo.get(b":method")
        if method is None:
            return "request without :method"
        if method == b"CONNECT":
            if b":scheme" in pseudo or b":path" in pseudo or b":authority" not in pseudo:
                return "CONNECT request with :scheme or :path, or without :authority"
        elif not pseudo.get(b":scheme") or not pseudo.get(b":path"):
            return "request without :scheme or :path"
        if b":authority" not in pseudo and not host:
            return "request without :authority or host"
    elif kind == "response":
        status = pseudo.get(b":status", b"")
        if len(status) != 3 or not status.isdigit():
            return f"response with :status {status[:10]!r}"
    return None


class _Block:
    """A decoded header block, checked once for what it may be on this end: what makes it malformed as a
    message head (a request to a server, a response to a client) and as trailers, and its content-length."""

    __slots__ = ("generation", "added", "headers", "head_problem", "trailers_problem", "length", "length_problem")

    def __init__(self, generation: int, added: tuple[tuple[bytes, bytes], ...] | None, headers: Headers,
                 client: bool) -> None:
        self.generation = generation  # the decoder's table generation it was decoded at
        self.added = added  # not None: it decodes the same at any generation, adding these fields (Decoder.replay)
        self.headers = headers
        self.head_problem = _message_error(headers, "response" if client else "request")
        self.trailers_problem = _message_error(headers, "trailers")
        self.length: int | None = None  # its content-length
        self.length_problem: str | None = None  # a content-length given twice differently, or not a number
        try:
            self.length = _content_length(headers)
        except _StreamError as exc:
            self.length_problem = str(exc)


def _content_length(headers: Headers) -> int | None:
    value: bytes | None = None
    for name, v in headers:
        if name == b"content-length":
            if value is not None and v != value:
                raise _StreamError(ErrorCodes.PROTOCOL_ERROR, "content-length given twice, differently")
            value = v
    if value is None:
        return None
    if not value.isdigit():
        raise _StreamError(ErrorCodes.PROTOCOL_ERROR, f"content-length {value[:20]!r}")
    return int(value)


class H2Endpoint:
    """One end of an HTTP/2 connection (``client=True``: we open the streams) with ``params``; see the module
    docstring."""

    def __init__(self, *, client: bool, params: Http2Params = DEFAULT_PARAMS) -> None:
        self.client = client
        self.params = params
        self.failed = False
        self.out = bytearray()  # the bytes for the peer, until ``data_to_send`` takes them
        self._buf = bytearray()  # a frame not yet whole
        self._need = 0  # bytes _buf must hold before it is worth parsing again
        self._preface = b"" if client else PREFACE  # the client preface still to come (a server's first bytes)
        self._settings_seen = False  # the peer's first frame must be SETTINGS
        self._block: list[object] | None = None  # a header block awaiting CONTINUATION: [sid, end, bytes, frames]
        self._encoder = Encoder()
        self._decoder = Decoder(params.max_header_list_size)
        self._blocks: dict[bytes, _Block] = {}
        # Our settings, and the connection window we give.
        self._stream_window = params.stream_window
        self._max_streams = params.max_concurrent_streams
        self._max_frame = params.max_frame_size
        self._recv_window = DEFAULT_WINDOW  # the connection's, left to the peer
        self._recv_max = DEFAULT_WINDOW
        self.recv_processed = 0  # bytes received and dealt with (``ack``), not yet given back to the connection
        # The peer's settings, and the connection window it gives.
        self.remote_max_frame = DEFAULT_MAX_FRAME
        self.remote_initial_window = DEFAULT_WINDOW
        self.remote_max_streams: int | None = None  # unlimited until it says
        self._send_window = DEFAULT_WINDOW
        # Streams.
        self._streams: dict[int, _Stream] = {}
        self._outboxes: dict[int, _Outbox] = {}  # (cleared, never replaced: ``pending`` is bound to it)
        # ``pending(stream_id)``: whether anything (data or the end) is still waiting to go out on the stream. The
        # dict's own membership test, bound here: a C call where a method would be a Python one (the core asks
        # twice per stream).
        self.pending: Callable[[int], bool] = self._outboxes.__contains__
        # The id of the next stream we open (``next_stream_id()``, as h2 names it; the proxy reads the attribute: a
        # call less per stream).
        self.next_sid = 1 if client else 2
        self._last_peer = 0  # the highest stream the peer opened
        self._local_open = 0  # streams we opened, not closed
        self._peer_open = 0  # streams the peer opened, not closed
        self._reset: dict[int, None] = {}  # streams we reset, newest last (RESET_MEMORY)
        self.goaway_received = False
        # The last stream our GOAWAY said we would process (None: no GOAWAY sent). A graceful shutdown sends two
        # (RFC 9113 §6.8): the first with the largest ID, so streams already on the wire are still served.
        self._goaway_last: int | None = None

    # -- setup ---------------------------------------------------------------------------------------------------

    def initiate(self) -> None:
        """The preface (client) and SETTINGS, then the connection window raised to ``connection_window``."""
        params = self.params
        settings = [(MAX_CONCURRENT, params.max_concurrent_streams), (INITIAL_WINDOW_SIZE, params.stream_window),
                    (MAX_HEADER_LIST, params.max_header_list_size)]
        if params.max_frame_size != DEFAULT_MAX_FRAME:
            settings.append((MAX_FRAME_SIZE, params.max_frame_size))
        if self.client:
            settings.insert(0, (ENABLE_PUSH, 0))  # a proxy has nowhere to deliver a pushed stream
            self.out += PREFACE
        payload = b"".join(code.to_bytes(2, "big") + value.to_bytes(4, "big") for code, value in settings)
        self.out += _frame(SETTINGS, 0, 0, payload)
        extra = params.connection_window - self._recv_window
        if extra > 0:
            self._recv_window += extra
            self._recv_max = self._recv_window
            self.out += _frame(WINDOW_UPDATE, 0, 0, extra.to_bytes(4, "big"))

    # -- receiving -----------------------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Bytes from the peer in; events out. Raises ``H2ProtocolError`` (the GOAWAY queued)."""
        if self.failed:
            raise H2ProtocolError("connection already failed", ErrorCodes.PROTOCOL_ERROR)
        events: list[Event] = []
        try:
            self._receive(data, events)
        except _ConnectionError as exc:
            self.failed = True
            self._outboxes.clear()
            self._send_goaway(exc.code, self._last_peer, str(exc).encode()[:256])
            raise H2ProtocolError(str(exc), exc.code) from None
        return events

    def _receive(self, data: bytes, events: list[Event]) -> None:
        if self._preface:
            n = min(len(self._preface), len(data))
            if data[:n] != self._preface[:n]:
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "not the HTTP/2 client preface")
            self._preface = self._preface[n:]
            data = data[n:]
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return
            data = bytes(buf)
            buf.clear()
        pos = 0
        size = len(data)
        while size - pos >= FRAME_HEADER:
            length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
            end = pos + FRAME_HEADER + length
            if length > self._max_frame:
                raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, f"frame of {length} bytes")
            if end > size:
                break
            kind = data[pos + 3]
            flags = data[pos + 4]
            sid = int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF
            start = pos + FRAME_HEADER
            pos = end
            if not self._settings_seen:
                if kind != SETTINGS or flags & ACK:
                    raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "the first frame is not SETTINGS")
                self._settings_seen = True
            if self._block is not None and (kind != CONTINUATION or sid != self._block[0]):
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "a header block interrupted")
            if kind == DATA:
                self._on_data(data, start, end, flags, sid, events)
            elif kind == HEADERS:
                if flags & (PADDED | PRIORITY_FLAG) or not flags & END_HEADERS or not sid:
                    self._on_headers(data, start, end, flags, sid, events)
                else:  # a whole block without padding or priority (nearly all): a call less per message
                    self._header_block(sid, bool(flags & END_STREAM), data[start:end], events, False)
            elif kind == CONTINUATION:
                self._on_continuation(data[start:end], flags, sid, events)
            elif kind == RST_STREAM:
                self._on_rst(data[start:end], sid, events)
            elif kind == WINDOW_UPDATE:
                self._on_window_update(data[start:end], sid, events)
            elif kind == SETTINGS:
                self._on_settings(data[start:end], flags, sid, events)
            elif kind == PING:
                self._on_ping(data[start:end], flags, sid, events)
            elif kind == GOAWAY:
                self._on_goaway(data[start:end], sid, events)
            elif kind == PRIORITY:
                if sid == 0:
                    raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "PRIORITY on stream 0")
                if length != 5:
                    self._stream_error(sid, ErrorCodes.FRAME_SIZE_ERROR, events)
            elif kind == PUSH_PROMISE:
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "PUSH_PROMISE (push is disabled)")
            # Unknown frame types are ignored (RFC 9113 §4.1, §5.5).
        if pos < size:
            rest = data[pos:]
            buf += rest
            if len(rest) < FRAME_HEADER:
                self._need = FRAME_HEADER
            else:
                self._need = FRAME_HEADER + ((rest[0] << 16) | (rest[1] << 8) | rest[2])

    def _idle(self, sid: int) -> bool:
        """Whether ``sid`` was never opened (by either side)."""
        if (sid & 1) == (1 if self.client else 0):  # ours
            return sid >= self.next_sid
        return sid > self._last_peer

    def _closed_frame(self, sid: int, kind: str) -> None:
        """A frame for a stream that is over: ignored if we reset it (frames may still be in flight), else
        answered with RST_STREAM(STREAM_CLOSED); on a stream never opened, a connection error."""
        if self._idle(sid):
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, f"{kind} on idle stream {sid}")
        if sid not in self._reset:
            self._send_rst(sid, ErrorCodes.STREAM_CLOSED)

    def _on_data(self, data: bytes, start: int, end: int, flags: int, sid: int, events: list[Event]) -> None:
        if sid == 0:
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "DATA on stream 0")
        length = end - start
        if flags & PADDED:
            if length < 1 or data[start] >= length:
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "DATA padding as long as the frame")
            body = data[start + 1:end - data[start]]
        else:
            body = data[start:end]
        if length > self._recv_window:
            raise _ConnectionError(ErrorCodes.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window -= length
        stream = self._streams.get(sid)
        if stream is None or stream.remote_closed:
            self.recv_processed += length  # the connection window still counts it
            if stream is None:
                self._closed_frame(sid, "DATA")
            else:
                self._stream_error(sid, ErrorCodes.STREAM_CLOSED, events)
            return
        if length > stream.recv_window:
            self.recv_processed += length
            self._stream_error(sid, ErrorCodes.FLOW_CONTROL_ERROR, events)
            return
        stream.recv_window -= length
        stream.received += len(body)
        ended = None
        if flags & END_STREAM:
            ended = StreamEnded(sid)
        if stream.expected is not None and (stream.received > stream.expected
                                            or (ended is not None and stream.received != stream.expected)):
            self.recv_processed += length
            self._stream_error(sid, ErrorCodes.PROTOCOL_ERROR, events)
            return
        events.append(DataReceived(sid, body, length, ended))
        if ended is not None:
            events.append(ended)
            stream.remote_closed = True
            if stream.local_closed:
                self._close(stream)

    def _on_headers(self, data: bytes, start: int, end: int, flags: int, sid: int, events: list[Event]) -> None:
        if sid == 0:
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "HEADERS on stream 0")
        pos = start
        pad = 0
        if flags & PADDED:
            if end - start < 1:
                raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, "HEADERS too short for its padding")
            pad = data[pos]
            pos += 1
        self_dependent = False
        if flags & PRIORITY_FLAG:
            if end - pos < 5:
                raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            self_dependent = int.from_bytes(data[pos:pos + 4], "big") & 0x7FFFFFFF == sid
            pos += 5
        if pos + pad > end:
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "HEADERS padding longer than the frame")
        fragment = data[pos:end - pad]
        ended = bool(flags & END_STREAM)
        if flags & END_HEADERS:
            self._header_block(sid, ended, fragment, events, self_dependent)
        else:
            self._block = [sid, ended, bytearray(fragment), 1, self_dependent]

    def _on_continuation(self, fragment: bytes, flags: int, sid: int, events: list[Event]) -> None:
        block = self._block
        if block is None:
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "CONTINUATION without a header block")
        buf: bytearray = block[2]  # type: ignore[assignment]
        buf += fragment
        block[3] = frames = block[3] + 1  # type: ignore[operator]
        if frames > MAX_CONTINUATIONS or len(buf) > 2 * self.params.max_header_list_size:
            raise _ConnectionError(ErrorCodes.ENHANCE_YOUR_CALM, "a header block in too many frames")
        if flags & END_HEADERS:
            self._block = None
            self._header_block(sid, bool(block[1]), bytes(buf), events, bool(block[4]))

    def _decode(self, block: bytes) -> _Block:
        """The block decoded and checked (see ``_header_block``), remembered when the same bytes will decode the
        same way."""
        decoder = self._decoder
        generation = decoder.generation
        try:
            headers, added = decoder.decode_block(block)
        except HpackError as exc:
            raise _ConnectionError(ErrorCodes.COMPRESSION_ERROR, str(exc)) from None
        except HeaderListTooLarge as exc:
            raise _ConnectionError(ErrorCodes.ENHANCE_YOUR_CALM, str(exc)) from None
        decoded = _Block(generation, added, headers, self.client)
        if added is not None or decoder.generation == generation:
            if len(self._blocks) >= BLOCK_MEMORY:
                self._blocks.clear()
            self._blocks[block] = decoded
        return decoded

    def _header_block(self, sid: int, ended: bool, block: bytes, events: list[Event], self_dependent: bool) -> None:
        # The block decoded (the decoder's table must follow the peer's), or remembered with its checks when the
        # same bytes must decode the same way: in a steady stream of messages most blocks are such. A block that
        # left the table as it was decodes the same way until the table changes (table indexes, or literals not
        # indexed: a client's repeated requests); a block that read nothing from the table decodes the same way
        # always, and what it added to the table is added again (``Decoder.replay``): nginx's responses, which
        # index ``date``, ``server``... and never refer to them, cost a replay instead of ~15 calls of decoding.
        decoded = self._blocks.get(block)
        if decoded is not None:
            added = decoded.added
            if added is not None:
                if added:
                    self._decoder.replay(added)
            elif decoded.generation != self._decoder.generation:
                decoded = None
        if decoded is None:
            decoded = self._decode(block)
        stream = self._streams.get(sid)
        if stream is None:
            if self.client or (sid & 1) == 0 or sid <= self._last_peer:
                if self._idle(sid):
                    raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, f"HEADERS opening stream {sid}")
                self._closed_frame(sid, "HEADERS")
                return
            self._open_peer_stream(sid, ended, decoded, events, self_dependent)
            return
        headers = list(decoded.headers)  # a copy: the event's to keep
        if self_dependent:
            self._stream_error(sid, ErrorCodes.PROTOCOL_ERROR, events)
            return
        if stream.remote_closed:
            self._stream_error(sid, ErrorCodes.STREAM_CLOSED, events)
            return
        try:
            if not stream.head_seen:  # a client's stream: the response head (or a 1xx)
                problem = decoded.head_problem
                if problem is not None:
                    raise _StreamError(ErrorCodes.PROTOCOL_ERROR, problem)
                status = headers[0][1]
                if status[0] == 0x31:  # 1xx
                    if ended or status == b"101":
                        raise _StreamError(ErrorCodes.PROTOCOL_ERROR, "1xx response ending the stream, or 101")
                    events.append(InformationalResponseReceived(sid, headers))
                    return
                stream.head_seen = True
                if not stream.no_body and status != b"204" and status != b"304":
                    if decoded.length_problem is not None:
                        raise _StreamError(ErrorCodes.PROTOCOL_ERROR, decoded.length_problem)
                    stream.expected = decoded.length
                end = StreamEnded(sid) if ended else None
                if end is not None and stream.expected:
                    raise _StreamError(ErrorCodes.PROTOCOL_ERROR, "content-length but no body")
                events.append(ResponseReceived(sid, headers, end))
            else:  # trailers
                if not ended:
                    raise _StreamError(ErrorCodes.PROTOCOL_ERROR, "trailers not ending the stream")
                problem = decoded.trailers_problem
                if problem is not None:
                    raise _StreamError(ErrorCodes.PROTOCOL_ERROR, problem)
                if stream.expected is not None and stream.received != stream.expected:
                    raise _StreamError(ErrorCodes.PROTOCOL_ERROR, "body shorter than its content-length")
                end = StreamEnded(sid)
                events.append(TrailersReceived(sid, headers, end))
        except _StreamError as exc:
            self._stream_error(sid, exc.code, events)
            return
        if end is not None:
            events.append(end)
            stream.remote_closed = True
            if stream.local_closed:
                self._close(stream)

    def _open_peer_stream(self, sid: int, ended: bool, decoded: _Block, events: list[Event],
                          self_dependent: bool) -> None:
        """A client's new stream: refused over the limit or after our GOAWAY, reset if malformed."""
        self._last_peer = sid
        if self._goaway_last is not None and sid > self._goaway_last:
            return  # above the last stream our GOAWAY said we would process: ignored (RFC 9113 §6.8)
        if self._peer_open >= self._max_streams:
            self._send_rst(sid, ErrorCodes.REFUSED_STREAM)
            return
        try:
            problem = "stream depends on itself" if self_dependent else decoded.head_problem
            if problem is None:
                problem = decoded.length_problem
            if problem is not None:
                raise _StreamError(ErrorCodes.PROTOCOL_ERROR, problem)
            headers = list(decoded.headers)  # a copy: the event's to keep
            expected = decoded.length
            if ended and expected:
                raise _StreamError(ErrorCodes.PROTOCOL_ERROR, "content-length but no body")
        except _StreamError as exc:
            self._send_rst(sid, exc.code)
            return
        stream = self._streams[sid] = _Stream(sid, self.remote_initial_window, self._stream_window)
        stream.head_seen = True
        stream.expected = expected
        self._peer_open += 1
        end = StreamEnded(sid) if ended else None
        events.append(RequestReceived(sid, headers, end))
        if end is not None:
            events.append(end)
            stream.remote_closed = True  # (a new stream: our side is open)

    def _on_rst(self, payload: bytes, sid: int, events: list[Event]) -> None:
        if sid == 0:
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, "RST_STREAM not of 4 bytes")
        stream = self._streams.get(sid)
        if stream is None:
            if self._idle(sid):
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
            return
        self._close(stream)
        events.append(StreamReset(sid, int.from_bytes(payload, "big"), True))

    def _on_window_update(self, payload: bytes, sid: int, events: list[Event]) -> None:
        if len(payload) != 4:
            raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, "WINDOW_UPDATE not of 4 bytes")
        delta = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if not delta:
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += delta
            if self._send_window > MAX_WINDOW:
                raise _ConnectionError(ErrorCodes.FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            events.append(WindowUpdated(0, delta))
            return
        stream = self._streams.get(sid)
        if stream is None:
            if self._idle(sid):
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
            return  # a closed stream's: allowed for a while, and nothing to do
        if not delta:
            self._stream_error(sid, ErrorCodes.PROTOCOL_ERROR, events)
            return
        stream.send_window += delta
        if stream.send_window > MAX_WINDOW:
            self._stream_error(sid, ErrorCodes.FLOW_CONTROL_ERROR, events)
            return
        events.append(WindowUpdated(sid, delta))

    def _on_settings(self, payload: bytes, flags: int, sid: int, events: list[Event]) -> None:
        if sid != 0:
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, "SETTINGS not in 6-byte entries")
        changed: dict[int, int] = {}
        for i in range(0, len(payload), 6):
            code = int.from_bytes(payload[i:i + 2], "big")
            value = int.from_bytes(payload[i + 2:i + 6], "big")
            if code == ENABLE_PUSH and value > 1:
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            if code == ENABLE_PUSH and value and self.client:
                raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "a server enabling push")
            if code == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(ErrorCodes.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}")
                delta = value - self.remote_initial_window
                self.remote_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise _ConnectionError(ErrorCodes.FLOW_CONTROL_ERROR, "a stream window over 2^31-1")
            elif code == MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= MAX_FRAME_SIZE_LIMIT:
                    raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self.remote_max_frame = value
            elif code == MAX_CONCURRENT:
                self.remote_max_streams = value
            elif code == HEADER_TABLE_SIZE:
                self._encoder.table_size_changed()
            changed[code] = value
        self.out += b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"  # SETTINGS ACK
        events.append(RemoteSettingsChanged(changed))

    def _on_ping(self, payload: bytes, flags: int, sid: int, events: list[Event]) -> None:
        if sid != 0:
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, "PING not of 8 bytes")
        if flags & ACK:
            events.append(PingAckReceived(payload))
        else:
            self.out += _frame(PING, ACK, 0, payload)

    def _on_goaway(self, payload: bytes, sid: int, events: list[Event]) -> None:
        if sid != 0:
            raise _ConnectionError(ErrorCodes.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise _ConnectionError(ErrorCodes.FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
        self.goaway_received = True
        events.append(GoAway(int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(payload[4:8], "big"),
                             payload[8:]))

    # -- stream states --------------------------------------------------------------------------------------------

    # A side ends its stream by setting its flag (``local_closed``: we sent END_STREAM; ``remote_closed``: the
    # peer did); the stream is closed once both are set. The flag is set where the END_STREAM is sent or read,
    # not in a method: every stream ends both ways (four Python calls per stream saved).

    def _close(self, stream: _Stream) -> None:
        if self._streams.pop(stream.sid, None) is None:
            return
        if (stream.sid & 1) == (1 if self.client else 0):
            self._local_open -= 1
        else:
            self._peer_open -= 1

    def _stream_error(self, sid: int, code: int, events: list[Event]) -> None:
        """The peer broke one stream: it is reset (and reported, if the caller knew it)."""
        stream = self._streams.get(sid)
        self._send_rst(sid, code)
        if stream is not None:
            self._close(stream)
            events.append(StreamReset(sid, code, False))

    def _send_rst(self, sid: int, code: int) -> None:
        self.out += _frame(RST_STREAM, 0, sid, code.to_bytes(4, "big"))
        reset = self._reset
        reset[sid] = None
        if len(reset) > RESET_MEMORY:
            del reset[next(iter(reset))]

    # -- flow control of what we receive ---------------------------------------------------------------------------

    # The bytes of the connection window dealt with (``recv_processed``) are given back when the bytes to send
    # are taken (``data_to_send``), in one WINDOW_UPDATE for all the acknowledgements of a callback: no call per
    # acknowledgement. A stream's window is given back by ``ack`` itself. Both follow h2's rule: a WINDOW_UPDATE
    # once half the window is processed, or the window exhausted and a little processed.

    def ack(self, stream_id: int, n: int) -> None:
        """``n`` bytes received on ``stream_id`` have been dealt with: give the peer its window back."""
        if n <= 0 or self.failed:
            return
        self.recv_processed += n
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # no point in reopening a closed stream's window
        stream.processed += n
        processed = stream.processed
        window = self._stream_window
        if processed >= window // 2 or (stream.recv_window == 0 and processed > min(1024, window // 4)):
            increment = min(processed, window - stream.recv_window)
            stream.processed = 0
            if increment:
                stream.recv_window += increment
                self.out += _FRAME_HEAD.pack(0, 4, WINDOW_UPDATE, 0, stream_id) + increment.to_bytes(4, "big")

    # -- sending ----------------------------------------------------------------------------------------------------

    def can_open_stream(self) -> bool:
        limit = self.remote_max_streams
        return not self.goaway_received and not self.failed and (limit is None or self._local_open < limit)

    def next_stream_id(self) -> int:
        return self.next_sid

    def send_headers(self, stream_id: int, headers: Iterable[tuple[bytes, bytes]], *,
                     end_stream: bool = False) -> bool:
        """Headers (a request, a response, a 1xx, trailers); False if the stream is over (or the connection).

        Opens the stream when ``stream_id`` is ``next_stream_id()`` (a client). Headers are sent as given:
        they were validated on the way in, or written by the proxy.
        """
        if self.failed:
            return False
        stream = self._streams.get(stream_id)
        if stream is None:
            if (not self.client or stream_id != self.next_sid or self._goaway_last is not None
                    or self.goaway_received):
                return False
            stream = self._streams[stream_id] = _Stream(stream_id, self.remote_initial_window, self._stream_window)
            self.next_sid += 2
            self._local_open += 1
            headers = list(headers)
            stream.no_body = (b":method", b"HEAD") in headers
        elif stream.local_closed:
            return False
        block = self._encoder.encode(headers if isinstance(headers, (list, tuple)) else list(headers))
        n = len(block)
        if n <= self.remote_max_frame:  # one frame (nearly always): packed here, a call less per message
            out = self.out  # (head and block appended apiece: no third bytes object for their concatenation)
            out += _FRAME_HEAD.pack(n >> 8, n & 0xFF, HEADERS, END_STREAM | END_HEADERS if end_stream
                                    else END_HEADERS, stream_id)
            out += block
        else:
            self._header_frames(stream_id, block, end_stream)
        if end_stream:
            stream.local_closed = True
            if stream.remote_closed:
                self._close(stream)
        return True

    def _header_frames(self, sid: int, block: bytes, end_stream: bool) -> None:
        limit = self.remote_max_frame
        flags = END_STREAM if end_stream else 0
        n = len(block)
        if n <= limit:
            self.out += _FRAME_HEAD.pack(n >> 8, n & 0xFF, HEADERS, flags | END_HEADERS, sid) + block
            return
        self.out += _frame(HEADERS, flags, sid, block[:limit])
        for i in range(limit, len(block), limit):
            last = i + limit >= len(block)
            self.out += _frame(CONTINUATION, END_HEADERS if last else 0, sid, block[i:i + limit])

    def queue_data(self, stream_id: int, data: bytes, *, end: bool = False, trailers: Headers | None = None) -> None:
        """``data`` to send on the stream (sent by ``flush``), and with ``end`` the stream's end after it (with
        ``trailers``, if any)."""
        box = self._outboxes.get(stream_id)
        if box is None:
            box = self._outboxes[stream_id] = _Outbox()
        if data:
            box.append(data)
            box.size += len(data)
        if end:
            box.end = True
            box.trailers = trailers or None

    def queue_end(self, stream_id: int, trailers: Headers | None = None) -> None:
        """The stream's end (with ``trailers``, if any), after the data queued. (The proxy's hot paths call
        ``queue_data`` with ``end`` themselves: a call less.)"""
        self.queue_data(stream_id, b"", end=True, trailers=trailers)

    def buffered(self, stream_id: int) -> int:
        box = self._outboxes.get(stream_id)
        return box.size if box is not None else 0

    def flush(self, stream_id: int | None = None) -> dict[int, int]:
        """Send what the windows allow (one stream or all); returns the data bytes sent per stream, and 0 for
        a stream left with nothing to send without data going (its end went, or it was reset meanwhile)."""
        sent: dict[int, int] = {}
        outboxes = self._outboxes
        if stream_id is None:
            boxes = list(outboxes.items())
        else:
            box = outboxes.get(stream_id)
            if box is None:
                return sent
            boxes = [(stream_id, box)]
        out = self.out
        for sid, box in boxes:
            n = 0  # data bytes of ``sid`` sent
            stream = self._streams.get(sid)
            if stream is None or stream.local_closed or self.failed:
                del outboxes[sid]  # reset or closed under us: nothing more goes out on it
                sent[sid] = 0
                continue
            while box:
                room = min(stream.send_window, self._send_window, self.remote_max_frame)
                if room <= 0:
                    break
                chunk = box[0]
                size = len(chunk)
                if size <= room:
                    box.popleft()
                else:
                    box[0] = chunk[room:]
                    chunk = chunk[:room]
                    size = room
                last = box.end and not box and not box.trailers  # the end rides on the last data frame
                out += _FRAME_HEAD.pack(size >> 8, size & 0xFF, DATA, END_STREAM if last else 0, sid)
                out += chunk
                stream.send_window -= size
                self._send_window -= size
                n += size
                box.size -= size
                if last:
                    del outboxes[sid]
                    stream.local_closed = True
                    if stream.remote_closed:
                        self._close(stream)
                    break
            else:  # all the data went: the end, if it is queued
                if box.end:
                    del outboxes[sid]
                    if box.trailers:
                        block = self._encoder.encode(box.trailers)
                        size = len(block)
                        if size <= self.remote_max_frame:  # one frame (nearly always): packed here, a call less
                            out += _FRAME_HEAD.pack(size >> 8, size & 0xFF, HEADERS, END_STREAM | END_HEADERS, sid)
                            out += block
                        else:
                            self._header_frames(sid, block, True)
                    else:
                        out += _FRAME_HEAD.pack(0, 0, DATA, END_STREAM, sid)
                    stream.local_closed = True
                    if stream.remote_closed:
                        self._close(stream)
            if n or sid not in outboxes:  # data went, or the stream is through
                sent[sid] = n
        return sent

    def reset(self, stream_id: int, error_code: int = ErrorCodes.CANCEL) -> int:
        """RST_STREAM (if the stream is still open); returns the queued data bytes dropped with it."""
        box = self._outboxes.pop(stream_id, None)
        stream = self._streams.get(stream_id)
        if stream is not None and not self.failed:
            self._send_rst(stream_id, error_code)
            self._close(stream)
        return box.size if box is not None else 0

    def drop(self, stream_id: int) -> int:
        """Forget what is queued on a stream that is over; returns the data bytes dropped."""
        box = self._outboxes.pop(stream_id, None)
        return box.size if box is not None else 0

    def ping(self, data: bytes = b"tether\x00\x00") -> None:
        """A PING for the peer to answer (keep-alive)."""
        if not self.failed:
            self.out += _frame(PING, 0, 0, data)

    def goaway(self, error_code: int = ErrorCodes.NO_ERROR, last_stream_id: int | None = None) -> None:
        """GOAWAY: no stream above ``last_stream_id`` (default: the last the peer opened) will be processed."""
        if not self.failed:
            self._send_goaway(error_code, self._last_peer if last_stream_id is None else last_stream_id, b"")

    def _send_goaway(self, code: int, last: int, debug: bytes) -> None:
        if self._goaway_last is not None:
            last = min(last, self._goaway_last)  # a later GOAWAY never raises the last stream ID (§6.8)
        self._goaway_last = last
        self.out += _frame(GOAWAY, 0, 0, last.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)

    def data_to_send(self) -> bytes:
        """What to write to the peer (the connection's window given back first, when due). It has nothing to do
        while ``out`` is empty and ``recv_processed`` is 0: a caller with many connections tests those (two
        attribute reads) rather than make the call for a connection that had no part in a callback."""
        processed = self.recv_processed
        if processed and not self.failed and (processed >= self._recv_max // 2 or (
                self._recv_window == 0 and processed > min(1024, self._recv_max // 4))):
            increment = min(processed, self._recv_max - self._recv_window)  # the connection's window given back
            self.recv_processed = 0
            if increment:
                self._recv_window += increment
                self.out += _frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big"))
        out = self.out
        if not out:
            return b""
        data = bytes(out)
        out.clear()
        return data
