"""What runs at an IP:port, for endpoint profiles (``GetProfile`` on a pod or workload IP).

Keyed by (IP, port).  Follows whether a pod is *running* there, not whether it
is ready (Linkerd does the same so StatefulSet peers can reach each other
before they are ready): a pod-network pod with that IP; else, where pods share
their node's network (Kubernetes), a pod reached at that node IP and port (a
hostNetwork pod's container port, or a ``hostPort``); else which
ExternalWorkload has that IP and declares that port.  The published ``Address`` carries the pod or workload (neither
when nothing runs at the IP) and whether the port is opaque: by the pod's
annotation, its namespace's, the defaults, or a Server with ``proxyProtocol:
opaque``.  Listeners hear the current target at once, then each change.

An IP that a Service takes as its cluster IP after it was subscribed to (``GetProfile`` on a Service's
address asked before the destination saw the Service: each component follows the cluster on its own watch,
and a pod can resolve the Service's name a moment earlier) is no endpoint: its listeners are told
(``became_service``) so the stream ends and the proxy, asking again, gets the service's profile instead of
forwarding to the address in plaintext for as long as its traffic keeps the stream open.
"""

from __future__ import annotations

from tether.destination.metrics import DestinationMetrics
from tether.destination.watcher.cluster import Change, ClusterIndex
from tether.destination.watcher.errors import ConflictingAddress
from tether.destination.watcher.facts import ExternalWorkloadFacts, PodFacts, ServiceFacts
from tether.destination.watcher.listeners import Address, WorkloadListener

Target = tuple[str, int]


class _Publisher:
    __slots__ = ("target", "listeners")

    def __init__(self, target: Address) -> None:
        self.target = target
        self.listeners: list[WorkloadListener] = []


class WorkloadWatcher:
    def __init__(self, index: ClusterIndex, metrics: DestinationMetrics) -> None:
        self._index = index
        self._metrics = metrics
        self._publishers: dict[Target, _Publisher] = {}
        self._ports_by_ip: dict[str, set[int]] = {}
        index.observe(self._on_change)

    def _pods(self, ip: str, port: int) -> list[PodFacts]:
        """The running pods at ``ip`` on the pod network, else those at ``ip:port`` on the host network."""
        return self._index.running_pods_at(ip) or self._index.running_pods_at_host_port(ip, port)

    def _target(self, ip: str, port: int) -> Address:
        pods = self._pods(ip, port)
        if pods:
            pod = pods[0]
            return Address(ip, port, pod, self._index.is_opaque(pod, port), owner=self._index.owner_of(pod))
        opaque = port in self._index.default_opaque_ports
        workloads = self._index.external_workloads_at(ip, port)
        return Address(ip, port, None, opaque, external=workloads[0] if workloads else None)

    def subscribe(self, ip: str, port: int, listener: WorkloadListener) -> None:
        """Raises ``ConflictingAddress`` when several running pods, or ExternalWorkloads, have this IP (and port)."""
        pods = self._index.running_pods_at(ip)
        if len(pods) > 1:
            names = ", ".join(f"{p.namespace}/{p.name}" for p in pods)
            raise ConflictingAddress(f"pod IP address conflict: {ip} is used by {names}")
        pods = pods or self._index.running_pods_at_host_port(ip, port)
        if len(pods) > 1:
            names = ", ".join(f"{p.namespace}/{p.name}" for p in pods)
            raise ConflictingAddress(f"host network endpoint conflict: {ip}:{port} is used by {names}")
        workloads = [] if pods else self._index.external_workloads_at(ip, port)
        if len(workloads) > 1:
            names = ", ".join(f"{w.namespace}/{w.name}" for w in workloads)
            raise ConflictingAddress(f"external workload address conflict: {ip}:{port} is used by {names}")
        key = (ip, port)
        publisher = self._publishers.get(key)
        if publisher is None:
            publisher = self._publishers[key] = _Publisher(self._target(ip, port))
            self._ports_by_ip.setdefault(ip, set()).add(port)
        publisher.listeners.append(listener)
        self._count()
        listener.update(publisher.target, None)

    def unsubscribe(self, ip: str, port: int, listener: WorkloadListener) -> None:
        key = (ip, port)
        publisher = self._publishers.get(key)
        if publisher is None or listener not in publisher.listeners:
            return
        publisher.listeners.remove(listener)
        if not publisher.listeners:
            del self._publishers[key]
            ports = self._ports_by_ip[ip]
            ports.discard(port)
            if not ports:
                del self._ports_by_ip[ip]
        self._count()

    def _count(self) -> None:
        self._metrics.workload_subscribers.set(sum(len(p.listeners) for p in self._publishers.values()))

    def _on_change(self, change: Change) -> None:
        if not self._publishers:
            return
        if change.kind == "pod":
            pods = [p for p in (change.old, change.new) if isinstance(p, PodFacts)]
            ips = {ip for p in pods for ip in p.ips}
            keys = [(ip, port) for ip in ips for port in self._ports_by_ip.get(ip, ())]
            # Its node's addresses too, on the ports it is reached at there (hostNetwork, hostPort).
            keys += {(ip, port) for p in pods for ip in p.host_ips for port in p.host_ports
                     if ip not in ips and port in self._ports_by_ip.get(ip, ())}
        elif change.kind == "external_workload":
            ips = {ip for w in (change.old, change.new) if isinstance(w, ExternalWorkloadFacts) for ip in w.ips}
            keys = [(ip, port) for ip in ips for port in self._ports_by_ip.get(ip, ())]
        elif change.kind in ("server", "namespace"):
            keys = [k for k, p in self._publishers.items() if p.target.pod is not None
                    and p.target.pod.namespace == change.namespace]
        elif change.kind == "service" and isinstance(change.new, ServiceFacts):
            old_ips = set(change.old.cluster_ips) if isinstance(change.old, ServiceFacts) else set()
            for ip in set(change.new.cluster_ips) - old_ips:
                for port in tuple(self._ports_by_ip.get(ip, ())):
                    publisher = self._publishers.get((ip, port))
                    for listener in tuple(publisher.listeners if publisher is not None else ()):
                        listener.became_service()  # it unsubscribes as its stream ends
            return
        else:
            return
        for key in keys:
            publisher = self._publishers[key]
            target = self._target(*key)
            if not target.changed_from(publisher.target):
                continue
            publisher.target = target
            self._metrics.workload_updates.inc()
            for listener in tuple(publisher.listeners):
                listener.update(target, change.at)
