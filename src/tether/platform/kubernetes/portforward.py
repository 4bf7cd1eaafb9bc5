"""A loopback port whose connections reach a pod's port, as ``kubectl port-forward`` (and ``linkerd diagnostics``) do.

``forwarded(dial)`` listens on ``127.0.0.1`` (an ephemeral port, loopback only)
and, for each connection accepted, asks ``dial`` for a ``Tunnel`` to the pod and
copies bytes both ways until either side ends.  The tunnel itself — a WebSocket
to the API server's ``pods/portforward`` subresource — is ``tether.platform.
kubernetes.tunnel``, kept apart so everything here can be exercised with any
byte stream standing in for it (kmock speaks no port-forward protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from tether.platform.kubernetes.client import KubeError

_CHUNK = 64 * 1024


class PortForwardError(KubeError):
    """The API server refused or broke the port-forward (no such pod, no permission, nothing listening)."""


class Tunnel(Protocol):
    """One byte stream to the pod's port."""

    async def read(self) -> bytes:
        """The next bytes from the pod; ``b""`` when the pod side has ended."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


Dial = Callable[[], Awaitable[Tunnel]]


async def _pump_out(reader: asyncio.StreamReader, tunnel: Tunnel) -> None:
    while data := await reader.read(_CHUNK):
        await tunnel.write(data)


async def _pump_in(tunnel: Tunnel, writer: asyncio.StreamWriter) -> None:
    while data := await tunnel.read():
        writer.write(data)
        await writer.drain()


async def _serve(dial: Dial, failures: list[BaseException], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    try:
        tunnel = await dial()
    except (KubeError, OSError) as exc:
        failures.append(exc)  # the local client sees the connection close; the caller reports why
        writer.close()
        return
    pumps = [asyncio.create_task(_pump_out(reader, tunnel)), asyncio.create_task(_pump_in(tunnel, writer))]
    try:
        _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            if task.done() and not task.cancelled() and isinstance(task.exception(), KubeError):
                failures.append(task.exception())  # type: ignore[arg-type]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        await tunnel.close()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class Forward:
    """A running forward: ``addr`` to connect to, ``failures`` the tunnels that could not be opened or broke."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.failures: list[BaseException] = []


@contextlib.asynccontextmanager
async def forwarded(dial: Dial) -> AsyncIterator[Forward]:
    """Forward connections to ``127.0.0.1:<ephemeral>`` through tunnels from ``dial`` while the block runs."""
    forward = Forward("")
    server = await asyncio.start_server(lambda r, w: _serve(dial, forward.failures, r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    forward.addr = f"127.0.0.1:{port}"
    try:
        yield forward
    finally:
        server.close()
        await server.wait_closed()
