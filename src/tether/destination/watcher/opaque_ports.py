"""Opaque ports per Service: its ``config.linkerd.io/opaque-ports``, else its namespace's, else the defaults;
and the ports it defines.

``GetProfile`` subscribes for the Service it resolves (existing or not: an
absent Service has the default set and defines nothing).  Listeners hear the
current ``ServicePorts`` at once and then only real changes, e.g. when the
Service's or its namespace's annotation changes, a port is added or removed,
or the Service is deleted.
"""

from __future__ import annotations

from tether.destination.metrics import DestinationMetrics
from tether.destination.watcher.cluster import Change, ClusterIndex, Key
from tether.destination.watcher.listeners import OpaquePortsListener, ServicePorts


class _Publisher:
    __slots__ = ("ports", "listeners")

    def __init__(self, ports: ServicePorts) -> None:
        self.ports = ports
        self.listeners: list[OpaquePortsListener] = []


class OpaquePortsWatcher:
    def __init__(self, index: ClusterIndex, metrics: DestinationMetrics) -> None:
        self._index = index
        self._metrics = metrics
        self._publishers: dict[Key, _Publisher] = {}
        index.observe(self._on_change)

    def subscribe(self, namespace: str, service: str, listener: OpaquePortsListener) -> None:
        key = (namespace, service)
        publisher = self._publishers.get(key)
        if publisher is None:
            publisher = self._publishers[key] = _Publisher(self._ports(key))
        publisher.listeners.append(listener)
        self._metrics.service_subscribers.labels(namespace, service).set(len(publisher.listeners))
        listener.update_ports(publisher.ports, None)

    def _ports(self, key: Key) -> ServicePorts:
        service = self._index.services.get(key)
        defined = frozenset(p.port for p in service.ports) if service is not None else None
        return ServicePorts(self._index.service_opaque_ports(*key), defined)

    def unsubscribe(self, namespace: str, service: str, listener: OpaquePortsListener) -> None:
        key = (namespace, service)
        publisher = self._publishers.get(key)
        if publisher is None or listener not in publisher.listeners:
            return
        publisher.listeners.remove(listener)
        if publisher.listeners:
            self._metrics.service_subscribers.labels(namespace, service).set(len(publisher.listeners))
        else:
            del self._publishers[key]
            self._metrics.service_subscribers.remove(namespace, service)

    def _on_change(self, change: Change) -> None:
        if change.kind == "service":
            keys = [change.key] if change.key in self._publishers else []
        elif change.kind == "namespace":
            keys = [k for k in self._publishers if k[0] == change.namespace]
        else:
            return
        for key in keys:
            publisher = self._publishers[key]
            ports = self._ports(key)
            if ports == publisher.ports:
                continue
            publisher.ports = ports
            for listener in tuple(publisher.listeners):
                listener.update_ports(ports, change.at)
