"""What every HTTP request of the proxy shares, whatever its version: where it goes, its settings, its hooks.

- ``Pick``: the router's answer for one request (endpoint, labels, balancer
  callbacks, profile route); ``Router``: the per-request routing function
  (``core.routes``), a generator that yields ``commands.Wait`` only when
  discovery has no answer yet.
- ``HttpSettings``: one direction's HTTP settings (metrics, header policy,
  limits, hooks), shared by its connections.
- ``InFlight``: ``*_MAX_IN_FLIGHT`` load shedding.
- ``RequestPolicy`` and ``StreamObserver``: the hook points for per-request
  policy and for tap (see their docstrings); none is installed yet.
- ``l5d-*`` header names and the rules on them every version applies
  (``mesh_request_headers``, ``strip_proxy_errors``), and ``MAX_REPLAY``
  (request body bytes kept for a retry).

Callers: ``core.http1_proxy`` (HTTP/1), ``core.http2_proxy`` (HTTP/2), ``core.exchange``, ``core.routes``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tether.proxy.codec.http1 import MAX_HEAD_SIZE, Headers, RequestHead
from tether.proxy.codec.http2 import DEFAULT_PARAMS, Http2Params
from tether.proxy.core.commands import Command, Revocable
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http_metrics import HttpMetrics

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tether.proxy.core.profiles import Route

L5D_PROXY_ERROR = b"l5d-proxy-error"
L5D_PROXY_CONNECTION = b"l5d-proxy-connection"
L5D_CLIENT_ID = b"l5d-client-id"
L5D_DST_OVERRIDE = b"l5d-dst-override"
L5D_DST_CANONICAL = b"l5d-dst-canonical"
PROXY_ERRORS = (L5D_PROXY_ERROR, L5D_PROXY_CONNECTION)  # a remote proxy's, not for the app (outbound)

ClientAddr = tuple[str, int]  # the accepted connection's peer (ip, port), as tap reports it

MAX_REPLAY = 64 * 1024  # request body bytes kept for a retry (Linkerd's); a larger body is not retried


# A ``Pick``'s callbacks when nobody listens (public: a core compares with them to skip the call and the clock read
# per request).
def no_sample(rtt: float) -> None:
    """A ``Pick`` that feeds no balancer."""


def nothing() -> None:
    """A ``Pick`` with nothing to tell."""


def no_outcome(status: int, grpc_status: int | None, elapsed: float) -> None:
    """A ``Pick`` with nobody to tell how its attempt ended."""


@dataclass(slots=True)
class Pick:
    """Where one request goes: the upstream connection to use and what to tell the balancer."""

    connect: Any  # commands.Connect
    header: bytes | None  # transport header for a new connection
    labels: str  # request metric labels (endpoint labels)
    authority: bytes  # Host for a request that has none
    observe: Callable[[float], None] = no_sample  # a latency sample for the endpoint
    failed: Callable[[], None] = nothing  # the endpoint could not be reached
    release: Callable[[], None] = nothing  # the request is over (in-flight count)
    # How an attempt ended: its response status (0: none), gRPC status, seconds since it was sent (failure
    # accrual, the policy's backend metrics).
    outcome: Callable[[int, int | None, float], None] = no_outcome
    route: Route | None = None  # its ServiceProfile route: timeout, retries, route metrics
    # Client policy: the sizes of the backend's response body frames (outbound_*_route_backend_response_frame_*).
    frames: Callable[[float], None] | None = None
    # The inbound route families (core.inbound_route_metrics): the sizes of the client's request body frames,
    # all of them (those before the pick too), when no profile or client policy route counts them.
    request_frames: Callable[[float], None] | None = None
    strip_override: bool = False  # ingress mode: l5d-dst-override chose the target; not passed on
    # Client policy (core.policy_routes): the route's request and response header modifiers, if any.
    rewrite: HeaderEdit | None = None
    respond: HeaderEdit | None = None
    # The l5d-orig-proto upgrade (core.orig_proto): (Connect, header) of the endpoint's shared HTTP/2
    # connection, taken by an HTTP/1 request that can be carried over it; None: HTTP/1 stays HTTP/1.
    upgrade: tuple[Any, bytes | None] | None = None
    # The endpoint's HTTP/2 connection could not be made (inbound: the app port's requests wait for a reconnect,
    # core.inbound_queue); nothing elsewhere.
    unreachable: Callable[[], None] = nothing

    # Written out, not generated: a dataclass's generated ``__init__`` is interpreted Python even in a compiled
    # module (mypyc keeps the methods a class defines, and lets ``dataclass`` generate the rest), and a request
    # makes a Pick or two (~0.5 µs a generated call). The fields as ``dataclasses.replace`` passes them.
    def __init__(self, connect: Any, header: bytes | None, labels: str, authority: bytes,
                 observe: Callable[[float], None] = no_sample, failed: Callable[[], None] = nothing,
                 release: Callable[[], None] = nothing,
                 outcome: Callable[[int, int | None, float], None] = no_outcome, route: Route | None = None,
                 frames: Callable[[float], None] | None = None, request_frames: Callable[[float], None] | None = None,
                 strip_override: bool = False, rewrite: HeaderEdit | None = None, respond: HeaderEdit | None = None,
                 upgrade: tuple[Any, bytes | None] | None = None, unreachable: Callable[[], None] = nothing) -> None:
        self.connect = connect
        self.header = header
        self.labels = labels
        self.authority = authority
        self.observe = observe
        self.failed = failed
        self.release = release
        self.outcome = outcome
        self.route = route
        self.frames = frames
        self.request_frames = request_frames
        self.strip_override = strip_override
        self.rewrite = rewrite
        self.respond = respond
        self.upgrade = upgrade
        self.unreachable = unreachable


Router = Callable[[RequestHead], Generator[Command, Any, "Pick | ProxyError"]]


def logical_names(headers: Headers) -> tuple[bytes | None, bytes | None, bytes | None]:
    """A request's ``l5d-dst-canonical``, ``:authority`` and ``host`` values (the last of each; None: absent), in
    one pass, lengths first, so most names are never lowered. What names an inbound request's logical service
    (``core.inbound_profile_routes``, interpreted, asks once per request: the loop over every header is here,
    compiled, where interpreted it was a few µs per request)."""
    canonical = authority = host = None
    for name, value in headers:
        size = len(name)
        if size == 17 and name.lower() == b"l5d-dst-canonical":
            canonical = value
        elif size == 10 and name == b":authority":
            authority = value
        elif size == 4 and name.lower() == b"host":
            host = value
    return canonical, authority, host


class InFlight:
    """Requests of one direction (all connections) in flight; past ``limit`` a new one is shed with a 503.

    Linkerd counts a request until its response head; this counts it until its
    response ends, which sheds no later than Linkerd would under the same limit.
    """

    __slots__ = ("limit", "count")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0


HeaderList = list[tuple[bytes, bytes]]
# A change of a message's headers, in any HTTP version: its headers in, the new ones out (a route's header
# modifier: an inbound request policy's edit, a client policy route's ``Pick.rewrite``/``respond``).
HeaderEdit = Callable[[Headers], Headers]


class RequestPolicy(Protocol):
    """Per-request policy, asked once per request head before it is routed (inbound authorization per
    route, route filters and rate limits: ``core.inbound_authz``). A ``ProxyError`` is what the proxy
    answers instead (403, 429, a redirect...); the request is then not routed. A ``HeaderEdit`` is applied
    to the request's headers before it is routed (a route's ``RequestHeaderModifier``); None: as it is.

    Outbound HTTPRoute client policy (#15) is routing, not a check: it plugs in as the ``Router``
    (``core.routes``), which already answers per request with a ``Pick`` carrying its route.
    """

    def check(self, request: RequestHead) -> ProxyError | HeaderEdit | None: ...

    def upgraded(self, request: RequestHead) -> Revocable | None:
        """``request`` (as the client sent it, admitted by ``check``) switched the connection to another protocol
        (101, a 2xx to CONNECT): what withdraws the joined connection when the policy stops admitting the
        request (None: nothing does)."""
        ...


class StreamObserver(Protocol):
    """Stream-scoped events for tap (issue #16) and the access log: told, never asked; must not block or raise.

    ``begin`` when a request head arrives, before anything is decided of it (with the connection's client
    address and verified client identity, if any); ``request`` when a request head is routed (with the endpoint's labels and the connection's client
    address, None when the transport did not say), ``response`` at its response head (the headers the
    client gets), ``end`` when the exchange is over (status None: no response was sent; ``error``: the
    error kind the proxy answered, if it did; ``grpc_status``: a gRPC stream's, from its trailers or the
    proxy's own answer; ``response_bytes``: the relayed response body's bytes; ``trailers``: the relayed
    response's trailers; ``reset_code``: the HTTP/2 error code the client's stream was reset with, if it was).
    """

    def begin(self, stream: object, request: RequestHead, client: ClientAddr | None,
              client_id: str | None) -> None: ...

    def request(self, stream: object, request: RequestHead, labels: str, client: ClientAddr | None) -> None: ...

    def response(self, stream: object, status: int, headers: Sequence[tuple[bytes, bytes]]) -> None: ...

    def end(self, stream: object, status: int | None, error: ProxyError | None, grpc_status: int | None = None,
            response_bytes: int = 0, trailers: Sequence[tuple[bytes, bytes]] = (),
            reset_code: int | None = None) -> None: ...


# Rapid reset (CVE-2023-44487): streams a client resets before their response head, less one per response head
# sent, past which its HTTP/2 connection ends with GOAWAY(ENHANCE_YOUR_CALM). hyper's default for
# max_pending_accept_reset_streams, which linkerd2-proxy's servers take when unset.
H2_MAX_PENDING_RESETS = 20


@dataclass(frozen=True, slots=True)
class HttpSettings:
    direction: str  # "inbound" | "outbound": also the prefix of <direction>_http_errors_total
    clock: Callable[[], float]
    metrics: HttpMetrics | None = None
    strip_proxy_errors: bool = False  # outbound: l5d-proxy-error from the remote proxy is not for the app
    meshed_client: bool = False  # inbound: the client is a proxy (gets l5d-proxy-connection)
    # l5d-proxy-error, l5d-proxy-connection and grpc-message on the proxy's own answers: outbound unless
    # LINKERD2_PROXY_OUTBOUND_DISABLE_INFORMATIONAL_HEADERS (default: ingress mode); inbound to meshed clients
    # only (proxy.md §8.4).
    informational: bool = True
    client_id: str | None = None  # inbound: the verified client identity (l5d-client-id)
    max_head_size: int = MAX_HEAD_SIZE
    error_labels: str = field(default="")  # labels of requests that got no endpoint
    # After ``error`` in <direction>_http_errors_total: inbound, the target's and the server's labels
    # (``target_*``, ``srv_*``), as linkerd2-proxy labels inbound_http_errors_total; outbound, none.
    error_scope: str = ""
    in_flight: InFlight | None = None  # *_MAX_IN_FLIGHT, shared by the direction's connections
    policy: RequestPolicy | None = None  # per-request policy (#15); None: every request is allowed
    observer: StreamObserver | None = None  # tap (#16); None: nobody listens
    # HTTP/2 server keep-alive (interval, timeout) in seconds: a PING after ``interval`` without a byte from the
    # client, the connection ended when no answer came within ``timeout``. None: no PINGs.
    h2_keep_alive: tuple[float, float] | None = None
    # HTTP/2: the client connections' settings (LINKERD2_PROXY_*_SERVER_HTTP2_*), the upstream connections'
    # (LINKERD2_PROXY_HTTP2_INITIAL_*_WINDOW_SIZE), and the rapid-reset bound (_MAX_PENDING_ACCEPT_RESET_STREAMS).
    h2_server: Http2Params = DEFAULT_PARAMS
    h2_client: Http2Params = DEFAULT_PARAMS
    h2_max_pending_resets: int = H2_MAX_PENDING_RESETS


def mesh_request_headers(headers: HeaderList, pick: Pick, settings: HttpSettings) -> HeaderList:
    """The ``l5d-*`` rules for a request going to ``pick`` (proxy.md §7.8), on end-to-end headers of any version:
    inbound, ``l5d-client-id`` is the verified client identity's (one a client sent is dropped); a profile's
    service is named to the peer in ``l5d-dst-canonical``; an ingress does not pass on the
    ``l5d-dst-override`` it acted on. A client policy route's ``RequestHeaderModifier`` (``Pick.rewrite``)
    applies first, so these rules have the last word."""
    if pick.rewrite is not None:
        headers = list(pick.rewrite(tuple(headers)))
    drop: tuple[bytes, ...] = ()
    add: HeaderList = []
    if settings.direction == "inbound":
        drop = (L5D_CLIENT_ID,)
        if settings.client_id:
            add.append((L5D_CLIENT_ID, settings.client_id.encode()))
    route = pick.route
    dst = route.dst if route is not None else b""
    if dst:
        drop += (L5D_DST_CANONICAL,)
    if pick.strip_override:
        drop += (L5D_DST_CANONICAL, L5D_DST_OVERRIDE)
    if dst:
        add.append((L5D_DST_CANONICAL, dst))
    if drop:
        for name, _ in headers:  # a copy only when a header is dropped (a call less per request without one)
            if name.lower() in drop:
                headers = [(n, v) for n, v in headers if n.lower() not in drop]
                break
    return headers + add if add else headers


def strip_proxy_errors(headers: HeaderList, settings: HttpSettings) -> HeaderList:
    """A response's headers without the remote proxy's ``l5d-proxy-error`` and ``l5d-proxy-connection``
    (outbound: they are for this proxy, not for the app). The error is logged (INFO), as linkerd2-proxy logs
    "Remote proxy error": the app sees only the status, so this log is where a 502 from a peer proxy is told
    apart from one of this proxy's own."""
    if settings.strip_proxy_errors:
        for name, _ in headers:  # a copy only when there is one (a call less per response without)
            if name.lower() in PROXY_ERRORS:
                for n, v in headers:
                    if n.lower() == L5D_PROXY_ERROR:
                        log.info("remote proxy error: %s", v.decode("latin-1"))
                return [(n, v) for n, v in headers if n.lower() not in PROXY_ERRORS]
    return headers
