"""The cluster index: facts of every watched object, the lookups the watchers need, and change fan-out.

``tether.destination.service`` feeds it one ``ResourceEvent`` at a time from
the platform's watches (``apply``); after updating its dictionaries it hands a
``Change`` to each observer (the endpoints, profile, opaque-ports and workload
watchers), which decide what their subscribers must hear.  Lookups are
indexed: pods by IP, Services by cluster IP, EndpointSlices by the Service
they are labelled for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from tether.destination.watcher.facts import (
    ExternalWorkloadFacts,
    NamespaceFacts,
    NodeFacts,
    OwnerFacts,
    PodFacts,
    ProfileFacts,
    ServerFacts,
    ServiceFacts,
    SliceFacts,
    facts_of,
    owner_label,
)
from tether.platform.watch import ResourceEvent
from tether.ports import PortSet, parse_port_set
from tether.resources import kinds

ChangeKind = Literal["pod", "service", "server", "profile", "namespace", "slice", "external_workload", "node",
                     "owner"]

# The resource types the destination watches, by ``ResourceType.key``, and what each is called in a Change.
WATCHED: dict[str, ChangeKind] = {
    kinds.NAMESPACE.key: "namespace",
    kinds.SERVICE.key: "service",
    kinds.POD.key: "pod",
    kinds.SERVER.key: "server",
    kinds.SERVICE_PROFILE.key: "profile",
    kinds.ENDPOINT_SLICE.key: "slice",
    kinds.EXTERNAL_WORKLOAD.key: "external_workload",
}

# On a platform with Nodes (Kubernetes) the destination also watches them, for the zone of a subscriber's node,
# and the Jobs and ReplicaSets that own pods, for the owner in their labels (all three as metadata only, as Linkerd).
WATCHED_WITH_NODES: dict[str, ChangeKind] = {**WATCHED, "Node": "node", "ReplicaSet.apps": "owner",
                                             "Job.batch": "owner"}

Key = tuple[str, str]  # (namespace, name); namespace "" for Namespaces and Nodes


@dataclass(frozen=True, slots=True)
class Change:
    """One object changed: its facts before and after (None when absent), and when the platform saw it."""

    kind: ChangeKind
    key: Key
    old: object | None
    new: object | None
    at: float

    @property
    def namespace(self) -> str:
        return self.key[1] if self.kind == "namespace" else self.key[0]  # "" for a Node


Observer = Callable[[Change], None]


@functools.lru_cache(maxsize=4096)
def _named_port_set(text: str, names: tuple[tuple[str, tuple[int, ...]], ...]) -> PortSet:
    return parse_port_set(text, dict(names))[0]


class ClusterIndex:
    """What the destination knows of the cluster; ``default_opaque_ports`` applies where nothing says otherwise.

    ``watched`` is what the platform is asked to watch: ``WATCHED_WITH_NODES`` where it has
    Nodes (``has_nodes``: subscribers are then filtered by topology), else ``WATCHED``.
    """

    def __init__(self, default_opaque_ports: PortSet, watched: Mapping[str, ChangeKind] = WATCHED) -> None:
        self.default_opaque_ports = default_opaque_ports
        self.watched = dict(watched)
        self.has_nodes = "node" in self.watched.values()
        self.nodes: dict[str, NodeFacts] = {}
        self.has_owners = "owner" in self.watched.values()
        # Pods share their node's network (hostNetwork, hostPort) only where there are Nodes: the local platform
        # runs every pod in its own network namespace, at its own IP, whatever its spec says.
        self.host_network = self.has_nodes
        self.owners: dict[tuple[str, str, str], OwnerFacts] = {}  # by (kind, namespace, name)
        self.pods: dict[Key, PodFacts] = {}
        self.services: dict[Key, ServiceFacts] = {}
        self.profiles: dict[Key, ProfileFacts] = {}
        self.namespaces: dict[str, NamespaceFacts] = {}
        self.slices: dict[Key, SliceFacts] = {}
        self.external_workloads: dict[Key, ExternalWorkloadFacts] = {}
        self._slices_by_service: dict[Key, set[str]] = {}
        self._workloads_by_ip: dict[str, set[Key]] = {}
        self._servers: dict[str, dict[str, ServerFacts]] = {}
        self._pods_by_ip: dict[str, set[Key]] = {}
        self._pods_by_host_port: dict[tuple[str, int], set[Key]] = {}  # (host IP, host port)
        self._services_by_ip: dict[str, set[Key]] = {}
        self._observers: list[Observer] = []
        self._synced: set[str] = set()

    # -- feeding -------------------------------------------------------------

    def observe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def apply(self, type_key: str, event: ResourceEvent) -> None:
        """Apply one platform event for resource type ``type_key`` and tell the observers."""
        if event.type == "SYNCED":
            self._synced.add(type_key)
            return
        kind = self.watched[type_key]
        key = event.key
        new = None if event.type == "DELETED" or event.object is None else facts_of(event.object)
        old = self._store_owner(type_key, key, new) if kind == "owner" else self._store(kind, key, new)
        if old is None and new is None:
            return
        change = Change(kind, key, old, new, event.received_at)
        for observer in self._observers:
            observer(change)

    def is_synced(self, type_key: str) -> bool:
        return type_key in self._synced

    @property
    def synced(self) -> bool:
        return all(key in self._synced for key in self.watched)

    def _store(self, kind: ChangeKind, key: Key, new: object | None) -> object | None:
        """Replace the facts at ``key`` and keep the secondary indexes in step; return the old facts."""
        namespace, name = key
        if kind == "pod":
            old_pod = self.pods.pop(key, None)
            if old_pod is not None:
                self._unindex_pod(old_pod)
            if isinstance(new, PodFacts):
                self.pods[key] = new
                self._index_pod(new)
            return old_pod
        if kind == "service":
            old_service = self.services.pop(key, None)
            if old_service is not None:
                for ip in old_service.cluster_ips:
                    discard_member(self._services_by_ip, ip, key)
            if isinstance(new, ServiceFacts):
                self.services[key] = new
                for ip in new.cluster_ips:
                    self._services_by_ip.setdefault(ip, set()).add(key)
            return old_service
        if kind == "server":
            servers = self._servers.setdefault(namespace, {})
            old_server = servers.pop(name, None)
            if isinstance(new, ServerFacts):
                servers[name] = new
            elif not servers:
                del self._servers[namespace]
            return old_server
        if kind == "profile":
            old_profile = self.profiles.pop(key, None)
            if isinstance(new, ProfileFacts):
                self.profiles[key] = new
            return old_profile
        if kind == "slice":
            old_slice = self.slices.pop(key, None)
            if old_slice is not None and old_slice.service is not None:
                discard_member(self._slices_by_service, (namespace, old_slice.service), name)
            if isinstance(new, SliceFacts):
                self.slices[key] = new
                if new.service is not None:
                    self._slices_by_service.setdefault((namespace, new.service), set()).add(name)
            return old_slice
        if kind == "external_workload":
            old_workload = self.external_workloads.pop(key, None)
            for ip in old_workload.ips if old_workload is not None else ():
                discard_member(self._workloads_by_ip, ip, key)
            if isinstance(new, ExternalWorkloadFacts):
                self.external_workloads[key] = new
                for ip in new.ips:
                    self._workloads_by_ip.setdefault(ip, set()).add(key)
            return old_workload
        if kind == "node":
            old_node = self.nodes.pop(name, None)
            if isinstance(new, NodeFacts):
                self.nodes[name] = new
            return old_node
        old_namespace = self.namespaces.pop(name, None)
        if isinstance(new, NamespaceFacts):
            self.namespaces[name] = new
        return old_namespace

    def _store_owner(self, type_key: str, key: Key, new: object | None) -> object | None:
        owner_key = (type_key.partition(".")[0], *key)  # a Job and a ReplicaSet may share a name
        old = self.owners.pop(owner_key, None)
        if isinstance(new, OwnerFacts):
            self.owners[owner_key] = new
        return old

    def _index_pod(self, pod: PodFacts) -> None:
        # Every IP of a pod-network pod (both families on a dual-stack cluster), as Linkerd's pod IP index does;
        # and, as its host IP index does, every hostIP:hostPort of a pod (a hostNetwork pod's IPs are its node's).
        key = (pod.namespace, pod.name)
        for ip in pod.ips if not (pod.host_network and self.host_network) else ():
            self._pods_by_ip.setdefault(ip, set()).add(key)
        for address in self._host_addresses(pod):
            self._pods_by_host_port.setdefault(address, set()).add(key)

    def _unindex_pod(self, pod: PodFacts) -> None:
        key = (pod.namespace, pod.name)
        for ip in pod.ips if not (pod.host_network and self.host_network) else ():
            discard_member(self._pods_by_ip, ip, key)
        for address in self._host_addresses(pod):
            discard_member(self._pods_by_host_port, address, key)

    def _host_addresses(self, pod: PodFacts) -> list[tuple[str, int]]:
        if not self.host_network:
            return []
        return [(ip, port) for ip in pod.host_ips for port in pod.host_ports]

    # -- lookups -------------------------------------------------------------

    def slices_of(self, namespace: str, service: str) -> list[SliceFacts]:
        """The EndpointSlices labelled for ``service``, by name."""
        names = sorted(self._slices_by_service.get((namespace, service), ()))
        return [self.slices[(namespace, n)] for n in names if (namespace, n) in self.slices]

    def address_of_hostname(self, namespace: str, service: str, hostname: str) -> str | None:
        """The address of the Service's endpoint called ``hostname`` (a StatefulSet pod's), if a slice lists one.

        A pod's is its primary IP (``status.podIP``), whichever family's slice names it, as Linkerd answers.
        """
        for slice_ in self.slices_of(namespace, service):
            for endpoint in slice_.endpoints:
                if endpoint.hostname == hostname and slice_.address_type != "FQDN":
                    ref = endpoint.target_ref
                    pod = self.pods.get((ref.namespace or namespace, ref.name)) if ref and ref.kind == "Pod" else None
                    return pod.ip if pod is not None and pod.ip is not None else endpoint.addresses[0]
        return None

    def running_pods_at(self, ip: str) -> list[PodFacts]:
        """Running (pod-network) pods with this IP, by name; more than one means a conflict."""
        pods = [self.pods[key] for key in self._pods_by_ip.get(ip, ()) if key in self.pods]
        return sorted((p for p in pods if p.is_running), key=lambda p: (p.namespace, p.name))

    def running_pods_at_host_port(self, ip: str, port: int) -> list[PodFacts]:
        """Running pods reached at ``ip:port`` through their node (hostNetwork, or a hostPort), by name; more than
        one means a conflict.  None on a platform without host networking (``host_network``)."""
        pods = [self.pods[key] for key in self._pods_by_host_port.get((ip, port), ()) if key in self.pods]
        return sorted((p for p in pods if p.is_running), key=lambda p: (p.namespace, p.name))

    def external_workloads_at(self, ip: str, port: int) -> list[ExternalWorkloadFacts]:
        """ExternalWorkloads with this workload IP that declare ``port``; more than one means a conflict."""
        workloads = (self.external_workloads[k] for k in self._workloads_by_ip.get(ip, ()) if k in self.external_workloads)
        return sorted((w for w in workloads if port in w.port_numbers), key=lambda w: (w.namespace, w.name))

    def services_at(self, ip: str) -> list[ServiceFacts]:
        """Services with this cluster IP; more than one means a conflict."""
        return sorted((self.services[k] for k in self._services_by_ip.get(ip, ()) if k in self.services),
                      key=lambda s: (s.namespace, s.name))

    def owner_of(self, pod: PodFacts) -> tuple[str, str]:
        """The pod's owner as its metric label key and name.

        Where Jobs and ReplicaSets are watched (Kubernetes), Linkerd's reading: a pod
        with one owner reference is labelled by that owner, or, for a Job or
        ReplicaSet, by the owner that stands for it (``OwnerFacts.stands_for_it``:
        ``cronjob``, ``deployment``...); a pod with none or several by itself.
        Elsewhere, the pod's own reading (``PodFacts.owner_kind``).  Read when an
        endpoint is built, as Linkerd does: an owner object changing later changes
        no endpoint already sent.
        """
        if not self.has_owners:
            return pod.owner_kind, pod.owner_name
        if len(pod.owner_refs) != 1:
            return "pod", pod.name
        kind, name = pod.owner_refs[0]
        owner = self.owners.get((kind, pod.namespace, name))  # only Jobs and ReplicaSets are kept
        parent = owner.stands_for_it() if owner is not None else None
        if parent is not None:
            kind, name = parent
        return owner_label(kind), name

    def node_zone(self, node_name: str) -> str:
        """The zone of a Node ("" when unknown: no such Node, or no zone label)."""
        node = self.nodes.get(node_name)
        return node.zone if node is not None else ""

    def servers_in(self, namespace: str) -> Iterable[ServerFacts]:
        return self._servers.get(namespace, {}).values()

    def pod_opaque_ports(self, pod: PodFacts) -> PortSet:
        """The pod's opaque ports: its annotation, else its namespace's, else the defaults."""
        if pod.opaque_ports is not None:
            return pod.opaque_ports
        namespace = self.namespaces.get(pod.namespace)
        if namespace is not None and namespace.opaque_ports_annotation is not None:
            names = tuple(sorted(pod.container_ports.items()))
            return _named_port_set(namespace.opaque_ports_annotation, names)
        return self.default_opaque_ports

    def service_opaque_ports(self, namespace: str, name: str) -> PortSet:
        """A Service's opaque ports: its annotation, else its namespace's, else the defaults (also when absent)."""
        service = self.services.get((namespace, name))
        if service is None:
            return self.default_opaque_ports
        if service.opaque_ports is not None:
            return service.opaque_ports
        ns = self.namespaces.get(namespace)
        if ns is not None and ns.opaque_ports_annotation is not None:
            names = tuple((p.name, (p.port,)) for p in service.ports if p.name)
            return _named_port_set(ns.opaque_ports_annotation, names)
        return self.default_opaque_ports

    def is_opaque(self, pod: PodFacts, port: int) -> bool:
        """Whether traffic to ``port`` of ``pod`` is opaque: by annotation (or default), or by a Server."""
        if port in self.pod_opaque_ports(pod):
            return True
        return any(server.marks_opaque(pod, port) for server in self.servers_in(pod.namespace))

    def sizes(self) -> dict[str, int]:
        """How many objects of each watched kind the index holds (for the cache-size metrics)."""
        return {
            "pod": len(self.pods),
            "service": len(self.services),
            "serviceprofile": len(self.profiles),
            "server": sum(len(s) for s in self._servers.values()),
            "namespace": len(self.namespaces),
            "endpointslice": len(self.slices),
            "externalworkload": len(self.external_workloads),
        } | ({"node": len(self.nodes)} if self.has_nodes else {})


def discard_member(index: dict, key: object, member: object) -> None:
    """Take ``member`` out of the set at ``index[key]``, and the key out when its set is empty."""
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]
