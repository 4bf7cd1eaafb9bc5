"""An HTTP/1.1 response as Tether's small servers write it: one home for the head (``tether.http_request`` reads
their requests).

Used by the proxy's admin port (``tether.proxy.io.admin``), the control plane's
webhooks and the injector's admin port (``tether.serving.webhook``) and the
components' admin port (``tether.admin``). It imports nothing of Tether, so the
proxy can use it without importing control-plane code.
"""

from __future__ import annotations

from collections.abc import Iterable

REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def response(status: int, body: bytes, content_type: str, *, keep_alive: bool, head_only: bool = False,
             headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """The status line, content-type, ``headers``, content-length (a 204 has neither it nor a body) and
    connection (keep-alive, said for HTTP/1.0 clients, or close), then the body unless ``head_only`` (a HEAD)."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, '')}", f"content-type: {content_type}",
             *(f"{name}: {value}" for name, value in headers)]
    if status != 204:
        lines.append(f"content-length: {len(body)}")
    lines.append(f"connection: {'keep-alive' if keep_alive else 'close'}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only or status == 204 else head + body
