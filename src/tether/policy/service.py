"""The policy controller process, assembled: platform watches -> inbound index -> gRPC + admin.

``tether.cli.policy`` builds a ``PolicyConfig`` and the platform's
``ResourceWatcher`` and calls ``PolicyService.run``; tests and benchmarks use
``start``/``stop``.  The lifecycle (admin port first, the index synced, then
gRPC with TLS; ``stop`` ends every stream with OK) is
``tether.serving.process``, the same as destination's.
"""

from __future__ import annotations

from tether.platform.watch import ResourceWatcher
from tether.policy.config import PolicyConfig
from tether.policy.inbound.index import WATCHED, InboundIndex
from tether.policy.inbound.server import InboundPolicyServer
from tether.policy.metrics import PolicyMetrics
from tether.serving.process import ControlPlaneProcess, Listen, ProcessFacade
from tether.serving.rpc import StreamSet


class PolicyService(ProcessFacade):
    def __init__(self, config: PolicyConfig, watcher: ResourceWatcher) -> None:
        self.config = config
        self.metrics = PolicyMetrics()
        self.index = InboundIndex(config)
        self.streams = StreamSet(config.stream_queue_capacity, config.stream_queue_bytes)
        self.inbound = InboundPolicyServer(config, self.index, self.metrics, self.streams)
        self.metrics.watch_index(self.index.sizes, lambda: self.index.watched_ports, lambda: self.index.updates,
                                 lambda: [(p.kind, p.reason) for p in self.index.problems()])
        self._process = ControlPlaneProcess(
            "policy",
            Listen(config.addr, config.admin_addr, config.tls, config.shutdown_grace),
            self.metrics.registry,
            watcher,
            WATCHED,
            apply=self.index.apply,
            synced=lambda: self.index.synced,
            handlers=lambda: [self.inbound.handler()],
            streams=[self.streams],
        )
