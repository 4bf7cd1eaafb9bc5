"""A sans-IO HTTP/1.1 connection, for either end of it (RFC 9112).

``Http1Connection(role)`` is fed the bytes read from one connection with
``receive_data(data)`` (``b""`` means EOF) and returns the events they complete:
``RequestHead`` / ``ResponseHead``, ``Body``, ``EndOfMessage``,
``ConnectionClosed``. Sending is ``send_head``, ``send_body``, ``send_end``,
which return the bytes to write. The connection never touches a socket; the
proxy's HTTP layer (``tether.proxy.core.http1_proxy``) owns the I/O.

What it handles:

- Framing both ways: ``Content-Length``, ``Transfer-Encoding: chunked`` (with
  trailers) and, for responses only, read-until-close. Requests with both
  framings, a transfer coding other than a final ``chunked``, or conflicting
  lengths are refused (request smuggling). Responses to ``HEAD`` and statuses
  1xx, 204 and 304 have no body; 1xx heads are passed on and the real
  response follows.
- Keep-alive: after a message pair, ``start_next_cycle()`` begins the next
  one unless either side said ``Connection: close`` (or spoke HTTP/1.0
  without ``keep-alive``), or a body was framed by the close: then
  ``keep_alive`` is False and the caller closes. One request is in flight at a
  time: bytes of a pipelined next request stay buffered, unparsed, until
  ``start_next_cycle()`` (so pipelining is safe, never concurrent).
- Protocol switches: a request with ``Upgrade`` or method ``CONNECT``, answered
  by ``101`` (or 2xx to ``CONNECT``), ends HTTP on the connection: ``switched``
  turns True and ``trailing_data`` holds the bytes already read after the head,
  which belong to the next protocol (opaque).
- Limits: a head longer than ``max_head_size`` is a ``HeadTooLarge`` (431), a
  first line that is not HTTP/1 (or longer than ``MAX_START_LINE``) a
  ``BadStartLine`` (400);
  any other malformed input is a ``BadMessage`` (400). Both are
  ``RemoteProtocolError`` (the peer's fault) carrying ``status_hint``. Misuse of
  the send side (a body longer than the declared length, a body after a HEAD
  response...) raises ``LocalProtocolError``: a bug on our side. Any error puts
  the connection in ``ERROR``; it is not usable after that.

The transitions of each side (ours and theirs) are in ``TRANSITIONS``, one
table for both roles; an input the table does not allow is an error.

Caller: ``tether.proxy.core.http1_proxy`` (the request-level layer), and tests.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import ClassVar, NoReturn

import httptools

from tether.proxy.codec.common import LocalProtocolError, RemoteProtocolError

Headers = tuple[tuple[bytes, bytes], ...]

MAX_HEAD_SIZE = 64 * 1024  # request/status line plus headers; hyper's default read buffer is 400 KiB, h11's 16 KiB
MAX_START_LINE = 8 * 1024  # request or status line (nginx's default buffer); longer is not HTTP we take
MAX_CHUNK_LINE = 4 * 1024  # a chunk-size line with its extensions
MAX_TRAILERS_SIZE = 16 * 1024


# -- errors -----------------------------------------------------------------------------------------------------


class BadMessage(RemoteProtocolError):
    """The peer sent a message HTTP/1.1 does not allow: answer ``status_hint`` (to a client) and close."""

    status_hint: ClassVar[int] = 400


class HeadTooLarge(BadMessage):
    """The request line and headers do not fit in ``max_head_size``."""

    status_hint = 431


class BadStartLine(BadMessage):
    """The first line is not an HTTP/1 request or status line (or is longer than ``MAX_START_LINE``)."""


# -- events -----------------------------------------------------------------------------------------------------


class Event:
    """Events are not frozen: a frozen dataclass's __init__ costs an object.__setattr__ per field, on every
    message. Nothing changes an event after the codec made it."""

    __slots__ = ()


# Two facts the parser learns for free and a proxy needs for every message (``compare=False``: they are
# derived from ``headers``). ``rewrite``: the head may hold headers a proxy rewrites -- hop-by-hop ones or
# ``l5d-*`` (True unless the parser saw none, so a head built by hand is always filtered) -- but a response's
# ``Connection: keep-alive`` lines, which only ``found`` tells (the proxy decides whether they may pass: nginx
# sends one with every response, and to an HTTP/1.1 client that stays it says nothing). ``found``: the
# lowercased values of the framing headers, as ``scan_framing`` gives them (None: not known; ``send_head`` scans).
# ``raw``: the head as received, start line and header lines each ending in CRLF (without the empty line):
# ``send_head`` writes it as it is, so a head a proxy forwards unchanged (or with lines appended to ``raw``
# and ``headers`` alike) is not serialised again. None for a head built by hand.


@dataclass(slots=True)
class RequestHead(Event):
    method: bytes
    target: bytes
    headers: Headers = ()
    version: bytes = b"1.1"
    rewrite: bool = field(default=True, compare=False, repr=False)
    found: dict[bytes, list[bytes]] | None = field(default=None, compare=False, repr=False)
    raw: bytes | None = field(default=None, compare=False, repr=False)

    # Written out, not generated: a dataclass's generated ``__init__`` is interpreted Python even in a compiled
    # module (mypyc keeps the methods a class defines), and every request makes a head (~0.4 µs a generated call).
    def __init__(self, method: bytes, target: bytes, headers: Headers = (), version: bytes = b"1.1",
                 rewrite: bool = True, found: dict[bytes, list[bytes]] | None = None, raw: bytes | None = None) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.version = version
        self.rewrite = rewrite
        self.found = found
        self.raw = raw


@dataclass(slots=True)
class ResponseHead(Event):
    status: int
    headers: Headers = ()
    reason: bytes = b""
    version: bytes = b"1.1"
    rewrite: bool = field(default=True, compare=False, repr=False)
    found: dict[bytes, list[bytes]] | None = field(default=None, compare=False, repr=False)
    raw: bytes | None = field(default=None, compare=False, repr=False)

    # Written out, not generated (as ``RequestHead``'s): every response makes a head.
    def __init__(self, status: int, headers: Headers = (), reason: bytes = b"", version: bytes = b"1.1",
                 rewrite: bool = True, found: dict[bytes, list[bytes]] | None = None, raw: bytes | None = None) -> None:
        self.status = status
        self.headers = headers
        self.reason = reason
        self.version = version
        self.rewrite = rewrite
        self.found = found
        self.raw = raw


@dataclass(slots=True)
class Body(Event):
    data: bytes

    def __init__(self, data: bytes) -> None:  # written out, as RequestHead's: one or more per message
        self.data = data


@dataclass(slots=True)
class EndOfMessage(Event):
    trailers: Headers = ()

    def __init__(self, trailers: Headers = ()) -> None:  # written out, as RequestHead's: one per message
        self.trailers = trailers


@dataclass(slots=True)
class ConnectionClosed(Event):
    """The peer closed cleanly between messages."""


# -- states -----------------------------------------------------------------------------------------------------


class Role(enum.Enum):
    CLIENT = "client"  # sends requests, reads responses
    SERVER = "server"  # reads requests, sends responses


class State(enum.Enum):
    IDLE = "IDLE"  # no message begun
    BODY = "BODY"  # head done, body (maybe empty) in progress
    DONE = "DONE"  # message ended; waiting for the other side or start_next_cycle()
    SWITCHED = "SWITCHED"  # the connection now carries another protocol
    CLOSED = "CLOSED"  # EOF between messages
    ERROR = "ERROR"

    __hash__ = object.__hash__  # members are singletons: identity hashing, done in C (TRANSITIONS lookups)


# Inputs of a side's state machine, besides the event classes above.
class Input(enum.Enum):
    INFORMATIONAL = "1xx head"  # a 1xx response head: the real response follows
    HEAD_NO_BODY = "head without body"  # the message ends with its head
    SWITCH = "switch protocols"
    EOF = "eof"
    NEXT_CYCLE = "next cycle"

    __hash__ = object.__hash__


# (state, input) -> next state, for whichever side (ours or the peer's) the input is about.
TRANSITIONS: dict[tuple[State, object], State] = {
    (State.IDLE, RequestHead): State.BODY,
    (State.IDLE, ResponseHead): State.BODY,
    (State.IDLE, Input.INFORMATIONAL): State.IDLE,
    (State.IDLE, Input.HEAD_NO_BODY): State.DONE,
    (State.IDLE, Input.EOF): State.CLOSED,
    (State.BODY, Body): State.BODY,
    (State.BODY, EndOfMessage): State.DONE,
    (State.DONE, Input.NEXT_CYCLE): State.IDLE,
    (State.DONE, Input.SWITCH): State.SWITCHED,
    (State.IDLE, Input.SWITCH): State.SWITCHED,
    (State.DONE, Input.EOF): State.CLOSED,
}


_next = TRANSITIONS.get  # every move is ``_next((state, input)) or _stuck(...)``: one dict lookup, no call


def _stuck(state: State, what: object, local: bool) -> NoReturn:
    """An input ``TRANSITIONS`` does not allow in ``state``: our bug (``local``) or the peer's."""
    text = f"{getattr(what, '__name__', what)} not allowed in state {state.value}"
    raise LocalProtocolError(text) if local else BadMessage(text)


# -- framing ----------------------------------------------------------------------------------------------------


class _Framing(enum.Enum):
    NONE = 0
    LENGTH = 1
    CHUNKED = 2
    UNTIL_CLOSE = 3


_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# The versions taken, as the start line spells them -> as events carry them (a lookup, not a regex per line).
_VERSIONS = {b"HTTP/1.1": b"1.1", b"HTTP/1.0": b"1.0"}
# Methods known to be tokens (the rest are checked with _TOKEN).
_METHODS = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH"})
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")
_HEX = re.compile(rb"[0-9A-Fa-f]+\Z")


def header(headers: Headers, name: bytes) -> bytes | None:
    """The value of the first header called ``name`` (lowercase), or None."""
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


_FRAMING_HEADERS = frozenset({b"transfer-encoding", b"content-length", b"connection", b"upgrade"})
# Hop-by-hop headers (RFC 9110 §7.6.1): a proxy never forwards them as they are.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"transfer-encoding",
                        b"upgrade", b"trailer"})
_NONE: list[bytes] = []
_KEEP_ALIVE = [b"keep-alive"]  # a head's found["connection"] that cannot close (see _wants_close)
_LINE_ENDS = (10, 13)  # LF, CR as bytes items


def scan_framing(headers: Headers) -> dict[bytes, list[bytes]]:
    """One pass over a head: the comma-separated, lowercased values of the headers framing depends on."""
    found: dict[bytes, list[bytes]] = {}
    for key, value in headers:
        low = key.lower()
        if low in _FRAMING_HEADERS:
            values = found.setdefault(low, [])
            for item in value.split(b","):  # a loop, not a generator: no call per header
                if item := item.strip():
                    values.append(item.lower())
    return found


_NO_BODY = (_Framing.NONE, 0)
_INFORMATIONAL = (_Framing.NONE, -1)  # what reading a 1xx head gives: no body, and the real response follows


def _framing(found: dict[bytes, list[bytes]], is_request: bool, error: type[Exception]) -> tuple[_Framing, int]:
    """The framing a head's headers declare; requests with neither have no body, responses run until close."""
    if not found:
        return (_Framing.NONE if is_request else _Framing.UNTIL_CLOSE), 0
    te = found.get(b"transfer-encoding", _NONE)
    lengths = found.get(b"content-length", _NONE)
    if te:
        if lengths:
            raise error("both Transfer-Encoding and Content-Length")
        if te[-1] != b"chunked" or te.count(b"chunked") != 1:
            if is_request:
                raise error("a request's transfer coding must end with chunked")
            return _Framing.UNTIL_CLOSE, 0
        return _Framing.CHUNKED, 0
    if lengths:
        first = lengths[0]
        # bytes.isdigit: ASCII digits only, and not empty (as [0-9]+, without a regex call per message)
        if len(first) > 18 or not first.isdigit() or (len(lengths) > 1 and len(set(lengths)) != 1):
            raise error("invalid Content-Length")
        return _Framing.LENGTH, int(lengths[0])
    return (_Framing.NONE if is_request else _Framing.UNTIL_CLOSE), 0


def _wants_close(found: dict[bytes, list[bytes]], version: bytes) -> bool:
    """Whether a head ends its connection after its message: ``Connection: close``, or HTTP/1.0 without
    ``keep-alive``. Callers test first that the head is not HTTP/1.1 or has a ``Connection`` other than
    ``keep-alive`` (the usual head has neither: nginx says keep-alive on every response), so a head that cannot
    close costs no call."""
    conn = found.get(b"connection", _NONE)
    if b"close" in conn:
        return True
    return version == b"1.0" and b"keep-alive" not in conn


# -- the connection ---------------------------------------------------------------------------------------------


class Http1Connection:
    """One HTTP/1.1 connection seen from ``role``; see the module docstring."""

    def __init__(self, role: Role, *, max_head_size: int = MAX_HEAD_SIZE) -> None:
        self.role = role
        self.max_head_size = max_head_size
        self.our_state = State.IDLE
        self.their_state = State.IDLE
        self.keep_alive = True
        # Bytes read and not parsed yet (a pipelined request, a body's next part): callers only read it -- its
        # length is what the I/O side bounds (``len``, not a property: a Python call less per read).
        self.unparsed = bytearray()
        self._searched = 0  # how far the head terminator has been looked for (keeps scanning O(n))
        # llhttp: made at the first head, or after it refused something or was left behind (receive_data).
        self._parser: _Llhttp | None = None
        self._eof = False
        # The message being read.
        self._rframing = _Framing.NONE
        self._rleft = 0  # bytes left: of a Content-Length body, or of the current chunk
        self._chunk_phase = 0  # 0 size line, 1 data, 2 CRLF after data, 3 trailers
        # The message being written.
        self._wframing = _Framing.NONE
        self._wleft = 0
        # The request of this cycle (the client needs it to read the response).
        self._method = b""
        self._switch_asked = False

    # -- state ------------------------------------------------------------------------------------------------

    @property
    def switched(self) -> bool:
        return self.our_state is State.SWITCHED

    @property
    def trailing_data(self) -> bytes:
        """Bytes read but not parsed: after a switch, the next protocol's first bytes."""
        return bytes(self.unparsed)

    @property
    def received(self) -> bytes:
        """Bytes held unparsed; after an error in a first head, all the peer sent (for an opaque fallback)."""
        return bytes(self.unparsed)

    def start_next_cycle(self) -> bool:
        """After both messages of a cycle ended (and keep-alive holds), get ready for the next request. True when
        something of the next cycle is held already (bytes or the EOF): ``parse_buffered`` has something to do."""
        if not (self.our_state is State.DONE and self.their_state is State.DONE and self.keep_alive):
            raise LocalProtocolError(f"no next cycle from {self.our_state.value}/{self.their_state.value}"
                                     f" (keep-alive {self.keep_alive})")
        # (DONE, NEXT_CYCLE) -> IDLE for both sides, as TRANSITIONS says: checked just above.
        self.our_state = self.their_state = State.IDLE
        self._method = b""
        self._switch_asked = False
        return bool(self.unparsed) or self._eof

    # -- receiving --------------------------------------------------------------------------------------------

    def receive_data(self, data: bytes | None) -> list[Event]:
        """Bytes from the peer (``b""``: EOF) in; the events they complete out. None: nothing new
        (``parse_buffered``)."""
        buf = self.unparsed
        if data is not None:
            if self.their_state is State.ERROR:
                raise BadMessage("connection already failed")
            if data:
                if self._eof:
                    raise LocalProtocolError("data after EOF")
                buf += data
            else:
                self._eof = True
        events: list[Event] = []
        # One step per pass: a head, or what the buffer holds of a body. Reading a head is written out here rather
        # than in a method of its own: two calls less per request and per response.
        try:
            while True:
                state = self.their_state
                if state is State.BODY:
                    if self._rframing is not _Framing.LENGTH:
                        if not self._read_body(events):
                            break
                        continue
                    # A Content-Length body (most are), here rather than in _read_body: a call less per message.
                    if buf:
                        n = min(self._rleft, len(buf))
                        data = bytes(buf[:n])
                        events.append(Body(data))
                        del buf[:n]
                        self._rleft -= n
                        llhttp = self._parser
                        if llhttp is not None:
                            try:
                                llhttp.parser.feed_data(data)
                            except httptools.HttpParserError:  # not reached (a length-framed body is opaque to it)
                                self._parser = None
                    if self._rleft == 0:  # _end_read, inline (every Content-Length body ends here)
                        self.their_state = (_next((self.their_state, EndOfMessage))
                                            or _stuck(self.their_state, EndOfMessage, False))
                        events.append(_END)
                        continue
                    if self._eof:
                        raise BadMessage("connection closed inside a body")
                    break
                if state is not State.IDLE:
                    break  # DONE: what follows waits for start_next_cycle() (or is the next protocol's)
                if self.role is Role.CLIENT and self.our_state is State.IDLE:
                    if buf:
                        raise BadMessage("response before any request")
                    if self._eof:  # the server closed an idle connection
                        self.their_state = (_next((self.their_state, Input.EOF))
                                            or _stuck(self.their_state, Input.EOF, False))
                        events.append(ConnectionClosed())
                    break
                if not (buf or self._eof):
                    break  # nothing to read a head from (the usual case after start_next_cycle)
                # Empty lines before a request line are allowed (RFC 9112 §2.2). (Looked at only when the buffer
                # starts with a line end: a slice per head costs an object.)
                if buf and buf[0] in _LINE_ENDS:
                    while buf[:2] == b"\r\n":
                        del buf[:2]
                        self._searched = 0
                    while buf[:1] == b"\n":
                        del buf[:1]
                        self._searched = 0
                end = buf.find(b"\r\n\r\n", max(0, self._searched - 3))
                if end < 0:
                    if len(buf) > self.max_head_size:
                        raise HeadTooLarge("head too large")
                    if len(buf) > MAX_START_LINE and buf.find(b"\r\n", 0, MAX_START_LINE) < 0:
                        raise BadStartLine("start line too long")
                    self._searched = len(buf)
                    if self._eof:
                        if buf:
                            raise BadMessage("connection closed inside a message head")
                        self.their_state = (_next((self.their_state, Input.EOF))
                                            or _stuck(self.their_state, Input.EOF, False))
                        events.append(ConnectionClosed())
                    break
                if end + 4 > self.max_head_size:
                    raise HeadTooLarge("head too large")
                head = bytes(buf[: end + 2])  # the start line and each header line, CRLF-terminated
                server = self.role is Role.SERVER
                read = self._got_request(head, events) if server else self._got_response(head, events)
                del buf[: end + 4]  # only now: after an error the buffer still holds everything the peer sent
                self._searched = 0
                if read is None:
                    break  # a protocol switch: what follows is not HTTP/1
                # The message's body begins (here, not in a method of its own: a call less per message).
                framing, length = read
                if length < 0:  # _INFORMATIONAL (compared by value: compiled, a returned tuple is a new object)
                    continue  # a 1xx head: the real response follows
                if framing is not _Framing.LENGTH and (framing is not _Framing.NONE or not server):
                    # llhttp is fed what is read of Content-Length bodies only (so it stays in step at no Python
                    # call); after another body, or a response without one (llhttp cannot know a HEAD's), a new
                    # parser.
                    self._parser = None
                if framing is _Framing.NONE or (framing is _Framing.LENGTH and length == 0):
                    self.their_state = (_next((self.their_state, Input.HEAD_NO_BODY))
                                        or _stuck(self.their_state, Input.HEAD_NO_BODY, False))
                    events.append(_END)
                    continue
                sent = RequestHead if server else ResponseHead
                self.their_state = _next((self.their_state, sent)) or _stuck(self.their_state, sent, False)
                self._rframing = framing
                self._rleft = length
                self._chunk_phase = 0
        except RemoteProtocolError:
            self.their_state = State.ERROR
            raise
        return events

    def parse_buffered(self) -> list[Event]:
        """The events the bytes held complete, with nothing new received: after ``start_next_cycle``, a
        pipelined request already read (or the EOF that followed it)."""
        return self.receive_data(None)

    def _got_request(self, head: bytes, events: list[Event]) -> tuple[_Framing, int]:
        """A request head: its event appended; returns how its body is framed."""
        line = head[: head.find(b"\r\n")]
        parts = line.split(b" ")
        if len(parts) != 3:
            raise BadStartLine("malformed request line")
        method, target, version = parts
        version = _VERSIONS.get(version, b"")
        if not version or (method not in _METHODS and not _TOKEN.match(method)) or not target \
                or _BAD_TARGET.search(target):
            raise BadStartLine("malformed request line")
        llhttp = self._parser or _Llhttp(True)
        headers, found, hosts, rewrite, going = _parse_head(head, llhttp)
        self._parser = llhttp if going else None
        if version == b"1.1" and hosts != 1:
            raise BadMessage("an HTTP/1.1 request needs exactly one Host")
        # A request without framing headers has no body (as _framing says, without the call: the usual GET).
        framing, length = _framing(found, True, BadMessage) if found else _NO_BODY
        if method == b"CONNECT":
            framing, length = _Framing.NONE, 0
        self._method = method
        self._switch_asked = method == b"CONNECT" or b"upgrade" in found
        if (b"connection" in found and found[b"connection"] != _KEEP_ALIVE or version != b"1.1") \
                and _wants_close(found, version):
            self.keep_alive = False
        events.append(RequestHead(method, target, headers, version, rewrite, found, head))
        return framing, length

    def _got_response(self, head: bytes, events: list[Event]) -> tuple[_Framing, int] | None:
        """A response head: its event appended; returns how its body is framed, ``_INFORMATIONAL`` for a 1xx
        head, None after a protocol switch."""
        parts = head[: head.find(b"\r\n")].split(b" ", 2)
        if len(parts) < 2:
            raise BadMessage("malformed status line")
        version = _VERSIONS.get(parts[0], b"")
        status_text = parts[1]
        if not version or len(status_text) != 3 or not status_text.isdigit():
            raise BadMessage("malformed status line")
        status = int(status_text)
        if status < 100:
            raise BadMessage("malformed status line")
        llhttp = self._parser or _Llhttp(False)
        headers, found, _, rewrite, going = _parse_head(head, llhttp)
        self._parser = llhttp if going else None
        reason = parts[2] if len(parts) == 3 else b""
        head_event = ResponseHead(status, headers, reason, version, rewrite, found, head)
        if status == 101 or (self._method == b"CONNECT" and 200 <= status < 300):
            if not self._switch_asked:
                raise BadMessage("a protocol switch nobody asked for")
            events.append(head_event)
            self.their_state = (_next((self.their_state, Input.SWITCH))
                                or _stuck(self.their_state, Input.SWITCH, False))
            self.our_state = _next((self.our_state, Input.SWITCH)) or _stuck(self.our_state, Input.SWITCH, False)
            return None
        if status < 200:
            events.append(head_event)
            self.their_state = (_next((self.their_state, Input.INFORMATIONAL))
                                or _stuck(self.their_state, Input.INFORMATIONAL, False))
            return _INFORMATIONAL
        if self._method == b"HEAD" or status in (204, 304):
            framing, length = _Framing.NONE, 0
        else:
            framing, length = _framing(found, False, BadMessage)
        if framing is _Framing.UNTIL_CLOSE or (b"connection" in found and found[b"connection"] != _KEEP_ALIVE
                                               or version != b"1.1") and _wants_close(found, version):
            self.keep_alive = False
        events.append(head_event)
        return framing, length

    def _end_read(self, events: list[Event], trailers: Headers = ()) -> None:
        self.their_state = _next((self.their_state, EndOfMessage)) or _stuck(self.their_state, EndOfMessage, False)
        events.append(EndOfMessage(trailers) if trailers else _END)

    def _read_body(self, events: list[Event]) -> bool:
        """What the buffer holds of a body read until the close, or chunked (a Content-Length body is read in
        ``receive_data``); True when the message ended."""
        buf = self.unparsed
        if self._rframing is _Framing.UNTIL_CLOSE:
            if buf:
                events.append(Body(bytes(buf)))
                buf.clear()
            if self._eof:
                self._end_read(events)
                self.their_state = _next((self.their_state, Input.EOF)) or _stuck(self.their_state, Input.EOF, False)
                events.append(ConnectionClosed())
            return False
        return self._read_chunked(events)

    def _read_chunked(self, events: list[Event]) -> bool:
        buf = self.unparsed
        while True:
            phase = self._chunk_phase
            if phase == 1:  # chunk data
                if not buf:
                    break
                n = min(self._rleft, len(buf))
                events.append(Body(bytes(buf[:n])))
                del buf[:n]
                self._rleft -= n
                if self._rleft == 0:
                    self._chunk_phase = 2
                continue
            if phase == 2:  # CRLF after the data
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise BadMessage("chunk data not followed by CRLF")
                del buf[:2]
                self._chunk_phase = 0
                continue
            if phase == 0:  # chunk-size [; extensions] CRLF
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_CHUNK_LINE:
                        raise BadMessage("chunk size line too long")
                    break
                size = bytes(buf[:end]).split(b";", 1)[0].strip(b" \t")
                if not _HEX.match(size) or len(size) > 15:
                    raise BadMessage("invalid chunk size")
                del buf[: end + 2]
                self._rleft = int(size, 16)
                self._chunk_phase = 1 if self._rleft else 3
                continue
            # phase 3: trailers up to an empty line
            if buf[:2] == b"\r\n":
                del buf[:2]
                self._end_read(events)
                return True
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_TRAILERS_SIZE:
                    raise HeadTooLarge("trailers too large")
                break
            trailers = _parse_headers(bytes(buf[:end]).split(b"\r\n"))
            del buf[: end + 4]
            self._end_read(events, trailers)
            return True
        if self._eof:
            raise BadMessage("connection closed inside a chunked body")
        return False

    # -- sending ----------------------------------------------------------------------------------------------

    def send_head(self, head: RequestHead | ResponseHead) -> bytes:
        """Serialise a head; its framing headers decide how ``send_body``/``send_end`` frame the body."""
        if self.our_state is State.ERROR:
            raise LocalProtocolError("connection already failed")
        headers = head.headers
        found = head.found
        if found is None:
            found = scan_framing(headers)
        if isinstance(head, RequestHead):
            if self.role is not Role.CLIENT:
                raise LocalProtocolError("a server sends responses")
            framing, length = _framing(found, True, LocalProtocolError) if found else _NO_BODY
            if head.method == b"CONNECT":
                framing, length = _Framing.NONE, 0
            self._method = head.method
            self._switch_asked = head.method == b"CONNECT" or b"upgrade" in found
            if (b"connection" in found and found[b"connection"] != _KEEP_ALIVE or head.version != b"1.1") \
                    and _wants_close(found, head.version):
                self.keep_alive = False
            line = b"" if head.raw is not None else b"%s %s HTTP/%s\r\n" % (head.method, head.target, head.version)
        else:
            if self.role is not Role.SERVER:
                raise LocalProtocolError("a client sends requests")
            status = head.status
            line = b"" if head.raw is not None else b"HTTP/%s %d %s\r\n" % (head.version, status, head.reason)
            if status == 101 or (self._method == b"CONNECT" and 200 <= status < 300):
                if not self._switch_asked or self.their_state is not State.DONE:
                    raise LocalProtocolError("a protocol switch the request did not ask for")
                self.our_state = _next((self.our_state, Input.SWITCH)) or _stuck(self.our_state, Input.SWITCH, True)
                self.their_state = (_next((self.their_state, Input.SWITCH))
                                    or _stuck(self.their_state, Input.SWITCH, True))
                return head.raw + b"\r\n" if head.raw is not None else line + _serialise(head.headers)
            if status < 200:
                self.our_state = (_next((self.our_state, Input.INFORMATIONAL))
                                  or _stuck(self.our_state, Input.INFORMATIONAL, True))
                return head.raw + b"\r\n" if head.raw is not None else line + _serialise(head.headers)
            if self._method == b"HEAD" or status in (204, 304):
                framing, length = _Framing.NONE, 0
            else:
                framing, length = _framing(found, False, LocalProtocolError)
            if framing is _Framing.UNTIL_CLOSE or (b"connection" in found and found[b"connection"] != _KEEP_ALIVE
                                                   or head.version != b"1.1") and _wants_close(found, head.version):
                self.keep_alive = False
        raw = head.raw
        out = raw + b"\r\n" if raw is not None else line + _serialise(head.headers)
        sent = RequestHead if self.role is Role.CLIENT else ResponseHead
        self.our_state = _next((self.our_state, sent)) or _stuck(self.our_state, sent, True)
        self._wframing = framing
        self._wleft = length
        return out

    def send_body(self, data: bytes) -> bytes:
        self.our_state = _next((self.our_state, Body)) or _stuck(self.our_state, Body, True)
        if not data:
            return b""
        framing = self._wframing
        if framing is _Framing.CHUNKED:
            return b"%x\r\n%s\r\n" % (len(data), data)
        if framing is _Framing.LENGTH:
            if len(data) > self._wleft:
                raise LocalProtocolError("body longer than its Content-Length")
            self._wleft -= len(data)
            return data
        if framing is _Framing.UNTIL_CLOSE:
            return data
        raise LocalProtocolError("this message has no body")

    def send_end(self, trailers: Headers = ()) -> bytes:
        self.our_state = _next((self.our_state, EndOfMessage)) or _stuck(self.our_state, EndOfMessage, True)
        framing = self._wframing
        if framing is _Framing.CHUNKED:
            return b"0\r\n" + _serialise(trailers)
        if trailers:
            raise LocalProtocolError("trailers need chunked framing")
        if framing is _Framing.LENGTH and self._wleft:
            raise LocalProtocolError("body shorter than its Content-Length")
        return b""

    def send_failed(self) -> None:
        """We could not finish our message (the other end of the proxy failed): the connection is unusable."""
        self.our_state = State.ERROR
        self.keep_alive = False


class _Llhttp:
    """A connection's llhttp parser and the collector of its callbacks.

    The parser holds the collector (its callbacks' object), and the collector does not hold the parser: a
    parser that held itself through its callbacks would be a reference cycle, freed only by the cyclic
    garbage collector, per connection (see docs/benchmarks.md on the collector's pauses)."""

    __slots__ = ("parser", "head")

    def __init__(self, is_request: bool) -> None:
        self.head = _HeadCollector(is_request)
        self.parser = (httptools.HttpRequestParser if is_request else httptools.HttpResponseParser)(self.head)


class _HeadCollector:
    """What llhttp's callbacks collect of the head in hand: its headers, the framing-relevant values, the Host
    count and whether anything in it is to be rewritten."""

    __slots__ = ("headers", "found", "hosts", "rewrite", "request")

    def __init__(self, request: bool) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.found: dict[bytes, list[bytes]] = {}
        self.hosts = 0
        self.rewrite = False
        self.request = request

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called by llhttp for every header line: one call, the notable headers looked at in it (not in another).
        self.headers.append((name, value.rstrip(b" \t")))  # llhttp drops leading whitespace only
        low = name.lower()
        if low not in _NOTABLE:
            if low[:4] == b"l5d-":
                self.rewrite = True
            return
        if low == b"host":
            self.hosts += 1
            return
        if low in HOP_BY_HOP and (self.request or (low, value.strip().lower()) != _HARMLESS):
            self.rewrite = True
        if low in _FRAMING_HEADERS:
            if b"," in value:
                values = [v.strip() for v in value.lower().split(b",") if v.strip()]
                if values:  # a value of commas alone lists nothing (as scan_framing's found has no empty entry)
                    self.found.setdefault(low, []).extend(values)
            elif stripped := value.strip():
                self.found.setdefault(low, []).append(stripped.lower())  # the common case: one value


_NOTABLE = HOP_BY_HOP | _FRAMING_HEADERS | {b"host"}  # the headers the collector looks at further
# The hop-by-hop line (lowercased, stripped) that does not make a response's ``rewrite`` (see ``ResponseHead``).
_HARMLESS = (b"connection", b"keep-alive")
_END = EndOfMessage()  # the end of a message without trailers (events are never changed)


def _parse_head(head: bytes, llhttp: _Llhttp) -> tuple[Headers, dict[bytes, list[bytes]], int, bool, bool]:
    """A head's headers, its framing-relevant values, its number of Host headers, its ``rewrite`` flag, and
    whether ``llhttp`` can be fed the connection's next bytes.

    llhttp (httptools) parses the common case several times faster than
    Python can; whatever it refuses (an extension method it does not know,
    say) is parsed again by ``_parse_headers``, whose rules decide. So the
    rules are the Python ones, and llhttp is only allowed to be stricter,
    never laxer: tests/proxy/test_http1_codec.py checks both agree.
    ``llhttp`` is the connection's, fed every head (and what follows it,
    where it frames it as the codec does) from the connection's first byte.
    """
    collected = llhttp.head
    collected.headers = []
    collected.found = {}
    collected.hosts = 0
    collected.rewrite = False
    going = True
    try:
        llhttp.parser.feed_data(head + b"\r\n")
    except httptools.HttpParserUpgrade:
        going = False  # the head is complete; what follows is not HTTP/1 for llhttp
    except httptools.HttpParserError:
        headers = _parse_headers(head.split(b"\r\n")[1:-1])
        names = [k.lower() for k, _ in headers]
        request = collected.request
        rewrite = any(n[:4] == b"l5d-" or (n in HOP_BY_HOP and (request or (n, v.lower()) != _HARMLESS))
                      for n, (_, v) in zip(names, headers))
        found = {name: values for name, values in scan_framing(headers).items() if values}
        return headers, found, names.count(b"host"), rewrite, False
    return tuple(collected.headers), collected.found, collected.hosts, collected.rewrite, going


def _parse_headers(lines: list[bytes]) -> Headers:
    out: list[tuple[bytes, bytes]] = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            # Also catches obs-fold (a line starting with whitespace), refused as RFC 9112 §5.2 allows.
            raise BadMessage("malformed header line")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise BadMessage("invalid header value")
        out.append((name, value))
    return tuple(out)


_LINE = b"%s: %s\r\n".__mod__  # (name, value) -> its line; mapped in C (a list comprehension is a call)


def serialise_lines(headers: Headers) -> bytes:
    """Header lines, each ending in CRLF: what a proxy appends to a ``raw`` head."""
    return b"".join(map(_LINE, headers))


def _serialise(headers: Headers) -> bytes:
    if not headers:
        return b"\r\n"
    return b"".join(map(_LINE, headers)) + b"\r\n"
