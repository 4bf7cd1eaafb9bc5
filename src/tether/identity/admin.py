"""The identity service's admin HTTP port: ``/metrics``, ``/ready``, ``/live`` and ``/ping``.

Started by ``tether.identity.server`` on ``--admin-addr`` (9990, as Linkerd).  It answers one
GET per connection; requests are small and bounded, anything else gets 404/405.  ``/ready`` is
200 once Certify is being served, 500 before (as Linkerd's admin server).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

MAX_REQUEST_HEAD = 16 * 1024
READ_TIMEOUT = 10.0


class AdminServer:
    def __init__(self, registry: CollectorRegistry, ready: Callable[[], bool]) -> None:
        self._registry = registry
        self._ready = ready
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; return the bound port (useful when ``port`` is 0)."""
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_REQUEST_HEAD)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            status, content_type, body = self._respond(method, path)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + (body if method != "HEAD" else b"")
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass  # a client that went away or sent junk gets no answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _respond(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", _TEXT, b"method not allowed\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/ready":
            return ("200 OK", _TEXT, b"ok\n") if self._ready() else ("500 Internal Server Error", _TEXT, b"not ready\n")
        if path == "/live":
            return "200 OK", _TEXT, b"live\n"
        if path == "/ping":
            return "200 OK", _TEXT, b"pong\n"
        return "404 Not Found", _TEXT, b"not found\n"


_TEXT = "text/plain; charset=utf-8"
