"""The destination's admin HTTP port (9996): ``/metrics``, ``/ready``, ``/live``, ``/ping``.

Started by ``tether.destination.service`` before the index syncs, so ``/live``
answers at once while ``/ready`` says 500 until the index has synced and gRPC
is serving (Linkerd's admin contract).  One small GET per connection; request
heads are capped and time out, anything else is 404/405.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

MAX_HEAD = 8 * 1024
READ_TIMEOUT = 5.0
_TEXT = "text/plain; charset=utf-8"


class AdminServer:
    def __init__(self, registry: CollectorRegistry, ready: Callable[[], bool]) -> None:
        self._registry = registry
        self._ready = ready
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; return the bound port (``port`` 0 picks a free one)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def respond(self, method: str, path: str) -> tuple[str, str, bytes]:
        """(status line, content type, body) for one request."""
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", _TEXT, b"only GET and HEAD\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/ready":
            if self._ready():
                return "200 OK", _TEXT, b"ok\n"
            return "500 Internal Server Error", _TEXT, b"not ready: the index has not synced\n"
        if path == "/live":
            return "200 OK", _TEXT, b"live\n"
        if path == "/ping":
            return "200 OK", _TEXT, b"pong\n"
        return "404 Not Found", _TEXT, b"not found\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, _, rest = request_line.partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            status, content_type, body = self.respond(method, path)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass  # a client that sent junk or left gets no answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
