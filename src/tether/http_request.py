"""An HTTP/1.1 request as Tether's small servers read it: one home for the head and body rules.

Used by the proxy's admin port (``tether.proxy.io.admin``), the control plane's
webhooks and the injector's admin port (``tether.serving.webhook``,
``tether.injector.server``) and the components' admin port (``tether.admin``).
It sits below all of them (it imports nothing of Tether): the proxy imports no
control-plane code, and ``tether.serving`` may not import the proxy.

``parse_head`` is pure; ``read_request`` is the one place that awaits the
stream: the head up to its blank line (the stream's ``limit`` bounds it: 431
when over), then exactly Content-Length bytes (413 over the caller's limit;
chunked bodies 411: these servers take small bodies with a length). A request
they will not read raises ``HttpError`` with the status to answer before closing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


class HttpError(Exception):
    """A request we answer with ``status`` and then close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # the request target before any "?"
    query: str  # after the "?" ("" without one)
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
    """The request line and headers (``head`` ends with the blank line); no body yet."""
    lines = head.decode("latin-1").split("\r\n")  # latin-1 decodes any byte
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
    path, _, query = target.partition("?")
    return Request(method, path, query, version, headers)


def body_length(request: Request, max_body: int) -> int:
    """The body's length by Content-Length (0 without one)."""
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
    return Request(request.method, request.path, request.query, request.version, request.headers, body)
