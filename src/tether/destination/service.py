"""The destination process, assembled: platform watches -> cluster index -> watchers -> gRPC + admin.

``tether.cli.destination`` builds a ``DestinationConfig`` and the platform's
``ResourceWatcher`` and calls ``DestinationService.run``; tests and benchmarks
use ``start``/``stop`` directly.  The lifecycle (admin port first, index
synced, then gRPC with TLS re-read when the files change; ``stop`` ends every
stream cleanly) is ``tether.serving.process``, shared with the policy
controller.
"""

from __future__ import annotations

from tether.destination.config import DestinationConfig
from tether.destination.metrics import DestinationMetrics
from tether.destination.server import DestinationServer
from tether.destination.watcher.cluster import WATCHED, WATCHED_WITH_NODES, ClusterIndex
from tether.destination.watcher.endpoints import EndpointsWatcher
from tether.destination.watcher.opaque_ports import OpaquePortsWatcher
from tether.destination.watcher.profiles import ProfileWatcher
from tether.destination.watcher.workloads import WorkloadWatcher
from tether.platform.watch import ResourceWatcher
from tether.serving.grpc_server import ConfigError, split_addr
from tether.serving.process import ControlPlaneProcess, Listen, ProcessFacade

__all__ = ["ConfigError", "DestinationService", "split_addr"]


class DestinationService(ProcessFacade):
    def __init__(self, config: DestinationConfig, watcher: ResourceWatcher) -> None:
        self.config = config
        self.metrics = DestinationMetrics()
        # Only a platform with Nodes (Kubernetes' watcher says so) knows the subscribers' zones; the local one has none.
        has_nodes = getattr(watcher, "has_nodes", False) is True
        self.index = ClusterIndex(config.default_opaque_ports, WATCHED_WITH_NODES if has_nodes else WATCHED)
        self.metrics.watch_index(self.index.sizes)
        self.endpoints = EndpointsWatcher(self.index, self.metrics, enable_ipv6=config.enable_ipv6)
        self.profiles = ProfileWatcher(self.index, self.metrics)
        self.opaque_ports = OpaquePortsWatcher(self.index, self.metrics)
        self.workloads = WorkloadWatcher(self.index, self.metrics)
        self.server = DestinationServer(
            config, self.index, self.endpoints, self.profiles, self.opaque_ports, self.workloads, self.metrics
        )
        self._process = ControlPlaneProcess(
            "destination",
            Listen(config.addr, config.admin_addr, config.tls, config.shutdown_grace),
            self.metrics.registry,
            watcher,
            tuple(self.index.watched),
            apply=self.index.apply,
            synced=lambda: self.index.synced,
            handlers=lambda: [self.server.handler()],
            streams=[self.server.streams],
        )
