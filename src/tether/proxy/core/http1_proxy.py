"""The HTTP/1 proxy of one client connection, push-driven: bytes in from callbacks, writes out through a sink.

``Http1Proxy`` is a plain class (sans-IO, no asyncio). The I/O side
(``io.http1_io``) calls it from the transports' callbacks --
``down_data``/``down_eof``/``down_lost`` for the accepted connection,
``up_data``/``up_eof`` for the upstream connection of the request in hand --
and it answers by calling its ``Http1Sink``: writes, a pooled connection
checked out or in, a discovery wait, a timer. A request on a warm connection
(the router answers at once, the pool has an idle connection) is served
within those callbacks: no task, future or awaited command. Only what has to
wait goes async and comes back by a callback: connecting, discovery, a route's
timeout.

For each request on the connection (parsed by one ``codec.http1``
connection in the server role, kept for the connection's life):

1. ``RequestPolicy.check`` (when installed, #15), then the ``Router`` picks
   where it goes -- per request, so P2C and the endpoint set apply to every
   request; a failed connect puts the endpoint in backoff and the request
   tries another, up to three times;
2. the head goes up (as it came, when there is nothing to rewrite: see
   ``core.http1_headers``), then the body as it arrives; the response comes
   back the same way as soon as its head is there (full duplex), re-framed
   for the client;
3. the upstream connection goes back to the pool when both ends allow
   keep-alive, and the next request (maybe already read: pipelining) begins.

A request on a ServiceProfile or client policy route (``Pick.route``) also gets the route's
timeout (a timer from the request head to the response head, over every
attempt: 504), retries of failures while the profile's budget (or the policy
rule's limit) allows (the body kept up to 64 KiB, ``MAX_REPLAY``), and the
route metrics (proxy.md §7.5, §7.6, §9.2, §9.5); a policy rule's retries may
also have a per-attempt timeout (``ex.attempt``: the attempt is dropped and
retried) and a backoff before each retry (the same timer). An idle pooled connection that turns out closed
is tried once more on a new one when what was sent can be sent again; when that connect fails, the request goes
to another pick, as after any failed connect (the endpoint may be shutting down).

Errors are answered as Linkerd answers them (``core.errors``: 502/503/504
with ``l5d-proxy-error``; 400/431 for a request the codec refuses, which is
also counted in ``response_total`` and logged, rate-limited); the
connection is closed after each, except after the answers Linkerd makes
without closing (``ProxyError.close`` false: 403, 404, 429, a redirect, an
injected failure, a client policy route's timeout): then the rest of the
request body is read and dropped (up to ``DRAIN_LIMIT`` bytes; more, and the
connection is closed) and the next request is served on the same connection
-- unless the client said it would not go on (``connection: close``,
HTTP/1.0) or the request was a ``CONNECT`` (what follows it is the tunnel's,
not HTTP). A client that goes away while its request
is in hand has its upstream connection closed at once. ``Upgrade`` + 101 and
``CONNECT`` + 2xx end HTTP: the sink joins the two connections byte for
byte (inbound, withdrawn when the port's policy stops admitting the request
that switched: ``RequestPolicy.upgraded``). A first line that is not HTTP/1 (detection only sees a prefix) is
carried as opaque bytes.

The proxy's graceful shutdown (``drain``): an idle connection closes at once,
one with a request in hand after its response (``connection: close``).

Tests: tests/proxy/test_http1_proxy.py (playbooks: events in, sink calls out).
Callers: ``core.inbound`` and ``core.outbound`` (``http1``, their
``PROTOCOL_LAYERS`` entry for HTTP/1), which hand the connection to
``io.driver`` with ``ServeHttp1``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Generator
from typing import Any, Protocol

from tether.proxy.codec.http1 import (
    BadMessage,
    BadStartLine,
    Body,
    ConnectionClosed,
    EndOfMessage,
    Event,
    Headers,
    Http1Connection,
    RequestHead,
    ResponseHead,
    Role,
    State,
)
from tether.proxy.core import errors, exchange, orig_proto
from tether.proxy.core.commands import Command, Connect, Failed, Layer, Revocable
from tether.proxy.core.errors import ProxyError, RouteError
from tether.proxy.core.http import MAX_REPLAY, ClientAddr, HttpSettings, Pick, Router, no_outcome, no_sample, nothing
from tether.proxy.core.http1_headers import downstream_response, edited, informational, upstream_request
from tether.proxy.core.http_commands import ServeHttp1, Upstream
from tether.proxy.core.retries import Settled

log = logging.getLogger(__name__)

CONNECT_ATTEMPTS = 3
# Client bytes held while the request in hand cannot take them (routing, connecting; a pipelined next
# request): above this, the client's connection is not read until they are passed on.
HOLD_LIMIT = 64 * 1024
# Request body read and dropped after an answer that keeps the connection: above this, the connection is closed
# instead (reading a large upload to its end costs more than the client's reconnecting).
DRAIN_LIMIT = 64 * 1024
REFUSAL_LOG_INTERVAL = 10.0  # seconds between log lines about refused requests (the rest are counted)


class Timer(Protocol):
    def cancel(self) -> None: ...


class Http1Sink(Protocol):
    """What the core asks of the I/O side (``io.http1_io.Http1Io``); none of it blocks."""

    def send_down(self, data: bytes) -> None:
        """Write to the client (the I/O side stops reading upstream while the client's buffer is full)."""

    def pause_down(self) -> None:
        """Stop reading the client (the core holds too much of what it sent)."""

    def resume_down(self) -> None: ...

    def close(self) -> None:
        """The connection is over: close the client's connection once what was written is sent."""

    def checkout(self, connect: Connect, header: bytes | None,
                 done: Callable[[Upstream | Failed], None]) -> Upstream | None:
        """An idle pooled connection at once (returned), else None and ``done`` called with a new one (or
        ``Failed``) later. A checked-out connection's bytes come to ``up_data``/``up_eof`` until checked in."""

    def send_up(self, data: bytes) -> None:
        """Write to the upstream connection in hand -- the one checked out last, not checked in since (the I/O
        side stops reading the client while the upstream's buffer is full)."""

    def checkin(self, up: Upstream, reuse: bool) -> None:
        """Give a connection back: to the pool when ``reuse``, else closed."""

    def wait(self, command: Command, done: Callable[[Any], None]) -> None:
        """Run a blocking command (the router's discovery ``Wait``); ``done`` gets its reply."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...

    def count(self, name: str, labels: str) -> None:
        """Add one to the counter ``name`` (``<direction>_http_errors_total``)."""

    def tunnel(self, up: Upstream, to_up: bytes, to_down: bytes, done: Callable[[], None],
               authz: Revocable | None) -> None:
        """After a protocol switch: join the two connections byte for byte; ``done`` when both ended. While
        joined, ``authz`` may withdraw them (both closed at once: the policy no longer admits them)."""


def http1(router: Router, settings: HttpSettings) -> Layer:
    """The HTTP/1 layer of a connection: the driver serves it with an ``Http1Proxy`` over its sink."""
    yield ServeHttp1(router, settings)


class Phase(enum.Enum):
    ROUTING = "routing"  # asking the router (maybe waiting for discovery)
    CONNECTING = "connecting"  # waiting for an upstream connection
    WAITING = "waiting"  # the request is going up; no final response head yet
    RELAYING = "relaying"  # the response is coming down
    OVER = "over"


class _Exchange:
    """One request and its response, across its attempts; with the request body as read so far (``kept``), for
    another attempt while it stays within ``keep_limit`` bytes (in this object rather than one of its own:
    one object less per request)."""

    __slots__ = ("request", "received", "start", "phase", "route", "route_labels", "timer", "attempt", "idle",
                 "active", "kept", "kept_size", "keep_limit", "overflow", "unsent", "held",
                 "pick", "up", "client", "connects", "begun", "sampled", "resent", "counted", "head", "success",
                 "chunked", "in_flight", "sent", "trailers", "frames", "series")

    def __init__(self, request: RequestHead, start: float) -> None:
        self.request = request  # as it goes on (a route's header modifier may have edited it)
        self.received = request  # as the client sent it (what the request policy decided on)
        self.start = start
        self.phase = Phase.ROUTING
        self.route: Any = None  # core.profiles.Route, once the first pick named one
        self.route_labels = ""  # the route metrics' series ("" : not counted)
        self.timer: Timer | None = None  # the route's timeout
        self.attempt: Timer | None = None  # a client policy rule's per-attempt timeout, or its retry backoff
        self.idle: Timer | None = None  # a client policy rule's idle timeout
        self.active = 0.0  # when a byte last moved (the idle timeout's reference)
        self.kept: list[Body | EndOfMessage] = []
        self.kept_size = 0
        self.keep_limit = 0  # without a route that retries: kept only while there is no body (a stale connection)
        self.overflow = False  # the body was too large to keep: the request cannot be sent again
        self.unsent: list[Body | EndOfMessage] = []  # body events not yet written to the upstream in hand
        self.held = 0  # bytes in ``unsent``
        self.pick: Pick | None = None
        self.up: Upstream | None = None
        # The upstream connection's HTTP/1 client codec, or the l5d-orig-proto leg that stands in for one (the leg
        # takes the same calls; typed as both so the compiled core checks and dispatches either).
        self.client: Http1Connection | orig_proto.Leg | None = None
        self.connects = 0  # failed connects of this attempt
        self.begun = 0.0  # when the attempt's request went out (the RTT sample's start)
        self.sampled = False
        self.resent = False  # sent again once after a stale pooled connection
        self.counted = False  # the attempt's request_total is counted
        self.head: ResponseHead | None = None  # the final response head being relayed
        self.success = True  # by the route's classes (the route metrics)
        self.chunked = False  # the response to the client is chunked (so it may carry trailers)
        self.sent = 0  # response body bytes relayed to the client (tap's response_end)
        self.trailers: Headers = ()  # the relayed response's trailers, kept only for an observer (tap)
        self.in_flight = False
        self.frames: Callable[[float], None] | None = None  # the policy route's request frame sizes
        self.series: Any = None  # the attempt's request_total series (core.http_metrics), for its response

    def keep(self, event: Body | EndOfMessage) -> None:
        """``event`` of the request body kept for another attempt, unless the body outgrew ``keep_limit``."""
        if isinstance(event, Body):
            self.kept_size += len(event.data)
            if self.kept_size > self.keep_limit:
                self.overflow = True
                self.kept.clear()
        if not self.overflow:
            self.kept.append(event)


class Http1Proxy:
    """One accepted HTTP/1 connection (see the module docstring), answering through ``sink``."""

    def __init__(self, router: Router, settings: HttpSettings, sink: Http1Sink, *,
                 client: ClientAddr | None = None) -> None:
        self.router = router
        self.client = client  # the connection's peer, for tap
        self.settings = settings
        self.sink = sink
        self.server = Http1Connection(Role.SERVER, max_head_size=settings.max_head_size)
        self.ex: _Exchange | None = None
        self.first = True  # no request head yet: a bad first line means "not HTTP" (opaque)
        self.over = False
        self.paused = False  # the client's connection is not read (HOLD_LIMIT)
        self.reading = False  # a request's body is being read (its EndOfMessage not yet seen)
        self.drained: int | None = None  # bytes of an answered request's body dropped so far (None: not draining)
        self.again = False  # the drained request ended inside ``_down_events``: it goes on with the next request

    @property
    def idle(self) -> bool:
        """No request in hand (between requests): what the client's idle timeout applies to."""
        return self.ex is None and not self.over

    # -- the client's connection ---------------------------------------------------------------------------------

    def down_data(self, data: bytes) -> None:
        if self.over:
            return
        try:
            events = self.server.receive_data(data)
        except BadMessage as exc:
            self._refused(exc)
            return
        self._down_events(events)
        if not self.over and not self.paused and len(self.server.unparsed) > HOLD_LIMIT:
            self._pause()

    def down_eof(self) -> None:
        self.down_data(b"")

    def expire(self) -> None:
        """The client kept its connection idle between requests for too long: close it (no answer)."""
        if self.idle:
            self._close()

    def drain(self) -> None:
        """The proxy is shutting down (hyper's graceful shutdown): an idle connection closes now; one with a
        request in hand closes after its response, which says ``connection: close`` unless its head is out."""
        if self.idle:
            self._close()
        else:
            self.server.keep_alive = False

    def down_lost(self) -> None:
        """The client's connection is gone: whatever is in hand upstream is dropped at once."""
        if self.over:
            return
        ex = self.ex
        if ex is not None:
            if ex.up is not None:
                self.sink.checkin(ex.up, reuse=False)
                ex.up = None
            if ex.head is not None and ex.pick is not None:
                self._record(ex.pick.labels, ex.head.status, False, ex.start)
            self._end(ex)
        self._close()

    def _down_events(self, events: list[Event]) -> None:
        while True:
            for event in events:
                if self.over:
                    return
                if isinstance(event, RequestHead):  # a request begins (here: a call less per request)
                    self.first = False
                    self.reading = True
                    settings = self.settings
                    ex = self.ex = _Exchange(event, settings.clock())
                    if settings.observer is not None:
                        settings.observer.begin(ex, event, self.client, settings.client_id)
                    ex.in_flight, refusal, edit = exchange.admit(settings, event)
                    if refusal is not None:
                        self._answer(ex, refusal, None)
                        continue
                    if edit is not None:
                        ex.request = edited(event, edit)
                    self._route(ex)
                elif isinstance(event, (Body, EndOfMessage)):
                    if isinstance(event, EndOfMessage):
                        self.reading = False
                    if self.ex is not None:
                        self._request_event(self.ex, event)
                    elif self.drained is not None:
                        self._drain(event)
                elif isinstance(event, ConnectionClosed):
                    self._close()
            # A loop, not a call: requests answered at once (pipelined 403s) must not nest a frame each.
            if not self.again or self.over:
                return
            self.again = False
            next_events = self._cycle()
            if next_events is None:
                return
            events = next_events

    def _pause(self) -> None:
        self.paused = True
        self.sink.pause_down()

    def _resume(self) -> None:
        if self.paused:
            self.paused = False
            self.sink.resume_down()

    # -- a request ----------------------------------------------------------------------------------------------

    def _request_event(self, ex: _Exchange, event: Body | EndOfMessage) -> None:
        if ex.idle is not None:
            ex.active = self.settings.clock()
        if isinstance(event, Body):
            ex.keep(event)
        elif not ex.overflow:  # the end, kept as ``keep`` keeps it (nothing to count: a call less per request)
            ex.kept.append(event)
        if ex.frames is not None and isinstance(event, Body):
            ex.frames(len(event.data))
        up = ex.up
        if up is not None and ex.phase in (Phase.WAITING, Phase.RELAYING):
            client = ex.client
            assert client is not None
            if isinstance(event, Body):
                self.sink.send_up(client.send_body(event.data))
            else:
                end = client.send_end(event.trailers)
                if end:  # nothing for a Content-Length body
                    self.sink.send_up(end)
            return
        if ex.phase is Phase.OVER:
            return
        ex.unsent.append(event)
        if isinstance(event, Body):
            ex.held += len(event.data)
            if ex.held > HOLD_LIMIT and not self.paused:
                self._pause()

    def _route(self, ex: _Exchange) -> None:
        ex.phase = Phase.ROUTING
        gen = self.router(ex.request)
        try:  # the first step here: a router that needs no wait answers at once (no _route_step call)
            command = gen.send(None)
        except StopIteration as stop:
            self._routed(ex, stop.value)
            return
        self.sink.wait(command, lambda answer: self._route_step(ex, gen, answer))

    def _route_step(self, ex: _Exchange, gen: Generator[Command, Any, Pick | ProxyError], reply: Any) -> None:
        if self.ex is not ex:
            gen.close()
            return
        try:
            command = gen.send(reply)
        except StopIteration as stop:
            self._routed(ex, stop.value)
            return
        self.sink.wait(command, lambda answer: self._route_step(ex, gen, answer))

    def _routed(self, ex: _Exchange, pick: Pick | ProxyError) -> None:
        if ex.route is None and pick.route is not None:  # the first pick names the request's profile route
            self._on_route(ex, pick.route)
        if isinstance(pick, ProxyError):
            self._outcome(ex, None, pick)
            return
        if pick.upgrade is not None and orig_proto.upgradable(ex.request):
            pick.connect, pick.header = pick.upgrade  # over the endpoint's HTTP/2 connection (l5d-orig-proto)
        ex.pick = pick
        if ex.frames is None and pick.request_frames is not None:
            frames = ex.frames = pick.request_frames
            for event in ex.unsent:  # the body that came before the pick
                if isinstance(event, Body):
                    frames(len(event.data))
        ex.phase = Phase.CONNECTING
        up = self.sink.checkout(pick.connect, pick.header, lambda reply: self._checked_out(ex, pick, reply))
        if up is not None:  # a pooled connection at once: nothing ended meanwhile (_checked_out's checks hold)
            self._send(ex, pick, up)

    def _on_route(self, ex: _Exchange, route: Any) -> None:
        ex.route = route
        ex.route_labels, frames, idle = exchange.route_begun(self.settings, route)
        ex.frames = frames
        if frames is not None:
            for event in ex.unsent:  # the body that came before the route was known
                if isinstance(event, Body):
                    frames(len(event.data))
        if route.budget is not None:
            ex.kept, ex.kept_size, ex.keep_limit, ex.overflow = [], 0, MAX_REPLAY, False
            for event in ex.unsent:  # what came before the route was known
                ex.keep(event)
        if route.timeout is not None:
            left = ex.start + route.timeout - self.settings.clock()
            ex.timer = self.sink.call_later(max(left, 0.0), lambda: self._timed_out(ex))
        if idle is not None:
            ex.active = self.settings.clock()
            ex.idle = self.sink.call_later(idle, lambda: self._idle_check(ex, idle))

    def _checked_out(self, ex: _Exchange, pick: Pick, reply: Upstream | Failed) -> None:
        if self.ex is not ex or ex.pick is not pick or ex.phase is not Phase.CONNECTING:
            if isinstance(reply, Upstream):  # the request ended meanwhile (a timeout, the client gone)
                self.sink.checkin(reply, reuse=True)  # nothing was sent on it: free for another request
            return
        if isinstance(reply, Failed):
            pick.failed()
            pick.release()
            ex.pick = None
            ex.connects += 1
            error = errors.connect_failed(pick.connect.addr, reply.timed_out, reply.error, reply.errno)
            if ex.connects < CONNECT_ATTEMPTS:
                self._route(ex)
            else:
                self._outcome(ex, None, error)
            return
        self._send(ex, pick, reply)

    def _send(self, ex: _Exchange, pick: Pick, up: Upstream) -> None:
        """The attempt's request goes out on ``up``: its head and what of the body has come so far."""
        settings = self.settings
        ex.up = up
        client = up.codec
        if client is None:
            client = up.codec = Http1Connection(Role.CLIENT, max_head_size=settings.max_head_size)
        ex.client = client
        if not ex.counted:
            ex.counted = True
            ex.begun = settings.clock()
            ex.sampled = False
            if settings.metrics is not None:
                ex.series = settings.metrics.request(pick.labels)
            if settings.observer is not None:
                settings.observer.request(ex, ex.request, pick.labels, self.client)
        out = client.send_head(upstream_request(ex.request, pick, settings))
        for event in ex.unsent:
            out += client.send_body(event.data) if isinstance(event, Body) else client.send_end(event.trailers)
        ex.unsent.clear()
        ex.held = 0
        ex.phase = Phase.WAITING
        self.sink.send_up(out)
        attempt = exchange.attempt_timeout(ex.route) if ex.route is not None else None
        if attempt is not None:
            self._cancel_attempt(ex)
            ex.attempt = self.sink.call_later(attempt, lambda: self._attempt_timed_out(ex, up, attempt))
        if self.paused and len(self.server.unparsed) <= HOLD_LIMIT:
            self._resume()

    # -- the upstream connection --------------------------------------------------------------------------------

    def up_data(self, up: Upstream, data: bytes) -> None:
        ex = self.ex
        if ex is None or ex.up is not up:
            return  # not ours any more (the I/O side stops delivering at check-in)
        if ex.idle is not None:
            ex.active = self.settings.clock()
        client = ex.client
        assert client is not None
        try:
            events = client.receive_data(data)
        except BadMessage:
            self._up_failed(ex)
            return
        if not events and not data:
            self._up_failed(ex)
            return
        for event in events:
            if self.ex is not ex or ex.up is not up:
                return
            if isinstance(event, ResponseHead):  # (here, not in a method of its own: a call less per response)
                pick = ex.pick
                assert pick is not None
                if not ex.sampled:
                    ex.sampled = True
                    if pick.observe is not no_sample:  # no balancer (inbound): no clock read, no call
                        pick.observe(self.settings.clock() - ex.begun)
                if event.status < 200 and client.our_state is not State.SWITCHED:
                    if self.server.our_state is State.IDLE:
                        self.sink.send_down(self.server.send_head(informational(event)))
                    continue
                self._outcome(ex, event, None)
            elif isinstance(event, Body):
                if ex.phase is Phase.RELAYING:
                    ex.sent += len(event.data)
                    frames = ex.pick.frames if ex.pick is not None else None
                    if frames is not None:
                        frames(len(event.data))
                    self.sink.send_down(self.server.send_body(event.data))
            elif isinstance(event, EndOfMessage):
                if ex.phase is Phase.RELAYING:
                    self._response_end(ex, event.trailers)
            else:  # ConnectionClosed: the upstream closed between messages, before any response
                self._up_failed(ex)

    def up_eof(self, up: Upstream) -> None:
        self.up_data(up, b"")

    def _up_failed(self, ex: _Exchange) -> None:
        up, pick = ex.up, ex.pick
        assert up is not None and pick is not None
        self.sink.checkin(up, reuse=False)
        ex.up = None
        if ex.phase is Phase.RELAYING:
            head = ex.head
            assert head is not None
            self.server.send_failed()
            self._record(pick.labels, head.status, False, ex.start, "unclassified")
            self._route_response(ex, head.status, False, "unclassified")
            self._end(ex)
            self._close()
            return
        if not ex.resent and up.reused and not ex.overflow:
            # An idle pooled connection the server had closed: what was kept is safe to send again. On a new
            # connection to the same endpoint; one that fails goes to another pick as any failed connect does
            # (``_checked_out``): the endpoint may be going away (a server proxy shutting down ends its
            # connections, then stops listening), and another can serve the request.
            ex.resent = True
            ex.unsent = list(ex.kept)
            ex.phase = Phase.CONNECTING
            fresh = self.sink.checkout(pick.connect, pick.header, lambda reply: self._checked_out(ex, pick, reply))
            if fresh is not None:
                self._send(ex, pick, fresh)
            return
        self._outcome(ex, None, orig_proto.upstream_failed(ex.client, pick.connect.addr))

    # -- what an attempt came to ------------------------------------------------------------------------------

    def _outcome(self, ex: _Exchange, head: ResponseHead | None, error: ProxyError | None) -> None:
        """An attempt's end: a final response head, or an error the proxy answers for. On a profile route, a
        failure (by the route's classes) may be retried within the budget (Linkerd's profile stack)."""
        if ex.attempt is not None:
            self._cancel_attempt(ex)
        route = ex.route
        pick = ex.pick
        # Failure accrual and the policy's backend metrics hear how the attempt ended (when anybody listens).
        if pick is not None and pick.outcome is not no_outcome:
            pick.outcome(head.status if head is not None else 0, None, self.settings.clock() - ex.begun)
        if route is None:
            if error is not None:
                self._answer(ex, error, pick)
            else:
                assert head is not None
                self._relay(ex, head, head.status < 500)
            return
        status = head.status if head is not None else error.status if error is not None else 0
        failure = route.is_failure(status)
        settled = exchange.settle_attempt(self.settings, route, ex.route_labels, ex.start, status, None, error,
                                          not ex.overflow)
        if settled is not Settled.FINAL:
            if pick is not None:
                self._record(pick.labels, status, status < 500, ex.start)
                pick.release()
                ex.pick = None
            if ex.up is not None:
                self.sink.checkin(ex.up, reuse=False)  # the failed response is not read further
                ex.up = None
            if settled is Settled.RETRY:
                ex.counted = False
                ex.connects = 0
                ex.unsent = list(ex.kept)
                ex.held = 0
                delay = exchange.retry_delay(route)
                if delay > 0:  # a client policy rule's backoff
                    ex.phase = Phase.ROUTING
                    ex.attempt = self.sink.call_later(delay, lambda: self._retry_now(ex))
                    return
                self._route(ex)
                return
            # The timeout wraps the retries: it has passed, so the request ends here.
            self._answer(ex, exchange.route_timeout(route), None, recorded=True)
            self._route_response(ex, 0, False, "timeout", route_error=exchange.timeout_error(route))
            return
        if error is not None:
            self._answer(ex, error, pick)
            self._route_response(ex, status, not failure, answered=error)
            return
        assert head is not None
        self._relay(ex, head, not failure)

    def _attempt_timed_out(self, ex: _Exchange, up: Upstream, timeout: float) -> None:
        """A client policy rule's per-attempt timeout passed before the response head: the attempt is
        abandoned, and retried while the rule allows (else 504)."""
        ex.attempt = None
        if self.ex is not ex or ex.up is not up or ex.phase is not Phase.WAITING:
            return
        self.sink.checkin(up, reuse=False)
        ex.up = None
        self._outcome(ex, None, errors.attempt_timeout(timeout))

    def _retry_now(self, ex: _Exchange) -> None:
        ex.attempt = None
        if self.ex is ex and ex.phase is Phase.ROUTING:
            self._route(ex)

    def _cancel_attempt(self, ex: _Exchange) -> None:
        if ex.attempt is not None:
            ex.attempt.cancel()
            ex.attempt = None

    def _idle_check(self, ex: _Exchange, idle: float) -> None:
        """The idle timer fired: re-armed if a byte moved meanwhile; else the request ends -- 504 before the
        response head, a broken-off response after it (the client's connection closed)."""
        ex.idle = None
        if self.ex is not ex or ex.phase is Phase.OVER:
            return
        left = ex.active + idle - self.settings.clock()
        if left > 0:
            ex.idle = self.sink.call_later(left, lambda: self._idle_check(ex, idle))
            return
        if ex.up is not None:
            self.sink.checkin(ex.up, reuse=False)
            ex.up = None
        pick = ex.pick
        if ex.phase is Phase.RELAYING:
            self._break_off(ex, "idle", RouteError.IDLE_TIMEOUT)
            return
        metrics = self.settings.metrics
        if pick is not None and not ex.counted and metrics is not None:
            metrics.request(pick.labels)
        self._answer(ex, errors.idle_timeout(idle), pick)
        self._route_response(ex, 0, False, "idle", route_error=RouteError.IDLE_TIMEOUT)

    def _break_off(self, ex: _Exchange, error: str, route_error: RouteError) -> None:
        """A response under way is broken off (a timeout passed): the upstream and the client's connection
        closed, the response recorded as failed with the status it had."""
        if ex.up is not None:
            self.sink.checkin(ex.up, reuse=False)
            ex.up = None
        head, pick = ex.head, ex.pick
        assert head is not None and pick is not None
        self.server.send_failed()
        self._record(pick.labels, head.status, False, ex.start, "unclassified")
        self._route_response(ex, head.status, False, error, route_error=route_error)
        self._end(ex)
        self._close()

    def _timed_out(self, ex: _Exchange) -> None:
        """The route's timeout passed: before the final response head 504 (the connection closed on a
        ServiceProfile route); after it (a client policy route's, which runs to the response's end) the response
        is broken off."""
        ex.timer = None
        if self.ex is not ex or ex.phase is Phase.OVER:
            return
        if ex.phase is Phase.RELAYING:
            self._break_off(ex, "timeout", exchange.timeout_error(ex.route))
            return
        if ex.up is not None:
            self.sink.checkin(ex.up, reuse=False)
            ex.up = None
        pick = ex.pick
        metrics = self.settings.metrics
        if pick is not None and not ex.counted and metrics is not None:
            metrics.request(pick.labels)  # timed out while connecting: the request still counts
        self._answer(ex, exchange.route_timeout(ex.route), pick)
        self._route_response(ex, 0, False, "timeout", route_error=exchange.timeout_error(ex.route))

    def _relay(self, ex: _Exchange, head: ResponseHead, success: bool) -> None:
        """From the final response head on: the response streamed to the client (or, after a protocol
        switch, the two connections joined)."""
        if ex.timer is not None and not exchange.timeout_spans_response(ex.route):
            ex.timer.cancel()
            ex.timer = None
        server = self.server
        up, pick, client = ex.up, ex.pick, ex.client
        assert up is not None and pick is not None and client is not None
        if self.settings.observer is not None:
            self.settings.observer.response(ex, head.status, head.headers)
        if client.our_state is State.SWITCHED:
            if server.their_state is not State.DONE:
                self.sink.checkin(up, reuse=False)
                ex.up = None
                self._end(ex)
                self._close()
                return
            self.sink.send_down(server.send_head(downstream_response(head, ex.request, server.keep_alive,
                                                                     self.settings)))
            self._record(pick.labels, head.status, True, ex.start)
            self._route_response(ex, head.status, success)
            ex.up = None
            ex.pick = None
            self._end(ex)
            self.over = True
            policy = self.settings.policy
            authz = policy.upgraded(ex.received) if policy is not None else None
            assert isinstance(client, Http1Connection)  # a leg never switches (orig_proto.upgradable)
            self.sink.tunnel(up, server.trailing_data, client.trailing_data, pick.release, authz)
            return
        down_head = downstream_response(head, ex.request, server.keep_alive, self.settings, pick.respond)
        framing = down_head.found
        ex.chunked = framing is not None and b"transfer-encoding" in framing
        ex.head = head
        ex.success = success
        ex.phase = Phase.RELAYING
        self.sink.send_down(server.send_head(down_head))

    def _response_end(self, ex: _Exchange, trailers: Headers) -> None:
        server = self.server
        up, pick, client, head = ex.up, ex.pick, ex.client, ex.head
        assert up is not None and pick is not None and client is not None and head is not None
        end = server.send_end(trailers if ex.chunked else ())
        if end:  # nothing for a Content-Length body
            self.sink.send_down(end)
        if ex.chunked and self.settings.observer is not None:
            ex.trailers = trailers
        exchange.record(self.settings, pick.labels, head.status, head.status < 500, ex.start, series=ex.series)
        if ex.route is not None:
            self._route_response(ex, head.status, ex.success)
        ex.up = None
        if server.their_state is not State.DONE:
            # The response ended before the request did: the rest of the request has nowhere to go.
            self.sink.checkin(up, reuse=False)
            self._end(ex)
            self._close()
            return
        reuse = client.keep_alive and client.our_state is State.DONE and client.their_state is State.DONE
        if reuse:
            client.start_next_cycle()
        self.sink.checkin(up, reuse=reuse)
        self._end(ex)
        events = self._cycle()  # the next request (as _next, without its call)
        if events:
            self._down_events(events)

    def _next(self) -> None:
        """The exchange is over and both sides allow it: the next request (maybe already read)."""
        events = self._cycle()
        if events:
            self._down_events(events)

    def _cycle(self) -> list[Event] | None:
        """The client's side of the connection moved on to its next request: what of it is already read (None:
        the connection closed instead)."""
        server = self.server
        if not server.keep_alive:
            self._close()
            return None
        if not server.start_next_cycle():  # nothing of the next request yet (the usual case): no parse
            if self.paused:
                self._resume()
            return []
        try:
            events = server.parse_buffered()
        except BadMessage as exc:
            self._refused(exc)
            return None
        if self.paused and len(server.unparsed) <= HOLD_LIMIT:
            self._resume()
        return events

    def _read_on(self, request: RequestHead) -> None:
        """After an answer that keeps the connection: the rest of the request body dropped, then the next
        request (see the module docstring)."""
        if not self.server.keep_alive or request.method == b"CONNECT":
            self._close()
            return
        if self.reading:  # its end comes through ``_down_events``, which goes on from there
            self.drained = 0
            self._resume()
            return
        self._next()

    def _drain(self, event: Body | EndOfMessage) -> None:
        if isinstance(event, Body):
            assert self.drained is not None
            self.drained += len(event.data)
            if self.drained > DRAIN_LIMIT:
                self._close()
            return
        self.drained = None
        self.again = True

    # -- answers, metrics and the end ----------------------------------------------------------------------------

    def _answer(self, ex: _Exchange, error: ProxyError, pick: Pick | None, recorded: bool = False) -> None:
        """Answer ``error`` for the request (its attempt's endpoint ``pick``, or none); then close, or read on
        when the error allows it.
        ``recorded``: the request was already recorded under the endpoint it tried."""
        settings = self.settings
        exchange.count_error(settings, error, self.sink.count)
        labels = pick.labels if pick is not None else settings.error_labels
        if not recorded and settings.metrics is not None and labels and pick is None:
            settings.metrics.request(labels)
        server = self.server
        keep = False
        if server.our_state is State.IDLE:
            head = errors.response(error, meshed_client=settings.meshed_client, informational=settings.informational)
            self.sink.send_down(server.send_head(head) + server.send_end())
            if labels and not recorded:
                self._record(labels, error.status, False, ex.start)
            keep = not error.close
        else:
            server.send_failed()
        if settings.observer is not None:
            settings.observer.end(ex, error.status, error)
        self._end(ex, told=True)
        if keep:
            self._read_on(ex.request)
        else:
            self._close()

    def _refused(self, exc: BadMessage) -> None:
        """The codec refused what the client sent."""
        ex = self.ex
        if isinstance(exc, BadStartLine) and self.first and ex is None:
            # Detection said HTTP/1 (its rule only sees a prefix) but the first line is not: carry it as opaque.
            self._opaque()
            return
        if ex is not None:  # a broken request body: what is in hand upstream is dropped
            if ex.up is not None:
                self.sink.checkin(ex.up, reuse=False)
                ex.up = None
            self._end(ex)
        if self.server.our_state is State.IDLE:
            error = errors.bad_request(exc.status_hint, str(exc))
            settings = self.settings
            labels = settings.error_labels
            if settings.metrics is not None and labels:
                settings.metrics.request(labels)
                settings.metrics.response(labels, error.status, False, 0, error.metric)
            exchange.count_error(settings, error, self.sink.count)
            _REFUSALS.note(settings.clock(), settings.direction, error)
            head = errors.response(error, meshed_client=False, informational=settings.informational)
            self.sink.send_down(self.server.send_head(head) + self.server.send_end())
        self._close()

    def _opaque(self) -> None:
        self._opaque_step(self.router(RequestHead(b"GET", b"/")), None)

    # Methods, not nested functions: a nested function that calls itself is a reference cycle (it is in its own
    # closure), which would hold this core until the cyclic collector runs (tests/proxy/test_http1_garbage.py).
    def _opaque_step(self, gen: Generator[Command, Any, Pick | ProxyError], reply: Any) -> None:
        if self.over:
            gen.close()
            return
        try:
            command = gen.send(reply)
        except StopIteration as stop:
            self._opaque_connect(stop.value)
            return
        self.sink.wait(command, lambda answer: self._opaque_step(gen, answer))

    def _opaque_connect(self, pick: Pick | ProxyError) -> None:
        if isinstance(pick, ProxyError):
            self._close()
            return
        up = self.sink.checkout(pick.connect, pick.header, lambda reply: self._opaque_connected(pick, reply))
        if up is not None:
            self._opaque_connected(pick, up)

    def _opaque_connected(self, pick: Pick, reply: Upstream | Failed) -> None:
        if isinstance(reply, Failed) or self.over:
            if isinstance(reply, Upstream):
                self.sink.checkin(reply, reuse=False)
            else:
                pick.failed()
            pick.release()
            self._close()
            return
        self.over = True
        self.sink.tunnel(reply, self.server.received, b"", pick.release, None)

    def _record(self, labels: str, status: int, success: bool, start: float, error: str = "") -> None:
        exchange.record(self.settings, labels, status, success, start, error)

    def _route_response(self, ex: _Exchange, status: int, success: bool, error: str = "",
                        answered: ProxyError | None = None, route_error: RouteError | None = None) -> None:
        exchange.record_route(self.settings, ex.route_labels, status, success, ex.start, error, route=ex.route,
                              answered=answered, route_error=route_error)

    def _end(self, ex: _Exchange, told: bool = False) -> None:
        """The exchange is over (however it ended): its timer, endpoint and in-flight count let go."""
        if ex.phase is Phase.OVER:
            return
        ex.phase = Phase.OVER
        if ex.timer is not None:
            ex.timer.cancel()
            ex.timer = None
        if ex.attempt is not None:
            self._cancel_attempt(ex)
        if ex.idle is not None:
            ex.idle.cancel()
            ex.idle = None
        pick = ex.pick
        if pick is not None:
            if pick.release is not nothing:
                pick.release()
            ex.pick = None
        if ex.in_flight:
            ex.in_flight = False
            exchange.leave(self.settings)
        observer = self.settings.observer
        if observer is not None and not told:
            observer.end(ex, ex.head.status if ex.head is not None else None, None,
                         response_bytes=ex.sent, trailers=ex.trailers)
        if self.ex is ex:
            self.ex = None

    def _close(self) -> None:
        if not self.over:
            self.over = True
            self.sink.close()


class _RefusalLog:
    """Requests the codec refused, logged at most once per ``REFUSAL_LOG_INTERVAL`` (the rest counted)."""

    __slots__ = ("last", "skipped")

    def __init__(self) -> None:
        self.last: float | None = None
        self.skipped = 0

    def note(self, now: float, direction: str, error: ProxyError) -> None:
        if self.last is not None and now - self.last < REFUSAL_LOG_INTERVAL:
            self.skipped += 1
            return
        more = f" ({self.skipped} more since the last line)" if self.skipped else ""
        log.info("%s HTTP/1 request refused with %d: %s%s", direction, error.status, error.message, more)
        self.last = now
        self.skipped = 0


_REFUSALS = _RefusalLog()
