"""Just enough HTTP/1.1 for the webhooks and the injector's admin port: the head limit and the reply.

Requests are read by ``tether.http_request`` (the rules shared with the proxy's admin port):
heads over `MAX_HEAD` bytes get 431, bodies over the caller's limit 413 (Linkerd's webhook takes
10 MiB), chunked bodies 411 (the API server sends Content-Length). Callers: `tether.serving.webhook`
(the admission webhooks of the injector and the policy controller) and the injector's admin port.
"""

from __future__ import annotations

MAX_HEAD = 64 * 1024

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def response(status: int, body: bytes, content_type: str, *, keep_alive: bool, head_only: bool = False) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + (b"" if head_only else body)
