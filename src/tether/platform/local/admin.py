"""The pod controller's admin HTTP port: ``/ready``, ``/live``, ``/ping``, ``/metrics``.

The same contract as the other components' admin ports, so ``tether up`` and ``tether status``
check every component the same way: ``/ready`` is 200 once the controller has read the store
and finished a reconcile pass.  ``/metrics`` is Prometheus text with a few gauges and counters
about the pods.  One small GET per connection.  Caller: ``tether platform run``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

MAX_HEAD = 8 * 1024
READ_TIMEOUT_S = 5.0
_TEXT = "text/plain; charset=utf-8"
_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class AdminServer:
    def __init__(self, ready: Callable[[], bool], metrics: Callable[[], str]) -> None:
        self._ready = ready
        self._metrics = metrics
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def respond(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", _TEXT, b"only GET and HEAD\n"
        if path == "/ready":
            if self._ready():
                return "200 OK", _TEXT, b"ok\n"
            return "500 Internal Server Error", _TEXT, b"not ready: the store has not been read yet\n"
        if path == "/live":
            return "200 OK", _TEXT, b"live\n"
        if path == "/ping":
            return "200 OK", _TEXT, b"pong\n"
        if path == "/metrics":
            return "200 OK", _METRICS, self._metrics().encode()
        return "404 Not Found", _TEXT, b"not found\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
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
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
