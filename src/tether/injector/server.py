"""The webhook process: an HTTPS listener for AdmissionReviews and a plain-HTTP admin port.

Started by ``tether injector serve`` (`run`). The webhook port (8443, as Linkerd's) takes a
POST on any path, hands the body to `Admission.review` on a worker thread with a deadline
below the API server's 10 s timeout, and answers on the same keep-alive connection; when the
deadline passes it answers per the failure policy instead of hanging (`Admission.fallback`).
TLS 1.3 with the certificate and key from files, re-read when they change (as Linkerd
reloads its mounted secret). The admin port (9995, as Linkerd's injector) serves
``/metrics``, ``/ready`` (200 once the webhook listens, which with a namespace watch waits for its
first listing), ``/live`` and ``/ping``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tether.injector import http
from tether.injector.admission import Admission

DEFAULT_ADDR = ("0.0.0.0", 8443)
DEFAULT_ADMIN_ADDR = ("0.0.0.0", 9995)
MAX_BODY = 10 * 1024 * 1024
_TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    tls_cert: Path
    tls_key: Path
    addr: tuple[str, int] = DEFAULT_ADDR
    admin_addr: tuple[str, int] = DEFAULT_ADMIN_ADDR
    handler_timeout: float = 8.0  # under the webhook's 10 s timeoutSeconds
    idle_timeout: float = 90.0
    max_body: int = MAX_BODY
    cert_reload_interval: float = 5.0


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for TLS 1.3, HTTP/1.1; raises `OSError`/`ssl.SSLError` for unusable files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert, key)
    return context


class InjectorServer:
    def __init__(
        self,
        config: ServeConfig,
        admission: Admission,
        *,
        tls: ssl.SSLContext | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        """``tls`` is a context from `tls_context` (made here from the config's files when None)."""
        self._config = config
        self._admission = admission
        self._log = logger or logging.getLogger("tether.injector")
        self._tls = tls or tls_context(config.tls_cert, config.tls_key)
        self._cert_stamp = self._stamp()
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task] = set()
        self._reloader: asyncio.Task | None = None
        self._ready = False

    @property
    def config(self) -> ServeConfig:
        return self._config

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> tuple[int, int]:
        """Listen on both ports; return (webhook port, admin port), useful when asked for port 0."""
        admin_port = await self.start_admin()
        return await self.start_webhook(), admin_port

    async def start_admin(self) -> int:
        """Listen on the admin port (``/ready`` says 503 until the webhook listens); return the port."""
        admin_host, admin_port = self._config.admin_addr
        admin = await asyncio.start_server(self._serve_admin, admin_host, admin_port, limit=http.MAX_HEAD)
        self._servers.append(admin)
        return admin.sockets[0].getsockname()[1]

    async def start_webhook(self) -> int:
        """Listen on the webhook port and become ready; return the port."""
        host, port = self._config.addr
        webhook = await asyncio.start_server(self._serve_webhook, host, port, ssl=self._tls, limit=http.MAX_HEAD)
        self._servers.append(webhook)
        self._reloader = asyncio.create_task(self._reload_certificates())
        self._ready = True
        return webhook.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._ready = False
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for server in self._servers:
            await server.wait_closed()

    # --- certificates ---------------------------------------------------------------------------

    def _stamp(self) -> tuple[int, int]:
        try:
            return (self._config.tls_cert.stat().st_mtime_ns, self._config.tls_key.stat().st_mtime_ns)
        except OSError:
            return (-1, -1)

    async def _reload_certificates(self) -> None:
        while True:
            await asyncio.sleep(self._config.cert_reload_interval)
            stamp = self._stamp()
            if stamp == self._cert_stamp:
                continue
            try:
                # New handshakes use the new pair; established connections keep theirs.
                self._tls.load_cert_chain(self._config.tls_cert, self._config.tls_key)
            except (OSError, ssl.SSLError) as err:
                self._log.warning("keeping the current TLS certificate: cannot load the new one: %s", err)
                continue
            self._cert_stamp = stamp
            self._log.info("reloaded the TLS certificate from %s", self._config.tls_cert)

    # --- connections ----------------------------------------------------------------------------

    async def _serve_webhook(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._connection(reader, writer, self._webhook_reply)

    async def _serve_admin(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._connection(reader, writer, self._admin_reply)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply) -> None:  # noqa: ANN001
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                try:
                    request = await asyncio.wait_for(
                        http.read_request(reader, self._config.max_body), self._config.idle_timeout
                    )
                except http.HttpError as err:
                    writer.write(http.response(err.status, f"{err.message}\n".encode(), _TEXT, keep_alive=False))
                    await writer.drain()
                    return
                if request is None:
                    return
                status, body, content_type = await reply(request)
                keep_alive = request.keep_alive
                writer.write(
                    http.response(status, body, content_type, keep_alive=keep_alive, head_only=request.method == "HEAD")
                )
                await writer.drain()
                if not keep_alive:
                    return
        except (ConnectionError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # the peer went away, idled out or spoke no TLS: nothing to answer
        except asyncio.CancelledError:
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _webhook_reply(self, request: http.Request) -> tuple[int, bytes, str]:
        if request.method != "POST":
            return 405, b"the webhook takes POSTed AdmissionReviews\n", _TEXT
        try:
            reply = await asyncio.wait_for(
                asyncio.to_thread(self._admission.review, request.body), self._config.handler_timeout
            )
        except TimeoutError:
            reply = self._admission.fallback(
                request.body, "timeout", f"no answer within {self._config.handler_timeout:g}s"
            )
        return reply.status, reply.body, reply.content_type

    async def _admin_reply(self, request: http.Request) -> tuple[int, bytes, str]:
        if request.method not in ("GET", "HEAD"):
            return 405, b"method not allowed\n", _TEXT
        if request.path == "/metrics":
            return 200, generate_latest(self._admission.metrics.registry), CONTENT_TYPE_LATEST
        if request.path == "/ready":
            return (200, b"ok\n", _TEXT) if self._ready else (503, b"not ready\n", _TEXT)
        if request.path == "/live":
            return 200, b"live\n", _TEXT
        if request.path == "/ping":
            return 200, b"pong\n", _TEXT
        return 404, b"not found\n", _TEXT


async def run(
    server: InjectorServer,
    stop: asyncio.Event,
    *,
    logger: logging.Logger,
    synced: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve until ``stop`` is set; log the bound addresses (the CLI's tests read them).

    With ``synced``, the admin port listens at once but the webhook only after it returns (the
    namespace watch has listed every Namespace), so no pod is admitted without its namespace's
    annotations.
    """
    config = server.config
    try:
        admin_port = await server.start_admin()
        logger.info("admin listening on http://%s:%d", config.admin_addr[0], admin_port)
        if synced is not None:
            waiting = asyncio.create_task(synced())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in (waiting, stopping):
                task.cancel()
            if waiting.done() and not waiting.cancelled():
                waiting.result()  # a watch that could not start says why
            elif stop.is_set():
                return
        webhook_port = await server.start_webhook()
        logger.info("webhook listening on https://%s:%d", config.addr[0], webhook_port)
        await stop.wait()
    finally:
        logger.info("shutting down")
        await server.stop()
