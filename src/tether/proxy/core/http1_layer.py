"""The HTTP/1 layer: one client connection, its requests routed one at a time (proxy.md §7.3, §7.8, §7.9, §9.2).

For each request on the accepted connection (parsed by
``codec.http1.Http1Connection`` in the server role):

1. the ``Router`` (``core.routes``) picks where it goes -- per request, so a
   balancer's P2C choice and its endpoint set apply to every request, and a
   new endpoint takes traffic from the next one;
2. an upstream connection to that endpoint is checked out of the driver's pool
   (a new one with mTLS and the transport header as the endpoint says, or an
   idle one kept from an earlier request); a failed connect puts the endpoint
   in backoff and the request tries another, up to three times;
3. the head goes up without hop-by-hop headers, then the body, chunk by chunk
   as it arrives (never buffered whole); the response comes back the same way,
   re-framed for the client (chunked when the upstream gave no length);
4. the connection goes back to the pool when both sides allow keep-alive, and
   the client's connection waits for its next request.

An ``Upgrade`` answered with ``101`` or a ``CONNECT`` answered with 2xx ends
HTTP on both connections: the driver then joins them byte for byte
(``Tunnel``), with whatever each codec had read past the head.

Errors are answered as Linkerd answers them (``core.errors``): no endpoint
within the failfast timeout is 504, a failed connect 502 (504 on a timeout),
an upstream that fails before its response head 502; a malformed request 400,
an oversized head 431, more requests in flight than the direction allows
(``InFlight``, ``*_MAX_IN_FLIGHT``) 503; the connection is closed after each
of these.
``l5d-proxy-error`` (and ``l5d-proxy-connection``) coming from a remote proxy
are removed on the outbound side; inbound, ``l5d-client-id`` is set from the
verified client identity, or removed.

Metrics (``core.http_metrics``): ``request_total``, ``response_total`` and
``response_latency_ms`` under the endpoint's labels.

Every request takes the same path (``_attempt``: endpoint, request, response
head; ``_relay``: the response). A request whose service has ServiceProfile
routes (``Pick.route``, set by the router) goes through ``_routed``, which
wraps it: the route's timeout bounds the wait for the
response head over every attempt (504), a failure is retried while the
profile's retry budget allows (the body kept up to 64 KiB), and the
``route_*`` families are recorded (proxy.md §7.5, §7.6, §9.2).

The layer yields commands (``tether.proxy.core.commands``, ``tether.proxy.core.http_commands``)
and does no I/O. Callers: ``core.outbound`` and ``core.inbound`` (their
``PROTOCOL_LAYERS`` entry for ``Http1``), via the driver.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from tether.proxy.core.commands import Command, Count, Failed, Layer
from tether.proxy.core import errors
from tether.proxy.core.http_commands import Checkin, Checkout, RecvDown, RecvUp, SendDown, SendUp, Tunnel, Upstream
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.core.retries import Settled, settle
from tether.proxy.codec.http1 import (
    HOP_BY_HOP,
    MAX_HEAD_SIZE,
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
    scan_framing,
)

CONNECT_ATTEMPTS = 3

L5D_PROXY_ERROR = b"l5d-proxy-error"
L5D_PROXY_CONNECTION = b"l5d-proxy-connection"
L5D_CLIENT_ID = b"l5d-client-id"
L5D_DST_OVERRIDE = b"l5d-dst-override"
L5D_DST_CANONICAL = b"l5d-dst-canonical"


@dataclass(slots=True)
class Pick:
    """Where one request goes: the upstream connection to use and what to tell the balancer."""

    connect: Any  # commands.Connect
    header: bytes | None  # transport header for a new connection
    labels: str  # request metric labels (endpoint labels)
    authority: bytes  # Host for a request that has none
    observe: Callable[[float], None] = lambda rtt: None  # a latency sample for the endpoint
    failed: Callable[[], None] = lambda: None  # the endpoint could not be reached
    release: Callable[[], None] = lambda: None  # the request is over (in-flight count)
    route: Any = None  # its ServiceProfile route (``core.profiles.Route``): timeout, retries, route metrics
    strip_override: bool = False  # ingress mode: l5d-dst-override chose the target; not passed on


Router = Callable[[RequestHead], Generator[Command, Any, "Pick | ProxyError"]]


class InFlight:
    """Requests of one direction (all connections) in flight; past ``limit`` a new one is shed with a 503.

    Linkerd counts a request until its response head; this counts it until its
    response ends, which sheds no later than Linkerd would under the same limit.
    """

    __slots__ = ("limit", "count")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0


@dataclass(frozen=True, slots=True)
class HttpSettings:
    direction: str  # "inbound" | "outbound": also the prefix of <direction>_http_errors_total
    clock: Callable[[], float]
    metrics: HttpMetrics | None = None
    strip_proxy_errors: bool = False  # outbound: l5d-proxy-error from the remote proxy is not for the app
    meshed_client: bool = False  # inbound: the client is a proxy (gets l5d-proxy-connection)
    client_id: str | None = None  # inbound: the verified client identity (l5d-client-id)
    max_head_size: int = MAX_HEAD_SIZE
    error_labels: str = field(default="")  # labels of requests that got no endpoint
    in_flight: InFlight | None = None  # *_MAX_IN_FLIGHT, shared by the direction's connections


class _UpClient:
    """What the layer keeps with a pooled upstream connection: its client codec and parsed, unread events."""

    __slots__ = ("conn", "pending")

    def __init__(self, conn: Http1Connection) -> None:
        self.conn = conn
        self.pending: deque[Event] = deque()


class _UpstreamFailed(Exception):
    """The upstream connection ended or broke the protocol; the proxy answers for it."""


def http1(router: Router, settings: HttpSettings) -> Layer:
    """Serve the accepted connection's requests until it closes (or an error closes it)."""
    server = Http1Connection(Role.SERVER, max_head_size=settings.max_head_size)
    pending: deque[Event] = deque()
    try:
        try:
            event = yield from _next_down(server, pending)
        except BadStartLine:
            # Detection said HTTP/1 (its rule only sees a prefix) but the first line is not: carry it as opaque.
            yield from _opaque(server, router)
            return
        pending.appendleft(event)
        while True:
            keep = yield from _exchange(server, pending, router, settings)
            if not keep or not server.keep_alive:
                return
            server.start_next_cycle()
    except BadMessage as exc:
        if server.our_state is State.IDLE:
            reply = errors.response(errors.bad_request(exc.status_hint, str(exc)), meshed_client=False)
            yield SendDown(server.send_head(reply) + server.send_end())


def _opaque(server: Http1Connection, router: Router) -> Generator[Command, Any, None]:
    pick = yield from router(RequestHead(b"GET", b"/"))
    if isinstance(pick, ProxyError):
        return
    try:
        up = yield Checkout(pick.connect, pick.header)
        if isinstance(up, Upstream):
            yield Tunnel(up, to_up=server.received, to_down=b"")
        else:
            pick.failed()
    finally:
        pick.release()


def _exchange(server: Http1Connection, pending: deque[Event], router: Router,
              settings: HttpSettings) -> Generator[Command, Any, bool]:
    """One request and its response; False when the client's connection must close."""
    event = yield from _next_down(server, pending)
    if isinstance(event, ConnectionClosed):
        return False
    assert isinstance(event, RequestHead)
    request = event
    start = settings.clock()
    in_flight = settings.in_flight
    if in_flight is not None:
        if in_flight.count >= in_flight.limit:
            yield from _answer_error(server, errors.load_shed(), settings, start, None)
            return False
        in_flight.count += 1
        try:
            return (yield from _route_and_forward(server, pending, request, router, settings, start))
        finally:
            in_flight.count -= 1
    return (yield from _route_and_forward(server, pending, request, router, settings, start))


def _route_and_forward(server: Http1Connection, pending: deque[Event], request: RequestHead, router: Router,
                       settings: HttpSettings, start: float) -> Generator[Command, Any, bool]:
    pick = yield from router(request)
    if pick.route is not None:  # a profile route (a ProxyError carries it too): the one check it costs
        return (yield from _routed(server, pending, request, router, settings, start, pick))
    # Without a route nothing is kept for a retry: a request is sent again only on a fresh connection when an
    # idle pooled one turned out closed, and only if it has no body (what an empty _Replay allows).
    attempt = yield from _attempt(server, pending, request, router, settings, None, _Replay(0), pick)
    tried = attempt.pick
    try:
        if attempt.error is not None:
            yield from _answer_error(server, attempt.error, settings, start, tried)
            return False
        assert attempt.head is not None and attempt.up is not None and tried is not None
        return (yield from _relay(server, request, attempt.head, attempt.up, tried, settings, start,
                                  attempt.head.status < 500, ""))
    finally:
        if tried is not None:
            tried.release()


def _next_down(server: Http1Connection, pending: deque[Event]) -> Generator[Command, Any, Event]:
    while not pending:
        data = yield RecvDown()
        events = server.receive_data(data)
        if not events and not data:
            raise BadMessage("connection closed")
        pending.extend(events)
    return pending.popleft()


def _next_up(client: Http1Connection, up: Upstream, deadline: float | None = None,
             clock: Callable[[], float] | None = None) -> Generator[Command, Any, Event]:
    """The upstream's next event; with a ``deadline`` (on ``clock``), ``_TimedOut`` once it has passed."""
    queue = up.codec.pending
    while not queue:
        if deadline is None:
            data = yield RecvUp(up)
        else:
            assert clock is not None
            left = deadline - clock()
            if left <= 0:
                raise _TimedOut()
            data = yield RecvUp(up, left)
            if data is None:
                raise _TimedOut()
        try:
            events = client.receive_data(data)
        except BadMessage as exc:
            raise _UpstreamFailed() from exc
        if not events and not data:
            raise _UpstreamFailed()
        queue.extend(events)
    event: Event = queue.popleft()
    return event


def _answer_error(server: Http1Connection, error: ProxyError, settings: HttpSettings, start: float,
                  pick: Pick | None) -> Generator[Command, Any, None]:
    if error.metric:
        yield Count(f"{settings.direction}_http_errors_total", f'error="{error.metric}"')
    labels = pick.labels if pick is not None else settings.error_labels
    if settings.metrics is not None and labels and pick is None:
        settings.metrics.request(labels)
    if server.our_state is State.IDLE:
        head = errors.response(error, meshed_client=settings.meshed_client)
        yield SendDown(server.send_head(head) + server.send_end())
        if labels:
            _record(settings, labels, error.status, False, start)
    else:
        server.send_failed()


def _record(settings: HttpSettings, labels: str, status: int, success: bool, start: float, error: str = "") -> None:
    if settings.metrics is not None:
        settings.metrics.response(labels, status, success, int((settings.clock() - start) * 1000), error)


# -- headers ----------------------------------------------------------------------------------------------------
# The parser marks heads that hold nothing to rewrite (``rewrite``) and hands over their framing values
# (``found``): the common request and response then pass with their header tuple as it is, and the codec
# does not scan it again to frame the body.


def _connection_tokens(headers: Headers) -> set[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b","))
    return tokens


def _end_to_end(headers: Headers, keep: frozenset[bytes] = frozenset()) -> tuple[tuple[bytes, bytes], ...]:
    listed = _connection_tokens(headers) - keep
    return tuple((n, v) for n, v in headers
                 if (low := n.lower()) in keep or (low not in HOP_BY_HOP and low not in listed))


def _found(head: RequestHead | ResponseHead) -> dict[bytes, list[bytes]]:
    return head.found if head.found is not None else scan_framing(head.headers)


def _wants_switch(request: RequestHead, found: dict[bytes, list[bytes]]) -> bool:
    return request.method == b"CONNECT" or b"upgrade" in found


def _upstream_request(request: RequestHead, pick: Pick, settings: HttpSettings) -> RequestHead:
    found = _found(request)
    switch = _wants_switch(request, found)
    client_id = settings.client_id.encode() if settings.client_id else None
    if not request.rewrite and not switch and request.found is not None and request.version == b"1.1":
        # Parsed, HTTP/1.1 (so it has its one Host), nothing hop-by-hop: the headers go up as they came.
        kept = request.headers
        if client_id is not None:
            kept += ((L5D_CLIENT_ID, client_id),)
        return RequestHead(request.method, request.target, kept, b"1.1", False, found)
    upgrade = switch and request.method != b"CONNECT"
    headers: list[tuple[bytes, bytes]]
    headers = list(_end_to_end(request.headers, frozenset({b"upgrade"}) if upgrade else frozenset()))
    if upgrade:
        headers.append((b"connection", b"upgrade"))
    if settings.direction == "inbound":
        headers = [(n, v) for n, v in headers if n.lower() != L5D_CLIENT_ID]
        if client_id is not None:
            headers.append((L5D_CLIENT_ID, client_id))
    if not any(n.lower() == b"host" for n, _ in headers):
        headers.insert(0, (b"host", pick.authority))
    if b"transfer-encoding" in found:  # hop-by-hop, so dropped above: the body is sent with the same framing
        headers.extend((n, v) for n, v in request.headers if n.lower() == b"transfer-encoding")
    return RequestHead(request.method, request.target, tuple(headers), b"1.1")


def _downstream_response(head: ResponseHead, request: RequestHead, server: Http1Connection,
                         settings: HttpSettings) -> ResponseHead:
    status = head.status
    if status == 101:
        upgraded = (*_end_to_end(head.headers, frozenset({b"upgrade"})), (b"connection", b"upgrade"))
        return ResponseHead(status, _strip_proxy_errors(upgraded, settings), head.reason, b"1.1")
    if request.method == b"CONNECT" and 200 <= status < 300:  # a tunnel: no body framing to speak of
        tunnel = tuple((n, v) for n, v in _end_to_end(head.headers) if n.lower() != b"content-length")
        return ResponseHead(status, _strip_proxy_errors(tunnel, settings), head.reason, b"1.1")
    up_found = _found(head)
    headers: Headers = _end_to_end(head.headers) if head.rewrite else head.headers
    if head.rewrite and settings.strip_proxy_errors:
        headers = _strip_proxy_errors(headers, settings)
    found: dict[bytes, list[bytes]] = {}
    no_body = request.method == b"HEAD" or status in (204, 304)
    extra: tuple[tuple[bytes, bytes], ...] = ()
    if b"content-length" in up_found:  # kept by _end_to_end; the codec refused it next to Transfer-Encoding
        found[b"content-length"] = up_found[b"content-length"]
    elif not no_body and request.version == b"1.1":
        extra = ((b"transfer-encoding", b"chunked"),)
        found[b"transfer-encoding"] = [b"chunked"]
    # else: no body, or an HTTP/1.0 client reads until the close.
    if not server.keep_alive:
        extra += ((b"connection", b"close"),)
        found[b"connection"] = [b"close"]
    elif request.version == b"1.0":
        extra += ((b"connection", b"keep-alive"),)
        found[b"connection"] = [b"keep-alive"]
    return ResponseHead(status, headers + extra if extra else headers, head.reason, b"1.1", False, found)


def _strip_proxy_errors(headers: Headers, settings: HttpSettings) -> tuple[tuple[bytes, bytes], ...]:
    if not settings.strip_proxy_errors:
        return tuple(headers)
    return tuple((n, v) for n, v in headers if n.lower() not in (L5D_PROXY_ERROR, L5D_PROXY_CONNECTION))


# -- ServiceProfile routes (proxy.md §7.5, §7.6, §9.2) ---------------------------------------------------------
# A request whose service has profile routes comes here from ``_route_and_forward`` (its ``Pick.route`` is
# set): ``_routed`` adds the route's timeout, retries and metrics around the attempt every request makes.

MAX_REPLAY = 64 * 1024  # request body bytes kept for a retry (Linkerd's); a larger body is not retried


class _Replay:
    """The request body as read so far, kept for another attempt while it stays within ``limit`` bytes."""

    __slots__ = ("events", "size", "limit", "done", "overflow")

    def __init__(self, limit: int) -> None:
        self.events: list[Body | EndOfMessage] = []
        self.size = 0
        self.limit = limit
        self.done = False  # the whole body has come from the client
        self.overflow = False  # it was too large to keep: the request cannot be sent again

    def keep(self, event: Event) -> None:
        if isinstance(event, EndOfMessage):
            self.done = True
        elif isinstance(event, Body):
            self.size += len(event.data)
            if self.size > self.limit:
                self.overflow = True
                self.events.clear()
        if not self.overflow:
            self.events.append(event)  # type: ignore[arg-type]


class _TimedOut(Exception):
    """The route's timeout passed before the response head came."""


@dataclass(slots=True)
class _Attempt:
    """One try of a routed request: the endpoint tried, and its response head or what the proxy answers instead."""

    pick: Pick | None  # None: no endpoint could be reached
    head: ResponseHead | None = None
    up: Upstream | None = None
    error: ProxyError | None = None
    timed_out: bool = False


def _routed(server: Http1Connection, pending: deque[Event], request: RequestHead, router: Router,
            settings: HttpSettings, start: float, pick: Pick | ProxyError) -> Generator[Command, Any, bool]:
    """A request on a profile route: its timeout over every attempt, retries within the budget, route metrics.

    As Linkerd's profile stack: a failure (by the route's response classes; an
    endpoint that cannot be reached or breaks before its head answers 502/504
    and is classified the same way) is retried while the budget allows and the
    body was kept (up to 64 KiB), with no backoff and no other limit; a
    request that ends without a retry deposits into the budget. The timeout
    bounds the wait for the response head across all attempts (504, the
    connection closed).
    """
    route = pick.route
    labels = route.metric_labels  # empty for an l5d-dst-override target without profile routes: not counted
    routes = settings.metrics.routes if settings.metrics is not None and labels else None
    budget = route.budget
    if routes is not None:
        routes.request(labels, budget is not None)
    deadline = None if route.timeout is None else start + route.timeout
    replay = _Replay(MAX_REPLAY if budget is not None else 0)
    given: Pick | ProxyError | None = pick
    tried: Pick | None = None  # the endpoint of the attempt in hand, released when it is over (or on any exit)
    try:
        while True:
            attempt = yield from _attempt(server, pending, request, router, settings, deadline, replay, given)
            given = None
            tried = attempt.pick
            error = attempt.error
            if attempt.timed_out:
                yield from _answer_error(server, errors.response_timeout(route.timeout), settings, start, tried)
                if routes is not None:
                    routes.response(labels, 0, False, int((settings.clock() - start) * 1000), "timeout",
                                    actual=False)
                return False
            if error is None:
                assert attempt.head is not None and tried is not None and attempt.up is not None
                status = attempt.head.status
            else:
                status = error.status
            failure = route.is_failure(status)
            # Linkerd answers for an endpoint error below its retry layer (so it is a 502/504 like any other);
            # fail-fast comes from above it and is not retried.
            retryable = failure and not replay.overflow and (error is None or error.kind.retryable)
            expired = retryable and budget is not None and deadline is not None and settings.clock() >= deadline
            settled = settle(budget, retryable, expired, routes, labels, status)
            if settled is not Settled.FINAL:
                if tried is not None:
                    _record(settings, tried.labels, status, status < 500, start)
                    tried.release()
                    tried = None
                if attempt.up is not None:
                    yield Checkin(attempt.up, reuse=False)  # the failed response is not read further
                if settled is Settled.RETRY:
                    continue
                # The timeout wraps the retries: it has passed, so the request ends here.
                yield from _answer_only(server, errors.response_timeout(route.timeout), settings)
                if routes is not None:
                    routes.response(labels, 0, False, int((settings.clock() - start) * 1000), "timeout",
                                    actual=False)
                return False
            if error is not None:
                yield from _answer_error(server, error, settings, start, tried)
                if routes is not None:
                    routes.response(labels, status, not failure, int((settings.clock() - start) * 1000))
                return False
            assert attempt.head is not None and attempt.up is not None and tried is not None
            return (yield from _relay(server, request, attempt.head, attempt.up, tried, settings, start,
                                      not failure, labels))
    finally:
        if tried is not None:
            tried.release()


def _answer_only(server: Http1Connection, error: ProxyError, settings: HttpSettings) -> Generator[Command, Any, None]:
    """``_answer_error`` for a request already recorded (under the endpoint it tried)."""
    if error.metric:
        yield Count(f"{settings.direction}_http_errors_total", f'error="{error.metric}"')
    if server.our_state is State.IDLE:
        head = errors.response(error, meshed_client=settings.meshed_client)
        yield SendDown(server.send_head(head) + server.send_end())
    else:
        server.send_failed()


def _attempt(server: Http1Connection, pending: deque[Event], request: RequestHead, router: Router,
             settings: HttpSettings, deadline: float | None, replay: _Replay,
             pick: Pick | ProxyError | None) -> Generator[Command, Any, _Attempt]:
    """An endpoint (a failed connect tries another, as for any request), the request, its response head."""
    error: ProxyError | None = None
    up: Upstream | None = None
    chosen: Pick | None = None
    for _ in range(CONNECT_ATTEMPTS):
        if pick is None:
            pick = yield from router(request)
        if isinstance(pick, ProxyError):
            return _Attempt(None, error=pick)
        reply = yield Checkout(pick.connect, pick.header)
        if isinstance(reply, Failed):
            pick.failed()
            pick.release()
            error = errors.connect_failed(pick.connect.addr, reply.timed_out, reply.error, reply.errno)
            pick = None
            continue
        up = reply
        chosen = pick
        break
    if up is None or chosen is None:
        assert error is not None
        return _Attempt(None, error=error)
    if settings.metrics is not None:
        settings.metrics.request(chosen.labels)
    begun = settings.clock()
    outcome: _Attempt | None = None
    try:
        for resend in range(2):
            if up.codec is None:
                up.codec = _UpClient(Http1Connection(Role.CLIENT, max_head_size=settings.max_head_size))
            client = up.codec.conn
            try:
                yield from _send_request(server, pending, request, chosen, client, up, settings, replay)
                head = yield from _response_head(server, client, up, chosen, settings, begun, deadline)
                outcome = _Attempt(chosen, head, up)
            except _UpstreamFailed:
                yield Checkin(up, reuse=False)
                if resend == 0 and up.reused and not replay.overflow:
                    # An idle pooled connection the server had closed: what was kept is safe to send again.
                    reply = yield Checkout(chosen.connect, chosen.header)
                    if isinstance(reply, Upstream):
                        up = reply
                        continue
                outcome = _Attempt(chosen, error=errors.io_error(chosen.connect.addr))
            except _TimedOut:
                yield Checkin(up, reuse=False)
                outcome = _Attempt(chosen, timed_out=True)
            return outcome
    finally:
        if outcome is None:  # a broken request, or the connection closing under us: the endpoint is not held
            chosen.release()
    raise AssertionError("unreachable")  # pragma: no cover


def _send_request(server: Http1Connection, pending: deque[Event], request: RequestHead, pick: Pick,
               client: Http1Connection, up: Upstream, settings: HttpSettings,
               replay: _Replay) -> Generator[Command, Any, None]:
    """The head, what was kept of the body, then the rest as it arrives from the client (kept as well, within
    the replay's limit); parsed together, written together."""
    head = _upstream_request(request, pick, settings)
    dst = pick.route.dst if pick.route is not None else b""
    if dst or pick.strip_override:
        # Linkerd names the profile's service to the peer (l5d-dst-canonical), and an ingress does not pass on
        # the l5d-dst-override it acted on.
        drop = (L5D_DST_CANONICAL, L5D_DST_OVERRIDE) if pick.strip_override else (L5D_DST_CANONICAL,)
        headers = tuple((n, v) for n, v in head.headers if n.lower() not in drop)
        if dst:
            headers += ((L5D_DST_CANONICAL, dst),)
        head = RequestHead(head.method, head.target, headers, head.version, head.rewrite, head.found)
    out = client.send_head(head)
    for kept in replay.events:
        out += client.send_body(kept.data) if isinstance(kept, Body) else client.send_end(kept.trailers)
    if replay.done:
        if not (yield SendUp(up, out)):
            raise _UpstreamFailed()
        return
    while True:
        if not pending:
            sent = yield SendUp(up, out)
            out = b""
            if not sent:
                raise _UpstreamFailed()
        event = yield from _next_down(server, pending)
        replay.keep(event)
        if isinstance(event, Body):
            out += client.send_body(event.data)
        elif isinstance(event, EndOfMessage):
            if not (yield SendUp(up, out + client.send_end(event.trailers))):
                raise _UpstreamFailed()
            return
        else:  # pragma: no cover - the codec ends a request with EndOfMessage or an error
            raise BadMessage("unexpected event in a request body")


def _response_head(server: Http1Connection, client: Http1Connection, up: Upstream, pick: Pick, settings: HttpSettings,
             begun: float, deadline: float | None) -> Generator[Command, Any, ResponseHead]:
    """Read up to the final response head, passing 1xx heads on; the first head is the endpoint's RTT sample
    (from ``begun``, when the request went out). With a ``deadline`` (a route's timeout) every read is bounded."""
    sampled = False
    clock = settings.clock
    while True:
        event = yield from _next_up(client, up, deadline, clock)
        if not isinstance(event, ResponseHead):
            raise _UpstreamFailed()
        if not sampled:
            pick.observe(clock() - begun)
            sampled = True
        if event.status < 200 and not client.switched:
            if server.our_state is State.IDLE:
                yield SendDown(server.send_head(ResponseHead(event.status, _end_to_end(event.headers),
                                                             event.reason)))
            continue
        return event


def _relay(server: Http1Connection, request: RequestHead, head: ResponseHead, up: Upstream, pick: Pick,
           settings: HttpSettings, start: float, success: bool, labels: str) -> Generator[Command, Any, bool]:
    """From the response head on: the response streamed to the client (or the two joined after a switch), the
    upstream connection back to the pool when both ends allow; the route's metrics too when ``labels`` (its
    ``success`` by the route's response classes)."""
    client = up.codec.conn
    routes = settings.metrics.routes if settings.metrics is not None and labels else None
    if client.switched:
        if server.their_state is not State.DONE:
            yield Checkin(up, reuse=False)
            return False
        yield SendDown(server.send_head(_downstream_response(head, request, server, settings)))
        _record(settings, pick.labels, head.status, True, start)
        if routes is not None:
            routes.response(labels, head.status, success, int((settings.clock() - start) * 1000))
        yield Tunnel(up, to_up=server.trailing_data, to_down=client.trailing_data)
        return False
    down_head = _downstream_response(head, request, server, settings)
    chunked = b"transfer-encoding" in _found(down_head)
    out = server.send_head(down_head)
    queue = up.codec.pending
    ok = True
    try:
        while ok:
            if not queue:
                ok = yield SendDown(out)
                out = b""
                if not ok:
                    break
            event = yield from _next_up(client, up)
            if isinstance(event, Body):
                out += server.send_body(event.data)
            elif isinstance(event, EndOfMessage):
                ok = yield SendDown(out + server.send_end(event.trailers if chunked else ()))
                break
            else:
                raise _UpstreamFailed()
    except _UpstreamFailed:
        yield Checkin(up, reuse=False)
        server.send_failed()
        _record(settings, pick.labels, head.status, False, start, "unclassified")
        if routes is not None:
            routes.response(labels, head.status, False, int((settings.clock() - start) * 1000), "unclassified")
        return False
    _record(settings, pick.labels, head.status, ok and head.status < 500, start)
    if routes is not None:
        routes.response(labels, head.status, ok and success, int((settings.clock() - start) * 1000))
    if not ok or server.their_state is not State.DONE:
        yield Checkin(up, reuse=False)
        return False
    reuse = client.keep_alive and client.our_state is State.DONE and client.their_state is State.DONE
    if reuse:
        client.start_next_cycle()
    yield Checkin(up, reuse=reuse)
    return True
