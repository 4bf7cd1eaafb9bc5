"""The admin HTTP port every control-plane process serves: ``/metrics``, ``/ready``, ``/live``, ``/ping``.

Used by identity, destination and the local pod controller, so ``tether up``
and ``tether status`` check every component the same way (Linkerd's admin
contract: ``/live`` answers at once, ``/ready`` is 500 until the component
serves).  One small GET per connection; request heads are capped and time
out, anything else is 404/405.  The proxy has its own admin server with more
routes, because it imports nothing of the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tether.http_request import HttpError, parse_head
from tether.http_response import response

MAX_HEAD = 8 * 1024
READ_TIMEOUT_S = 5.0
_TEXT = "text/plain; charset=utf-8"


class AdminServer:
    """Serves ``metrics()`` as Prometheus text and ``ready()`` as /ready's verdict."""

    def __init__(self, metrics: Callable[[], bytes], ready: Callable[[], bool], not_ready: str = "not ready") -> None:
        self._metrics = metrics
        self._ready = ready
        self._not_ready = f"not ready: {not_ready}\n".encode()
        self._server: asyncio.Server | None = None

    @classmethod
    def for_registry(cls, registry: CollectorRegistry, ready: Callable[[], bool], not_ready: str) -> AdminServer:
        return cls(lambda: generate_latest(registry), ready, not_ready)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; return the bound port (``port`` 0 picks a free one)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for one request."""
        if method not in ("GET", "HEAD"):
            return 405, _TEXT, b"only GET and HEAD\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self._metrics()
        if path == "/ready":
            return (200, _TEXT, b"ok\n") if self._ready() else (500, _TEXT, self._not_ready)
        if path == "/live":
            return 200, _TEXT, b"live\n"
        if path == "/ping":
            return 200, _TEXT, b"pong\n"
        return 404, _TEXT, b"not found\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = parse_head(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S))
            method = request.method
            status, content_type, body = self.respond(method, request.path)
            writer.write(response(status, body, content_type, keep_alive=False, head_only=method == "HEAD"))
            await writer.drain()
        except (HttpError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass  # a client that sent junk or left gets no answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
