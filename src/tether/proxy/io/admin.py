"""The admin server (port 4191): metrics, readiness, liveness, the environment, log level, shutdown (proxy.md §10.1).

A small HTTP/1.1 server on asyncio streams, with bounded heads (16 KiB) and
bodies (64 KiB), keep-alive, and Linkerd's answers (requests are read by
``tether.http_request``, as the control plane's small servers read theirs):

- ``/live``: 200 ``live``; ``/ready``: 200 ``ready`` once the proxy has its
  certificate, else 503 ``not ready``;
- ``/metrics``: the registry in Prometheus text (gzip when asked);
- ``/env.json``: the proxy's environment, or only the variables named in the
  query (``?A&B``; unset ones are null);
- ``/proxy-log-level`` (GET, PUT) and ``/shutdown`` (POST, only when
  ``LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED``) answer only to localhost.

Unlike Linkerd, the admin port speaks plain HTTP only (no mesh TLS detection).

Caller: ``tether.proxy.app``.
"""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import json
import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from tether.http_request import HttpError, read_request
from tether.http_response import response as http_response
from tether.proxy.core.logs import LogFilter
from tether.proxy.core.metrics import Registry

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    client: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    keep_alive: bool = True


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()


class AdminServer:
    def __init__(
        self,
        *,
        registry: Registry,
        ready: Callable[[], bool],
        env: Mapping[str, str],
        log_filter: LogFilter,
        shutdown_enabled: bool,
        on_shutdown: Callable[[], None],
    ) -> None:
        self._registry = registry
        self._ready = ready
        self._env = dict(env)
        self._log_filter = log_filter
        self._shutdown_enabled = shutdown_enabled
        self._on_shutdown = on_shutdown
        self._server: asyncio.Server | None = None

    async def start(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._serve, sock=sock, limit=MAX_HEAD)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = _ip(peer[0]) if peer else None
        try:
            while True:
                request = await _read_request(reader, client)
                if isinstance(request, Response):
                    _write(writer, request, keep_alive=False)
                    break
                if request is None:
                    break
                response = self.handle(request)
                keep_alive = request.keep_alive
                _write(writer, response, keep_alive=keep_alive,
                       gzip_ok="gzip" in request.headers.get("accept-encoding", ""))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def handle(self, request: Request) -> Response:
        """The answer to one request (no I/O)."""
        route = {
            "/live": self._live,
            "/ready": self._ready_route,
            "/metrics": self._metrics,
            "/env.json": self._env_json,
            "/proxy-log-level": self._log_level,
            "/shutdown": self._shutdown,
        }.get(request.path)
        if route is None:
            return Response(404)
        return route(request)

    def _live(self, request: Request) -> Response:
        return Response(200, b"live\n")

    def _ready_route(self, request: Request) -> Response:
        return Response(200, b"ready\n") if self._ready() else Response(503, b"not ready\n")

    def _metrics(self, request: Request) -> Response:
        return Response(200, self._registry.render().encode(), "text/plain; version=0.0.4")

    def _env_json(self, request: Request) -> Response:
        if request.method != "GET":
            return Response(405)
        accept = request.headers.get("accept", "*/*")
        if not any(t.split(";")[0].strip() in ("*/*", "application/*", "application/json")
                   for t in accept.split(",")):
            return Response(406)
        if not request.query:
            return _json(self._env)
        selected: dict[str, str | None] = {}
        for item in request.query.split("&"):
            if not item:
                continue
            if "=" in item:
                return Response(400, b"env.json query must be variable names, not key=value pairs\n")
            name = unquote(item)
            selected[name] = self._env.get(name)
        return _json(selected)

    def _log_level(self, request: Request) -> Response:
        if not _is_localhost(request.client):
            return Response(403, b"Requests are only permitted from localhost.")
        if request.method == "GET":
            return Response(200, self._log_filter.text.encode())
        if request.method == "PUT":
            try:
                self._log_filter.set(request.body.decode().strip())
            except (UnicodeDecodeError, ValueError) as exc:
                return Response(400, f"{exc}\n".encode())
            for target in self._log_filter.unmatched:
                log.warning("/proxy-log-level: target %r names no logger of this proxy", target)
            return Response(204)
        return Response(405)

    def _shutdown(self, request: Request) -> Response:
        if request.method != "POST":
            return Response(405)
        if not _is_localhost(request.client):
            return Response(403, b"Requests are only permitted from localhost.")
        if not self._shutdown_enabled:
            return Response(404, b"shutdown endpoint is not enabled\n")
        asyncio.get_running_loop().call_soon(self._on_shutdown)
        return Response(200, b"shutdown\n")


async def _read_request(
    reader: asyncio.StreamReader, client: ipaddress.IPv4Address | ipaddress.IPv6Address | None
) -> Request | Response | None:
    """The next request; None at a clean EOF; an error ``Response`` for a request we will not read."""
    try:
        request = await read_request(reader, MAX_BODY)
    except HttpError as exc:
        return Response(exc.status)
    if request is None:
        return None
    return Request(request.method, request.path, request.query, request.headers, request.body, client,
                   request.keep_alive)


def _write(writer: asyncio.StreamWriter, response: Response, *, keep_alive: bool, gzip_ok: bool = False) -> None:
    body, headers = response.body, list(response.headers)
    if gzip_ok and len(body) > 1024:
        body = gzip.compress(body, compresslevel=5)
        headers.append(("content-encoding", "gzip"))
    writer.write(http_response(response.status, body, response.content_type, keep_alive=keep_alive, headers=headers))


def _json(value: object) -> Response:
    return Response(200, json.dumps(value).encode(), "application/json")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _is_localhost(ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    return ip is not None and ip.is_loopback
