"""Just enough HTTP/1.1 for the webhook and its admin port: parse a request head, frame a body, write a reply.

The head parser (`parse_head`) is pure; `read_request` is the one place that awaits the
stream (head up to a blank line, then exactly Content-Length bytes). Bounded: heads over
`MAX_HEAD` bytes get 431, bodies over the caller's limit 413 (Linkerd's webhook takes 10 MiB),
chunked bodies 411 (the API server sends Content-Length). Callers: `tether.serving.webhook` (the
admission webhooks of the injector and the policy controller) and the injector's admin port.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

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


class HttpError(Exception):
    """A request we answer with ``status`` and then close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


def parse_head(head: bytes) -> Request:
    """The request line and headers (``head`` ends with the blank line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
        raise HttpError(400, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"bad request line {lines[0][:80]!r}")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"bad header line {line[:80]!r}")
        key = name.lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return Request(method, target.partition("?")[0], version, headers)


def body_length(request: Request, max_body: int) -> int:
    if "transfer-encoding" in request.headers:
        raise HttpError(411, "chunked bodies are not accepted; send Content-Length")
    raw = request.headers.get("content-length")
    if raw is None:
        return 0
    if not raw.isdigit():
        raise HttpError(400, f"bad Content-Length {raw[:20]!r}")
    length = int(raw)
    if length > max_body:
        raise HttpError(413, f"body of {length} bytes is over the {max_body}-byte limit")
    return length


async def read_request(reader: asyncio.StreamReader, max_body: int) -> Request | None:
    """The next request on the connection, or None when the peer closed it between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if not err.partial.strip():
            return None
        raise HttpError(400, "connection closed inside the request head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "request head too large") from None
    request = parse_head(head)
    length = body_length(request, max_body)
    if length == 0:
        return request
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise HttpError(400, "connection closed inside the request body") from None
    return Request(request.method, request.path, request.version, request.headers, body)


def response(status: int, body: bytes, content_type: str, *, keep_alive: bool, head_only: bool = False) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + (b"" if head_only else body)
