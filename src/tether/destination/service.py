"""The destination process, assembled: platform watches -> cluster index -> watchers -> gRPC + admin.

``tether.cli.destination`` builds a ``DestinationConfig`` and the platform's
``ResourceWatcher`` and calls ``DestinationService.run``; tests and benchmarks
use ``start``/``stop`` directly.  ``start`` opens the admin port, starts one
watch task per resource type, waits until every type has synced, then serves
gRPC (TLS from ``config.tls``, re-read when the files change) and flips
``/ready``.  ``stop`` ends every open stream cleanly, stops the gRPC server
and the watches.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
from pathlib import Path

import grpc

from tether.admin import AdminServer
from tether.destination.config import DestinationConfig, TlsFiles
from tether.destination.metrics import DestinationMetrics
from tether.destination.server import DestinationServer
from tether.destination.watcher.cluster import WATCHED, ClusterIndex
from tether.destination.watcher.endpoints import EndpointsWatcher
from tether.destination.watcher.opaque_ports import OpaquePortsWatcher
from tether.destination.watcher.profiles import ProfileWatcher
from tether.destination.watcher.workloads import WorkloadWatcher
from tether.platform.watch import ResourceWatcher

log = logging.getLogger(__name__)

# Let other tasks (streams) run between this many events of a large batch.
_EVENTS_PER_YIELD = 64
# gRPC core queues incoming calls the (single-threaded) asyncio server has not picked up yet, and by
# default stalls calls beyond 1,000 (soft) / 3,000 (hard) pending: every proxy reconnecting at once
# after a restart would wait.  Found by bench/destination.py --large (5,000 streams opened together).
_SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.server.max_pending_requests", 1 << 20),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
]


def _release_listing_memory() -> None:
    """Give back to the OS what the initial listing used (the whole store, decoded), once the index holds facts."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the memory is reused, just not returned


class ConfigError(Exception):
    """The configuration cannot be served (unreadable TLS files, unparsable address)."""


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` of a listen address (``[::]:8086`` for IPv6)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{addr!r} is not a host:port listen address")
    return host.strip("[]") or "0.0.0.0", int(port)


class _ServingCertificate:
    """The gRPC port's certificate, read from files and read again (at the next handshake) when they change."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._stamp = self._mtimes()
        self._config = self._load()

    def _mtimes(self) -> tuple[float, ...]:
        paths = [self._files.cert, self._files.key, *([self._files.client_ca] if self._files.client_ca else [])]
        try:
            return tuple(os.stat(p).st_mtime_ns for p in paths)
        except OSError as exc:
            raise ConfigError(f"cannot read TLS file: {exc}") from None

    def _load(self) -> grpc.ServerCertificateConfiguration:
        try:
            cert, key = Path(self._files.cert).read_bytes(), Path(self._files.key).read_bytes()
            roots = Path(self._files.client_ca).read_bytes() if self._files.client_ca else None
        except OSError as exc:
            raise ConfigError(f"cannot read TLS file: {exc}") from None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=roots)

    def credentials(self) -> grpc.ServerCredentials:
        # With trust anchors given, clients must present a certificate they issued.
        return grpc.dynamic_ssl_server_credentials(
            self._config, self._fetch, require_client_authentication=self._files.client_ca is not None
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC (its own thread) before each handshake; None keeps the current certificate.
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                return None
            config = self._load()
        except ConfigError as exc:
            log.warning("keeping the current TLS certificate: %s", exc)
            return None
        self._stamp = stamp
        log.info("serving a new TLS certificate from %s", self._files.cert)
        return config


class DestinationService:
    def __init__(self, config: DestinationConfig, watcher: ResourceWatcher) -> None:
        self.config = config
        self._watcher = watcher
        self.metrics = DestinationMetrics()
        self.index = ClusterIndex(config.default_opaque_ports)
        self.metrics.watch_index(self.index.sizes)
        self.endpoints = EndpointsWatcher(self.index, self.metrics)
        self.profiles = ProfileWatcher(self.index, self.metrics)
        self.opaque_ports = OpaquePortsWatcher(self.index, self.metrics)
        self.workloads = WorkloadWatcher(self.index, self.metrics)
        self.server = DestinationServer(
            config, self.index, self.endpoints, self.profiles, self.opaque_ports, self.workloads, self.metrics
        )
        self._admin = AdminServer.for_registry(
            self.metrics.registry, ready=lambda: self._serving, not_ready="the index has not synced"
        )
        self._grpc: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._synced = asyncio.Event()
        self._serving = False
        self.port: int | None = None
        self.admin_port: int | None = None

    @property
    def ready(self) -> bool:
        return self._serving

    async def start(self) -> None:
        """Open the admin port, sync the index, then serve gRPC; on any failure undo what was started."""
        grpc_host, grpc_port = split_addr(self.config.addr)
        admin_host, admin_port = split_addr(self.config.admin_addr)
        certificate = _ServingCertificate(self.config.tls) if self.config.tls is not None else None
        try:
            self.admin_port = await self._admin.start(admin_host, admin_port)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.config.admin_addr}: {exc.strerror}") from None
        try:
            await self._sync()
            _release_listing_memory()
            server = grpc.aio.server(options=_SERVER_OPTIONS)
            server.add_generic_rpc_handlers((self.server.handler(),))
            self._grpc = server
            bind = f"[{grpc_host}]:{grpc_port}" if ":" in grpc_host else f"{grpc_host}:{grpc_port}"
            try:
                if certificate is None:
                    self.port = server.add_insecure_port(bind)
                else:
                    self.port = server.add_secure_port(bind, certificate.credentials())
            except RuntimeError:
                self.port = 0
            if not self.port:
                raise ConfigError(f"cannot listen on {self.config.addr}")
            await server.start()
        except BaseException:
            await self.stop()
            raise
        self._serving = True
        log.info("destination serving gRPC on port %s, admin on port %s", self.port, self.admin_port)

    async def _sync(self) -> None:
        """Start one watch per resource type and wait until every one has listed (SYNCED)."""
        self._tasks = [asyncio.create_task(self._watch(type_key), name=f"watch {type_key}") for type_key in WATCHED]
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
        self._serving = False
        self.server.shutdown()
        if self._grpc is not None:
            await self._grpc.stop(self.config.shutdown_grace)
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
                self.index.apply(type_key, event)
            except Exception:
                log.exception("failed to apply a %s %s event to the index", event.type, type_key)
            if event.type == "SYNCED" and self.index.synced:
                self._synced.set()
            count += 1
            if count % _EVENTS_PER_YIELD == 0:
                await asyncio.sleep(0)
