"""The responses the proxy makes itself, as Linkerd makes them (proxy.md §7.8, §7.9).

An empty body with ``content-length: 0`` and the error in ``l5d-proxy-error``;
errors that end the connection also say ``connection: close`` (and, toward a
meshed client, ``l5d-proxy-connection: close``). The HTTP/1 layer writes them
with its connection's codec, so a synthesized response is framed like any
other.

Caller: ``tether.proxy.http.layer``.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def failfast(service: str) -> ProxyError:
    return ProxyError(504, f"logical service {service}: service in fail-fast", metric="failfast")


def connect_failed(addr: object, error: str, errno: str) -> ProxyError:
    if error == "connect timeout":
        return ProxyError(504, f"endpoint {addr}: connect timed out", metric="i/o")
    detail = f" ({errno})" if errno else ""
    return ProxyError(502, f"endpoint {addr}: {error}{detail}", metric="i/o")


def io_error(addr: object) -> ProxyError:
    return ProxyError(502, f"endpoint {addr}: connection closed before the response", metric="i/o")


def bad_request(status: int, reason: str) -> ProxyError:
    return ProxyError(status, reason)


def response(error: ProxyError, *, meshed_client: bool) -> ResponseHead:
    headers = [(b"content-length", b"0"), (b"l5d-proxy-error", error.message.encode("latin-1", "replace"))]
    if error.close:
        headers.append((b"connection", b"close"))
        if meshed_client:
            headers.append((b"l5d-proxy-connection", b"close"))
    return ResponseHead(error.status, tuple(headers), REASONS.get(error.status, b""))
