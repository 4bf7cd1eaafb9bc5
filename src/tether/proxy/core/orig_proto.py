"""The outbound half of ``l5d-orig-proto`` (proxy.md §7.7): HTTP/1 requests carried over HTTP/2 to a peer proxy.

When discovery hints an endpoint ``h2`` (a meshed pod; not one of our own
addresses) an HTTP/1 request to it -- unless it is a ``CONNECT`` or asks
for a protocol switch (``upgradable``) -- goes on one HTTP/2 connection to
that endpoint, shared by every client connection of the proxy, with
``l5d-orig-proto: HTTP/1.1`` (or ``HTTP/1.0``, as the request was; ``;
absolute-form`` when its target was) and without hop-by-hop headers; the
peer's inbound proxy downgrades it for its app and marks the response the
same way (``downgraded_version``, for our own inbound side). The response
comes back to the client as HTTP/1.

The HTTP/1 core (``core.http1_proxy``) is unchanged by this: it checks out
what it takes for an HTTP/1 connection (the pick's ``upgrade`` plan:
``core.endpoint.upgrade_plan``) and talks to that connection's codec. That
connection is a ``Leg``, and the leg is its own codec (``Upstream.codec``):
the core's request head opens a stream of the shared
``UpgradeConnection`` (HEADERS at once, with END_STREAM when the head says
there is no body), its body goes as DATA, and the stream's response comes
back as the codec's events (``ResponseHead`` framed by its length or
chunked, ``Body``, ``EndOfMessage`` with the trailers) -- no HTTP/1 bytes
in between, so nothing is parsed or serialised twice. A leg is kept in the
core's pool between requests like any connection, so a warm request opens no
connection and makes no task switch. A stream that fails (reset, GOAWAY past
it, the connection lost) ends its leg as a closed pooled connection would end:
before the response, the core sends the request once more on a new leg (a new
connection to the endpoint, or another pick when that connect fails); else, or
the second time, it answers 502 (or breaks off the response it was relaying),
in linkerd2-proxy's words when the stream failed with an HTTP/2 error code
(``upstream_failed``).

The per-request path is kept short (calls per request, docs/benchmarks.md): a
request without a body goes whole in its HEADERS frame and nothing is flushed
for it (``UpgradeConnection.unsent``); the I/O side is asked to write once until
it has (``woken``); each frame of the response is one call to its leg, which
ends the response on the frame that ended the stream; the response head is
built as the HTTP/1 codec would have parsed it (``h1_response``).

Flow control stays explicit: a response's bytes are acknowledged to the
peer as they are handed to the core, unless the core's client cannot take
more (``Leg.pause``): then they are acknowledged once it can, so at most the
stream window (64 KiB) waits per stream. A request's bytes beyond the
peer's windows wait in the codec's send buffer; ``Leg.buffered`` says how
many, and the I/O side stops reading the client above ``SEND_LIMIT``.

Pure: no I/O (``io.upgrade_io`` carries the bytes). Tests:
tests/proxy/test_orig_proto.py (playbooks), tests/proxy/test_orig_proto_mesh.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from tether.proxy.codec import http2_events as h2e
from tether.proxy.codec.http1 import (
    HOP_BY_HOP,
    BadMessage,
    Body,
    EndOfMessage,
    Event,
    RequestHead,
    ResponseHead,
    State,
    scan_framing,
)
from tether.proxy.codec.http2 import DEFAULT_PARAMS, H2Endpoint, H2ProtocolError, Headers, Http2Params
from tether.proxy.core import errors

L5D_ORIG_PROTO = b"l5d-orig-proto"
SEND_LIMIT = 64 * 1024  # request bytes waiting for the peer's window above which the client is not read
# Not forwarded over HTTP/2 (RFC 9113 §8.2.2); ``host`` becomes ``:authority``.
_DROPPED = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade",
                      b"host", b"te"})


def upgradable(request: RequestHead) -> bool:
    """Whether an HTTP/1 request may be carried over HTTP/2: not a CONNECT, not a protocol switch (an
    ``Upgrade: h2c`` is not one: it is dropped)."""
    if request.method == b"CONNECT":
        return False
    found = request.found
    if found is not None:
        values = found.get(b"upgrade")
        return not values or all(v.strip().lower() == b"h2c" for v in values)
    return all(v.strip().lower() == b"h2c" for n, v in request.headers if n.lower() == b"upgrade")


def h2_request(head: RequestHead) -> Headers:
    """The HTTP/2 header list of an HTTP/1 request, marked with ``l5d-orig-proto``."""
    target = head.target
    mark = b"HTTP/1.0" if head.version == b"1.0" else b"HTTP/1.1"
    scheme = b"http"
    authority = b""
    path = target
    low_target = target[:8].lower()
    if low_target.startswith(b"http://") or low_target.startswith(b"https://"):
        scheme, _, rest = target.partition(b"://")
        scheme = scheme.lower()
        authority, slash, tail = rest.partition(b"/")
        path = b"/" + tail if slash else b"/"
        mark += b"; absolute-form"
    listed: set[bytes] = set()
    for name, value in head.headers:
        if name.lower() == b"connection":
            listed.update(t.strip().lower() for t in value.split(b","))
    fields: Headers = []
    for name, value in head.headers:
        low = name.lower()
        if low in _DROPPED or low in listed:
            if low == b"host" and not authority:
                authority = value
            elif low == b"te" and value.strip().lower() == b"trailers":
                fields.append((low, b"trailers"))
            continue
        fields.append((low, value))
    pseudo: Headers = [(b":method", head.method), (b":scheme", scheme)]
    if authority:
        pseudo.append((b":authority", authority))
    pseudo.append((b":path", path or b"/"))
    return pseudo + fields + [(L5D_ORIG_PROTO, mark)]


def downgraded_version(mark: bytes) -> bytes:
    """The HTTP/1 version of a request a peer upgraded (inbound), from its ``l5d-orig-proto`` value."""
    return b"1.0" if mark.upper().startswith(b"HTTP/1.0") else b"1.1"


def h1_response(headers: Headers, method: bytes) -> ResponseHead:
    """An HTTP/2 response head as HTTP/1.1 for the core: without ``l5d-orig-proto`` (the peer's mark), framed
    by its length or chunked. Its ``found`` and ``rewrite`` are what the HTTP/1 codec would have found parsing
    it (the codec refused connection-specific fields, and checked ``content-length`` is digits), so the core
    forwards it without scanning it again (9 calls a request)."""
    status = 0
    fields: list[tuple[bytes, bytes]] = []
    found: dict[bytes, list[bytes]] = {}
    rewrite = False
    for name, value in headers:
        if name[:1] == b":":
            if name == b":status":
                status = int(value)
            continue
        if name == L5D_ORIG_PROTO:
            continue
        if name == b"content-length":
            found[name] = [value]
        elif name in HOP_BY_HOP or name[:4] == b"l5d-":  # te, trailer; the peer's l5d-proxy-error...
            rewrite = True
        fields.append((name, value))
    if not found and status >= 200 and status not in (204, 304) and method != b"HEAD":
        fields.append((b"transfer-encoding", b"chunked"))
        found[b"transfer-encoding"] = [b"chunked"]
        rewrite = True  # a hop-by-hop field, for the core to drop (and frame the body for its client)
    return ResponseHead(status, tuple(fields), _REASONS.get(status, b""), b"1.1", rewrite, found)


_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}  # a dict: no enum call per response
_END = EndOfMessage()  # a response's end without trailers (the core never changes an event)


def upstream_failed(codec: object, addr: object) -> errors.ProxyError:
    """What the HTTP/1 core answers when its upstream connection ended before the response head (``codec``: the
    connection's client codec): for a leg whose HTTP/2 stream failed with an error code, linkerd2-proxy's
    wording for it; else the connection closed."""
    if isinstance(codec, Leg) and codec.reset is not None:
        return errors.upgrade_reset(addr, codec.reset)
    return errors.io_error(addr)


class Leg:
    """One HTTP/1 connection as the core sees it -- its client codec (``Upstream.codec``), each request one stream
    of ``conn``: the core's heads and bodies go out as HTTP/2 frames at once, and the stream's response comes
    back as the codec's events (``receive_data``), without HTTP/1 bytes in between."""

    __slots__ = ("conn", "sid", "events", "broken", "reset", "closed", "method", "waiting", "paused", "owed",
                 "sending", "body", "our_state", "their_state", "user")

    keep_alive = True  # a leg is reused until it breaks (then it reads as closed)

    def __init__(self, conn: UpgradeConnection) -> None:
        self.conn = conn
        self.sid = 0  # the stream of the request in hand (0: none)
        self.events: list[Event] = []  # the response so far, for the core's next ``receive_data``
        self.broken = False  # the stream (or the connection) failed: the core sees the connection end
        self.reset: int | None = None  # the HTTP/2 error code that failed its stream (None: none, or no stream)
        self.closed = False  # the core is done with it
        self.method = b""
        self.waiting: list[Any] | None = None  # a request waiting for a stream slot: [headers, end, events...]
        self.paused = False  # the core's client cannot take more: acknowledgements held
        self.owed: dict[int, int] = {}  # bytes received and not acknowledged, per stream
        # Request bytes queued since the I/O side last looked (``moved``): only then may they wait above
        # ``SEND_LIMIT``, so only then is ``buffered`` asked.
        self.sending = False
        self.body = False  # the request in hand has a body (else it went whole with its HEADERS)
        self.our_state = State.IDLE  # the request's, as the core's codec would say
        self.their_state = State.IDLE  # the response's
        self.user: Any = None  # the I/O side's object for this leg

    @property
    def buffered(self) -> int:
        """Request bytes waiting for the peer's window."""
        if self.sid:
            return self.conn.h2.buffered(self.sid)
        waiting = self.waiting
        return sum(len(e.data) for e in waiting[2:] if isinstance(e, Body)) if waiting else 0

    # -- the codec surface the core uses (``core.http1_proxy``) --------------------------------------------------

    def send_head(self, head: RequestHead) -> bytes:
        """Open the request's stream (or queue it for a slot); nothing to write: the connection writes."""
        self.method = head.method
        found = head.found if head.found is not None else scan_framing(head.headers)
        length = found.get(b"content-length")
        body = self.body = b"transfer-encoding" in found or (length is not None and length != [b"0"])
        self.our_state = State.BODY if body else State.DONE
        self.waiting = [h2_request(head), not body]  # no body: the request ends with its HEADERS
        conn = self.conn
        if not conn.usable:
            self._break()
        elif not conn.queued and conn.h2.can_open_stream():
            self.started()
        else:
            conn.queued.append(self)
        if not conn.woken:  # (set and called here, not in a method: a call less per request)
            conn.woken = True
            conn.on_output()
        return b""

    def send_body(self, data: bytes) -> bytes:
        if self.waiting is not None:
            self.waiting.append(Body(data))
        elif self.sid and data:  # else the response came first and the stream is over: the rest goes nowhere
            self.conn.h2.queue_data(self.sid, data)  # sent when the connection writes (its end on the last frame)
        self._moved()
        return b""

    def send_end(self, trailers: Headers | tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
        if self.our_state is State.DONE:  # the head said there is no body
            return b""
        self.our_state = State.DONE
        if self.waiting is not None:
            self.waiting.append(EndOfMessage(tuple(trailers)))
        elif self.sid:
            self.conn.h2.queue_data(self.sid, b"", end=True, trailers=[(n.lower(), v) for n, v in trailers] or None)
        self._moved()
        return b""

    def receive_data(self, data: bytes) -> list[Event]:
        """The response's events since the last call (``data`` is the I/O side's token; ``b""``: the leg ended)."""
        events, self.events = self.events, []
        if not data and self.broken and self.their_state is State.BODY:
            raise BadMessage("the upgraded stream failed during its response")
        return events

    def start_next_cycle(self) -> None:
        self.our_state = self.their_state = State.IDLE
        self.method = b""
        self.events = []

    def _moved(self) -> None:
        """Request bytes were queued: the connection sends them, and the I/O side looks at what waits."""
        self.sending = True
        conn = self.conn
        conn.unsent = True
        conn.touched.append(self)
        if not conn.woken:
            conn.woken = True
            conn.on_output()

    # -- from the I/O side -----------------------------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        h2 = self.conn.h2
        for sid, n in self.owed.items():
            h2.ack(sid, n)
        self.owed.clear()

    def close(self) -> None:
        """The core is done with this connection: a stream still in hand is reset (CANCEL)."""
        if self.closed:
            return
        self.closed = True
        self._end_stream()
        self.conn.leg_closed(self)

    # -- from the connection -------------------------------------------------------------------------------------

    def started(self) -> None:
        """A stream slot is free: the waiting request goes out."""
        waiting = self.waiting
        assert waiting is not None
        self.waiting = None
        conn = self.conn
        h2 = conn.h2
        sid = h2.next_sid
        headers, ended = waiting[0], waiting[1]
        if not h2.send_headers(sid, headers, end_stream=ended):
            self._break()
            return
        self.sid = sid
        conn.streams[sid] = self
        if ended:
            return
        for event in waiting[2:]:
            if isinstance(event, Body):
                h2.queue_data(sid, event.data)
            else:
                h2.queue_data(sid, b"", end=True, trailers=[(n.lower(), v) for n, v in event.trailers] or None)
        conn.unsent = True

    # One method per kind of stream event (``UpgradeConnection.receive`` dispatches by type). The end of the
    # response is carried by the event whose frame ended it (``stream_ended``), so the codec's own
    # ``StreamEnded`` that follows finds the stream forgotten: one call per frame.

    def on_response(self, event: h2e.ResponseReceived) -> None:
        self.their_state = State.BODY
        self.events.append(h1_response(event.headers, self.method))
        if event.stream_ended is not None:
            self._response_end(_END)

    def on_data(self, event: h2e.DataReceived) -> None:
        if event.data:
            self.events.append(Body(event.data))
        n = event.flow_controlled_length
        if n:
            if self.paused:
                self.owed[event.stream_id] = self.owed.get(event.stream_id, 0) + n
            else:
                self.conn.h2.ack(event.stream_id, n)
        if event.stream_ended is not None:
            self._response_end(_END)

    def on_trailers(self, event: h2e.TrailersReceived) -> None:
        self._response_end(EndOfMessage(tuple(event.headers)))  # trailers always end the stream

    def on_informational(self, event: h2e.InformationalResponseReceived) -> None:
        fields = tuple((n, v) for n, v in event.headers if n[:1] != b":")
        status = int(dict(event.headers)[b":status"])
        self.events.append(ResponseHead(status, fields, _REASONS.get(status, b"")))

    def on_reset(self, event: h2e.StreamReset) -> None:
        self._break(event.error_code)

    def _response_end(self, end: EndOfMessage) -> None:
        self.their_state = State.DONE
        self.events.append(end)
        sid = self.sid
        conn = self.conn
        if self.our_state is not State.DONE or (self.body and conn.h2.pending(sid)):
            conn.h2.reset(sid)  # the response came before the whole request: the rest is not sent
        conn.forget(self)

    def _break(self, reset: int | None = None) -> None:
        """The stream failed (``reset``: with that HTTP/2 error code), or could not be opened."""
        if self.broken:
            return
        self.broken = True
        self.reset = reset
        self._end_stream()
        self.conn.touched.append(self)

    def _end_stream(self) -> None:
        """No more of the request goes: a waiting one is dropped, a stream in hand reset (CANCEL)."""
        self.waiting = None
        if self.sid:
            self.conn.h2.reset(self.sid)
            self.conn.forget(self)


class UpgradeConnection:
    """One HTTP/2 client connection to an h2-hinted peer proxy, carrying the ``Leg``s of every client
    connection to it; see the module docstring."""

    def __init__(self, params: Http2Params = DEFAULT_PARAMS) -> None:
        self.h2 = H2Endpoint(client=True, params=params)
        self.h2.initiate()
        # Called when a leg queued frames from outside ``receive`` (the core sending): the I/O side writes them
        # soon, once for all that queued meanwhile. ``woken``: it was called and the I/O side has not written
        # since (``data_to_send``), so a leg need not call it again.
        self.on_output: Callable[[], object] = _nothing
        self.woken = False
        self.streams: dict[int, Leg] = {}
        self.queued: deque[Leg] = deque()  # requests waiting for a stream slot (MAX_CONCURRENT_STREAMS)
        self.legs = 0  # legs not closed
        self.touched: list[Leg] = []  # legs with bytes for the core, or broken, since ``take_touched``
        # Data or a stream's end was queued, or a window opened, since the last flush: a flush may send something
        # (checked before flushing: most requests queue nothing, their HEADERS go at once).
        self.unsent = False
        self.failed = False
        self.usable = True  # new legs may use it: not failed, no GOAWAY received (kept, not computed: asked often)
        self.pings = 0  # keep-alive PINGs sent and not answered

    def leg(self) -> Leg:
        self.legs += 1
        return Leg(self)

    def take_touched(self) -> list[Leg]:
        """The legs that moved since the last call (what the windows allow of what the legs queued is sent
        first: the legs whose bytes went are touched too)."""
        if self.unsent:
            self._flush()
        touched, self.touched = self.touched, []
        return list(dict.fromkeys(touched)) if len(touched) > 1 else touched

    def data_to_send(self) -> bytes:
        """The bytes for the peer: the I/O side writes them (``woken`` is over)."""
        if self.unsent:
            self._flush()
        self.woken = False
        h2 = self.h2
        return h2.data_to_send() if h2.out or h2.recv_processed else b""  # (see H2Endpoint.data_to_send)

    def _flush(self) -> None:
        """Send what the windows allow of what the legs queued; the legs whose bytes went are touched."""
        self.unsent = False
        streams = self.streams
        for sid in self.h2.flush():
            leg = streams.get(sid)
            if leg is not None:
                self.touched.append(leg)

    def forget(self, leg: Leg) -> None:
        """``leg``'s stream is over (reset by the leg, or ended: nothing of it is queued in the codec)."""
        sid = leg.sid
        if sid:
            self.streams.pop(sid, None)
            leg.owed.pop(sid, None)
            leg.sid = 0
        if self.queued:
            self._start_queued()

    def leg_closed(self, leg: Leg) -> None:
        self.legs -= 1
        if leg in self.queued:
            self.queued.remove(leg)

    def _start_queued(self) -> None:
        queued = self.queued
        while queued and self.h2.can_open_stream():
            leg = queued.popleft()
            if leg.waiting is not None:
                leg.started()
                self.touched.append(leg)

    def receive(self, data: bytes) -> None:
        """Bytes from the peer proxy; what they mean for the legs is in ``take_touched``."""
        if self.failed:
            return
        try:
            events = self.h2.receive_data(data)
        except H2ProtocolError as exc:
            self.lost(exc.error_code)
            return
        streams = self.streams
        touched = self.touched
        for event in events:
            on = _ON_STREAM_EVENT.get(type(event))
            if on is not None:
                leg = streams.get(event.stream_id)  # type: ignore[attr-defined]
                if leg is not None:
                    on(leg, event)
                    touched.append(leg)
            elif isinstance(event, (h2e.WindowUpdated, h2e.RemoteSettingsChanged)):
                self.unsent = True
                if isinstance(event, h2e.RemoteSettingsChanged) and self.queued:
                    self._start_queued()
            elif isinstance(event, h2e.PingAckReceived):
                self.pings = 0
            elif isinstance(event, h2e.GoAway):
                if event.error_code:  # a connection error: the peer closes, nothing more will come
                    self.lost(event.error_code)
                    return
                self._goaway(event)

    def _goaway(self, event: h2e.GoAway) -> None:
        """Streams the peer did not take fail (the core may send them again); those it took may finish."""
        self.usable = False
        for sid, leg in list(self.streams.items()):
            if sid > event.last_stream_id:
                leg._break(event.error_code)  # noqa: SLF001
        while self.queued:
            self.queued.popleft()._break()  # noqa: SLF001

    def lost(self, error_code: int | None = None) -> None:
        """The connection is gone (closed; or a connection error, ``error_code``, ours or the peer's): every
        stream fails."""
        self.failed = True
        self.usable = False
        for leg in list(self.streams.values()):
            leg._break(error_code)  # noqa: SLF001
        while self.queued:
            self.queued.popleft()._break()  # noqa: SLF001

    def ping(self) -> None:
        """A keep-alive PING (discovery's ``WeightedAddr.http2.keep_alive``); ``pings`` until answered."""
        self.pings += 1
        self.h2.ping()

    def end(self) -> None:
        """We close it (idle): GOAWAY first."""
        self.h2.goaway()
        self.failed = True
        self.usable = False


# The stream events a leg takes (see ``Leg.on_response``); ``StreamEnded`` is not one.
_ON_STREAM_EVENT: dict[type, Callable[[Leg, Any], None]] = {
    h2e.ResponseReceived: Leg.on_response,
    h2e.DataReceived: Leg.on_data,
    h2e.TrailersReceived: Leg.on_trailers,
    h2e.InformationalResponseReceived: Leg.on_informational,
    h2e.StreamReset: Leg.on_reset,
}


def _nothing() -> None:
    """No one to tell."""
