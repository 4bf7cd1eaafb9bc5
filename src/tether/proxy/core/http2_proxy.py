"""The HTTP/2 proxy of one client connection, push-driven: bytes in from callbacks, writes out through a sink.

``Http2Proxy`` is a plain class (sans-IO, no asyncio), the HTTP/2 twin of
``core.http1_proxy.Http1Proxy``. The I/O side (``io.http2_io``) calls it from
the transports' callbacks -- ``down_data``/``down_lost`` for the accepted
connection, ``up_data``/``up_eof`` for its upstream connections,
``writable`` when a write buffer fills or drains -- and it answers by calling
its ``Http2Sink``. Frames are ``codec.http2.H2Endpoint``'s (Tether's own
HTTP/2 connection, with send buffers flushed within the windows). Only what has to wait
goes async and comes back by a callback: a discovery wait, a connect, a
route's timeout, the keep-alive's PING.

Each **stream** (one request and its response) is routed on its own, through
the same ``Router`` as HTTP/1 (``RequestHead(method, :path, headers, b"2")``,
``Host`` from ``:authority``), with what every exchange shares written once in
``core.exchange`` (load shedding and the request policy, profile routes'
retries and timeouts, metrics) and ``core.http`` (the ``l5d-*`` rules). Its
progress is a ``Phase``, moved only through ``TRANSITIONS`` (one table):

    ROUTING --PICKED--> CONNECTING --OPENED--> WAITING --HEAD--> RELAYING --END--> ENDING --DONE--> OVER
    ROUTING/CONNECTING/WAITING --RETRY--> ROUTING        (another endpoint, a profile retry, not processed)
    ROUTING/CONNECTING/WAITING/RELAYING --ANSWER--> ENDING   (the proxy answers: an error, the route's timeout)
    any --RESET--> OVER                                   (a reset either way; the client gone)

The request half runs beside it (full duplex): what the client sends goes on
as it comes once the upstream stream is open, is held before that (within
the client's window), and is dropped (``discard``) once the upstream leg is
gone.

Upstream, streams to one endpoint share one HTTP/2 connection (prior
knowledge; mTLS and the transport header as the endpoint says), **per client
connection** (closed with it); a stream waits for a free slot at the
endpoint's ``MAX_CONCURRENT_STREAMS``; a connect failure tries another
endpoint, three times in all; an endpoint's GOAWAY sends new streams to a new
connection. Inbound with ``downgrade``, a stream carrying ``l5d-orig-proto:
HTTP/1.x`` (a linkerd2-proxy upgraded it, proxy.md §7.7) goes to the app as
HTTP/1 on a pooled connection, and its response comes back as HTTP/2.

Flow control is the peers' own: bytes received on one side are acknowledged
to their sender only once written to the other side, within that side's
window, so the proxy holds at most the windows it advertised; data for a
connection whose write buffer is full is held until it drains. An HTTP/1
app (downgrade) has no window: it is not read while ``H1_BACKLOG`` bytes of
its response wait for the client's window.

Resets pass through with their code (REFUSED_STREAM before any response is
sent again, once, when the request can be; so is a stream above an upstream
GOAWAY's last stream ID, which the server did not process either). Rapid reset (CVE-2023-44487):
a stream reset in the same read as its HEADERS is never started, and past
``HttpSettings.h2_max_pending_resets`` streams reset before their response the connection
ends with GOAWAY(ENHANCE_YOUR_CALM). Keep-alive: with
``HttpSettings.h2_keep_alive``, a silent client gets a PING and, without an
answer in time, GOAWAY; with an endpoint's keep-alive from discovery
(``Connect.h2_keep_alive``), a silent endpoint gets a PING and, without an
answer in time, its connection is closed and its streams fail.

The proxy's graceful shutdown (``drain``): GOAWAY with the largest stream ID
and a PING, then, once the PING is answered, GOAWAY with the last stream
taken (RFC 9113 §6.8); the streams in flight finish and the connection ends.
At the end of the grace period ``cut`` resets what is left.

Tests: tests/proxy/test_http2_proxy.py (playbooks: an h2 client in, sink calls out).
Callers: ``core.inbound`` and ``core.outbound`` (``http2``, their ``PROTOCOL_LAYERS`` entry for HTTP/2),
which hand the connection to ``io.driver`` with ``ServeHttp2``.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, Protocol

from tether.proxy.codec import http2_events as h2e
from tether.proxy.codec.common import LocalProtocolError
from tether.proxy.codec.http1 import (
    BadMessage,
    Body,
    EndOfMessage,
    Http1Connection,
    RequestHead,
    ResponseHead,
    Role,
    State,
)
from tether.proxy.codec.http2 import (
    MAX_STREAM_ID,
    ErrorCodes,
    GoAway,
    H2Endpoint,
    H2ProtocolError,
    Headers,
    Http2Params,
    error_name,
)
from tether.proxy.core import errors, exchange, orig_proto
from tether.proxy.core.commands import Command, Connect, Failed, Layer
from tether.proxy.core.errors import ErrorKind, ProxyError, RouteError
from tether.proxy.core.http import (
    MAX_REPLAY,
    PROXY_ERRORS,
    ClientAddr,
    HttpSettings,
    Pick,
    Router,
    mesh_request_headers,
    no_outcome,
    no_sample,
    nothing,
    strip_proxy_errors,
)
from tether.proxy.core.http_commands import ServeHttp2, Upstream
from tether.proxy.core.profiles import Route
from tether.proxy.core.retries import Settled

log = logging.getLogger(__name__)

CONNECT_ATTEMPTS = 3
H1_BACKLOG = 64 * 1024  # a downgraded response's bytes waiting for the client's window: the app is not read past it

L5D_ORIG_PROTO = b"l5d-orig-proto"
DRAIN_PING = b"drain\x00\x00\x00"  # the graceful shutdown's PING (the keep-alive's carries other data)
GRPC_STATUS = b"grpc-status"
# HTTP/1 hop-by-hop headers (RFC 9110 §7.6.1): not forwarded, and not allowed in HTTP/2.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"transfer-encoding",
                        b"upgrade", b"trailer"})


class Timer(Protocol):
    def cancel(self) -> None: ...


class Http2Sink(Protocol):
    """What the core asks of the I/O side (``io.http2_io.Http2Io``); none of it blocks."""

    def send_down(self, data: bytes) -> None:
        """Write to the client."""

    def close(self) -> None:
        """The connection is over: close the client's connection (once written) and every upstream one."""

    def connect(self, connect: Connect, header: bytes | None, done: Callable[[Upstream | Failed], None]) -> None:
        """A new upstream connection (HTTP/2, never pooled: it belongs to this client connection); ``done``
        later with it (its bytes then come to ``up_data``/``up_eof``) or ``Failed``."""

    def checkout(self, connect: Connect, header: bytes | None,
                 done: Callable[[Upstream | Failed], None]) -> Upstream | None:
        """An HTTP/1 connection (downgrade): a pooled one at once (returned), else None and ``done`` later."""

    def send_up(self, up: Upstream, data: bytes) -> None: ...

    def checkin(self, up: Upstream, reuse: bool) -> None:
        """Done with ``up``: back to the pool when ``reuse`` (HTTP/1 only), else closed."""

    def read_up(self, up: Upstream, reading: bool) -> None:
        """Stop (or resume) reading ``up`` (an HTTP/1 app whose response waits for the client's window)."""

    def wait(self, command: Command, done: Callable[[Any], None]) -> None:
        """Run a blocking command (the router's discovery ``Wait``); ``done`` gets its reply."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...

    def count(self, name: str, labels: str) -> None:
        """Add one to the counter ``name`` (``<direction>_http_errors_total``)."""


def http2(router: Router, settings: HttpSettings, *, downgrade: bool = False) -> Layer:
    """The HTTP/2 layer of a connection: the driver serves it with an ``Http2Proxy`` over its sink;
    ``downgrade``: honour ``l5d-orig-proto`` (inbound)."""
    yield ServeHttp2(router, settings, downgrade)


class Phase(enum.Enum):
    # Members are singletons compared by identity: hashing them so is exact, and a C call where Enum's own
    # __hash__ is a Python one (TRANSITIONS is looked up a few times per stream).
    __hash__ = object.__hash__

    ROUTING = "routing"  # asking the router (maybe waiting for discovery)
    CONNECTING = "connecting"  # picked: waiting for the endpoint's connection, or a free stream on it
    WAITING = "waiting"  # the request is going up; no response head yet
    RELAYING = "relaying"  # the response head went to the client; the rest follows as it comes
    ENDING = "ending"  # the response's end is queued to the client (an answer, or the upstream's end)
    OVER = "over"


class Step(enum.Enum):
    __hash__ = object.__hash__  # as Phase's

    PICKED = "picked"  # the router chose an endpoint
    OPENED = "opened"  # the upstream stream (or HTTP/1 request) went out
    RETRY = "retry"  # this attempt is over; the request is routed again
    HEAD = "head"  # the final response head went to the client
    END = "end"  # the response's end is queued to the client
    ANSWER = "answer"  # the proxy answers for the stream (no more from upstream)
    DONE = "done"  # both halves are through
    RESET = "reset"  # reset either way, or the connection gone


_P = Phase
TRANSITIONS: dict[tuple[Phase, Step], Phase] = {
    (_P.ROUTING, Step.PICKED): _P.CONNECTING,
    (_P.CONNECTING, Step.OPENED): _P.WAITING,
    (_P.WAITING, Step.HEAD): _P.RELAYING,
    (_P.RELAYING, Step.END): _P.ENDING,
    (_P.ENDING, Step.DONE): _P.OVER,
    **{(p, Step.RETRY): _P.ROUTING for p in (_P.ROUTING, _P.CONNECTING, _P.WAITING)},
    **{(p, Step.ANSWER): _P.ENDING for p in (_P.ROUTING, _P.CONNECTING, _P.WAITING, _P.RELAYING)},
    **{(p, Step.RESET): _P.OVER for p in (_P.ROUTING, _P.CONNECTING, _P.WAITING, _P.RELAYING, _P.ENDING)},
}
_BEFORE_HEAD = (_P.ROUTING, _P.CONNECTING, _P.WAITING)
_TIMED = (*_BEFORE_HEAD, _P.RELAYING)  # the phases a stream's route timers (timeout, idle) apply in
# A stream moves only by ``stream.phase = TRANSITIONS.get((stream.phase, step)) or _illegal(stream, step)``: the
# lookup is written where the stream moves, not in a method, as every stream moves at least five times (five
# Python calls per stream saved); a step the table does not allow from the phase raises.


def _illegal(stream: _Stream, step: Step) -> Phase:
    """``step`` is not allowed from ``stream``'s phase: a bug of this core (``LocalProtocolError``)."""
    raise LocalProtocolError(f"HTTP/2 stream {stream.sid}: {step.value} while {stream.phase.value}")


class _KeepAlive:
    """HTTP/2 keep-alive of one connection: a PING once the peer has been silent for ``interval`` (only while
    ``busy()``, if given), and ``dead()`` when no byte answers it within ``timeout`` -- as hyper's keep-alive
    does for linkerd2-proxy, towards its clients and its endpoints. ``done()`` ends each timer callback."""

    __slots__ = ("interval", "timeout", "clock", "call_later", "ping", "dead", "done", "busy", "heard_at", "pinged",
                 "timer")

    def __init__(self, interval: float, timeout: float, clock: Callable[[], float],
                 call_later: Callable[[float, Callable[[], None]], Timer], ping: Callable[[], None],
                 dead: Callable[[], None], done: Callable[[], None], busy: Callable[[], bool] | None = None) -> None:
        self.interval = interval
        self.timeout = timeout
        self.clock = clock
        self.call_later = call_later
        self.ping = ping
        self.dead = dead
        self.done = done
        self.busy = busy
        self.heard_at = clock()  # when the peer last sent a byte
        self.pinged = False  # a PING is out, unanswered
        self.timer: Timer | None = call_later(interval, self._check)

    def heard(self) -> None:
        """The peer sent something (a PING's ACK, or anything else)."""
        self.heard_at = self.clock()
        if self.pinged:
            self.pinged = False
            if self.timer is not None:
                self.timer.cancel()
            self._next()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check(self) -> None:
        self._next()
        self.done()

    def _next(self) -> None:
        now = self.clock()
        if self.pinged:
            self.timer = None
            log.debug("HTTP/2 peer did not answer a keep-alive PING within %ss", self.timeout)
            self.dead()
        elif now >= self.heard_at + self.interval and (self.busy is None or self.busy()):
            self.ping()
            self.pinged = True
            self.timer = self.call_later(self.timeout, self._check)
        else:
            due = self.heard_at + self.interval - now  # overdue here: not busy, so look again in an interval
            self.timer = self.call_later(due if due > 0 else self.interval, self._check)


class _Up:
    """An HTTP/2 connection to one endpoint, shared by this client connection's streams to it."""

    __slots__ = ("key", "ep", "io", "addr", "streams", "waiting", "draining", "keep_alive", "keep_alive_params")

    def __init__(self, key: object, addr: object, params: Http2Params,
                 keep_alive: tuple[float, float, bool] | None) -> None:
        self.key = key
        self.addr = addr
        self.keep_alive_params = keep_alive  # the endpoint's (interval, timeout, while idle), from discovery
        self.ep = H2Endpoint(client=True, params=params)
        self.ep.initiate()  # the preface waits in the endpoint until the connection is up
        self.io: Upstream | None = None  # None while connecting
        self.streams: dict[int, _Stream] = {}  # upstream stream id -> stream
        self.waiting: deque[_Stream] = deque()  # streams waiting for the connection, or for a free stream
        self.draining = False  # it sent GOAWAY: no new streams
        self.keep_alive: _KeepAlive | None = None  # with the endpoint's keep-alive (Connect.h2_keep_alive)


class _H1:
    """An HTTP/1.1 connection to the app carrying one downgraded request (``l5d-orig-proto``)."""

    __slots__ = ("io", "codec", "out", "chunked", "replayable", "eof", "paused")

    def __init__(self, io: Upstream, codec: Http1Connection, replayable: bool) -> None:
        self.io = io
        self.codec = codec  # the connection's (Upstream.codec), kept across its requests
        self.out = bytearray()  # bytes to write when the callback returns
        self.chunked = False  # the request body is chunked (so it may end with trailers)
        self.replayable = replayable  # no request body: can be sent again if a pooled connection was stale
        self.eof = False
        self.paused = False  # not read: H1_BACKLOG bytes of its response wait for the client's window


class _Stream:
    """One client stream and where it went: its request, its upstream leg, and what is still owed."""

    __slots__ = ("sid", "phase", "method", "path", "authority", "scheme", "headers", "grpc", "orig_proto", "start",
                 "attempts", "pick", "counted", "recorded", "up", "usid", "h1", "req_buf", "req_end",
                 "req_trailers", "req_sent", "discard", "owed_down", "owed_up", "status", "grpc_status",
                 "head_ended", "resp_trailers", "sampled", "reset_after", "in_flight", "route", "route_labels",
                 "timer", "kept", "kept_size", "skip_ack", "timed_out", "route_recorded", "body_seen", "refused",
                 "routing", "error", "head", "backoff", "attempt", "idle", "active", "idled", "unwatch", "sent",
                 "frames")

    def __init__(self, sid: int, pseudo: dict[bytes, bytes], headers: Headers, start: float) -> None:
        self.sid = sid
        self.phase = Phase.ROUTING
        self.method = pseudo.get(b":method", b"")
        self.path = pseudo.get(b":path", b"")
        self.authority = pseudo.get(b":authority", b"")
        self.scheme = pseudo.get(b":scheme", b"http")
        self.headers = headers  # the regular headers, as received
        self.grpc = False
        for name, value in headers:  # (a loop: this runs for every stream, and a generator costs more)
            if name == b"content-type":
                self.grpc = value.startswith(b"application/grpc")
                break
        self.orig_proto: bytes | None = None  # inbound: the request is downgraded to this HTTP/1 version
        self.start = start
        self.attempts = 0  # failed connects of this attempt
        self.routing: Generator[Command, Any, Pick | ProxyError] | None = None  # the router, while it waits
        self.in_flight = False  # placed in the direction's InFlight (core.exchange.admit)
        self.pick: Pick | None = None
        self.frames: Callable[[float], None] | None = None  # the policy route's request frame sizes
        self.counted = False  # request_total recorded
        self.recorded = False  # response_total recorded
        self.up: _Up | None = None
        self.usid: int | None = None
        self.h1: _H1 | None = None
        self.req_buf: deque[bytes] = deque()  # request data not yet handed to the upstream leg
        self.req_end = False  # the client ended its request
        self.req_trailers: Headers | None = None
        self.req_sent = False  # the request's end was handed to the upstream leg
        self.discard = False  # the upstream leg is gone for good: request data from now on is dropped
        self.owed_down = 0  # request bytes received, not yet acknowledged to the client
        self.owed_up = 0  # response bytes received, not yet acknowledged to the upstream
        self.status: int | None = None  # the response status sent to the client
        self.grpc_status: int | None = None
        self.head_ended = False  # the response's end was carried by its headers
        self.resp_trailers: Headers | None = None
        self.sent = 0  # response body bytes relayed to the client (tap's response_end)
        self.sampled = False  # the endpoint's latency sample was taken (or there is none to take: see _sample)
        self.reset_after: int | None = None  # reset the client's stream with this code once the response is out
        # A ServiceProfile route (proxy.md §7.5, §7.6): see Http2Proxy._route_step.
        self.route: Route | None = None  # the route of the first pick: its timeout, retries and route_* series
        self.route_labels = ""
        self.timer: Timer | None = None  # the route's timeout, until the response head
        self.backoff: Timer | None = None  # a client policy retry's backoff, before it is routed again
        self.attempt: Timer | None = None  # a client policy rule's per-attempt timeout, until the response head
        self.idle: Timer | None = None  # a client policy rule's idle timeout, until the stream is over
        self.active = 0.0  # when a frame of this stream last came either way (the idle timeout's reference)
        self.idled = False  # the idle timeout ended it (its route metrics say IDLE_TIMEOUT)
        self.kept: list[bytes] | None = None  # the request body kept for a retry (None: not kept, or too large)
        self.kept_size = 0
        self.skip_ack = 0  # bytes of a retry's request already acknowledged to the client (sent again as kept)
        self.timed_out = False
        self.route_recorded = False  # route_response_total recorded
        self.body_seen = False  # request body bytes came (a bodiless request can always be sent again)
        self.refused = False  # an upstream refused it once (REFUSED_STREAM): sent again, once
        self.error: ProxyError | None = None  # what the proxy answered, if it did (for the observer)
        self.head: RequestHead | None = None
        self.unwatch: Callable[[], None] | None = None  # a CONNECT tunnel's policy watch (Http2Proxy._tunnel)

    def request_head(self) -> RequestHead:
        """The request as the router, the policy and tap see it: ``Host`` from ``:authority``, which wins over a
        ``host`` header when both came (RFC 9113 §8.3.1; linkerd2-proxy routes and labels by the URI's)."""
        head = self.head
        if head is None:
            headers = tuple(self.headers)
            if self.authority:
                for name, _ in headers:
                    if name == b"host":
                        headers = tuple(h for h in headers if h[0] != b"host")
                        break
                headers = ((b"host", self.authority),) + headers
            head = self.head = RequestHead(self.method, self.path, headers, b"2")
        return head


class Http2Proxy:
    """One accepted HTTP/2 connection (see the module docstring), answering through ``sink``."""

    def __init__(self, router: Router, settings: HttpSettings, sink: Http2Sink, *, downgrade: bool = False,
                 client: ClientAddr | None = None) -> None:
        self.router = router
        self.client = client  # the connection's peer, for tap
        self.settings = settings
        self.sink = sink
        self.downgrade = downgrade
        self.down = H2Endpoint(client=False, params=settings.h2_server)
        self.streams: dict[int, _Stream] = {}  # client stream id -> stream
        self.ups: dict[object, _Up] = {}  # endpoint (address, TLS) -> the connection new streams open on
        self.live: dict[Upstream, _Up] = {}  # every connected HTTP/2 upstream
        self.h1s: dict[Upstream, _Stream] = {}  # downgraded requests' HTTP/1 connections
        self.blocked: set[Upstream | None] = set()  # connections whose write buffer is full (None: the client)
        self.touched: list[_Stream] = []  # streams that may be through, checked when the callback returns
        self.closing = False  # the client sent GOAWAY: finish the streams in flight, then close
        self.draining = False  # the proxy is shutting down: our first GOAWAY (all streams taken) and PING are out
        self.goaway_final = False  # the GOAWAY naming the last stream taken is out (see ``drain``)
        self.ended = False  # the connection is to end when the callback returns
        self.over = False
        self.resets = 0  # streams reset by the client before their response head (settings.h2_max_pending_resets)
        self.keep_alive: _KeepAlive | None = None  # with settings.h2_keep_alive

    # -- the client's connection ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Our SETTINGS (and the connection window) go out; the keep-alive starts."""
        self.down.initiate()
        keep_alive = self.settings.h2_keep_alive
        if keep_alive is not None:
            self.keep_alive = _KeepAlive(*keep_alive, self.settings.clock, self.sink.call_later, self.down.ping,
                                         self._client_silent, self._after)
        self._after()

    def down_data(self, data: bytes) -> None:
        if self.over:
            return
        if not data:
            self.down_lost()
            return
        if self.keep_alive is not None:
            self.keep_alive.heard()
        self._from_down(data)
        self._after()

    def down_lost(self) -> None:
        """The client closed or is gone, and its streams with it."""
        if not self.over:
            self.ended = True
            self._after()

    def writable(self, up: Upstream | None, writable: bool) -> None:
        """A connection's write buffer filled (``writable`` False) or drained (None: the client's)."""
        if self.over:
            return
        if not writable:
            self.blocked.add(up)  # data for it is held from now on (nothing to write now: no _after)
            return
        if writable:
            self.blocked.discard(up)
            if up is None:
                self._flush_down()
            else:
                live = self.live.get(up)
                if live is not None:
                    self._flush_up(live)
                stream = self.h1s.get(up)
                if stream is not None:
                    self._push_h1(stream)
        else:
            self.blocked.add(up)
        self._after()

    def _after(self) -> None:
        """The end of every callback: streams that are through finish, writes go out, the end is done."""
        while self.touched and not self.ended:
            touched, self.touched = self.touched, []
            for stream in touched:
                # Through: the response's end went to the client, and the request's end to the upstream (or
                # nowhere: discarded). Written here, not called: once per stream and more.
                if stream.phase is not Phase.ENDING or self.down.pending(stream.sid):
                    continue
                up = stream.up
                if stream.discard or (stream.req_sent and (stream.usid is None or up is None
                                                           or not up.ep.pending(stream.usid))):
                    self._finish(stream, Step.DONE)
        if self.closing and not self.streams and not self.ended:
            if not self.goaway_final:
                self.down.goaway(ErrorCodes.NO_ERROR)
            self.ended = True
        # Each connection's bytes, asked of its endpoint only when it may have some (see
        # ``H2Endpoint.data_to_send``): a callback moves one or two of them, not every one (a call less for each).
        sink = self.sink
        down = self.down
        if down.out or down.recv_processed:
            data = down.data_to_send()
            if data:
                sink.send_down(data)
        if self.ended:
            self._end()
            return
        for io, up in self.live.items():
            ep = up.ep
            if ep.out or ep.recv_processed:
                data = ep.data_to_send()
                if data:
                    sink.send_up(io, data)
        for io, stream in self.h1s.items():
            h1 = stream.h1
            if h1 is not None and h1.out:
                sink.send_up(io, bytes(h1.out))
                h1.out.clear()

    def _end(self) -> None:
        self.over = True
        if self.keep_alive is not None:
            self.keep_alive.cancel()
            self.keep_alive = None
        for up in self.live.values():
            if up.keep_alive is not None:
                up.keep_alive.cancel()
                up.keep_alive = None  # (it refers back to this core)
        for io in [*self.live, *self.h1s]:
            self.sink.checkin(io, reuse=False)
        self.live.clear()
        self.h1s.clear()
        for stream in list(self.streams.values()):
            self._release(stream)
            if self.settings.observer is not None:
                self._tell_end(stream)
        self.streams.clear()
        self.sink.close()

    def _from_down(self, data: bytes) -> None:
        try:
            events = self.down.receive_data(data)
        except H2ProtocolError:
            self.ended = True  # the codec queued the GOAWAY with the error's code; _after writes it
            return
        # A stream reset in the same read as its HEADERS is never started: nothing goes upstream for it. (The
        # set only when a read has a reset: most have none, and an empty set per read is an object made and freed.)
        reset: set[int] | None = None
        for event in events:  # (a loop, not a set comprehension: a call less per read)
            if isinstance(event, h2e.StreamReset):
                if reset is None:
                    reset = set()
                reset.add(event.stream_id)
        for event in events:
            if self.ended:
                return
            if isinstance(event, h2e.RequestReceived):
                if reset is not None and event.stream_id in reset:
                    self._early_reset()
                else:
                    self._request(event)
            elif isinstance(event, h2e.DataReceived):
                self._request_data(event)
            elif isinstance(event, h2e.TrailersReceived):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.req_trailers = event.headers  # (the codec's copy, the event's to keep: not copied again)
            elif isinstance(event, h2e.StreamEnded):
                stream = self.streams.get(event.stream_id)
                if stream is not None and not stream.req_end:
                    stream.req_end = True
                    self._forward_request(stream)
            elif isinstance(event, h2e.StreamReset):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    self._client_reset(stream, event.error_code)
            elif isinstance(event, (h2e.WindowUpdated, h2e.RemoteSettingsChanged)):
                self._flush_down()
            elif isinstance(event, GoAway):
                if event.error_code:
                    self.ended = True
                else:
                    self.closing = True
            elif isinstance(event, h2e.PingAckReceived):
                if self.draining and event.ping_data == DRAIN_PING:
                    self._drain_acked()

    def _request(self, event: h2e.RequestReceived) -> None:
        pseudo: dict[bytes, bytes] = {}
        regular: Headers = []
        orig = None  # the first l5d-orig-proto, found in the same pass
        for name, value in event.headers:
            if name[:1] == b":":
                pseudo[name] = value
            else:
                regular.append((name, value))
                if name == L5D_ORIG_PROTO and orig is None:
                    orig = value
        stream = _Stream(event.stream_id, pseudo, regular, self.settings.clock())
        if self.downgrade and orig is not None and orig.upper().startswith(b"HTTP/1"):
            stream.orig_proto = orig
        stream.req_end = event.stream_ended is not None
        self.streams[stream.sid] = stream
        head = stream.request_head()
        if self.settings.observer is not None:
            self.settings.observer.begin(stream, head, self.client, self.settings.client_id)
        stream.in_flight, refusal, edit = exchange.admit(self.settings, head)
        if refusal is not None:
            self._fail(stream, refusal)
            return
        if edit is not None:  # a route's header modifier (names as HTTP/2 wants them)
            stream.headers = [(n.lower(), v) for n, v in edit(tuple(stream.headers))]
            stream.head = None
            head = stream.request_head()
        self._route_step(stream, self.router(head), None)  # (_route's step, with the head at hand: calls less)

    def _request_data(self, event: h2e.DataReceived) -> None:
        sid = event.stream_id
        data = event.data
        stream = self.streams.get(sid)
        if stream is None or stream.discard or stream.req_sent:
            self.down.ack(sid, event.flow_controlled_length)  # nowhere to go: dropped
            return
        if event.flow_controlled_length > len(data):  # padding (the call only when there is some)
            self.down.ack(sid, event.flow_controlled_length - len(data))
        if stream.idle is not None:  # a frame of the stream: its idle timeout starts over
            stream.active = self.settings.clock()
        if data:
            stream.body_seen = True
            if stream.frames is not None:
                stream.frames(len(data))
            stream.req_buf.append(data)
            stream.owed_down += len(data)
            if stream.kept is not None:
                self._keep(stream, data)
        if event.stream_ended is not None:
            stream.req_end = True
        self._forward_request(stream)

    def _forward_request(self, stream: _Stream) -> None:
        """Hand what the client sent to the upstream leg (if there is one yet)."""
        if stream.discard:
            self._drop_request(stream)
        elif stream.usid is not None:
            up = stream.up
            assert up is not None
            ep = up.ep
            buf = stream.req_buf
            while len(buf) > 1:
                ep.queue_data(stream.usid, buf.popleft())
            # The last chunk and the request's end in one call (a gRPC request's message and end: a call less).
            ending = stream.req_end and not stream.req_sent
            if buf or ending:
                ep.queue_data(stream.usid, buf.popleft() if buf else b"", end=ending,
                              trailers=stream.req_trailers if ending else None)
                if ending:
                    stream.req_sent = True
            self._flush_up(up, stream.usid)
        elif stream.h1 is not None:
            self._push_h1(stream)

    def _drop_request(self, stream: _Stream) -> None:
        if stream.owed_down:
            self.down.ack(stream.sid, stream.owed_down)
            stream.owed_down = 0
        stream.req_buf.clear()

    def _early_reset(self) -> None:
        """A stream the client reset before its response head: past ``h2_max_pending_resets``, GOAWAY
        (ENHANCE_YOUR_CALM) and the connection ends; the other connections go on being served."""
        self.resets += 1
        if self.resets > self.settings.h2_max_pending_resets:
            log.info("HTTP/2 client reset %d streams before their responses: GOAWAY(ENHANCE_YOUR_CALM)",
                     self.resets)
            self.sink.count(f"{self.settings.direction}_http_errors_total",
                            exchange.error_labels(self.settings, "rapid reset"))
            self.down.goaway(ErrorCodes.ENHANCE_YOUR_CALM)
            self.ended = True

    def _client_reset(self, stream: _Stream, code: int) -> None:
        """The client reset its stream: the upstream one is reset with the same code (its work cancelled)."""
        if stream.status is None:
            self._early_reset()
        if stream.up is not None and stream.usid is not None:
            stream.up.ep.reset(stream.usid, code)
        self._reset_down(stream, code, by_client=True)

    def _flush_down(self, sid: int | None = None) -> None:
        """Send the client what its windows allow; acknowledge what went to the upstream it came from.

        Held while the client's connection has a full write buffer: the data
        stays queued (and unacknowledged, so its source soon stops).
        """
        if None in self.blocked:
            return
        for stream_id, n in self.down.flush(sid).items():
            stream = self.streams.get(stream_id)
            if stream is None:
                continue
            self.touched.append(stream)
            if n and stream.up is not None and stream.usid is not None:
                stream.up.ep.ack(stream.usid, n)
                stream.owed_up -= n
            h1 = stream.h1
            if h1 is not None and h1.paused and self.down.buffered(stream_id) < H1_BACKLOG:
                h1.paused = False
                self.sink.read_up(h1.io, True)

    # -- routing and connecting -----------------------------------------------------------------------------------

    def _route(self, stream: _Stream) -> None:
        self._route_step(stream, self.router(stream.request_head()), None)

    def _route_step(self, stream: _Stream, gen: Generator[Command, Any, Pick | ProxyError], reply: Any) -> None:
        if stream.phase is not Phase.ROUTING or self.over:
            gen.close()  # over, or answered (a route's timeout) meanwhile
            return
        try:
            command = gen.send(reply)
        except StopIteration as stop:
            stream.routing = None
            result: Pick | ProxyError = stop.value
        else:
            stream.routing = gen
            self.sink.wait(command, lambda answer: self._waited(stream, gen, answer))
            return
        # Routed (here, not in a method of its own: a call less per stream).
        if result.route is not None and stream.route is None:
            self._route_begun(stream, result.route)
        if isinstance(result, ProxyError):
            self._fail(stream, result)
            return
        stream.pick = result
        stream.sampled = result.observe is no_sample  # no balancer to feed (inbound): nothing to sample
        if stream.frames is None and result.request_frames is not None:
            frames = stream.frames = result.request_frames
            for chunk in stream.req_buf:  # the body that came before the pick
                frames(len(chunk))
        if not stream.counted:
            stream.counted = True
            if self.settings.metrics is not None:
                self.settings.metrics.request(result.labels)
            if self.settings.observer is not None:  # tap (core.http.StreamObserver)
                self.settings.observer.request(stream, stream.request_head(), result.labels, self.client)
        stream.phase = TRANSITIONS.get((stream.phase, Step.PICKED)) or _illegal(stream, Step.PICKED)
        if stream.orig_proto is not None:
            self._checkout_h1(stream, result)
            return
        self._attach(stream, result)

    def _waited(self, stream: _Stream, gen: Generator[Command, Any, Pick | ProxyError], reply: Any) -> None:
        self._route_step(stream, gen, reply)
        self._after()

    def _attach(self, stream: _Stream, pick: Pick) -> None:
        """Queue ``stream`` on the endpoint's connection (opened if there is none)."""
        key = pick.connect.pool_key
        up = self.ups.get(key)
        if up is None:
            up = self.ups[key] = _Up(key, pick.connect.addr, self.settings.h2_client, pick.connect.h2_keep_alive)
            self.sink.connect(pick.connect, pick.header, lambda reply: self._connected(up, reply))
        up.waiting.append(stream)
        if up.io is not None:
            self._open_waiting(up)

    def _retry(self, stream: _Stream, error: ProxyError) -> None:
        """The endpoint could not be reached: another pick, up to ``CONNECT_ATTEMPTS``, else ``error``."""
        pick = stream.pick
        if pick is not None:
            pick.failed()
        stream.attempts += 1
        if stream.attempts >= CONNECT_ATTEMPTS:
            self._fail(stream, error)  # under the last pick's labels; released when the stream is over
            return
        if pick is not None:
            pick.release()
        stream.pick = None
        stream.phase = TRANSITIONS.get((stream.phase, Step.RETRY)) or _illegal(stream, Step.RETRY)
        self._route(stream)

    def _connected(self, up: _Up, reply: Upstream | Failed) -> None:
        if self.over:
            return
        if isinstance(reply, Failed):
            if self.ups.get(up.key) is up:
                del self.ups[up.key]
            error = errors.connect_failed(up.addr, reply.timed_out, reply.error, reply.errno)
            waiting, up.waiting = up.waiting, deque()
            if waiting and waiting[0].pick is not None:
                # Inbound: the app port is unreachable now; the streams routed again below wait for it.
                waiting[0].pick.unreachable()
            for stream in waiting:
                if stream.phase is Phase.CONNECTING:
                    self._retry(stream, error)
        else:
            up.io = reply
            self.live[reply] = up
            if up.keep_alive_params is not None:
                interval, timeout, while_idle = up.keep_alive_params
                up.keep_alive = _KeepAlive(interval, timeout, self.settings.clock, self.sink.call_later, up.ep.ping,
                                           lambda: self._up_lost(up), self._after,
                                           None if while_idle else lambda: bool(up.streams))
            self._open_waiting(up)
        self._after()

    def _open_waiting(self, up: _Up) -> None:
        while up.waiting and not up.draining and up.ep.can_open_stream():
            stream = up.waiting.popleft()
            if stream.phase is Phase.CONNECTING:
                self._open_stream(up, stream)

    def _open_stream(self, up: _Up, stream: _Stream) -> None:
        # The request's head as it goes up: its pseudo-headers, then the regular ones under the l5d-* rules. (Built
        # here, not in a method of its own: a call less per stream.)
        pick = stream.pick
        assert pick is not None
        headers: Headers = [(b":method", stream.method)]
        if stream.path:  # CONNECT has neither :scheme nor :path
            headers.append((b":scheme", stream.scheme))
        authority = stream.authority
        if not authority and not any(n == b"host" for n, _ in stream.headers):
            authority = pick.authority
        if authority:
            headers.append((b":authority", authority))
        if stream.path:
            headers.append((b":path", stream.path))
        regular = mesh_request_headers(stream.headers, pick, self.settings)
        if pick.rewrite is not None:  # a client policy's names, as HTTP/2 wants them (the codec sends them as given)
            regular = [(n.lower(), v) for n, v in regular]
        headers.extend(regular)
        usid = up.ep.next_sid
        end = stream.req_end and not stream.req_buf and not stream.req_trailers
        if not up.ep.send_headers(usid, headers, end_stream=end):
            self._fail(stream, errors.io_error(up.addr))
            return
        stream.up = up
        stream.usid = usid
        up.streams[usid] = stream
        stream.phase = TRANSITIONS.get((stream.phase, Step.OPENED)) or _illegal(stream, Step.OPENED)
        timeout = exchange.attempt_timeout(stream.route) if stream.route is not None else None
        if timeout is not None:
            stream.attempt = self.sink.call_later(timeout, lambda: self._attempt_timed_out(stream, usid, timeout))
        if end:
            stream.req_sent = True
        elif stream.req_buf or stream.req_end:  # else nothing to hand on yet (three calls less per such stream)
            self._forward_request(stream)

    def _flush_up(self, up: _Up, usid: int | None = None) -> None:
        """Send an upstream what its windows allow (not while its write buffer is full); acknowledge what went."""
        if up.io is None or up.io in self.blocked:
            return
        for stream_id, n in up.ep.flush(usid).items():
            stream = up.streams.get(stream_id)
            if stream is None:
                continue
            self.touched.append(stream)
            if stream.skip_ack:  # a retry's kept bytes: the client had them acknowledged the first time
                skip = min(n, stream.skip_ack)
                stream.skip_ack -= skip
                n -= skip
            self.down.ack(stream.sid, n)
            stream.owed_down -= n

    # -- upstream HTTP/2 ------------------------------------------------------------------------------------------

    def up_data(self, io: Upstream, data: bytes) -> None:
        if self.over:
            return
        up = self.live.get(io)
        if up is not None:
            self._from_up(up, data)
        else:
            stream = self.h1s.get(io)
            if stream is not None:
                self._from_h1(stream, data)
        self._after()

    def up_eof(self, io: Upstream) -> None:
        self.up_data(io, b"")

    def _from_up(self, up: _Up, data: bytes) -> None:
        if not data:
            self._up_lost(up)
            return
        if up.keep_alive is not None:
            up.keep_alive.heard()
        try:
            events = up.ep.receive_data(data)
        except H2ProtocolError:
            self._up_lost(up)
            return
        for i, event in enumerate(events):
            if isinstance(event, h2e.ResponseReceived):
                stream = up.streams.get(event.stream_id)
                if stream is not None:  # (the codec's copy of the headers, the event's to keep: not copied again)
                    self._response_head(stream, event.headers, event.stream_ended is not None)
            elif isinstance(event, h2e.InformationalResponseReceived):
                stream = up.streams.get(event.stream_id)
                if stream is not None and stream.status is None:
                    self.down.send_headers(stream.sid, event.headers)
            elif isinstance(event, h2e.DataReceived):
                # The stream's end next (END_STREAM on this frame, or its trailers, which end it): its StreamEnded
                # flushes this data with the end (a gRPC response's message and trailers: one flush, not two).
                after = events[i + 1] if i + 1 < len(events) else None
                self._response_data(up, event, event.stream_ended is not None or (
                    isinstance(after, h2e.TrailersReceived) and after.stream_id == event.stream_id))
            elif isinstance(event, h2e.TrailersReceived):
                stream = up.streams.get(event.stream_id)
                if stream is not None:
                    if stream.idle is not None:  # a frame of the stream: its idle timeout starts over
                        stream.active = self.settings.clock()
                    stream.resp_trailers = event.headers  # (the codec's copy: not copied again)
                    self._note_grpc_status(stream, stream.resp_trailers)
            elif isinstance(event, h2e.StreamEnded):
                stream = up.streams.get(event.stream_id)
                if stream is not None:
                    self._response_end(stream)
            elif isinstance(event, h2e.StreamReset):
                stream = up.streams.get(event.stream_id)
                if stream is not None:
                    self._upstream_reset(stream, event.error_code)
            elif isinstance(event, (h2e.WindowUpdated, h2e.RemoteSettingsChanged)):
                self._flush_up(up)
                if up.waiting:  # (the call only when a stream waits)
                    self._open_waiting(up)
            elif isinstance(event, GoAway):
                if event.error_code:
                    self._up_lost(up)  # a connection error: the peer closes, nothing more will come
                    return
                self._up_goaway(up, event)

    def _response_head(self, stream: _Stream, headers: Headers, end: bool) -> None:
        if stream.idle is not None:  # a frame of the stream: its idle timeout starts over
            stream.active = self.settings.clock()
        if not stream.sampled:
            self._sample(stream)
        # One pass (a loop, not next() over a generator): the first :status, whether a grpc-status came (most
        # heads have none: then no _note_grpc_status call, unless a modifier may have added one), and whether a
        # remote proxy's error header came (names are lowercase in HTTP/2: the codec checked; most heads have
        # none: then no strip_proxy_errors call).
        status: bytes | None = None
        grpc_status = False
        proxy_error = False
        for name, value in headers:
            if name == b":status":
                if status is None:
                    status = value
            elif name == GRPC_STATUS:
                grpc_status = True
            elif name in PROXY_ERRORS:
                proxy_error = True
        stream.status = int(status) if status is not None and status.isdigit() else 502
        self.resets = max(self.resets - 1, 0)  # a stream answered: a client that resets some is not abusive
        if proxy_error:
            headers = strip_proxy_errors(headers, self.settings)  # (it keeps grpc-status)
        pick = stream.pick
        if pick is not None and pick.respond is not None:  # a client policy route's ResponseHeaderModifier
            headers = [h for h in headers if h[0][:1] == b":"] + [
                (n.lower(), v) for n, v in pick.respond(tuple(h for h in headers if h[0][:1] != b":"))]
            grpc_status = True  # (it may have added one, or taken it away)
        if grpc_status:
            self._note_grpc_status(stream, headers)
        if stream.route is not None and self._retried(stream, stream.status,
                                                      stream.grpc_status if stream.grpc else None):
            return
        self._headed(stream, headers)
        self.down.send_headers(stream.sid, headers, end_stream=end)
        stream.head_ended = end

    def _headed(self, stream: _Stream, headers: Headers) -> None:
        """The final response head goes to the client: the route's timers stop."""
        stream.phase = TRANSITIONS.get((stream.phase, Step.HEAD)) or _illegal(stream, Step.HEAD)
        if stream.attempt is not None:
            self._stop_attempt(stream)
        if stream.timer is not None and not exchange.timeout_spans_response(stream.route):
            stream.timer.cancel()
            stream.timer = None
        if self.settings.observer is not None:
            self.settings.observer.response(stream, stream.status or 0, headers)
        if stream.method == b"CONNECT" and 200 <= (stream.status or 0) < 300:
            self._tunnel(stream)

    def _tunnel(self, stream: _Stream) -> None:
        """A 2xx to CONNECT made the stream a tunnel: like an upgraded HTTP/1 connection it follows the port's
        policy (proxy.md §8.3, ``RequestPolicy.upgraded``) and is reset both ways (CONNECT_ERROR to the client)
        once a change no longer admits its request."""
        policy = self.settings.policy
        watch = policy.upgraded(stream.request_head()) if policy is not None else None
        if watch is not None:
            stream.unwatch = watch.watch(lambda: self._revoked(stream))

    def _revoked(self, stream: _Stream) -> None:
        if self.over or stream.phase is not Phase.RELAYING:
            return
        self._detach(stream)
        self._reset_down(stream, ErrorCodes.CONNECT_ERROR)
        self._after()

    def _sample(self, stream: _Stream) -> None:
        """The endpoint's latency sample for the balancer, once per pick: callers call it only while
        ``stream.sampled`` is False, which a pick without a balancer (inbound) starts True (no call, no clock)."""
        stream.sampled = True
        if stream.pick is not None:
            stream.pick.observe(self.settings.clock() - stream.start)

    @staticmethod
    def _note_grpc_status(stream: _Stream, headers: Headers) -> None:
        for name, value in headers:
            if name == GRPC_STATUS:
                if value.strip().isdigit():
                    stream.grpc_status = int(value)
                return

    def _response_data(self, up: _Up, event: h2e.DataReceived, end_next: bool) -> None:
        stream = up.streams.get(event.stream_id)
        if stream is None or stream.phase is not Phase.RELAYING:
            up.ep.ack(event.stream_id, event.flow_controlled_length)
            return
        data = event.data
        if event.flow_controlled_length > len(data):  # padding (the call only when there is some)
            up.ep.ack(event.stream_id, event.flow_controlled_length - len(data))
        if stream.idle is not None:  # a frame of the stream: its idle timeout starts over
            stream.active = self.settings.clock()
        if data:
            stream.owed_up += len(data)
            stream.sent += len(data)
            pick = stream.pick
            if pick is not None and pick.frames is not None:
                pick.frames(len(data))
            self.down.queue_data(stream.sid, data)
            if not end_next:  # (else the end, next, flushes it)
                self._flush_down(stream.sid)

    def _response_end(self, stream: _Stream, trailers: Headers | None = None) -> None:
        if stream.phase is not Phase.RELAYING:
            return
        stream.phase = TRANSITIONS.get((stream.phase, Step.END)) or _illegal(stream, Step.END)
        self.touched.append(stream)
        if trailers is not None:  # a downgraded (HTTP/1) response's
            stream.resp_trailers = trailers
        if not stream.head_ended:
            self.down.queue_data(stream.sid, b"", end=True, trailers=stream.resp_trailers)  # (queue_end, a call less)
            self._flush_down(stream.sid)
        status = stream.status or 200
        success = stream.grpc_status == 0 if stream.grpc_status is not None else status < 500
        self._record(stream, status, success)

    def _upstream_reset(self, stream: _Stream, code: int) -> None:
        """The upstream reset its stream: reset the client's with the same code (NO_ERROR: once it has all).

        REFUSED_STREAM before any response means the server did not process the request (``_unprocessed``).
        """
        if code == ErrorCodes.REFUSED_STREAM and self._unprocessed(stream):
            return
        stream.discard = True
        self._drop_request(stream)
        if code == ErrorCodes.NO_ERROR and stream.phase is Phase.ENDING:
            # "Stop sending": the response is complete; the client gets it, then the same reset.
            stream.reset_after = ErrorCodes.NO_ERROR
            self.touched.append(stream)
            return
        self._reset_down(stream, code, route_error=errors.reset_error(code))

    def _unprocessed(self, stream: _Stream) -> bool:
        """The upstream did not process the stream (RST_STREAM REFUSED_STREAM, RFC 9113 §8.7, or a stream above its
        GOAWAY's last stream ID, §6.8): sent again, once, on a new pick (another endpoint, or a new connection),
        when it can be -- before any response, its body kept whole, or none. False: it cannot be."""
        if stream.phase is not Phase.WAITING or stream.refused:
            return False
        if stream.kept is None and stream.req_end and not stream.body_seen:
            stream.kept = []  # bodiless: nothing to keep
        if stream.kept is None:
            return False
        stream.refused = True
        self._again(stream, recount=False)  # one request for the endpoint metrics, as it was not served
        return True

    def _up_goaway(self, up: _Up, event: GoAway) -> None:
        """The endpoint is going away: new streams go to a new connection; the ones it did not take are sent
        again when they can be (``_unprocessed``), else fail."""
        up.draining = True
        if self.ups.get(up.key) is up:
            del self.ups[up.key]
        for usid, stream in list(up.streams.items()):
            if usid > event.last_stream_id and not self._unprocessed(stream):
                self._leg_failed(stream, errors.io_error(up.addr))
        waiting, up.waiting = up.waiting, deque()
        for stream in waiting:
            if stream.phase is Phase.CONNECTING and stream.pick is not None:
                self._attach(stream, stream.pick)
        if not up.streams:
            self._close_up(up)

    def _up_lost(self, up: _Up) -> None:
        """The connection closed or broke HTTP/2: its streams fail, the ones waiting for it go elsewhere."""
        self._close_up(up, lost=True)
        for stream in list(up.streams.values()):
            self._leg_failed(stream, errors.io_error(up.addr))
        up.streams.clear()
        waiting, up.waiting = up.waiting, deque()
        for stream in waiting:
            if stream.phase is Phase.CONNECTING:
                self._retry(stream, errors.io_error(up.addr))

    def _close_up(self, up: _Up, lost: bool = False) -> None:
        if self.ups.get(up.key) is up:
            del self.ups[up.key]
        if up.keep_alive is not None:
            up.keep_alive.cancel()
            up.keep_alive = None
        if up.io is not None and self.live.pop(up.io, None) is not None:
            data = up.ep.data_to_send()  # resets and the like still owed to it (unless it is gone)
            if data and not lost:
                self.sink.send_up(up.io, data)
            self.sink.checkin(up.io, reuse=False)

    # -- ServiceProfile routes (proxy.md §7.5, §7.6, §9.2; core.exchange) -----------------------------------------

    def _route_begun(self, stream: _Stream, route: Route) -> None:
        """The stream's first pick has a profile route: counted, its timer set, its body kept if retryable."""
        stream.route = route
        stream.route_labels, frames, idle = exchange.route_begun(self.settings, route)
        stream.frames = frames
        if frames is not None:
            for chunk in stream.req_buf:  # nothing has gone upstream yet: all the client sent so far
                frames(len(chunk))
        if route.timeout is not None:
            left = stream.start + route.timeout - self.settings.clock()
            stream.timer = self.sink.call_later(max(left, 0.0), lambda: self._timed_out(stream))
        if idle is not None:
            stream.active = self.settings.clock()
            stream.idle = self.sink.call_later(idle, lambda: self._idle_check(stream, idle))
        if route.budget is not None:
            stream.kept = []  # nothing has gone upstream yet: what the client sent so far is all in req_buf
            for chunk in stream.req_buf:
                if stream.kept is not None:
                    self._keep(stream, chunk)

    def _keep(self, stream: _Stream, data: bytes) -> None:
        assert stream.kept is not None
        stream.kept_size += len(data)
        if stream.kept_size > MAX_REPLAY:
            stream.kept = None  # too large to send again: the stream is not retried
        else:
            stream.kept.append(data)

    def _timed_out(self, stream: _Stream) -> None:
        """The route's timeout passed: before the response head the timeout error; after it (a client policy
        route's, which runs to the response's end) the stream ends as after an idle timeout (reset, or a gRPC
        response's trailers). The upstream stream is reset (CANCEL); the connection stays open (every stream
        stands alone)."""
        stream.timer = None
        if self.over or stream.phase not in _TIMED:
            return
        assert stream.route is not None and stream.route.timeout is not None
        stream.timed_out = True
        if stream.phase is Phase.RELAYING:
            self._leg_failed(stream, exchange.route_timeout(stream.route))
        else:
            self._fail(stream, exchange.route_timeout(stream.route), attempt=False)
        self._after()

    def _attempt_timed_out(self, stream: _Stream, usid: int, timeout: float) -> None:
        """A client policy rule's per-attempt timeout passed before the response head: the attempt is
        abandoned (its stream reset) and retried while the rule allows, else answered (504/DEADLINE_EXCEEDED)."""
        stream.attempt = None
        if self.over or stream.phase is not Phase.WAITING or stream.usid != usid:
            return
        self._fail(stream, errors.attempt_timeout(timeout))
        self._after()

    def _idle_check(self, stream: _Stream, idle: float) -> None:
        """The idle timer fired: re-armed if a frame came meanwhile; else the stream ends as linkerd2-proxy's
        stream timeouts end it -- 504 / DEADLINE_EXCEEDED before the response head (not retried), after it a
        gRPC response's trailers say DEADLINE_EXCEEDED and any other stream is reset (INTERNAL_ERROR)."""
        stream.idle = None
        if self.over or stream.phase not in _TIMED:
            return
        left = stream.active + idle - self.settings.clock()
        if left > 0:
            stream.idle = self.sink.call_later(left, lambda: self._idle_check(stream, idle))
            return
        stream.idled = True
        if stream.phase is Phase.RELAYING:
            self._leg_failed(stream, errors.idle_timeout(idle))
        else:
            self._fail(stream, errors.idle_timeout(idle), attempt=False)
        self._after()

    @staticmethod
    def _stop_attempt(stream: _Stream) -> None:
        if stream.attempt is not None:
            stream.attempt.cancel()
            stream.attempt = None

    def _retried(self, stream: _Stream, status: int, grpc_status: int | None, error: ProxyError | None = None) -> bool:
        """An attempt of a routed stream ended with ``status`` (and ``grpc_status``) before anything went to
        the client: True when it is sent again (or the timeout, passed, answered it), False when this is the
        answer. ``core.exchange.settle_attempt`` decides, as for HTTP/1; the body must be kept whole (a
        request still coming goes on to the new attempt as it comes)."""
        route = stream.route
        assert route is not None
        settled = exchange.settle_attempt(self.settings, route, stream.route_labels, stream.start, status,
                                          grpc_status, error, stream.kept is not None)
        if settled is Settled.FINAL:
            return False
        # The attempt is over: its response under its endpoint, the endpoint released, the upstream stream reset.
        if stream.counted:
            default_ok = error is None and (grpc_status == 0 if grpc_status is not None else status < 500)
            stream.grpc_status = grpc_status
            self._record(stream, status, default_ok, route=False)
        if settled is Settled.EXPIRED:
            self._detach(stream)
            stream.status = None
            stream.timed_out = True
            self._fail(stream, exchange.route_timeout(route), attempt=False)
            return True
        self._again(stream, delay=exchange.retry_delay(route))
        return True

    def _again(self, stream: _Stream, recount: bool = True, delay: float = 0.0) -> None:
        """Another attempt: the kept request goes to a new pick (on a new upstream stream), after ``delay`` (a
        client policy rule's backoff); ``recount``: the new attempt is a request of its own in the endpoint
        metrics."""
        up = stream.up
        self._drop_leg(stream)  # the failed response is not read further
        if up is not None and up.draining and not up.streams:
            self._close_up(up)
        if stream.pick is not None:
            stream.pick.release()
            stream.pick = None
        assert stream.kept is not None
        stream.req_buf = deque(stream.kept)
        stream.req_sent = False
        stream.skip_ack = stream.kept_size - stream.owed_down  # the part the client has had acknowledged
        stream.status = stream.grpc_status = None
        stream.head_ended = stream.sampled = stream.recorded = False
        stream.counted = stream.counted and not recount
        stream.resp_trailers = None
        stream.sent = 0
        stream.attempts = 0
        stream.discard = False  # an upstream lost before the head detached the stream: it goes on
        stream.phase = TRANSITIONS.get((stream.phase, Step.RETRY)) or _illegal(stream, Step.RETRY)
        if delay > 0:
            stream.backoff = self.sink.call_later(delay, lambda: self._backed_off(stream))
        else:
            self._route(stream)

    def _backed_off(self, stream: _Stream) -> None:
        stream.backoff = None
        if not self.over and stream.phase is Phase.ROUTING:
            self._route(stream)
            self._after()

    # -- errors ---------------------------------------------------------------------------------------------------

    def _fail(self, stream: _Stream, error: ProxyError, *, attempt: bool = True) -> None:
        """The proxy answers for ``stream`` (no response began): Linkerd's synthesized response.

        On a profile route, an ``attempt``'s error is that response as far as
        retries go (Linkerd answers for an endpoint below its retry layer):
        an endpoint error may be retried instead.
        """
        if attempt and stream.route is not None and stream.phase in _BEFORE_HEAD:
            status, grpc = (200, errors.grpc_status(error)) if stream.grpc else (error.status, None)
            if self._retried(stream, status, grpc, error):
                return
        exchange.count_error(self.settings, error, self.sink.count)
        labels = stream.pick.labels if stream.pick is not None else self.settings.error_labels
        metrics = self.settings.metrics
        if metrics is not None and labels and not stream.counted:
            metrics.request(labels)
        stream.counted = True
        if stream.phase is Phase.RELAYING:
            self._leg_failed(stream, error)
            return
        if stream.grpc:
            status = 200
            headers: Headers = [(b":status", b"200"),
                                *errors.grpc_headers(error, informational=self.settings.informational)]
            stream.grpc_status = errors.grpc_status(error)
        else:
            status = error.status
            # l5d-proxy-connection only for a downgraded request: the HTTP/2 connection itself stays open.
            head = errors.response(error, meshed_client=stream.orig_proto is not None and self.settings.meshed_client,
                                   informational=self.settings.informational)
            headers = [(b":status", str(status).encode())]
            headers += [(n.lower(), v) for n, v in head.headers if n.lower() not in HOP_BY_HOP]
            if stream.orig_proto is not None:  # as the app's response would be: of the request's version
                headers.append((L5D_ORIG_PROTO, b"HTTP/" + orig_proto.downgraded_version(stream.orig_proto)))
        stream.status = status
        stream.head_ended = True
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        stream.phase = TRANSITIONS.get((stream.phase, Step.ANSWER)) or _illegal(stream, Step.ANSWER)
        self.touched.append(stream)
        self.down.send_headers(stream.sid, headers, end_stream=True)
        self._record(stream, status, False, answered=error)
        stream.error = error
        self._detach(stream)
        if not stream.req_end:
            stream.reset_after = ErrorCodes.NO_ERROR  # the client need not send the rest

    def _leg_failed(self, stream: _Stream, error: ProxyError) -> None:
        """The upstream leg broke: an error response if none began, else the stream ends in error."""
        self._detach(stream)
        if stream.phase in _BEFORE_HEAD:
            self._fail(stream, error)
            return
        if stream.phase is not Phase.RELAYING:
            return
        # The route's metrics: the upstream connection broke under the stream (IO), or the proxy's own error.
        route_error = RouteError.IO if error.kind is ErrorKind.UPSTREAM_CLOSED else errors.ROUTE_ERRORS.get(error.kind)
        if stream.grpc:
            # Linkerd reports an error after a gRPC response began in its trailers.
            self._record(stream, stream.status or 0, False, "unclassified", route_error=route_error)
            stream.phase = TRANSITIONS.get((stream.phase, Step.ANSWER)) or _illegal(stream, Step.ANSWER)
            self.touched.append(stream)
            trailers = [(GRPC_STATUS, str(errors.grpc_status(error)).encode())]
            if self.settings.informational:  # inbound: to meshed clients only
                trailers.append((b"grpc-message", errors.grpc_message(error.message)))
            self.down.queue_end(stream.sid, trailers)
            self._flush_down(stream.sid)
        else:
            self._reset_down(stream, ErrorCodes.INTERNAL_ERROR, error="unclassified", route_error=route_error)

    def _detach(self, stream: _Stream) -> None:
        """Forget the upstream leg (reset it if still open); request data from now on is dropped."""
        stream.discard = True
        self._drop_request(stream)
        self._drop_leg(stream)
        self.touched.append(stream)

    def _drop_leg(self, stream: _Stream) -> None:
        """The upstream leg goes: its stream reset (CANCEL), a downgraded request's HTTP/1 connection closed."""
        self._stop_attempt(stream)
        up = stream.up
        if up is not None and stream.usid is not None:
            up.ep.reset(stream.usid, ErrorCodes.CANCEL)
            up.streams.pop(stream.usid, None)
            self._ack_up(stream)
        stream.up = None
        stream.usid = None
        h1 = stream.h1
        if h1 is not None:
            self.h1s.pop(h1.io, None)
            self.sink.checkin(h1.io, reuse=False)
            stream.h1 = None

    def _ack_up(self, stream: _Stream) -> None:
        if stream.owed_up and stream.up is not None and stream.usid is not None:
            stream.up.ep.ack(stream.usid, stream.owed_up)
        stream.owed_up = 0

    # -- the end of a stream --------------------------------------------------------------------------------------

    def _reset_down(self, stream: _Stream, code: int, *, by_client: bool = False, error: str = "",
                    route_error: RouteError | None = None) -> None:
        """The stream ends in a reset with ``code``: a response under way is recorded as failed (``error``, else
        ``h2(<CODE>)``; ``route_error``: its client policy route's error, else UNKNOWN), the client's stream reset
        (unless the client reset it: ``by_client``), the stream over."""
        if stream.phase is Phase.RELAYING:
            self._record(stream, stream.status or 0, False, error or f"h2({error_name(code)})",
                         route_error=route_error)
        if by_client:
            self.down.drop(stream.sid)
        else:
            self.down.reset(stream.sid, code)
        self._finish(stream, Step.RESET, reset=code)

    def _tell_end(self, stream: _Stream, reset: int | None = None) -> None:
        observer = self.settings.observer
        assert observer is not None
        observer.end(stream, stream.status, stream.error, stream.grpc_status if stream.grpc else None,
                     response_bytes=stream.sent, trailers=stream.resp_trailers or (), reset_code=reset)

    def _finish(self, stream: _Stream, step: Step, reset: int | None = None) -> None:
        if stream.phase is Phase.OVER:
            return
        stream.phase = TRANSITIONS.get((stream.phase, step)) or _illegal(stream, step)
        if self.settings.observer is not None:
            self._tell_end(stream, reset)
        self.streams.pop(stream.sid, None)
        if stream.owed_down:
            self.down.ack(stream.sid, stream.owed_down)
            stream.owed_down = 0
        if stream.reset_after is not None and not stream.req_end:
            self.down.reset(stream.sid, stream.reset_after)
        up = stream.up
        if up is not None and stream.usid is not None:
            up.streams.pop(stream.usid, None)
            if stream.owed_up:  # (the call only when something is owed)
                self._ack_up(stream)
            if up.ep.pending(stream.usid):  # (the call only when something is queued: pending is a C call)
                up.ep.drop(stream.usid)
            if up.draining and not up.streams:
                self._close_up(up)
            elif up.waiting:  # (the call only when a stream waits for this one's slot)
                self._open_waiting(up)
        h1 = stream.h1
        if h1 is not None:
            codec = h1.codec
            keep = (step is Step.DONE and codec.keep_alive and codec.our_state is State.DONE
                    and codec.their_state is State.DONE and not h1.eof)
            if keep and codec.start_next_cycle():
                h1.io.codec = None  # bytes past the response came: the next request gets a new codec, not them
            self.h1s.pop(h1.io, None)
            if h1.paused:
                self.sink.read_up(h1.io, True)
            self.sink.checkin(h1.io, reuse=keep)
        self._release(stream)

    def _release(self, stream: _Stream) -> None:
        if stream.unwatch is not None:
            stream.unwatch()
            stream.unwatch = None
        if stream.in_flight:
            stream.in_flight = False
            exchange.leave(self.settings)
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        if stream.backoff is not None:
            stream.backoff.cancel()
            stream.backoff = None
        if stream.attempt is not None:
            self._stop_attempt(stream)
        if stream.idle is not None:
            stream.idle.cancel()
            stream.idle = None
        if stream.routing is not None:
            stream.routing.close()
            stream.routing = None
        if stream.pick is not None:
            if stream.pick.release is not nothing:
                stream.pick.release()
            stream.pick = None

    def _record(self, stream: _Stream, status: int, success: bool, error: str = "", *, route: bool = True,
                answered: ProxyError | None = None, route_error: RouteError | None = None) -> None:
        """The stream's response (``success`` by the default rule), under its endpoint and (``route``) its route;
        each once; ``answered``: the error the proxy answered it with. (One method for both: one call per
        stream.)"""
        if route and stream.route is not None and not stream.route_recorded:
            stream.route_recorded = True
            grpc = stream.grpc_status if stream.grpc else None
            if stream.timed_out:  # the response's status, if its head went out (a client policy route's)
                relaying = stream.phase is Phase.RELAYING
                exchange.record_route(self.settings, stream.route_labels, status if relaying else 0, False,
                                      stream.start, "timeout", grpc if relaying else None, route=stream.route,
                                      route_error=exchange.timeout_error(stream.route))
            elif stream.idled:  # as HTTP/1 records it: the response's status once its head went out, else none
                exchange.record_route(self.settings, stream.route_labels,
                                      status if stream.phase is Phase.RELAYING else 0, False, stream.start, "idle",
                                      grpc, route=stream.route, route_error=RouteError.IDLE_TIMEOUT)
            else:
                ok = not error and not stream.route.is_failure(status, grpc)
                exchange.record_route(self.settings, stream.route_labels, status, ok, stream.start, error, grpc,
                                      route=stream.route, answered=answered, route_error=route_error)
        if stream.recorded:
            return
        stream.recorded = True
        if stream.pick is not None and stream.pick.outcome is not no_outcome:
            # Failure accrual (core.breaker) and the policy's backend metrics: the attempt's status and time.
            stream.pick.outcome(status, stream.grpc_status if stream.grpc else None,
                                self.settings.clock() - stream.start)
        labels = stream.pick.labels if stream.pick is not None else self.settings.error_labels
        exchange.record(self.settings, labels, status, success, stream.start, error,
                        stream.grpc_status if stream.grpc else None)

    # -- graceful shutdown (io.driver's drain and cut) -------------------------------------------------------------

    def drain(self) -> None:
        """The proxy is shutting down (hyper's graceful shutdown, RFC 9113 §6.8's two steps): a GOAWAY with the
        largest stream ID and a PING go out; streams still on their way are served. The PING's answer proves
        the client saw the GOAWAY, and ``_drain_acked`` names the last stream taken; the streams in flight
        finish, then the connection ends."""
        if self.over or self.draining:
            return
        self.draining = True
        if not self.closing:  # (a client that sent GOAWAY opens nothing more: its connection ends when done)
            self.down.goaway(ErrorCodes.NO_ERROR, MAX_STREAM_ID)
            self.down.ping(DRAIN_PING)
        self._after()

    def _drain_acked(self) -> None:
        """The client answered the drain's PING: GOAWAY with the last stream taken (a later one is ignored, and
        the client knows it was not processed), and the connection ends once its streams have."""
        self.down.goaway(ErrorCodes.NO_ERROR)
        self.goaway_final = True
        self.closing = True

    def cut(self) -> None:
        """The shutdown grace period is over: every stream still open is reset (CANCEL) and the connection
        ends."""
        if self.over:
            return
        for stream in list(self.streams.values()):
            self._reset_down(stream, ErrorCodes.CANCEL)
        self.down.goaway(ErrorCodes.NO_ERROR)
        self.ended = True
        self._after()

    # -- keep-alive -----------------------------------------------------------------------------------------------

    def _client_silent(self) -> None:
        """The client did not answer a keep-alive PING in time: GOAWAY, and the connection ends."""
        if not self.over:
            self.down.goaway(ErrorCodes.NO_ERROR)
            self.ended = True

    # -- downgraded requests: HTTP/1 to the app (l5d-orig-proto, proxy.md §7.7) ------------------------------------

    def _checkout_h1(self, stream: _Stream, pick: Pick) -> None:
        up = self.sink.checkout(pick.connect, pick.header, lambda reply: self._checked_out(stream, pick, reply))
        if up is not None:
            self._checked_out(stream, pick, up, now=True)

    def _checked_out(self, stream: _Stream, pick: Pick, reply: Upstream | Failed, now: bool = False) -> None:
        if self.over or stream.phase is not Phase.CONNECTING or stream.pick is not pick:
            if isinstance(reply, Upstream):
                self.sink.checkin(reply, reuse=False)
            return
        if isinstance(reply, Failed):
            self._retry(stream, errors.connect_failed(pick.connect.addr, reply.timed_out, reply.error, reply.errno))
        else:
            codec = reply.codec
            if codec is None:  # a new connection: a pooled one keeps its codec (no codec made per request)
                codec = reply.codec = Http1Connection(Role.CLIENT, max_head_size=self.settings.max_head_size)
            h1 = _H1(reply, codec, replayable=stream.req_end and not stream.req_buf and not stream.req_trailers)
            stream.h1 = h1
            self.h1s[reply] = stream
            stream.phase = TRANSITIONS.get((stream.phase, Step.OPENED)) or _illegal(stream, Step.OPENED)
            head, h1.chunked = self._downgraded_request(stream)
            h1.out += h1.codec.send_head(head)
            self._push_h1(stream)
        if not now:
            self._after()

    def _downgraded_request(self, stream: _Stream) -> tuple[RequestHead, bool]:
        assert stream.orig_proto is not None and stream.pick is not None
        version = orig_proto.downgraded_version(stream.orig_proto)
        target = stream.path
        if b"absolute-form" in stream.orig_proto.lower():
            target = stream.scheme + b"://" + stream.authority + stream.path
        headers: Headers = []
        host = length = False
        # One pass (not a comprehension and two any()s: six calls less per request): what is dropped, and
        # whether Host and Content-Length came.
        for name, value in mesh_request_headers(stream.headers, stream.pick, self.settings):
            if name == L5D_ORIG_PROTO or name == b"te":
                continue
            if name == b"host":
                host = True
            elif name == b"content-length":
                length = True
            headers.append((name, value))
        if not host:
            headers.insert(0, (b"host", stream.authority or stream.pick.authority))
        chunked = False
        body = not stream.req_end or bool(stream.req_buf)
        if body and not length:
            if stream.req_end and not stream.req_trailers:
                size = 0
                for chunk in stream.req_buf:
                    size += len(chunk)
                headers.append((b"content-length", str(size).encode()))
            else:
                headers.append((b"transfer-encoding", b"chunked"))
                chunked = True
                version = b"1.1"
        return RequestHead(stream.method, target, tuple(headers), version), chunked

    def _push_h1(self, stream: _Stream) -> None:
        """Write the request body to the app while its connection takes it (no window: its buffer decides)."""
        h1 = stream.h1
        if h1 is None or h1.io in self.blocked or stream.req_sent:
            return
        codec = h1.codec
        try:
            while stream.req_buf:
                chunk = stream.req_buf.popleft()
                h1.out += codec.send_body(chunk)
                self.down.ack(stream.sid, len(chunk))
                stream.owed_down -= len(chunk)
            if stream.req_end:
                h1.out += codec.send_end(tuple(stream.req_trailers or ()) if h1.chunked else ())
                stream.req_sent = True
                self.touched.append(stream)
        except LocalProtocolError:
            # The client's body does not match its content-length.
            self._detach(stream)
            self._reset_down(stream, ErrorCodes.PROTOCOL_ERROR)

    def _from_h1(self, stream: _Stream, data: bytes) -> None:
        h1 = stream.h1
        assert h1 is not None
        if not data:
            h1.eof = True
        try:
            events = h1.codec.receive_data(data)
        except BadMessage:
            events = None
        for event in events or ():
            if isinstance(event, ResponseHead):
                if event.status >= 200:
                    self._downgraded_response(stream, event)
            elif isinstance(event, Body):
                if stream.phase is Phase.RELAYING:
                    stream.sent += len(event.data)
                    pick = stream.pick
                    if pick is not None and pick.frames is not None:
                        pick.frames(len(event.data))
                    self.down.queue_data(stream.sid, event.data)
            elif isinstance(event, EndOfMessage):
                trailers = event.trailers  # (a comprehension only when there are some: a call less per request)
                self._response_end(stream, [(n.lower(), v) for n, v in trailers] if trailers else None)
        if stream.phase is not Phase.WAITING and stream.phase is not Phase.RELAYING:
            return
        if events is None or h1.eof:
            if (stream.status is None and h1.replayable and h1.io.reused
                    and stream.attempts + 1 < CONNECT_ATTEMPTS):
                # A pooled connection the app had closed: a request without a body is sent again.
                stream.attempts += 1
                self.h1s.pop(h1.io, None)
                self.sink.checkin(h1.io, reuse=False)
                stream.h1 = None
                pick = stream.pick
                assert pick is not None
                stream.phase = TRANSITIONS.get((stream.phase, Step.RETRY)) or _illegal(stream, Step.RETRY)
                stream.phase = TRANSITIONS.get((stream.phase, Step.PICKED)) or _illegal(stream, Step.PICKED)
                self._checkout_h1(stream, pick)
                return
            addr = stream.pick.connect.addr if stream.pick is not None else "app"
            self._leg_failed(stream, errors.io_error(addr))
            return
        self._flush_down(stream.sid)
        if not h1.paused and self.down.buffered(stream.sid) >= H1_BACKLOG:
            h1.paused = True
            self.sink.read_up(h1.io, False)

    def _downgraded_response(self, stream: _Stream, head: ResponseHead) -> None:
        if not stream.sampled:
            self._sample(stream)
        headers: Headers = [(b":status", str(head.status).encode())]
        listed: list[bytes] = []  # the headers Connection names, hop-by-hop too
        for name, value in head.headers:
            low = name.lower()
            if low in HOP_BY_HOP or low == L5D_ORIG_PROTO:
                if low == b"connection":
                    # The names it lists but those dropped here anyway (a loop, not a comprehension): with the
                    # usual ``keep-alive`` nothing is listed, and there is no second pass (two calls less).
                    for token in value.split(b","):
                        token = token.strip().lower()
                        if token not in HOP_BY_HOP and token != L5D_ORIG_PROTO:
                            listed.append(token)
                continue
            headers.append((low, value))
        if listed:  # (rare: a second pass then, rather than a set built for every response)
            headers[1:] = [h for h in headers[1:] if h[0] not in listed]
        headers.append((L5D_ORIG_PROTO, b"HTTP/" + head.version))
        stream.status = head.status
        self._headed(stream, headers)
        self.down.send_headers(stream.sid, headers)
