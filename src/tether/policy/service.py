"""The policy controller process, assembled: platform watches -> inbound and outbound indexes -> gRPC + admin.

``tether.cli.policy`` builds a ``PolicyConfig`` and the platform's
``ResourceWatcher`` and calls ``PolicyService.run``; tests and benchmarks use
``start``/``stop``.  The lifecycle (admin port first, the index synced, then
gRPC with TLS; ``stop`` ends every stream with OK) is
``tether.serving.process``, the same as destination's.  Both indexes are fed
from one set of watches (each type once, handed to the index or indexes that
read it) and share the streams' bounds.  With a ``status_writer`` the status
controller runs too; with a webhook certificate, the validating admission
webhook (``admission``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from tether.platform.watch import ResourceEvent, ResourceWatcher
from tether.policy.admission import PolicyAdmission
from tether.policy.config import PolicyConfig
from tether.policy.inbound.index import WATCHED, InboundIndex
from tether.policy.inbound.server import InboundPolicyServer
from tether.policy.metrics import PolicyMetrics
from tether.policy.outbound.index import WATCHED as OUTBOUND_WATCHED
from tether.policy.outbound.index import OutboundIndex
from tether.policy.outbound.server import OutboundPoliciesServicer
from tether.policy.status import StatusController, StatusWriter
from tether.serving.grpc_server import ConfigError, split_addr
from tether.serving.process import ControlPlaneProcess, Listen, ProcessFacade
from tether.serving.rpc import StreamSet
from tether.serving.webhook import WebhookConfig, WebhookServer


log = logging.getLogger(__name__)


def _call_soon(callback: Callable[[], None]) -> None:
    # The outbound index coalesces a burst of events into one update per target, once per loop turn.
    asyncio.get_running_loop().call_soon(callback)


class PolicyService(ProcessFacade):
    def __init__(self, config: PolicyConfig, watcher: ResourceWatcher, status_writer: StatusWriter | None = None,
                 *, leading: asyncio.Event | None = None) -> None:
        """``status_writer`` None: this process writes no status; ``leading``: it writes only while that is set."""
        self.config = config
        self.admission = PolicyAdmission()
        self.webhook: WebhookServer | None = None
        self.webhook_port: int | None = None
        self.metrics = PolicyMetrics()
        self.index = InboundIndex(config)
        self.streams = StreamSet(config.stream_queue_capacity, config.stream_queue_bytes)
        self.inbound = InboundPolicyServer(config, self.index, self.metrics, self.streams)
        self.metrics.watch_index(self.index.sizes, lambda: self.index.watched_ports, lambda: self.index.updates,
                                 lambda: [(p.kind, p.reason) for p in self.index.problems()])
        self.outbound_index = OutboundIndex(config, schedule=_call_soon)
        self.outbound = OutboundPoliciesServicer(self.outbound_index, self.streams, self.metrics)
        self.metrics.watch_index(
            self.outbound_index.sizes, lambda: self.outbound_index.watched_targets,
            lambda: self.outbound_index.updates, lambda: [(p.kind, p.reason) for p in self.outbound_index.problems()],
            side="outbound")
        self.status = None if status_writer is None else StatusController(
            self.index, lambda: self.outbound_index.services, lambda: self.outbound_index.egress_networks,
            status_writer, self.metrics, leading=leading, patch_timeout=config.patch_timeout)
        self._status_task: asyncio.Task[None] | None = None
        self._status_writer = status_writer
        self._process = ControlPlaneProcess(
            "policy",
            Listen(config.addr, config.admin_addr, config.tls, config.shutdown_grace),
            self.metrics.registry,
            watcher,
            tuple(dict.fromkeys((*WATCHED, *OUTBOUND_WATCHED))),
            apply=self._apply,
            synced=lambda: self.index.synced and self.outbound_index.synced,
            handlers=lambda: [self.inbound.handler(), self.outbound.handler()],
            streams=[self.streams],
        )

    async def start(self) -> None:
        await self._process.start()
        if self.status is not None:
            self.status.changed()
            self._status_task = asyncio.create_task(self.status.run(), name="status controller")
        if self.config.webhook is not None:
            settings = self.config.webhook
            host, port = split_addr(settings.addr)
            try:
                self.webhook = WebhookServer(WebhookConfig(settings.tls_cert, settings.tls_key, (host, port)),
                                             self.admission)
                self.webhook_port = await self.webhook.start()
            except (OSError, ssl.SSLError) as exc:
                self.webhook = None
                await self.stop()
                raise ConfigError(f"cannot serve the admission webhook on {settings.addr}: {exc}") from None
            log.info("policy admission webhook on port %s", self.webhook_port)

    async def stop(self) -> None:
        if self._status_task is not None:
            self._status_task.cancel()
            await asyncio.gather(self._status_task, return_exceptions=True)
            self._status_task = None
        if self._status_writer is not None:
            self._status_writer.close()
            self._status_writer = None
        if self.webhook is not None:
            await self.webhook.stop()
            self.webhook = None
        await self._process.stop()

    def _apply(self, type_key: str, event: ResourceEvent) -> None:
        if self.status is not None and event.type != "SYNCED":
            self.status.observe(type_key, event)
            self.status.changed()
        # A failure in one index must not keep the event from the other.
        for watched, index in ((WATCHED, self.index), (OUTBOUND_WATCHED, self.outbound_index)):
            if type_key in watched:
                try:
                    index.apply(type_key, event)
                except Exception:
                    log.exception("failed to apply a %s %s event to the %s", event.type, type_key,
                                  type(index).__name__)
