"""The responses the proxy makes itself, as Linkerd makes them (proxy.md §7.8, §7.9).

An empty body with ``content-length: 0`` and the error in ``l5d-proxy-error``;
errors that end the connection (``ProxyError.close``) also say ``connection:
close`` (and, toward a meshed client, ``l5d-proxy-connection: close``). The
answers linkerd2-proxy makes without closing (``close_connection: false`` in
its ``SyntheticHttpResponse``) are policy's: 404 no route, 403, 429, a
redirect, an outbound injected failure, a client policy route's timeouts;
after them the HTTP/1 core reads the rest of the request and goes on with the
next. The HTTP/1 layer writes them with its connection's codec, so a
synthesized response is framed like any other.

A gRPC request (HTTP/2, ``content-type: application/grpc...``) gets instead a
trailers-only ``200`` whose ``grpc-status`` says what went wrong
(``grpc_headers``): Linkerd's mapping, UNAVAILABLE for a failed endpoint,
DEADLINE_EXCEEDED for fail-fast and connect timeouts (proxy.md §7.9).

Callers: ``tether.proxy.core.http1_proxy``, ``tether.proxy.core.http2_proxy``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from tether.proxy.codec.http1 import ResponseHead
from tether.proxy.codec.http2_events import ErrorCodes

REASONS = {301: b"Moved Permanently", 302: b"Found", 303: b"See Other", 307: b"Temporary Redirect",
           308: b"Permanent Redirect", 400: b"Bad Request", 403: b"Forbidden", 404: b"Not Found", 429: b"Too Many Requests",
           431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
           502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout"}


GRPC_OK = 0
GRPC_NOT_FOUND = 5
GRPC_DEADLINE_EXCEEDED = 4
GRPC_PERMISSION_DENIED = 7
GRPC_FAILED_PRECONDITION = 9
GRPC_RESOURCE_EXHAUSTED = 8
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14


class ErrorKind(enum.Enum):
    """Every error the proxy answers a request for, with what each one means everywhere it shows.

    Value: (HTTP status, gRPC code, ``<direction>_http_errors_total{error}`` label ("" when not counted),
    whether a retryable route may retry it, what it means). Linkerd answers for an endpoint error below its retry layer
    (a 502/504 like any other, so retryable); fail-fast, load shedding and a route's timeout come from above
    it and are not retried -- except a fail-fast on a client policy route, which linkerd2-proxy's policy retries
    take as retryable whatever the rule's conditions (``core.exchange.settle_attempt``).
    """

    FAILFAST = (504, GRPC_DEADLINE_EXCEEDED, "failfast", False, "no endpoint within the failfast timeout")
    CONNECT_TIMEOUT = (504, GRPC_DEADLINE_EXCEEDED, "i/o", True, "the endpoint's connect timed out")
    CONNECT_FAILED = (502, GRPC_UNAVAILABLE, "i/o", True, "the endpoint could not be connected")
    UPSTREAM_CLOSED = (502, GRPC_UNAVAILABLE, "i/o", True, "the endpoint failed before its response head")
    LOOP = (502, GRPC_UNAVAILABLE, "i/o", True, "the endpoint is this proxy")
    UNKNOWN_OVERRIDE = (502, GRPC_UNAVAILABLE, "i/o", True, "l5d-dst-override names no known service")
    BAD_OVERRIDE = (400, GRPC_INTERNAL, "", False, "l5d-dst-override is not host[:port]")
    LOAD_SHED = (503, GRPC_UNAVAILABLE, "loadshed", False, "too many requests in flight")
    RESPONSE_TIMEOUT = (504, GRPC_DEADLINE_EXCEEDED, "response timeout", False, "a route's timeout passed")
    ATTEMPT_TIMEOUT = (504, GRPC_DEADLINE_EXCEEDED, "response timeout", True,
                       "a policy rule's per-attempt timeout passed (retried while retries are left)")
    IDLE_TIMEOUT = (504, GRPC_DEADLINE_EXCEEDED, "response timeout", False,
                    "nothing moved on the request for a policy rule's idle timeout")
    # A request the codec refuses (smuggling, a bad head...): Linkerd's catch-all label, so they leave a trace.
    BAD_REQUEST = (400, GRPC_INTERNAL, "unexpected", False, "a malformed request")
    HEAD_TOO_LARGE = (431, GRPC_INTERNAL, "unexpected", False, "a request head over the size limit")
    # Inbound policy (proxy.md §8.3): a denial is counted by its own metrics (inbound_http_authz_deny_total,
    # inbound_http_route_not_found_total) and not as an error; every other policy answer is an error to
    # linkerd2-proxy's error metrics, which have no name for it: "unexpected".
    ROUTE_NOT_FOUND = (404, GRPC_NOT_FOUND, "", False, "no route of the server's policy matches the request")
    UNAUTHORIZED = (403, GRPC_PERMISSION_DENIED, "", False, "no authorization of the route admits the client")
    RATE_LIMITED = (429, GRPC_RESOURCE_EXHAUSTED, "unexpected", False, "the server's local rate limit is reached")
    # An error linkerd2-proxy's inbound error mapper has no case for (an injected failure, a redirect that
    # cannot be made): 500 "unexpected error", connection closed.
    UNEXPECTED = (500, GRPC_INTERNAL, "unexpected", False, "an inbound injected failure or invalid redirect")
    # Outbound client policy (proxy.md §7.2, §7.9): answered by the route, before any endpoint.
    NO_ROUTE = (404, GRPC_NOT_FOUND, "unexpected", False, "no route of the client policy matches the request")
    REDIRECT = (302, GRPC_NOT_FOUND, "unexpected", False, "the route's RequestRedirect filter (status and Location)")
    INJECTED = (500, GRPC_FAILED_PRECONDITION, "unexpected", False, "the route's failure injector")
    INVALID_POLICY = (500, GRPC_INTERNAL, "unexpected", False, "the client or server policy or route is invalid")
    NO_BACKEND = (502, GRPC_UNAVAILABLE, "unexpected", False, "the route's backend has no dispatcher")

    def __init__(self, status: int, grpc: int, metric: str, retryable: bool, meaning: str) -> None:
        self.status = status
        self.grpc = grpc
        self.metric = metric
        self.retryable = retryable
        self.meaning = meaning  # for docs and logs; the l5d-proxy-error text names the target (ProxyError.message)


class RouteError(enum.Enum):
    """Why a client policy route's request ended without a whole response: the ``error`` label of
    ``outbound_{http,grpc}_route_request_statuses_total`` (proxy.md §9.5), as linkerd2-proxy's route metrics
    name the error that reached them (its ``labels::Error``). Its ``GO_AWAY`` has no member: a stream a GOAWAY
    did not take is sent again, or answered (502) as the io error it is here."""

    FAIL_FAST = "FAIL_FAST"  # no endpoint within the failfast timeout
    LOAD_SHED = "LOAD_SHED"  # the balancer's queue was full
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"  # the rule's request timeout (the stream's deadline)
    RESPONSE_HEADERS_TIMEOUT = "RESPONSE_HEADERS_TIMEOUT"  # the retry's per-attempt timeout, not retried
    RESPONSE_STREAM_TIMEOUT = "RESPONSE_STREAM_TIMEOUT"  # the rule's response timeout
    IDLE_TIMEOUT = "IDLE_TIMEOUT"  # the rule's idle timeout
    CANCEL = "CANCEL"  # the upstream reset the stream: CANCEL
    REFUSED = "REFUSED"  # ... REFUSED_STREAM (when not sent again)
    ENHANCE_YOUR_CALM = "ENHANCE_YOUR_CALM"  # ... ENHANCE_YOUR_CALM
    RESET = "RESET"  # ... any other code
    IO = "IO"  # the upstream connection broke under the stream
    UNKNOWN = "UNKNOWN"  # anything else


# Errors raised between a route and its endpoints that the proxy answers itself: linkerd2-proxy's route metrics
# see the error, not a response (its endpoint errors are answered below the route, by status) -- its client
# policy routes label them so (outbound_*_route_request_statuses_total), its ServiceProfile routes record the
# failfast and load-shed ones as ``error="unclassified"`` without a status (``UNSTATUSED``).
ROUTE_ERRORS = {ErrorKind.FAILFAST: RouteError.FAIL_FAST, ErrorKind.LOAD_SHED: RouteError.LOAD_SHED,
                ErrorKind.ATTEMPT_TIMEOUT: RouteError.RESPONSE_HEADERS_TIMEOUT,
                ErrorKind.IDLE_TIMEOUT: RouteError.IDLE_TIMEOUT}
UNSTATUSED = frozenset((ErrorKind.FAILFAST, ErrorKind.LOAD_SHED))

# An upstream's RST_STREAM code as the route's error; any other code is RESET.
_RESET_ERRORS = {int(ErrorCodes.CANCEL): RouteError.CANCEL, int(ErrorCodes.REFUSED_STREAM): RouteError.REFUSED,
                 int(ErrorCodes.ENHANCE_YOUR_CALM): RouteError.ENHANCE_YOUR_CALM}


def reset_error(code: int) -> RouteError:
    """The route error of a stream the upstream reset with ``code``."""
    return _RESET_ERRORS.get(code, RouteError.RESET)


@dataclass(frozen=True, slots=True)
class ProxyError:
    """An error the proxy answers for: its kind, its ``l5d-proxy-error`` text, whether it closes the connection."""

    kind: ErrorKind
    message: str
    route: Any = None  # the request's profile route (``core.profiles.Route``), for its metrics
    status_code: int = 0  # a status of the route's choosing (redirect, injected failure); 0: the kind's
    grpc_code: int | None = None  # a gRPC code of the route's choosing (injected failure)
    headers: tuple[tuple[bytes, bytes], ...] = ()  # more response headers (a redirect's Location)
    # The client's connection ends after the answer (HTTP/1: ``connection: close``); False for the answers
    # linkerd2-proxy makes with ``close_connection: false`` (set by the constructors below).
    close: bool = True

    @property
    def status(self) -> int:
        return self.status_code or self.kind.status

    @property
    def metric(self) -> str:
        return self.kind.metric


def failfast(service: str) -> ProxyError:
    return ProxyError(ErrorKind.FAILFAST, f"logical service {service}: service in fail-fast")


def queue_full(service: str) -> ProxyError:
    """The balancer's queue already holds its capacity of waiters (``core.balancer_queue``): the route sheds
    the request, 503, as linkerd2-proxy's does."""
    return ProxyError(ErrorKind.LOAD_SHED, f"logical service {service}: service unavailable")


def connect_failed(addr: object, timed_out: bool, error: str, errno: str) -> ProxyError:
    if timed_out:
        return ProxyError(ErrorKind.CONNECT_TIMEOUT, f"endpoint {addr}: connect timed out")
    detail = f" ({errno})" if errno else ""
    return ProxyError(ErrorKind.CONNECT_FAILED, f"endpoint {addr}: {error}{detail}")


def io_error(addr: object) -> ProxyError:
    return ProxyError(ErrorKind.UPSTREAM_CLOSED, f"endpoint {addr}: connection closed before the response")


def upgrade_reset(addr: object, error_code: int) -> ProxyError:
    """An upgraded request's HTTP/2 stream failed (``core.orig_proto``): reset, refused by a GOAWAY, or its
    connection failed with ``error_code`` -- linkerd2-proxy's ``DowngradedH2Error``, with the code told as the
    ``h2`` crate tells it."""
    reason = _H2_REASONS.get(error_code, "unknown reason")
    return ProxyError(ErrorKind.UPSTREAM_CLOSED, f"endpoint {addr}: upgraded connection failed with HTTP/2 reset: "
                                                 f"{reason}")


# RFC 9113 §7's error codes as the h2 crate's ``Reason`` displays them.
_H2_REASONS = {
    0x0: "not a result of an error",
    0x1: "unspecific protocol error detected",
    0x2: "unexpected internal error encountered",
    0x3: "flow-control protocol violated",
    0x4: "settings ACK not received in timely manner",
    0x5: "received frame when stream half-closed",
    0x6: "frame with invalid size",
    0x7: "refused stream before processing any application logic",
    0x8: "stream no longer needed",
    0x9: "unable to maintain the header compression context",
    0xA: "connection established in response to a CONNECT request was reset or abnormally closed",
    0xB: "detected excessive load generating behavior",
    0xC: "security properties do not meet minimum requirements",
    0xD: "endpoint requires HTTP/1.1",
}


def loop(addr: object) -> ProxyError:
    return ProxyError(ErrorKind.LOOP, f"endpoint {addr}: loop")


def bad_override(value: bytes) -> ProxyError:
    return ProxyError(ErrorKind.BAD_OVERRIDE, f"invalid l5d-dst-override header: {value.decode('latin-1')!r}")


def unknown_override(authority: str) -> ProxyError:
    return ProxyError(ErrorKind.UNKNOWN_OVERRIDE, f"l5d-dst-override {authority}: not a known service")


def load_shed() -> ProxyError:
    """More requests in flight than *_MAX_IN_FLIGHT allows (proxy.md §7.11): 503, connection closed."""
    return ProxyError(ErrorKind.LOAD_SHED, "service unavailable: too many requests in flight")


def response_timeout(timeout: float) -> ProxyError:
    """A ServiceProfile route's timeout passed before the response head (proxy.md §7.6): 504, connection closed."""
    return ProxyError(ErrorKind.RESPONSE_TIMEOUT, f"HTTP response timeout after {rust_duration(timeout)}")


def request_timeout(timeout: float) -> ProxyError:
    """A client policy route's request timeout passed before the response head: 504, the connection kept
    (Linkerd's ``gateway_timeout_nonfatal``, unlike a ServiceProfile route's ``response_timeout``)."""
    return ProxyError(ErrorKind.RESPONSE_TIMEOUT, f"HTTP response timeout after {rust_duration(timeout)}",
                      close=False)


def attempt_timeout(timeout: float) -> ProxyError:
    """A client policy rule's per-attempt timeout (``retry.linkerd.io/timeout``) before the response head."""
    return ProxyError(ErrorKind.ATTEMPT_TIMEOUT, f"HTTP response headers timeout after {rust_duration(timeout)}",
                      close=False)


def idle_timeout(timeout: float) -> ProxyError:
    """A client policy rule's idle timeout (``timeouts.idle``) passed with no byte either way."""
    return ProxyError(ErrorKind.IDLE_TIMEOUT, f"HTTP stream idle for {rust_duration(timeout)}", close=False)


def bad_request(status: int, reason: str) -> ProxyError:
    """A request the codec refused: its status hint says which (431: the head is too large; else 400)."""
    return ProxyError(ErrorKind.HEAD_TOO_LARGE if status == 431 else ErrorKind.BAD_REQUEST, reason)


def route_not_found() -> ProxyError:
    return ProxyError(ErrorKind.ROUTE_NOT_FOUND, "no route found for request", close=False)


def unauthorized() -> ProxyError:
    return ProxyError(ErrorKind.UNAUTHORIZED, "unauthorized request on route", close=False)


def rate_limited(scope: str) -> ProxyError:
    return ProxyError(ErrorKind.RATE_LIMITED, f"too many requests ({scope} rate limit)", close=False)


def unexpected() -> ProxyError:
    """What linkerd2-proxy's inbound answers for an error its mapper has no case for: 500, connection closed."""
    return ProxyError(ErrorKind.UNEXPECTED, "unexpected error")


def no_route() -> ProxyError:
    return ProxyError(ErrorKind.NO_ROUTE, "no route", close=False)


def redirect(status: int, location: str) -> ProxyError:
    return ProxyError(ErrorKind.REDIRECT, f"redirected to {location}", status_code=status,
                      headers=((b"location", location.encode("latin-1", "replace")),), close=False)


def injected(status: int, grpc_code: int | None, message: str) -> ProxyError:
    """A failure the route's injector chose: its HTTP status, or for a gRPC route its code (HTTP 200)."""
    return ProxyError(ErrorKind.INJECTED, message, status_code=status, grpc_code=grpc_code, close=False)


def invalid_policy(message: str) -> ProxyError:
    return ProxyError(ErrorKind.INVALID_POLICY, message)


def no_backend(name: str) -> ProxyError:
    return ProxyError(ErrorKind.NO_BACKEND, f"backend {name} has no dispatcher")


def rust_duration(seconds: float) -> str:
    """A duration as Rust's ``Duration`` prints it with ``{:?}`` (``250ms``, ``1.5s``, ``10µs``)."""
    nanos = round(seconds * 1e9)
    for unit, size in (("s", 10**9), ("ms", 10**6), ("µs", 10**3)):
        if nanos >= size:
            whole, frac = divmod(nanos, size)
            digits = str(frac).rjust(len(str(size)) - 1, "0").rstrip("0")
            return f"{whole}.{digits}{unit}" if digits else f"{whole}{unit}"
    return f"{nanos}ns"




def response(error: ProxyError, *, meshed_client: bool, informational: bool = True) -> ResponseHead:
    """``informational``: ``l5d-proxy-error`` and ``l5d-proxy-connection`` may be sent (inbound: to meshed clients
    only, proxy.md §8.4)."""
    headers = [(b"content-length", b"0")]
    if informational:
        headers.append((b"l5d-proxy-error", error.message.encode("latin-1", "replace")))
    headers.extend(error.headers)
    if error.close:
        headers.append((b"connection", b"close"))
        if meshed_client and informational:
            headers.append((b"l5d-proxy-connection", b"close"))
    return ResponseHead(error.status, tuple(headers), REASONS.get(error.status, b""))


# -- gRPC (proxy.md §7.9) -----------------------------------------------------------------------------------

def grpc_status(error: ProxyError) -> int:
    return error.grpc_code if error.grpc_code is not None else error.kind.grpc


def grpc_message(text: str) -> bytes:
    """``grpc-message`` is percent-encoded: every byte outside printable ASCII, and ``%`` itself."""
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode())


def grpc_headers(error: ProxyError, *, informational: bool = True) -> tuple[tuple[bytes, bytes], ...]:
    """The headers (after ``:status: 200``) of a trailers-only gRPC answer for ``error``; ``grpc-message`` and
    ``l5d-proxy-error`` only when ``informational``."""
    status = ((b"content-length", b"0"), (b"content-type", b"application/grpc"),
              (b"grpc-status", str(grpc_status(error)).encode()))
    if not informational:
        return status
    return (*status, (b"grpc-message", grpc_message(error.message)),
            (b"l5d-proxy-error", error.message.encode("latin-1", "replace")))
