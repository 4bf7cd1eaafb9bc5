"""Tap in the proxy, the pure part: which requests an ``Observe`` call wants, and the events it gets (proxy.md §10.2).

``compile_match(match)`` turns an ``ObserveRequest.Match`` tree into a
predicate over ``TapRequest`` (what a tap can see of a request when its head
arrives): ``all``/``any``/``not`` of source or destination netmasks and port
ranges, HTTP scheme, method, authority and path (exact or prefix), and
destination and route labels.  A malformed tree raises ``MatchError`` (the
server answers ``INVALID_ARGUMENT``).

``Taps`` is the registry the HTTP layers report to.  ``begin(request, now)``
is the whole cost on the request path when no tap is open: one truth test of
an empty list, returning None.  With taps open it returns a ``TappedStream``
that emits the request-init event to each matching tap still under its
``limit`` (requests, not events), and then ``response_init`` and
``response_end`` to the same taps; headers and trailers are included when the
tap asked for them (``extract.http.headers``).  Each ``Tap`` buffers up to
``EVENT_BUFFER`` events (further ones are dropped, as the proxy's bounded
channel drops them) and calls its ``wake`` hook when one arrives; it is
``finished`` once its limit is reached and every stream it took has ended.

``TapObserver`` is the ``core.http.StreamObserver`` the HTTP layers call
(request routed, response head, end): it reads the request head and the
endpoint's metric labels (``target_addr``, ``tls``, ``client_id``/``server_id``,
``dst_*``) and the connection's client address (the source) into a
``TapRequest``; headers (the request's, the response's without HTTP/2
pseudo-headers) are extracted when a tap asks for them.

Times are seconds from the caller's monotonic clock; nothing here does I/O.
Callers: ``tether.proxy.io.tap_server`` (Observe) and the HTTP layers (through ``TapObserver``).
"""

from __future__ import annotations

import ipaddress
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf.duration_pb2 import Duration

from tether.api import http_types_pb2, net_pb2, tap_pb2
from tether.api.addresses import InvalidAddress, from_ip_address, to_tcp_address
from tether.proxy.codec.http1 import RequestHead

EVENT_BUFFER = 400  # events buffered per tap, as linkerd2-proxy's per-response buffer
INBOUND = tap_pb2.TapEvent.INBOUND
OUTBOUND = tap_pb2.TapEvent.OUTBOUND

_METHODS = {name: value for name, value in http_types_pb2.HttpMethod.Registered.items()}
_SCHEMES = {"http": http_types_pb2.Scheme.HTTP, "https": http_types_pb2.Scheme.HTTPS}

Header = tuple[bytes, bytes]


class MatchError(ValueError):
    """An ``ObserveRequest`` the proxy cannot serve; the message says which part."""


@dataclass(slots=True)  # not frozen: built for every request while a tap is open, and frozen init is slow
class TapRequest:
    """A request as tap sees it when its head arrives."""

    direction: int  # INBOUND or OUTBOUND
    source: tuple[str, int]
    destination: tuple[str, int]
    method: str
    scheme: str  # "http" or "https"
    authority: str
    path: str
    headers: Sequence[Header] = ()
    source_labels: Mapping[str, str] = field(default_factory=dict)
    destination_labels: Mapping[str, str] = field(default_factory=dict)
    route_labels: Mapping[str, str] = field(default_factory=dict)


Predicate = Callable[[TapRequest], bool]


# -- match trees ----------------------------------------------------------------------------------


def compile_match(match: tap_pb2.ObserveRequest.Match | None) -> Predicate:
    """A predicate for ``match``; an absent match takes every request."""
    if match is None:
        return lambda request: True
    return _compile(match, "match")


def _compile(match: tap_pb2.ObserveRequest.Match, path: str) -> Predicate:
    kind = match.WhichOneof("match")
    if kind == "all":
        parts = [_compile(m, f"{path}.all[{i}]") for i, m in enumerate(match.all.matches)]
        return lambda r: all(p(r) for p in parts)
    if kind == "any":
        parts = [_compile(m, f"{path}.any[{i}]") for i, m in enumerate(match.any.matches)]
        return lambda r: any(p(r) for p in parts)
    if kind == "not":
        inner = _compile(getattr(match, "not"), f"{path}.not")
        return lambda r: not inner(r)
    if kind == "source":
        test = _tcp(match.source, f"{path}.source")
        return lambda r: test(r.source)
    if kind == "destination":
        test = _tcp(match.destination, f"{path}.destination")
        return lambda r: test(r.destination)
    if kind == "http":
        return _http(match.http, f"{path}.http")
    if kind == "destination_label":
        key, value = match.destination_label.key, match.destination_label.value
        return lambda r: r.destination_labels.get(key) == value
    if kind == "route_label":
        key, value = match.route_label.key, match.route_label.value
        return lambda r: r.route_labels.get(key) == value
    raise MatchError(f"{path}: no condition set")


def _tcp(tcp: tap_pb2.ObserveRequest.Match.Tcp, path: str) -> Callable[[tuple[str, int]], bool]:
    kind = tcp.WhichOneof("match")
    if kind == "netmask":
        network = _network(tcp.netmask.ip, tcp.netmask.mask, f"{path}.netmask")
        return lambda addr: _in(addr[0], network)
    if kind == "ports":
        low = tcp.ports.min
        high = tcp.ports.max or low
        if not 0 < low <= high <= 0xFFFF:
            raise MatchError(f"{path}.ports: {tcp.ports.min}..{tcp.ports.max} is not a port range")
        return lambda addr: low <= addr[1] <= high
    raise MatchError(f"{path}: neither netmask nor ports")


def _network(ip: net_pb2.IPAddress, mask: int, path: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        address = from_ip_address(ip)
        return ipaddress.ip_network(f"{address}/{mask}", strict=False)
    except (InvalidAddress, ValueError) as err:
        raise MatchError(f"{path}: {err}") from None


def _in(ip: str, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    try:
        return ipaddress.ip_address(ip) in network
    except ValueError:
        return False


def _http(http: tap_pb2.ObserveRequest.Match.Http, path: str) -> Predicate:
    kind = http.WhichOneof("match")
    if kind == "scheme":
        want = _scheme_name(http.scheme)
        return lambda r: r.scheme.lower() == want
    if kind == "method":
        method = _method_name(http.method)
        return lambda r: r.method.upper() == method
    if kind == "authority":
        test = _string(http.authority, f"{path}.authority")
        return lambda r: test(r.authority)
    if kind == "path":
        test = _string(http.path, f"{path}.path")
        return lambda r: test(r.path)
    raise MatchError(f"{path}: no condition set")


def _string(match: tap_pb2.ObserveRequest.Match.Http.StringMatch, path: str) -> Callable[[str], bool]:
    kind = match.WhichOneof("match")
    if kind == "exact":
        exact = match.exact
        return lambda value: value == exact
    if kind == "prefix":
        prefix = match.prefix
        return lambda value: value.startswith(prefix)
    raise MatchError(f"{path}: neither exact nor prefix")


def _method_name(method: http_types_pb2.HttpMethod) -> str:
    if method.WhichOneof("type") == "unregistered":
        return str(method.unregistered).upper()
    return str(http_types_pb2.HttpMethod.Registered.Name(method.registered))


def _scheme_name(scheme: http_types_pb2.Scheme) -> str:
    if scheme.WhichOneof("type") == "unregistered":
        return str(scheme.unregistered).lower()
    return str(http_types_pb2.Scheme.Registered.Name(scheme.registered)).lower()


def method_message(method: str) -> http_types_pb2.HttpMethod:
    value = _METHODS.get(method.upper())
    return http_types_pb2.HttpMethod(registered=value) if value is not None else (
        http_types_pb2.HttpMethod(unregistered=method))


def scheme_message(scheme: str) -> http_types_pb2.Scheme:
    value = _SCHEMES.get(scheme.lower())
    return http_types_pb2.Scheme(registered=value) if value is not None else http_types_pb2.Scheme(unregistered=scheme)


def headers_message(headers: Sequence[Header]) -> http_types_pb2.Headers:
    # Names lower-cased, as HTTP/2 carries them and linkerd2-proxy reports HTTP/1's.
    return http_types_pb2.Headers(headers=[http_types_pb2.Headers.Header(name=n.decode("latin-1").lower(), value=v)
                                           for n, v in headers])


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(max(0, int(seconds * 1e9)))
    return d


# -- the registry ---------------------------------------------------------------------------------


class Tap:
    """One ``Observe`` call: what it wants, how many more requests it may take, its buffered events."""

    def __init__(self, limit: int, match: Predicate, headers: bool, wake: Callable[[], None]) -> None:
        self.remaining = limit
        self.match = match
        self.headers = headers
        self.wake = wake
        self.events: deque[tap_pb2.TapEvent] = deque()
        self.dropped = 0
        self.open_streams = 0
        self.closed = False  # the caller went away

    @property
    def finished(self) -> bool:
        return self.closed or (self.remaining == 0 and self.open_streams == 0)

    def push(self, event: tap_pb2.TapEvent) -> None:
        if len(self.events) >= EVENT_BUFFER:
            self.dropped += 1
            return
        self.events.append(event)
        self.wake()


def new_tap(request: tap_pb2.ObserveRequest, wake: Callable[[], None]) -> Tap:
    """Validates ``request`` (``MatchError`` names what is wrong) and makes its ``Tap``."""
    if request.limit <= 0:
        raise MatchError("limit: must be greater than 0")
    match = compile_match(request.match if request.HasField("match") else None)
    headers = (request.HasField("extract") and request.extract.WhichOneof("extract") == "http"
               and request.extract.http.WhichOneof("extract") == "headers")
    return Tap(request.limit, match, headers, wake)


class Taps:
    """The taps open in this proxy, and the stream ids of the requests it reports (``base`` is per process)."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.taps: list[Tap] = []
        self._next_stream = 0

    def add(self, tap: Tap) -> None:
        self.taps.append(tap)

    def remove(self, tap: Tap) -> None:
        tap.closed = True
        if tap in self.taps:
            self.taps.remove(tap)

    def begin(self, request: TapRequest, now: float) -> TappedStream | None:
        """The request's head arrived; None (at the cost of one test) when no open tap takes it."""
        if not self.taps:
            return None
        takers = [t for t in self.taps if t.remaining > 0 and not t.closed and t.match(request)]
        if not takers:
            return None
        self._next_stream += 1
        stream = TappedStream(self, request, self._next_stream, takers, now)
        for tap in takers:
            tap.remaining -= 1
            tap.open_streams += 1
        stream.emit_request_init()
        return stream


class TappedStream:
    """One tapped request: its events go to the taps that took it."""

    def __init__(self, taps: Taps, request: TapRequest, stream: int, takers: list[Tap], now: float) -> None:
        self.request = request
        self.id = tap_pb2.TapEvent.Http.StreamId(base=taps.base, stream=stream)
        self.takers = takers
        self.started = now
        self.response_started: float | None = None
        self.ended = False
        self._template = self._base()  # addresses and labels, packed once for the stream's three events

    def _base(self) -> tap_pb2.TapEvent:
        r = self.request
        event = tap_pb2.TapEvent(proxy_direction=r.direction)  # type: ignore[arg-type]
        try:
            event.source.CopyFrom(to_tcp_address(*r.source))
            event.destination.CopyFrom(to_tcp_address(*r.destination))
        except InvalidAddress:
            pass
        event.source_meta.labels.update(r.source_labels)
        event.destination_meta.labels.update(r.destination_labels)
        event.route_meta.labels.update(r.route_labels)
        return event

    def _emit(self, fill: Callable[[tap_pb2.TapEvent, bool], None]) -> None:
        plain: tap_pb2.TapEvent | None = None
        full: tap_pb2.TapEvent | None = None
        for tap in self.takers:
            if tap.closed:
                continue
            if tap.headers:
                if full is None:
                    full = tap_pb2.TapEvent()
                    full.CopyFrom(self._template)
                    fill(full, True)
                tap.push(full)
            else:
                if plain is None:
                    plain = tap_pb2.TapEvent()
                    plain.CopyFrom(self._template)
                    fill(plain, False)
                tap.push(plain)

    def emit_request_init(self) -> None:
        r = self.request

        def fill(event: tap_pb2.TapEvent, headers: bool) -> None:
            init = event.http.request_init
            init.id.CopyFrom(self.id)
            init.method.CopyFrom(method_message(r.method))
            init.scheme.CopyFrom(scheme_message(r.scheme))
            init.authority = r.authority
            init.path = r.path
            if headers:
                init.headers.CopyFrom(headers_message(r.headers))

        self._emit(fill)

    def response_init(self, status: int, headers: Sequence[Header], now: float) -> None:
        if self.ended or self.response_started is not None:
            return
        self.response_started = now

        def fill(event: tap_pb2.TapEvent, with_headers: bool) -> None:
            init = event.http.response_init
            init.id.CopyFrom(self.id)
            init.since_request_init.CopyFrom(_duration(now - self.started))
            init.http_status = status
            if with_headers:
                init.headers.CopyFrom(headers_message(headers))

        self._emit(fill)

    def response_end(self, now: float, *, response_bytes: int = 0, grpc_status: int | None = None,
                     reset_code: int | None = None, trailers: Sequence[Header] = ()) -> None:
        """The response is over (or the stream was reset, ``reset_code``); the stream's taps are released."""
        if self.ended:
            return
        self.ended = True
        since_response = now - (self.response_started if self.response_started is not None else now)

        def fill(event: tap_pb2.TapEvent, with_headers: bool) -> None:
            end = event.http.response_end
            end.id.CopyFrom(self.id)
            end.since_request_init.CopyFrom(_duration(now - self.started))
            end.since_response_init.CopyFrom(_duration(since_response))
            end.response_bytes = response_bytes
            if grpc_status is not None:
                end.eos.grpc_status_code = grpc_status
            elif reset_code is not None:
                end.eos.reset_error_code = reset_code
            if with_headers and trailers:
                end.trailers.CopyFrom(headers_message(trailers))

        self._emit(fill)
        for tap in self.takers:
            tap.open_streams -= 1
            if tap.finished:
                tap.wake()


# -- the HTTP layers' hook ------------------------------------------------------------------------

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_TLS_KEYS = ("tls", "client_id", "server_id", "no_tls_reason", "sni")


def parse_labels(labels: str) -> dict[str, str]:
    """A rendered label set (``a="x",b="y"``, as ``core.labels`` renders it) back into a mapping."""
    return {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\") for k, v in _LABEL.findall(labels)}


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return "0.0.0.0", 0


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """What tap reads from an endpoint's rendered labels (the same string for every request to it)."""

    destination: tuple[str, int]
    source_labels: Mapping[str, str]
    destination_labels: Mapping[str, str]


def endpoint_of(labels: str, direction: int) -> _Endpoint:
    found = parse_labels(labels)
    tls = {k: found[k] for k in _TLS_KEYS if k in found}
    dst = {k[4:]: v for k, v in found.items() if k.startswith("dst_")}
    return _Endpoint(_address(found.get("target_addr", "")), tls if direction == INBOUND else {},
                     {**dst, **tls} if direction == OUTBOUND else dst)


UNKNOWN_SOURCE = ("0.0.0.0", 0)  # the transport did not say who the client is (it was closing)


def request_of(head: RequestHead, endpoint: _Endpoint, direction: int,
               client: tuple[str, int] | None = None) -> TapRequest:
    """What tap sees of a routed request: its head, its connection's client, and its endpoint's labels."""
    authority = next((v for n, v in head.headers if n.lower() == b"host"), b"")
    return TapRequest(
        direction=direction,
        source=client or UNKNOWN_SOURCE,
        destination=endpoint.destination,
        method=head.method.decode("latin-1"),
        scheme="http",
        authority=authority.decode("latin-1"),
        path=head.target.decode("latin-1"),
        headers=tuple(head.headers),
        source_labels=endpoint.source_labels,
        destination_labels=endpoint.destination_labels,
    )


ENDPOINT_CACHE = 1024  # endpoints' parsed labels kept while taps are open (cleared whole beyond)


class TapObserver:
    """``core.http.StreamObserver`` for tap: the HTTP layers' stream events, reported to ``Taps``.

    With no tap open, each request costs one call and one test of an empty list.
    """

    def __init__(self, taps: Taps, direction: int, clock: Callable[[], float]) -> None:
        self.taps = taps
        self.direction = direction
        self.clock = clock
        self._streams: dict[int, TappedStream] = {}
        self._endpoints: dict[str, _Endpoint] = {}

    def begin(self, stream: object, request: RequestHead, client: tuple[str, int] | None,
              client_id: str | None) -> None:
        """Tap reports requests once routed (``request``)."""

    def request(self, stream: object, request: RequestHead, labels: str, client: tuple[str, int] | None) -> None:
        if not self.taps.taps:
            return
        endpoint = self._endpoints.get(labels)
        if endpoint is None:  # parsed once per endpoint: a tap open must not cost a regex per request
            if len(self._endpoints) >= ENDPOINT_CACHE:
                self._endpoints.clear()
            endpoint = self._endpoints[labels] = endpoint_of(labels, self.direction)
        tapped = self.taps.begin(request_of(request, endpoint, self.direction, client), self.clock())
        if tapped is not None:
            self._streams[id(stream)] = tapped

    def response(self, stream: object, status: int, headers: Sequence[Header]) -> None:
        tapped = self._streams.get(id(stream))
        if tapped is not None:
            tapped.response_init(status, [h for h in headers if h[0][:1] != b":"], self.clock())

    def end(self, stream: object, status: int | None, error: object, grpc_status: int | None = None,
            response_bytes: int = 0, trailers: Sequence[Header] = (), reset_code: int | None = None) -> None:
        tapped = self._streams.pop(id(stream), None)
        if tapped is None:
            return
        now = self.clock()
        if tapped.response_started is None and status is not None:
            tapped.response_init(status, (), now)  # the proxy answered (an error) without a relayed head
        tapped.response_end(now, grpc_status=grpc_status, response_bytes=response_bytes, trailers=trailers,
                            reset_code=reset_code)
