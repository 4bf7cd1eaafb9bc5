"""Per-RPC ``grpc_server_*`` metrics, as the go-grpc-prometheus / Linkerd controllers name them.

``started`` when a call arrives, ``msg_sent`` per message written, ``handled``
with the status code when it ends.  Labels: ``grpc_service``, ``grpc_method``,
``grpc_type`` and, on handled, ``grpc_code``.
"""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter


class GrpcServerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["grpc_service", "grpc_method", "grpc_type"]
        self.started = Counter("grpc_server_started", "RPCs started on the server", labels, registry=registry)
        self.msg_sent = Counter("grpc_server_msg_sent", "Stream messages sent by the server", labels,
                                registry=registry)
        self.handled = Counter("grpc_server_handled", "RPCs completed on the server, by status code",
                               [*labels, "grpc_code"], registry=registry)

    def call(self, service: str, method: str, kind: str) -> RpcObserver:
        return RpcObserver(self, service, method, kind)


class RpcObserver:
    """One method's series, bound once: ``start``, ``sent`` and ``end(code)``."""

    __slots__ = ("_metrics", "_labels", "_sent")

    def __init__(self, metrics: GrpcServerMetrics, service: str, method: str, kind: str) -> None:
        self._metrics = metrics
        self._labels = (service, method, kind)
        self._sent = metrics.msg_sent.labels(*self._labels)

    def start(self) -> None:
        self._metrics.started.labels(*self._labels).inc()

    def sent(self, _delay: float | None = None) -> None:
        self._sent.inc()

    def end(self, code: grpc.StatusCode) -> None:
        self._metrics.handled.labels(*self._labels, code.name).inc()
