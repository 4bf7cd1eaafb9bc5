"""A control-plane process's lifecycle: admin port, platform watches synced into an index, then gRPC.

Destination and the policy controller are both this shape (Linkerd's: the
admin port answers ``/live`` at once, ``/ready`` only once the index has
synced and gRPC serves).  ``start`` opens the admin port, starts one watch
task per resource type feeding ``apply``, waits until ``synced()`` holds after
a ``SYNCED`` marker, gives back the listing's memory, then starts gRPC; any
failure undoes what was started.  ``stop`` ends every stream cleanly (status
OK), stops gRPC, the watches and the admin port.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry

from tether.admin import AdminServer
from tether.platform.watch import ResourceEvent, ResourceWatcher
from tether.serving.grpc_server import ConfigError, TlsFiles, split_addr, start_grpc
from tether.serving.rpc import StreamSet

log = logging.getLogger(__name__)

# Let other tasks (streams, the admin port) run between this many events of a large batch.
EVENTS_PER_YIELD = 64


def release_listing_memory() -> None:
    """Give back to the OS what the initial listing used (the whole store, decoded), once the index holds facts."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the memory is reused, just not returned


@dataclass(frozen=True, slots=True)
class Listen:
    addr: str
    admin_addr: str
    tls: TlsFiles | None
    shutdown_grace: float = 2.0


class ControlPlaneProcess:
    """Runs one controller: ``apply(type_key, event)`` feeds its index; ``handlers`` serve once ``synced()``."""

    def __init__(
        self,
        name: str,
        listen: Listen,
        registry: CollectorRegistry,
        watcher: ResourceWatcher,
        watched: Sequence[str],
        apply: Callable[[str, ResourceEvent], None],
        synced: Callable[[], bool],
        handlers: Callable[[], Sequence[grpc.GenericRpcHandler]],
        streams: Sequence[StreamSet],
    ) -> None:
        self.name = name
        self._listen = listen
        self._watcher = watcher
        self._watched = tuple(watched)
        self._apply = apply
        self._synced_check = synced
        self._handlers = handlers
        self._streams = tuple(streams)
        self._admin = AdminServer.for_registry(registry, ready=lambda: self.serving, not_ready="the index has not synced")
        self._grpc: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._synced = asyncio.Event()
        self.serving = False
        self.port: int | None = None
        self.admin_port: int | None = None

    async def start(self) -> None:
        """Open the admin port, sync the index, then serve gRPC; on any failure undo what was started."""
        split_addr(self._listen.addr)  # a bad address fails before anything opens
        admin_host, admin_port = split_addr(self._listen.admin_addr)
        try:
            self.admin_port = await self._admin.start(admin_host, admin_port)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self._listen.admin_addr}: {exc.strerror}") from None
        try:
            await self._sync()
            release_listing_memory()
            self._grpc, self.port = await start_grpc(self._handlers(), self._listen.addr, self._listen.tls)
        except BaseException:
            await self.stop()
            raise
        self.serving = True
        log.info("%s serving gRPC on port %s, admin on port %s", self.name, self.port, self.admin_port)

    async def _sync(self) -> None:
        """Start one watch per resource type and wait until every one has listed (SYNCED)."""
        self._tasks = [asyncio.create_task(self._watch(key), name=f"watch {key}") for key in self._watched]
        synced = asyncio.create_task(self._synced.wait())
        done, _ = await asyncio.wait([synced, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        if synced in done:
            return
        synced.cancel()
        failed = next(iter(done))
        cause = None if failed.cancelled() else failed.exception()
        raise RuntimeError(f"a resource watch ended before the index synced: {failed.get_name()}") from cause

    async def stop(self) -> None:
        """End every stream cleanly (status OK), stop serving, stop the watches."""
        self.serving = False
        for streams in self._streams:
            streams.shutdown()
        if self._grpc is not None:
            await self._grpc.stop(self._listen.shutdown_grace)
            self._grpc = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._admin.stop()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    async def _watch(self, type_key: str) -> None:
        # The one place that catches everything: a bad event must not end the watch that feeds the index.
        count = 0
        async for event in self._watcher.watch(type_key):
            try:
                self._apply(type_key, event)
            except Exception:
                log.exception("failed to apply a %s %s event to the index", event.type, type_key)
            if event.type == "SYNCED" and self._synced_check():
                self._synced.set()
            count += 1
            if count % EVENTS_PER_YIELD == 0:
                await asyncio.sleep(0)


class ProcessFacade:
    """What a controller's service object exposes of its ``ControlPlaneProcess`` (set as ``_process``)."""

    _process: ControlPlaneProcess

    @property
    def ready(self) -> bool:
        return self._process.serving

    @property
    def port(self) -> int | None:
        return self._process.port

    @property
    def admin_port(self) -> int | None:
        return self._process.admin_port

    async def start(self) -> None:
        await self._process.start()

    async def stop(self) -> None:
        await self._process.stop()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, through this object's own ``start``/``stop`` (what a controller adds runs too)."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()
