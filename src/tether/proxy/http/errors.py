"""The responses the proxy makes itself, as Linkerd makes them (proxy.md §7.8, §7.9).

An empty body with ``content-length: 0`` and the error in ``l5d-proxy-error``;
errors that end the connection also say ``connection: close`` (and, toward a
meshed client, ``l5d-proxy-connection: close``). The HTTP/1 layer writes them
with its connection's codec, so a synthesized response is framed like any
other.

A gRPC request (HTTP/2, ``content-type: application/grpc...``) gets instead a
trailers-only ``200`` whose ``grpc-status`` says what went wrong
(``grpc_headers``): Linkerd's mapping, UNAVAILABLE for a failed endpoint,
DEADLINE_EXCEEDED for fail-fast and connect timeouts (proxy.md §7.9).

Callers: ``tether.proxy.http.layer``, ``tether.proxy.http.h2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.proxy.protocol.http1 import ResponseHead

REASONS = {400: b"Bad Request", 431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
           502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout"}


@dataclass(frozen=True, slots=True)
class ProxyError:
    """An error the proxy answers for: its status, its ``l5d-proxy-error`` text, and whether it is fatal."""

    status: int
    message: str
    close: bool = True
    metric: str = ""  # the ``error`` label of outbound_http_errors_total, when counted
    route: Any = None  # the request's profile route (``http.profiles.Route``), for its metrics


def failfast(service: str) -> ProxyError:
    return ProxyError(504, f"logical service {service}: service in fail-fast", metric="failfast")


def connect_failed(addr: object, error: str, errno: str) -> ProxyError:
    if error == "connect timeout":
        return ProxyError(504, f"endpoint {addr}: connect timed out", metric="i/o")
    detail = f" ({errno})" if errno else ""
    return ProxyError(502, f"endpoint {addr}: {error}{detail}", metric="i/o")


def io_error(addr: object) -> ProxyError:
    return ProxyError(502, f"endpoint {addr}: connection closed before the response", metric="i/o")


def load_shed() -> ProxyError:
    """More requests in flight than *_MAX_IN_FLIGHT allows (proxy.md §7.11): 503, connection closed."""
    return ProxyError(503, "service unavailable: too many requests in flight", metric="load shed")


def response_timeout(timeout: float) -> ProxyError:
    """A ServiceProfile route's timeout passed before the response head (proxy.md §7.6): 504, connection closed."""
    return ProxyError(504, f"HTTP response timeout after {rust_duration(timeout)}", metric="response timeout")


def rust_duration(seconds: float) -> str:
    """A duration as Rust's ``Duration`` prints it with ``{:?}`` (``250ms``, ``1.5s``, ``10µs``)."""
    nanos = round(seconds * 1e9)
    for unit, size in (("s", 10**9), ("ms", 10**6), ("µs", 10**3)):
        if nanos >= size:
            whole, frac = divmod(nanos, size)
            digits = str(frac).rjust(len(str(size)) - 1, "0").rstrip("0")
            return f"{whole}.{digits}{unit}" if digits else f"{whole}{unit}"
    return f"{nanos}ns"


def bad_request(status: int, reason: str) -> ProxyError:
    return ProxyError(status, reason)


def response(error: ProxyError, *, meshed_client: bool) -> ResponseHead:
    headers = [(b"content-length", b"0"), (b"l5d-proxy-error", error.message.encode("latin-1", "replace"))]
    if error.close:
        headers.append((b"connection", b"close"))
        if meshed_client:
            headers.append((b"l5d-proxy-connection", b"close"))
    return ResponseHead(error.status, tuple(headers), REASONS.get(error.status, b""))


# -- gRPC (proxy.md §7.9) -----------------------------------------------------------------------------------

GRPC_OK = 0
GRPC_NOT_FOUND = 5
GRPC_DEADLINE_EXCEEDED = 4
GRPC_PERMISSION_DENIED = 7
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14

# The HTTP status of each error the proxy synthesizes -> the gRPC code Linkerd gives it instead.
GRPC_CODES = {404: GRPC_NOT_FOUND, 403: GRPC_PERMISSION_DENIED, 502: GRPC_UNAVAILABLE, 503: GRPC_UNAVAILABLE,
              504: GRPC_DEADLINE_EXCEEDED}


def grpc_status(error: ProxyError) -> int:
    return GRPC_CODES.get(error.status, GRPC_INTERNAL)


def grpc_message(text: str) -> bytes:
    """``grpc-message`` is percent-encoded: every byte outside printable ASCII, and ``%`` itself."""
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in text.encode())


def grpc_headers(error: ProxyError) -> tuple[tuple[bytes, bytes], ...]:
    """The headers (after ``:status: 200``) of a trailers-only gRPC answer for ``error``."""
    return ((b"content-length", b"0"), (b"content-type", b"application/grpc"),
            (b"grpc-status", str(grpc_status(error)).encode()), (b"grpc-message", grpc_message(error.message)),
            (b"l5d-proxy-error", error.message.encode("latin-1", "replace")))
