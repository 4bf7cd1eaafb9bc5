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
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tether.http_request import Request
from tether.injector.admission import Admission
from tether.serving.webhook import MAX_BODY, MAX_HEAD, ConnectionTasks, WebhookConfig, WebhookServer, tls_context

__all__ = ["InjectorServer", "ServeConfig", "run", "tls_context"]

DEFAULT_ADDR = ("0.0.0.0", 8443)
DEFAULT_ADMIN_ADDR = ("0.0.0.0", 9995)
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
        self._tasks = ConnectionTasks()
        self._webhook = WebhookServer(
            WebhookConfig(config.tls_cert, config.tls_key, config.addr, config.handler_timeout, config.idle_timeout,
                          config.max_body, config.cert_reload_interval),
            admission, tls=tls, logger=self._log, tasks=self._tasks)
        self._admin: asyncio.Server | None = None
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
        serve = self._tasks.handler(self._admin_reply, max_body=self._config.max_body,
                                    idle_timeout=self._config.idle_timeout)
        self._admin = await asyncio.start_server(serve, admin_host, admin_port, limit=MAX_HEAD)
        return self._admin.sockets[0].getsockname()[1]

    async def start_webhook(self) -> int:
        """Listen on the webhook port and become ready; return the port."""
        port = await self._webhook.start()
        self._ready = True
        return port

    async def stop(self) -> None:
        self._ready = False
        if self._admin is not None:
            self._admin.close()
        await self._webhook.stop()
        if self._admin is not None:
            await self._admin.wait_closed()
            self._admin = None

    async def _admin_reply(self, request: Request) -> tuple[int, bytes, str]:
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
