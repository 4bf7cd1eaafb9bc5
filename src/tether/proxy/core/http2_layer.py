"""The HTTP/2 layer: one client connection, each of its streams routed on its own (proxy.md §7.3, §7.7-7.9, §9.2).

An HTTP/2 (prior knowledge) connection is served by ``codec.http2.H2Endpoint``
in the server role. For each stream (one request and its response):

1. the ``Router`` (``core.routes``, the one the HTTP/1 layer uses) picks where
   it goes, from a ``RequestHead(method, :path, headers, b"2")`` -- per stream,
   so each gRPC call on one connection is balanced by P2C on its own;
2. the stream is opened on an HTTP/2 connection to that endpoint
   (``OpenUp``: mTLS and the transport header, session protocol ``http2``,
   as the endpoint says). Streams to one endpoint share one connection,
   **per client connection**: upstream connections are not shared between
   client connections (each closes with its client's), and a stream waits
   for a free slot when the endpoint's ``MAX_CONCURRENT_STREAMS`` is reached;
3. headers, data and trailers go both ways as they come, RST_STREAM is
   passed on as a reset of the paired stream (same code), and a GOAWAY from
   the client lets the streams in flight finish before the connection closes.

Flow control is the peers' own: bytes received on one side are acknowledged
(their window handed back) only once they have been sent on to the other,
so the proxy holds at most the windows it advertised (64 KiB a stream, 1 MiB
a connection, Linkerd's defaults), and a side whose peer window is exhausted
simply stops being sent more. Connections that do not read are not read
either (``Poll``).

Inbound, a request carrying ``l5d-orig-proto`` (a linkerd2-proxy upgraded an
HTTP/1 request to HTTP/2 for the hop between proxies, proxy.md §7.7) is
downgraded: sent to the app as HTTP/1.x on a pooled connection
(``Checkout``), without that header, and its response comes back as HTTP/2
with ``l5d-orig-proto`` set. An HTTP/1 app has no flow control, so it is not
read while the client's window holds ``H1_BACKLOG`` bytes of its response.

Errors are Linkerd's (``core.errors``): a gRPC request (``content-type:
application/grpc...``) is answered ``200`` with ``grpc-status`` (UNAVAILABLE
for a failed endpoint, DEADLINE_EXCEEDED for fail-fast), ``grpc-message``
and ``l5d-proxy-error``; another request 502/503/504 as over HTTP/1. An
error after the response began resets the stream (gRPC: trailers with
``grpc-status`` instead). A protocol error from the client ends its
connection with the GOAWAY h2 chose. Errors do not close the connection:
every stream is balanced on its own, so there is nothing to reconnect for.

Headers: inbound, ``l5d-client-id`` is set from the verified identity (or
removed); outbound, ``l5d-proxy-error`` and ``l5d-proxy-connection`` from
the remote proxy are removed. Metrics (``core.http_metrics``) per stream, with
``grpc_status`` for gRPC responses (success: ``grpc-status`` 0).

A stream whose pick has a ServiceProfile route (``Pick.route``) is treated
as ``core.http1_proxy._routed`` treats an HTTP/1 request (proxy.md §7.5, §7.6,
§9.2): ``route_*`` metrics (classification by the route's response classes,
then a gRPC response's ``grpc-status``, then 5xx); the route's timeout for
the response head, from the stream's start across every attempt (the
timeout error -- gRPC: DEADLINE_EXCEEDED -- and the upstream stream
cancelled; a heap of deadlines gives ``Poll`` its timeout); and retries
within the budget (``retries.settle``, the decision HTTP/1 takes too) of a
failed attempt whose head has not gone to the client -- a failing status
or a trailers-only gRPC failure, or an endpoint lost before its head --
with the request body kept up to 64 KiB and sent again on a new stream to
a new pick.

Many streams in one layer: the layer waits on all its connections with one
``Poll`` and runs slow steps (discovery's ``Wait``, connects) with
``Start``, so only the stream that asked waits. It yields commands and does
no I/O. Callers: ``core.outbound`` and ``core.inbound`` (their
``PROTOCOL_LAYERS`` entry for ``Http2``), via the driver.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Generator
from typing import Any, cast

from h2 import events as h2e
from h2.errors import ErrorCodes

from tether.proxy.core.commands import Command, Count, Failed, Layer
from tether.proxy.core import errors
from tether.proxy.core.http_commands import Checkin, Checkout, OpenUp, Poll, Polled, SendDown, Start, Upstream
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import L5D_DST_CANONICAL, L5D_DST_OVERRIDE, MAX_REPLAY, HttpSettings, Pick, Router
from tether.proxy.core.profiles import Route
from tether.proxy.core.retries import Settled, settle
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
from tether.proxy.codec.http2 import GoAway, H2Endpoint, H2ProtocolError, Headers, error_name

CONNECT_ATTEMPTS = 3
H1_BACKLOG = 64 * 1024  # a downgraded response's bytes waiting for the client's window: the app is not read past it

L5D_ORIG_PROTO = b"l5d-orig-proto"
L5D_CLIENT_ID = b"l5d-client-id"
L5D_PROXY_ERROR = b"l5d-proxy-error"
L5D_PROXY_CONNECTION = b"l5d-proxy-connection"
GRPC_STATUS = b"grpc-status"
# HTTP/1 hop-by-hop headers (RFC 9110 §7.6.1): not forwarded, and not allowed in HTTP/2.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"transfer-encoding",
                        b"upgrade", b"trailer"})


class _Up:
    """An HTTP/2 connection to one endpoint, shared by this client connection's streams to it."""

    __slots__ = ("key", "ep", "io", "addr", "streams", "waiting", "draining")

    def __init__(self, key: object, addr: object) -> None:
        self.key = key
        self.addr = addr
        self.ep = H2Endpoint(client=True)
        self.ep.initiate()  # the preface waits in the endpoint until the connection is up
        self.io: Upstream | None = None  # None while connecting
        self.streams: dict[int, _Pair] = {}  # upstream stream id -> pair
        self.waiting: deque[_Pair] = deque()  # pairs waiting for the connection, or for a free stream
        self.draining = False  # it sent GOAWAY: no new streams


class _H1:
    """An HTTP/1.1 connection to the app carrying one downgraded request (``l5d-orig-proto``)."""

    __slots__ = ("io", "codec", "out", "chunked", "replayable", "eof")

    def __init__(self, io: Upstream, replayable: bool) -> None:
        self.io = io
        self.codec = Http1Connection(Role.CLIENT)
        self.out = bytearray()  # bytes to write at the next Poll
        self.chunked = False  # the request body is chunked (so it may end with trailers)
        self.replayable = replayable  # no request body: can be sent again if a pooled connection was stale
        self.eof = False


class _Pair:
    """One client stream and where it went: its request, its upstream leg, and what is still owed."""

    __slots__ = ("sid", "method", "path", "authority", "scheme", "headers", "grpc", "orig_proto", "start",
                 "attempts", "route_gen", "pick", "counted", "recorded", "up", "usid", "h1", "req_buf",
                 "req_end", "req_trailers", "req_sent", "leg_gone", "owed_down", "owed_up", "status",
                 "grpc_status", "resp_end", "head_ended", "resp_trailers", "sampled", "finished", "reset_after",
                 "in_flight", "route", "deadline", "kept", "kept_size", "skip_ack", "timed_out", "route_recorded",
                 "body_seen", "refused")

    def __init__(self, sid: int, pseudo: dict[bytes, bytes], headers: Headers, start: float) -> None:
        self.sid = sid
        self.method = pseudo.get(b":method", b"")
        self.path = pseudo.get(b":path", b"")
        self.authority = pseudo.get(b":authority", b"")
        self.scheme = pseudo.get(b":scheme", b"http")
        self.headers = headers  # the regular headers, as received
        self.grpc = any(n == b"content-type" and v.startswith(b"application/grpc") for n, v in headers)
        self.orig_proto: bytes | None = None  # inbound: the request is downgraded to this HTTP/1 version
        self.start = start
        self.attempts = 0
        self.route_gen: Generator[Command, Any, Pick | ProxyError] | None = None
        self.in_flight = False  # counted in the direction's InFlight until released
        self.pick: Pick | None = None
        self.counted = False  # request_total recorded
        self.recorded = False  # response_total recorded
        self.up: _Up | None = None
        self.usid: int | None = None
        self.h1: _H1 | None = None
        self.req_buf: deque[bytes] = deque()  # request data not yet handed to the upstream leg
        self.req_end = False  # the client ended its request
        self.req_trailers: Headers | None = None
        self.req_sent = False  # the request's end was handed to the upstream leg
        self.leg_gone = False  # no upstream any more: request data is dropped (and acknowledged)
        self.owed_down = 0  # request bytes received, not yet acknowledged to the client
        self.owed_up = 0  # response bytes received, not yet acknowledged to the upstream
        self.status: int | None = None  # the response status sent to the client
        self.grpc_status: int | None = None
        self.resp_end = False  # the response's end is queued to the client
        self.head_ended = False  # ... carried by the response headers themselves
        self.resp_trailers: Headers | None = None
        self.sampled = False  # the endpoint's latency sample was taken
        self.finished = False
        self.reset_after: int | None = None  # reset the client's stream with this code once the response is out
        # A ServiceProfile route (proxy.md §7.5, §7.6): see _Http2._routed.
        self.route: Route | None = None  # the route of the first pick: its timeout, retries and route_* series
        self.deadline: float | None = None  # the response head is due by then (the route's timeout)
        self.kept: list[bytes] | None = None  # the request body kept for a retry (None: not kept, or too large)
        self.kept_size = 0
        self.skip_ack = 0  # bytes of a retry's request already acknowledged to the client (sent again as kept)
        self.timed_out = False
        self.route_recorded = False  # route_response_total recorded
        self.body_seen = False  # request body bytes came from the client (a bodiless request can always be resent)
        self.refused = False  # an upstream refused it once (REFUSED_STREAM): sent again, once

    def route_head(self) -> RequestHead:
        headers = tuple(self.headers)
        if self.authority and not any(n == b"host" for n, _ in headers):
            headers = ((b"host", self.authority),) + headers
        return RequestHead(self.method, self.path, headers, b"2")


log = logging.getLogger(__name__)

# Rapid reset (CVE-2023-44487): streams the client reset before their response head count against this (less
# one for each response head sent); past it, the connection ends with GOAWAY(ENHANCE_YOUR_CALM). hyper's
# default for max_pending_accept_reset_streams, which linkerd2-proxy's servers take when unset.
MAX_PENDING_RESETS = 20


def http2(router: Router, settings: HttpSettings, *, downgrade: bool = False) -> Layer:
    """Serve the accepted HTTP/2 connection's streams until it closes; ``downgrade``: honour ``l5d-orig-proto``."""
    yield from _Http2(router, settings, downgrade).run()


class _Http2:
    """The state of one client connection; ``run`` is the layer."""

    def __init__(self, router: Router, settings: HttpSettings, downgrade: bool) -> None:
        self.router = router
        self.settings = settings
        self.downgrade = downgrade
        self.down = H2Endpoint(client=False)
        self.pairs: dict[int, _Pair] = {}  # client stream id -> pair
        self.ups: dict[object, _Up] = {}  # endpoint (address, TLS) -> the connection new streams open on
        self.live: dict[Upstream, _Up] = {}  # every connected HTTP/2 upstream
        self.h1s: dict[Upstream, _Pair] = {}  # downgraded requests' HTTP/1 connections
        self.blocked: frozenset[Upstream | None] = frozenset()
        self.out: list[Command] = []  # non-blocking commands to yield before the next Poll
        self.closing = False  # the client sent GOAWAY: finish the streams in flight, then close
        self.ended = False
        self.deadlines: list[tuple[float, int, _Pair]] = []  # a heap of route deadlines (stale ones popped lazily)
        self.resets = 0  # streams reset by the client before their response head (MAX_PENDING_RESETS)
        self.heard = settings.clock()  # when the client last sent a byte (keep-alive)
        self.pinged: float | None = None  # when the keep-alive PING went out, until the client answers

    # -- the loop ---------------------------------------------------------------------------------------------

    def run(self) -> Layer:
        self.down.initiate()
        try:
            while not self.ended:
                while self.out:
                    yield self.out.pop(0)
                polled: Polled = yield Poll(True, self._polled_ups(), self._writes(), self._poll_timeout())
                unblocked = self.blocked - polled.blocked
                self.blocked = polled.blocked
                if None in unblocked:
                    self._flush_down()
                for io in unblocked:
                    if io is not None and io in self.live:
                        self._flush_up(self.live[io])
                for tag, reply in polled.done:
                    self._job_done(cast(tuple[str, Any], tag), reply)
                for io, data in polled.ups:
                    self._from_up(io, data)
                if polled.down is not None:
                    self.heard = self.settings.clock()
                    self.pinged = None  # the client is there (its PING ACK, or anything else)
                    self._from_down(polled.down)
                self._keep_alive()
                for pair in list(self.h1s.values()):
                    self._push_h1(pair)
                if self.deadlines:
                    self._expire()
                self._sweep()
                if self.closing and not self.pairs and not self.ended:
                    self.down.goaway(ErrorCodes.NO_ERROR)
                    self.ended = True
            for io in list(self.live) + list(self.h1s):
                self.out.append(Checkin(io, reuse=False))
            while self.out:
                yield self.out.pop(0)
            final = self.down.data_to_send()  # a GOAWAY
            if final:
                yield SendDown(final)
        finally:
            # No yield here: the driver may be closing this generator.
            for pair in list(self.pairs.values()):
                self._release(pair)

    def _polled_ups(self) -> tuple[Upstream, ...]:
        ups = list(self.live)
        for io, pair in self.h1s.items():
            h1 = pair.h1
            if h1 is not None and not h1.eof and not pair.resp_end and self.down.buffered(pair.sid) < H1_BACKLOG:
                ups.append(io)
        return tuple(ups)

    def _writes(self) -> tuple[tuple[Upstream | None, bytes], ...]:
        writes: list[tuple[Upstream | None, bytes]] = []
        data = self.down.data_to_send()
        if data:
            writes.append((None, data))
        for io, up in self.live.items():
            data = up.ep.data_to_send()
            if data:
                writes.append((io, data))
        for io, pair in self.h1s.items():
            h1 = pair.h1
            if h1 is not None and h1.out:
                writes.append((io, bytes(h1.out)))
                h1.out.clear()
        return tuple(writes)

    def _job_done(self, tag: tuple[str, Any], reply: Any) -> None:
        kind, subject = tag
        if kind == "route":
            if subject.finished or subject.leg_gone:  # over, or answered (a route's timeout) meanwhile
                if subject.route_gen is not None:
                    subject.route_gen.close()
                    subject.route_gen = None
                return
            self._route(subject, reply)
        elif kind == "dial":
            self._dialed(subject, reply)
        else:
            self._checked_out(subject, reply)

    # -- the client's side ------------------------------------------------------------------------------------

    def _from_down(self, data: bytes) -> None:
        if not data:
            self.ended = True  # the client is gone, and its streams with it
            return
        try:
            events = self.down.receive_data(data)
        except H2ProtocolError:
            self.ended = True  # h2 queued the GOAWAY with the error's code; run() writes it
            return
        # A stream reset in the same read as its HEADERS is never started: nothing goes upstream for it.
        reset = {e.stream_id for e in events if isinstance(e, h2e.StreamReset)}
        for event in events:
            if self.ended:
                return
            if isinstance(event, h2e.RequestReceived):
                if event.stream_id in reset:
                    self._early_reset()
                else:
                    self._request(event)
            elif isinstance(event, h2e.DataReceived):
                self._request_data(event)
            elif isinstance(event, h2e.TrailersReceived):
                pair = self.pairs.get(event.stream_id)
                if pair is not None:
                    pair.req_trailers = list(event.headers)
            elif isinstance(event, h2e.StreamEnded):
                pair = self.pairs.get(event.stream_id)
                if pair is not None and not pair.req_end:
                    pair.req_end = True
                    self._forward_request(pair)
            elif isinstance(event, h2e.StreamReset):
                pair = self.pairs.get(event.stream_id)
                if pair is not None:
                    self._client_reset(pair, event.error_code)
            elif isinstance(event, (h2e.WindowUpdated, h2e.RemoteSettingsChanged)):
                self._flush_down()
            elif isinstance(event, GoAway):
                if event.error_code:
                    self.ended = True
                else:
                    self.closing = True

    def _request(self, event: h2e.RequestReceived) -> None:
        pseudo: dict[bytes, bytes] = {}
        regular: Headers = []
        for name, value in event.headers:
            if name[:1] == b":":
                pseudo[name] = value
            else:
                regular.append((name, value))
        pair = _Pair(event.stream_id, pseudo, regular, self.settings.clock())
        if self.downgrade:
            orig = next((v for n, v in regular if n == L5D_ORIG_PROTO), None)
            if orig is not None and orig.upper().startswith(b"HTTP/1"):
                pair.orig_proto = orig
        pair.req_end = event.stream_ended is not None
        self.pairs[pair.sid] = pair
        limit = self.settings.in_flight
        if limit is not None:
            if limit.count >= limit.limit:
                self._fail(pair, errors.load_shed())
                return
            limit.count += 1
            pair.in_flight = True
        policy = self.settings.policy
        if policy is not None:  # the hook for per-request policy (core.http.RequestPolicy, #15)
            answer = policy.check(pair.route_head())
            if isinstance(answer, ProxyError):
                self._fail(pair, answer)
                return
            if answer is not None:  # a route's header modifier
                pair.headers = list(answer(tuple(pair.headers)))
        self._route(pair, None)

    def _request_data(self, event: h2e.DataReceived) -> None:
        sid = event.stream_id
        data = event.data
        pair = self.pairs.get(sid)
        if pair is None or pair.leg_gone or pair.req_sent:
            self.down.ack(sid, event.flow_controlled_length)  # nowhere to go: dropped
            return
        self.down.ack(sid, event.flow_controlled_length - len(data))  # padding
        if data:
            pair.body_seen = True
            pair.req_buf.append(data)
            pair.owed_down += len(data)
            if pair.kept is not None:
                self._keep(pair, data)
        if event.stream_ended is not None:
            pair.req_end = True
        self._forward_request(pair)

    def _forward_request(self, pair: _Pair) -> None:
        """Hand what the client sent to the upstream leg (if there is one yet)."""
        if pair.leg_gone:
            self._drop_request(pair)
        elif pair.usid is not None:
            up = pair.up
            assert up is not None
            while pair.req_buf:
                up.ep.queue_data(pair.usid, pair.req_buf.popleft())
            if pair.req_end and not pair.req_sent:
                up.ep.queue_end(pair.usid, pair.req_trailers)
                pair.req_sent = True
            self._flush_up(up, pair.usid)
        elif pair.h1 is not None:
            self._push_h1(pair)

    def _drop_request(self, pair: _Pair) -> None:
        if pair.owed_down:
            self.down.ack(pair.sid, pair.owed_down)
            pair.owed_down = 0
        pair.req_buf.clear()

    def _early_reset(self) -> None:
        """A stream the client reset before its response head: past ``MAX_PENDING_RESETS``, GOAWAY
        (ENHANCE_YOUR_CALM) and the connection ends; the other connections go on being served."""
        self.resets += 1
        if self.resets > MAX_PENDING_RESETS:
            log.info("HTTP/2 client reset %d streams before their responses: GOAWAY(ENHANCE_YOUR_CALM)",
                     self.resets)
            self.out.append(Count(f"{self.settings.direction}_http_errors_total", 'error="rapid reset"'))
            self.down.goaway(ErrorCodes.ENHANCE_YOUR_CALM)
            self.ended = True

    def _client_reset(self, pair: _Pair, code: int) -> None:
        """The client reset its stream: reset the upstream one with the same code."""
        if pair.status is None:
            self._early_reset()
        if pair.up is not None and pair.usid is not None:
            pair.up.ep.reset(pair.usid, code)
        if pair.status is not None and not pair.resp_end:
            self._record(pair, pair.status, False, f"h2({error_name(code)})")
        self.down.drop(pair.sid)
        self._finish(pair, reuse=False)

    def _flush_down(self, sid: int | None = None) -> None:
        """Send the client what its windows allow; acknowledge what went to the upstream it came from.

        Held while the client's connection has a full write buffer: the data
        stays queued (and unacknowledged, so its source soon stops).
        """
        if None in self.blocked:
            return
        for stream_id, n in self.down.flush(sid).items():
            pair = self.pairs.get(stream_id)
            if pair is not None and pair.up is not None and pair.usid is not None:
                pair.up.ep.ack(pair.usid, n)
                pair.owed_up -= n

    # -- routing and connecting -------------------------------------------------------------------------------

    def _route(self, pair: _Pair, reply: Any) -> None:
        """Step the router for ``pair``; a blocking step runs in the background and comes back here."""
        gen = pair.route_gen
        if gen is None:
            gen = pair.route_gen = self.router(pair.route_head())
        try:
            while True:
                command = gen.send(reply)
                if command.blocking:
                    self.out.append(Start(("route", pair), command))
                    return
                self.out.append(command)
                reply = None
        except StopIteration as stop:
            result = stop.value
        pair.route_gen = None
        if result.route is not None and pair.route is None:
            self._routed(pair, result.route)
        if isinstance(result, ProxyError):
            self._fail(pair, result)
            return
        self._attach(pair, result)

    def _attach(self, pair: _Pair, pick: Pick) -> None:
        pair.pick = pick
        if not pair.counted:
            if self.settings.metrics is not None:
                self.settings.metrics.request(pick.labels)
            if self.settings.observer is not None:  # tap (core.http.StreamObserver, #16)
                self.settings.observer.request(pair, pair.route_head(), pick.labels)
        pair.counted = True
        if pair.orig_proto is not None:
            self.out.append(Start(("h1", pair), Checkout(pick.connect, pick.header)))
            return
        key = (pick.connect.addr, pick.connect.tls)
        up = self.ups.get(key)
        if up is None:
            up = self.ups[key] = _Up(key, pick.connect.addr)
            self.out.append(Start(("dial", up), OpenUp(pick.connect, pick.header)))
        up.waiting.append(pair)
        if up.io is not None:
            self._open_waiting(up)

    def _retry(self, pair: _Pair, error: ProxyError) -> None:
        """The endpoint could not be reached: another pick, up to ``CONNECT_ATTEMPTS``, else ``error``."""
        pick = pair.pick
        if pick is not None:
            pick.failed()
        pair.attempts += 1
        if pair.attempts >= CONNECT_ATTEMPTS:
            self._fail(pair, error)  # under the last pick's labels; released when the pair is over
            return
        if pick is not None:
            pick.release()
        pair.pick = None
        self._route(pair, None)

    def _dialed(self, up: _Up, reply: Upstream | Failed) -> None:
        if isinstance(reply, Failed):
            if self.ups.get(up.key) is up:
                del self.ups[up.key]
            error = errors.connect_failed(up.addr, reply.timed_out, reply.error, reply.errno)
            waiting, up.waiting = up.waiting, deque()
            for pair in waiting:
                if not pair.finished and not pair.leg_gone:
                    self._retry(pair, error)
            return
        up.io = reply
        self.live[reply] = up
        self._open_waiting(up)

    def _open_waiting(self, up: _Up) -> None:
        while up.waiting and not up.draining and up.ep.can_open_stream():
            pair = up.waiting.popleft()
            if not pair.finished and not pair.leg_gone:
                self._open_stream(up, pair)

    def _open_stream(self, up: _Up, pair: _Pair) -> None:
        usid = up.ep.next_stream_id()
        end = pair.req_end and not pair.req_buf and not pair.req_trailers
        if not up.ep.send_headers(usid, self._upstream_headers(pair), end_stream=end):
            self._fail(pair, errors.io_error(up.addr))
            return
        pair.up = up
        pair.usid = usid
        up.streams[usid] = pair
        if end:
            pair.req_sent = True
        else:
            self._forward_request(pair)

    def _upstream_headers(self, pair: _Pair) -> Headers:
        headers: Headers = [(b":method", pair.method)]
        if pair.path:  # CONNECT has neither :scheme nor :path
            headers.append((b":scheme", pair.scheme))
        authority = pair.authority
        if not authority and not any(n == b"host" for n, _ in pair.headers) and pair.pick is not None:
            authority = pair.pick.authority
        if authority:
            headers.append((b":authority", authority))
        if pair.path:
            headers.append((b":path", pair.path))
        pick = pair.pick
        dst = pick.route.dst if pick is not None and pick.route is not None else b""
        if dst or (pick is not None and pick.strip_override):
            # As over HTTP/1: the profile's service named to the peer, and an ingress's override not passed on.
            drop = (L5D_DST_CANONICAL, L5D_DST_OVERRIDE) if pick is not None and pick.strip_override else (
                L5D_DST_CANONICAL,)
            headers.extend((n, v) for n, v in self._request_headers(pair) if n not in drop)
            if dst:
                headers.append((L5D_DST_CANONICAL, dst))
            return headers
        headers.extend(self._request_headers(pair))
        return headers

    def _request_headers(self, pair: _Pair) -> Headers:
        """The regular headers going upstream: ``l5d-client-id`` inbound from the verified identity only."""
        if self.settings.direction != "inbound":
            rewrite = pair.pick.rewrite if pair.pick is not None else None  # client policy (core.policy_routes)
            return list(rewrite(tuple(pair.headers)) if rewrite is not None else pair.headers)
        headers = [(n, v) for n, v in pair.headers if n != L5D_CLIENT_ID]
        if self.settings.client_id:
            headers.append((L5D_CLIENT_ID, self.settings.client_id.encode()))
        return headers

    def _flush_up(self, up: _Up, usid: int | None = None) -> None:
        """Send an upstream what its windows allow (not while its write buffer is full); acknowledge what went."""
        if up.io is None or up.io in self.blocked:
            return
        for stream_id, n in up.ep.flush(usid).items():
            pair = up.streams.get(stream_id)
            if pair is not None:
                if pair.skip_ack:  # a retry's kept bytes: the client had them acknowledged the first time
                    skip = min(n, pair.skip_ack)
                    pair.skip_ack -= skip
                    n -= skip
                self.down.ack(pair.sid, n)
                pair.owed_down -= n

    # -- upstream HTTP/2 ------------------------------------------------------------------------------------

    def _from_up(self, io: Upstream, data: bytes) -> None:
        up = self.live.get(io)
        if up is None:
            pair = self.h1s.get(io)
            if pair is not None:
                self._from_h1(pair, data)
            return
        if not data:
            self._up_lost(up)
            return
        try:
            events = up.ep.receive_data(data)
        except H2ProtocolError:
            self._up_lost(up)
            return
        for event in events:
            if isinstance(event, h2e.ResponseReceived):
                pair = up.streams.get(event.stream_id)
                if pair is not None:
                    self._response_head(pair, list(event.headers), event.stream_ended is not None)
            elif isinstance(event, h2e.InformationalResponseReceived):
                pair = up.streams.get(event.stream_id)
                if pair is not None and pair.status is None:
                    self.down.send_headers(pair.sid, event.headers)
            elif isinstance(event, h2e.DataReceived):
                self._response_data(up, event)
            elif isinstance(event, h2e.TrailersReceived):
                pair = up.streams.get(event.stream_id)
                if pair is not None:
                    pair.resp_trailers = list(event.headers)
                    self._note_grpc_status(pair, pair.resp_trailers)
            elif isinstance(event, h2e.StreamEnded):
                pair = up.streams.get(event.stream_id)
                if pair is not None:
                    self._response_end(pair)
            elif isinstance(event, h2e.StreamReset):
                pair = up.streams.get(event.stream_id)
                if pair is not None:
                    self._upstream_reset(pair, event.error_code)
            elif isinstance(event, (h2e.WindowUpdated, h2e.RemoteSettingsChanged)):
                self._flush_up(up)
                self._open_waiting(up)
            elif isinstance(event, GoAway):
                if event.error_code:
                    self._up_lost(up)  # a connection error: the peer closes, nothing more will come
                    return
                self._up_goaway(up, event)

    def _response_head(self, pair: _Pair, headers: Headers, end: bool) -> None:
        self._sample(pair)
        status = next((v for n, v in headers if n == b":status"), b"")
        pair.status = int(status) if status.isdigit() else 502
        self.resets = max(self.resets - 1, 0)  # a stream answered: a client that resets some is not abusive
        if self.settings.observer is not None:
            self.settings.observer.response(pair, pair.status)
        if self.settings.strip_proxy_errors:
            headers = [(n, v) for n, v in headers if n not in (L5D_PROXY_ERROR, L5D_PROXY_CONNECTION)]
        self._note_grpc_status(pair, headers)
        if pair.route is not None and self._retried(pair, pair.status, pair.grpc_status if pair.grpc else None):
            return
        self.down.send_headers(pair.sid, headers, end_stream=end)
        pair.head_ended = end

    def _sample(self, pair: _Pair) -> None:
        if not pair.sampled and pair.pick is not None:
            pair.sampled = True
            pair.pick.observe(self.settings.clock() - pair.start)

    def _note_grpc_status(self, pair: _Pair, headers: Headers) -> None:
        value = next((v for n, v in headers if n == GRPC_STATUS), None)
        if value is not None and value.strip().isdigit():
            pair.grpc_status = int(value)

    def _response_data(self, up: _Up, event: h2e.DataReceived) -> None:
        pair = up.streams.get(event.stream_id)
        if pair is None or pair.finished:
            up.ep.ack(event.stream_id, event.flow_controlled_length)
            return
        data = event.data
        up.ep.ack(event.stream_id, event.flow_controlled_length - len(data))  # padding
        if data:
            pair.owed_up += len(data)
            self.down.queue_data(pair.sid, data)
            self._flush_down(pair.sid)

    def _response_end(self, pair: _Pair, trailers: Headers | None = None) -> None:
        if pair.resp_end:
            return
        pair.resp_end = True
        if not pair.head_ended:
            self.down.queue_end(pair.sid, trailers if trailers is not None else pair.resp_trailers)
            self._flush_down(pair.sid)
        status = pair.status or 200
        success = pair.grpc_status == 0 if pair.grpc_status is not None else status < 500
        self._record(pair, status, success)

    def _upstream_reset(self, pair: _Pair, code: int) -> None:
        """The upstream reset its stream: reset the client's with the same code (NO_ERROR: once it has all).

        REFUSED_STREAM before any response means the server did not process the request (RFC 9113 §8.7):
        it is sent again, once, on a new pick, when it can be -- its body kept whole, or none.
        """
        if code == ErrorCodes.REFUSED_STREAM and pair.status is None and not pair.refused:
            if pair.kept is None and pair.req_end and not pair.body_seen:
                pair.kept = []  # bodiless: nothing to keep
            if pair.kept is not None:
                pair.refused = True
                self._again(pair, recount=False)  # one request for the endpoint metrics, as it was not served
                return
        pair.leg_gone = True
        self._drop_request(pair)
        if code == ErrorCodes.NO_ERROR and pair.resp_end:
            # "Stop sending": the response is complete; the client gets it, then the same reset.
            pair.reset_after = ErrorCodes.NO_ERROR
            return
        if pair.status is not None and not pair.resp_end:
            self._record(pair, pair.status, False, f"h2({error_name(code)})")
        self.down.reset(pair.sid, code)
        self._finish(pair, reuse=False)

    def _up_goaway(self, up: _Up, event: GoAway) -> None:
        """The endpoint is going away: new streams go to a new connection; the ones it did not take fail."""
        up.draining = True
        if self.ups.get(up.key) is up:
            del self.ups[up.key]
        for usid, pair in list(up.streams.items()):
            if usid > event.last_stream_id:
                self._leg_failed(pair, errors.io_error(up.addr))
        waiting, up.waiting = up.waiting, deque()
        for pair in waiting:
            if not pair.finished and not pair.leg_gone and pair.pick is not None:
                self._attach(pair, pair.pick)
        if not up.streams:
            self._close_up(up)

    def _up_lost(self, up: _Up) -> None:
        """The connection closed or broke HTTP/2: its streams fail, the ones waiting for it go elsewhere."""
        self._close_up(up)
        for pair in list(up.streams.values()):
            self._leg_failed(pair, errors.io_error(up.addr))
        up.streams.clear()
        waiting, up.waiting = up.waiting, deque()
        for pair in waiting:
            if not pair.finished and not pair.leg_gone:
                self._retry(pair, errors.io_error(up.addr))

    def _close_up(self, up: _Up) -> None:
        if self.ups.get(up.key) is up:
            del self.ups[up.key]
        if up.io is not None and self.live.pop(up.io, None) is not None:
            self.out.append(Checkin(up.io, reuse=False))

    # -- ServiceProfile routes (proxy.md §7.5, §7.6, §9.2; http.layer._routed for HTTP/1) ----------------------

    def _routes(self, pair: _Pair) -> Any:
        """The route metrics to record ``pair`` in (None: no metrics, or a route without a series)."""
        metrics = self.settings.metrics
        return metrics.routes if metrics is not None and pair.route is not None and pair.route.metric_labels \
            else None

    def _routed(self, pair: _Pair, route: Route) -> None:
        """The stream's first pick has a profile route: counted, its deadline set, its body kept if retryable."""
        pair.route = route
        routes = self._routes(pair)
        if routes is not None:
            routes.request(route.metric_labels, route.budget is not None)
        if route.timeout is not None:
            pair.deadline = pair.start + route.timeout
            heapq.heappush(self.deadlines, (pair.deadline, pair.sid, pair))
        if route.budget is not None:
            pair.kept = []  # nothing has gone upstream yet: what the client sent so far is all in req_buf
            for chunk in pair.req_buf:
                if pair.kept is not None:
                    self._keep(pair, chunk)

    def _keep(self, pair: _Pair, data: bytes) -> None:
        assert pair.kept is not None
        pair.kept_size += len(data)
        if pair.kept_size > MAX_REPLAY:
            pair.kept = None  # too large to send again: the stream is not retried
        else:
            pair.kept.append(data)

    @staticmethod
    def _waits_for_head(pair: _Pair) -> bool:
        return pair.status is None and not pair.resp_end and not pair.leg_gone and not pair.finished

    def _poll_timeout(self) -> float | None:
        """Until the earliest of a route deadline and the keep-alive's next step."""
        left = self._next_deadline() if self.deadlines else None
        keep_alive = self.settings.h2_keep_alive
        if keep_alive is not None:
            interval, timeout = keep_alive
            due = self.pinged + timeout if self.pinged is not None else self.heard + interval
            step = max(due - self.settings.clock(), 0.0)
            left = step if left is None else min(left, step)
        return left

    def _keep_alive(self) -> None:
        """A PING once the client has been silent for the interval; no answer within the timeout ends the
        connection (GOAWAY), as hyper's server keep-alive does for linkerd2-proxy."""
        keep_alive = self.settings.h2_keep_alive
        if keep_alive is None or self.ended:
            return
        interval, timeout = keep_alive
        now = self.settings.clock()
        if self.pinged is not None:
            if now >= self.pinged + timeout:
                log.debug("HTTP/2 client did not answer a keep-alive PING within %ss: closing", timeout)
                self.down.goaway(ErrorCodes.NO_ERROR)
                self.ended = True
        elif now >= self.heard + interval:
            self.down.ping()
            self.pinged = now

    def _next_deadline(self) -> float | None:
        """The ``Poll`` timeout: until the earliest deadline of a stream still waiting for its response head."""
        heap = self.deadlines
        while heap and not self._waits_for_head(heap[0][2]):
            heapq.heappop(heap)
        if not heap:
            return None
        return max(heap[0][0] - self.settings.clock(), 0.0)

    def _expire(self) -> None:
        """Streams whose route timeout passed before their response head: the timeout error, the upstream
        stream reset (CANCEL)."""
        heap = self.deadlines
        now = self.settings.clock()
        while heap and heap[0][0] <= now:
            pair = heapq.heappop(heap)[2]
            if self._waits_for_head(pair):
                assert pair.route is not None and pair.route.timeout is not None
                pair.timed_out = True
                self._fail(pair, errors.response_timeout(pair.route.timeout), attempt=False)

    def _retried(self, pair: _Pair, status: int, grpc_status: int | None, error: ProxyError | None = None) -> bool:
        """An attempt of a routed stream ended with ``status`` (and ``grpc_status``) before anything went to
        the client: True when it is sent again (or the timeout, passed, answered it), False when this is the
        answer.

        As ``core.http1_proxy._routed``: a failure by the route's classes is
        retried while the budget allows, if the request body is kept whole
        (within 64 KiB; one still coming goes on to the new attempt as it
        comes, as HTTP/1's replay does); an endpoint error only if it is an
        i/o one (not fail-fast). ``settle`` (``core.retries``) decides.
        """
        route = pair.route
        assert route is not None
        budget = route.budget
        if budget is None:
            return False
        failure = route.is_failure(status, grpc_status)
        retryable = failure and pair.kept is not None and (error is None or error.kind.retryable)
        expired = retryable and pair.deadline is not None and self.settings.clock() >= pair.deadline
        settled = settle(budget, retryable, expired, self._routes(pair), route.metric_labels, status, grpc_status)
        if settled is Settled.FINAL:
            return False
        # The attempt is over: its response under its endpoint, the endpoint released, the upstream stream reset.
        if pair.counted:
            default_ok = error is None and (grpc_status == 0 if grpc_status is not None else status < 500)
            pair.grpc_status = grpc_status
            self._record_endpoint(pair, status, default_ok)
        if settled is Settled.EXPIRED:
            self._detach(pair)
            pair.status = None
            pair.timed_out = True
            self._fail(pair, errors.response_timeout(route.timeout or 0.0), attempt=False)
            return True
        self._again(pair)
        return True

    def _again(self, pair: _Pair, recount: bool = True) -> None:
        """Another attempt: the kept request goes to a new pick (on a new upstream stream); ``recount``: the new
        attempt is a request of its own in the endpoint metrics."""
        up = pair.up
        self._drop_leg(pair)  # the failed response is not read further
        if up is not None and up.draining and not up.streams:
            self._close_up(up)
        if pair.pick is not None:
            pair.pick.release()
            pair.pick = None
        assert pair.kept is not None
        pair.req_buf = deque(pair.kept)
        pair.req_sent = False
        pair.skip_ack = pair.kept_size - pair.owed_down  # the part the client has had acknowledged
        pair.status = pair.grpc_status = None
        pair.head_ended = pair.sampled = pair.recorded = False
        pair.counted = pair.counted and not recount
        pair.resp_trailers = None
        pair.attempts = 0
        pair.leg_gone = False  # an upstream lost before the head detached the stream: it goes on
        self._route(pair, None)

    # -- errors -----------------------------------------------------------------------------------------------

    def _fail(self, pair: _Pair, error: ProxyError, *, attempt: bool = True) -> None:
        """The proxy answers for ``pair`` (no response began): Linkerd's synthesized response.

        On a profile route, an ``attempt``'s error is that response as far as
        retries go (Linkerd answers for an endpoint below its retry layer):
        an endpoint error may be retried instead.
        """
        if attempt and pair.route is not None and pair.status is None and not pair.resp_end:
            status, grpc = (200, errors.grpc_status(error)) if pair.grpc else (error.status, None)
            if self._retried(pair, status, grpc, error):
                return
        if error.metric:
            self.out.append(Count(f"{self.settings.direction}_http_errors_total", f'error="{error.metric}"'))
        labels = pair.pick.labels if pair.pick is not None else self.settings.error_labels
        metrics = self.settings.metrics
        if metrics is not None and labels and not pair.counted:
            metrics.request(labels)
        pair.counted = True
        if pair.status is not None:
            self._leg_failed(pair, error)
            return
        if pair.grpc:
            status = 200
            headers: Headers = [(b":status", b"200"),
                                *errors.grpc_headers(error, informational=self.settings.informational)]
            pair.grpc_status = errors.grpc_status(error)
        else:
            status = error.status
            # l5d-proxy-connection only for a downgraded request: the HTTP/2 connection itself stays open.
            head = errors.response(error, meshed_client=pair.orig_proto is not None and self.settings.meshed_client,
                                   informational=self.settings.informational)
            headers = [(b":status", str(status).encode())]
            headers += [(n.lower(), v) for n, v in head.headers if n.lower() not in HOP_BY_HOP]
            if pair.orig_proto is not None:
                headers.append((L5D_ORIG_PROTO, b"HTTP/1.1"))
        pair.status = status
        pair.resp_end = pair.head_ended = True
        self.down.send_headers(pair.sid, headers, end_stream=True)
        self._record(pair, status, False)
        self._detach(pair)
        if not pair.req_end:
            pair.reset_after = ErrorCodes.NO_ERROR  # the client need not send the rest

    def _leg_failed(self, pair: _Pair, error: ProxyError) -> None:
        """The upstream leg broke: an error response if none began, else the stream ends in error."""
        self._detach(pair)
        if pair.status is None:
            self._fail(pair, error)
            return
        if pair.resp_end:
            return
        self._record(pair, pair.status, False, "unclassified")
        if pair.grpc:
            # Linkerd reports an error after a gRPC response began in its trailers.
            pair.resp_end = True
            self.down.queue_end(pair.sid, [(GRPC_STATUS, str(errors.grpc_status(error)).encode()),
                                           (b"grpc-message", errors.grpc_message(error.message))])
            self._flush_down(pair.sid)
        else:
            self.down.reset(pair.sid, ErrorCodes.INTERNAL_ERROR)
            self._finish(pair, reuse=False)

    def _detach(self, pair: _Pair) -> None:
        """Forget the upstream leg (reset it if still open); request data from now on is dropped."""
        pair.leg_gone = True
        self._drop_request(pair)
        self._drop_leg(pair)

    def _drop_leg(self, pair: _Pair) -> None:
        """The upstream leg goes: its stream reset (CANCEL), a downgraded request's HTTP/1 connection closed."""
        up = pair.up
        if up is not None and pair.usid is not None:
            up.ep.reset(pair.usid, ErrorCodes.CANCEL)
            up.streams.pop(pair.usid, None)
            self._ack_up(pair)
        pair.up = None
        pair.usid = None
        if pair.h1 is not None:
            self.h1s.pop(pair.h1.io, None)
            self.out.append(Checkin(pair.h1.io, reuse=False))
            pair.h1 = None

    def _ack_up(self, pair: _Pair) -> None:
        if pair.owed_up and pair.up is not None and pair.usid is not None:
            pair.up.ep.ack(pair.usid, pair.owed_up)
        pair.owed_up = 0

    # -- the end of a stream ----------------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Finish the pairs whose both directions are through."""
        for pair in list(self.pairs.values()):
            if pair.resp_end and not self.down.pending(pair.sid) and self._request_through(pair):
                self._finish(pair, reuse=True)

    def _request_through(self, pair: _Pair) -> bool:
        if pair.leg_gone:
            return True
        if not pair.req_sent:
            return False
        return pair.usid is None or pair.up is None or not pair.up.ep.pending(pair.usid)

    def _finish(self, pair: _Pair, *, reuse: bool) -> None:
        if pair.finished:
            return
        pair.finished = True
        if self.settings.observer is not None:
            self.settings.observer.end(pair, pair.status, None)
        self.pairs.pop(pair.sid, None)
        if pair.owed_down:
            self.down.ack(pair.sid, pair.owed_down)
            pair.owed_down = 0
        if pair.reset_after is not None and not pair.req_end:
            self.down.reset(pair.sid, pair.reset_after)
        up = pair.up
        if up is not None and pair.usid is not None:
            up.streams.pop(pair.usid, None)
            self._ack_up(pair)
            up.ep.drop(pair.usid)
            if up.draining and not up.streams:
                self._close_up(up)
            else:
                self._open_waiting(up)
        h1 = pair.h1
        if h1 is not None:
            codec = h1.codec
            keep = (reuse and codec.keep_alive and codec.our_state is State.DONE
                    and codec.their_state is State.DONE and not h1.eof)
            if keep:
                h1.io.codec = None  # the HTTP/1 layer makes its own codec for a pooled connection
            self.h1s.pop(h1.io, None)
            self.out.append(Checkin(h1.io, reuse=keep))
        self._release(pair)

    def _release(self, pair: _Pair) -> None:
        if pair.in_flight:
            pair.in_flight = False
            self.settings.in_flight.count -= 1  # type: ignore[union-attr]  # set only with a limit
        if pair.route_gen is not None:
            pair.route_gen.close()
            pair.route_gen = None
        if pair.pick is not None:
            pair.pick.release()
            pair.pick = None

    def _record(self, pair: _Pair, status: int, success: bool, error: str = "") -> None:
        """The stream's response (``success`` by the default rule), under its endpoint and its route."""
        if pair.route is not None:
            self._record_route(pair, status, error)
        self._record_endpoint(pair, status, success, error)

    def _record_route(self, pair: _Pair, status: int, error: str) -> None:
        """``route_response_total`` and its latency, once: ``classification`` by the route's classes."""
        route = pair.route
        if route is None or pair.route_recorded:
            return
        pair.route_recorded = True
        routes = self._routes(pair)
        if routes is None:
            return
        grpc = pair.grpc_status if pair.grpc else None
        ms = int((self.settings.clock() - pair.start) * 1000)
        if pair.timed_out:
            routes.response(route.metric_labels, 0, False, ms, "timeout", actual=False)
        else:
            routes.response(route.metric_labels, status, not error and not route.is_failure(status, grpc), ms,
                            error, grpc_status=grpc)

    def _record_endpoint(self, pair: _Pair, status: int, success: bool, error: str = "") -> None:
        if pair.recorded:
            return
        pair.recorded = True
        if pair.pick is not None:
            pair.pick.outcome(success)  # failure accrual (core.breaker)
        metrics = self.settings.metrics
        labels = pair.pick.labels if pair.pick is not None else self.settings.error_labels
        if metrics is not None and labels:
            metrics.response(labels, status, success, int((self.settings.clock() - pair.start) * 1000), error,
                             grpc_status=pair.grpc_status if pair.grpc else None)

    # -- downgraded requests: HTTP/1 to the app (l5d-orig-proto, proxy.md §7.7) -----------------------------

    def _checked_out(self, pair: _Pair, reply: Upstream | Failed) -> None:
        if pair.finished or pair.leg_gone:
            if isinstance(reply, Upstream):
                self.out.append(Checkin(reply, reuse=False))
            return
        pick = pair.pick
        assert pick is not None
        if isinstance(reply, Failed):
            self._retry(pair, errors.connect_failed(pick.connect.addr, reply.timed_out, reply.error, reply.errno))
            return
        h1 = _H1(reply, replayable=pair.req_end and not pair.req_buf and not pair.req_trailers)
        pair.h1 = h1
        self.h1s[reply] = pair
        head, h1.chunked = self._downgraded_request(pair)
        h1.out += h1.codec.send_head(head)
        self._push_h1(pair)

    def _downgraded_request(self, pair: _Pair) -> tuple[RequestHead, bool]:
        assert pair.orig_proto is not None
        version = b"1.0" if pair.orig_proto.upper().startswith(b"HTTP/1.0") else b"1.1"
        target = pair.path
        if b"absolute-form" in pair.orig_proto.lower():
            target = pair.scheme + b"://" + pair.authority + pair.path
        drop = (L5D_ORIG_PROTO, b"te")
        headers = [(n, v) for n, v in self._request_headers(pair) if n not in drop]
        if not any(n == b"host" for n, _ in headers):
            headers.insert(0, (b"host", pair.authority or (pair.pick.authority if pair.pick else b"")))
        chunked = False
        body = not pair.req_end or bool(pair.req_buf)
        if body and not any(n == b"content-length" for n, _ in headers):
            if pair.req_end and not pair.req_trailers:
                headers.append((b"content-length", str(sum(len(c) for c in pair.req_buf)).encode()))
            else:
                headers.append((b"transfer-encoding", b"chunked"))
                chunked = True
                version = b"1.1"
        return RequestHead(pair.method, target, tuple(headers), version), chunked

    def _push_h1(self, pair: _Pair) -> None:
        """Write the request body to the app while its connection takes it (no window: its buffer decides)."""
        h1 = pair.h1
        if h1 is None or h1.io in self.blocked or pair.req_sent:
            return
        codec = h1.codec
        try:
            while pair.req_buf:
                chunk = pair.req_buf.popleft()
                h1.out += codec.send_body(chunk)
                self.down.ack(pair.sid, len(chunk))
                pair.owed_down -= len(chunk)
            if pair.req_end:
                h1.out += codec.send_end(tuple(pair.req_trailers or ()) if h1.chunked else ())
                pair.req_sent = True
        except LocalProtocolError:
            # The client's body does not match its content-length.
            self.down.reset(pair.sid, ErrorCodes.PROTOCOL_ERROR)
            self._detach(pair)
            self._finish(pair, reuse=False)

    def _from_h1(self, pair: _Pair, data: bytes) -> None:
        h1 = pair.h1
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
                    self._downgraded_response(pair, event)
            elif isinstance(event, Body):
                if pair.status is not None:
                    self.down.queue_data(pair.sid, event.data)
            elif isinstance(event, EndOfMessage):
                if pair.status is not None:
                    self._response_end(pair, [(n.lower(), v) for n, v in event.trailers] or None)
        if pair.finished or pair.resp_end:
            return
        if events is None or h1.eof:
            if pair.status is None and h1.replayable and h1.io.reused and pair.attempts + 1 < CONNECT_ATTEMPTS:
                # A pooled connection the app had closed: a request without a body is sent again.
                pair.attempts += 1
                self.h1s.pop(h1.io, None)
                self.out.append(Checkin(h1.io, reuse=False))
                pair.h1 = None
                assert pair.pick is not None
                self.out.append(Start(("h1", pair), Checkout(pair.pick.connect, pair.pick.header)))
                return
            addr = pair.pick.connect.addr if pair.pick is not None else "app"
            self._leg_failed(pair, errors.io_error(addr))
            return
        self._flush_down(pair.sid)

    def _downgraded_response(self, pair: _Pair, head: ResponseHead) -> None:
        self._sample(pair)
        listed = {t.strip().lower() for n, v in head.headers if n.lower() == b"connection" for t in v.split(b",")}
        headers: Headers = [(b":status", str(head.status).encode())]
        for name, value in head.headers:
            low = name.lower()
            if low in HOP_BY_HOP or low in listed or low == L5D_ORIG_PROTO:
                continue
            headers.append((low, value))
        headers.append((L5D_ORIG_PROTO, b"HTTP/" + head.version))
        pair.status = head.status
        self.down.send_headers(pair.sid, headers)
