"""An admission webhook's HTTPS listener, and the keep-alive HTTP/1.1 connection loop behind it.

Used by the proxy injector (mutating, port 8443) and the policy controller
(validating, port 9443).  The listener takes a POST on any path, hands the
body to the ``Reviewer`` on a worker thread with a deadline below the API
server's 10 s timeout, and answers on the same connection; when the deadline
passes it answers ``reviewer.fallback`` instead of hanging.  TLS 1.3 with the
certificate and key from files, re-read when they change (as Linkerd reloads
its mounted secret).  ``serve_connection`` is the loop any small HTTP port of
the control plane can run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tether.http_request import HttpError, Request, read_request
from tether.http_response import response
from tether.serving.admission_review import TEXT, Reply

MAX_HEAD = 64 * 1024  # a request head past it is answered 431
MAX_BODY = 10 * 1024 * 1024

Handler = Callable[[Request], Awaitable[tuple[int, bytes, str]]]


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    tls_cert: Path
    tls_key: Path
    addr: tuple[str, int]
    handler_timeout: float = 8.0  # under the webhook's 10 s timeoutSeconds
    idle_timeout: float = 90.0
    max_body: int = MAX_BODY
    cert_reload_interval: float = 5.0


class Reviewer(Protocol):
    def review(self, body: bytes) -> Reply: ...

    def fallback(self, body: bytes, reason: str, message: str) -> Reply: ...


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for TLS 1.3, HTTP/1.1; raises `OSError`/`ssl.SSLError` for unusable files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(cert, key)
    return context


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: Handler, *,
                           max_body: int, idle_timeout: float) -> None:
    """Answer requests on one connection with ``reply`` until the peer closes, idles out or asks to close."""
    try:
        while True:
            try:
                request = await asyncio.wait_for(read_request(reader, max_body), idle_timeout)
            except HttpError as err:
                writer.write(response(err.status, f"{err.message}\n".encode(), TEXT, keep_alive=False))
                await writer.drain()
                return
            if request is None:
                return
            status, body, content_type = await reply(request)
            keep_alive = request.keep_alive
            writer.write(
                response(status, body, content_type, keep_alive=keep_alive, head_only=request.method == "HEAD")
            )
            await writer.drain()
            if not keep_alive:
                return
    except (ConnectionError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError):
        pass  # the peer went away, idled out or spoke no TLS: nothing to answer
    except asyncio.CancelledError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


class ConnectionTasks:
    """The tasks serving connections of some listeners, so ``cancel`` can end them all on shutdown."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def handler(self, reply: Handler, *, max_body: int, idle_timeout: float) -> Callable[..., Awaitable[None]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is not None:
                self._tasks.add(task)
            try:
                await serve_connection(reader, writer, reply, max_body=max_body, idle_timeout=idle_timeout)
            finally:
                if task is not None:
                    self._tasks.discard(task)
        return serve

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class WebhookServer:
    def __init__(self, config: WebhookConfig, reviewer: Reviewer, *, tls: ssl.SSLContext | None = None,
                 logger: logging.Logger | None = None, tasks: ConnectionTasks | None = None) -> None:
        """``tls`` is a context from `tls_context` (made here from the config's files when None)."""
        self.config = config
        self._reviewer = reviewer
        self._log = logger or logging.getLogger(__name__)
        self._tls = tls or tls_context(config.tls_cert, config.tls_key)
        self._cert_stamp = self._stamp()
        self._server: asyncio.Server | None = None
        self._tasks = tasks or ConnectionTasks()
        self._reloader: asyncio.Task | None = None

    async def start(self) -> int:
        """Listen; return the bound port (useful when asked for port 0)."""
        host, port = self.config.addr
        serve = self._tasks.handler(self._reply, max_body=self.config.max_body, idle_timeout=self.config.idle_timeout)
        self._server = await asyncio.start_server(serve, host, port, ssl=self._tls, limit=MAX_HEAD)
        self._reloader = asyncio.create_task(self._reload_certificates())
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
            self._reloader = None
        if self._server is not None:
            self._server.close()
        self._tasks.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _stamp(self) -> tuple[int, int]:
        try:
            return (self.config.tls_cert.stat().st_mtime_ns, self.config.tls_key.stat().st_mtime_ns)
        except OSError:
            return (-1, -1)

    async def _reload_certificates(self) -> None:
        while True:
            await asyncio.sleep(self.config.cert_reload_interval)
            stamp = self._stamp()
            if stamp == self._cert_stamp:
                continue
            try:
                # New handshakes use the new pair; established connections keep theirs.
                self._tls.load_cert_chain(self.config.tls_cert, self.config.tls_key)
            except (OSError, ssl.SSLError) as err:
                self._log.warning("keeping the current TLS certificate: cannot load the new one: %s", err)
                continue
            self._cert_stamp = stamp
            self._log.info("reloaded the TLS certificate from %s", self.config.tls_cert)

    async def _reply(self, request: Request) -> tuple[int, bytes, str]:
        if request.method != "POST":
            return 405, b"the webhook takes POSTed AdmissionReviews\n", TEXT
        try:
            reply = await asyncio.wait_for(asyncio.to_thread(self._reviewer.review, request.body),
                                           self.config.handler_timeout)
        except TimeoutError:
            reply = self._reviewer.fallback(request.body, "timeout",
                                            f"no answer within {self.config.handler_timeout:g}s")
        return reply.status, reply.body, reply.content_type
