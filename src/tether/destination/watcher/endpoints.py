"""Endpoints of services: one publisher per subscribed Service, one per requested port and hostname.

``EndpointsWatcher.subscribe`` is what ``Get`` calls.  The address set of a
port is read from the Service's EndpointSlices (labelled
``kubernetes.io/service-name``), on both platforms: Kubernetes' EndpointSlice
controller writes them on a cluster, the local platform's controller
(``tether.platform.local.endpointslices``) and the ExternalWorkload controller
write them locally, and a selectorless Service takes hand-written ones.  As
Linkerd reads them: an endpoint is used unless its ``ready`` condition is
false (terminating endpoints are not ready); the requested port is matched to
the Service port of that number and the slice port of the same name gives the
target port, and a port the Service does not define is used as is; the
endpoint's ``targetRef`` names the Pod or ExternalWorkload behind it (identity,
protocol hints), and an endpoint without one is a bare address.  A
subscription for ``<hostname>.<svc>...`` (a StatefulSet pod) sees only the
endpoints with that hostname.  Of a pod listed in an IPv4 and an IPv6 slice
(dual stack) only the IPv6 endpoint is sent, and with IPv6 disabled
(``--disable-ipv6``) no pod's IPv6 endpoint is (``topology.select_family``).
FQDN slices are not used, and entries a slice could not give (bad addresses or
ports) are reported once per slice version (a warning and
``endpointslice_invalid_entries_total``) and skipped.

New listeners get the snapshot, then diffs: ``add`` for new or changed
addresses, ``remove`` for gone ones; a deleted Service is one ``remove`` with
``service_exists`` False, and its re-creation a fresh snapshot.

Changes are coalesced per event-loop turn: events only update a publisher's
current addresses and mark it dirty; one scheduled ``flush`` then sends each
listener the difference from what it was last told.  A burst (a store batch,
a rollout) thus costs a stream one ``add`` and one ``remove``, not one message
per event, and a single change still goes out on the very next loop turn.

On a platform with Nodes, each subscriber sees the endpoints meant for its
node (``tether.destination.watcher.topology``: ``internalTrafficPolicy: Local``
and zone hints), filtered again when the Service or that Node changes.

Publishers exist only while someone listens.  Everything runs on the event
loop thread; the listeners only enqueue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tether.destination.metrics import DestinationMetrics, EndpointGauges
from tether.destination.watcher.cluster import Change, ClusterIndex, Key, discard_member
from tether.destination.watcher.errors import InvalidService, ServiceNotFound
from tether.destination.watcher.facts import NodeFacts, ServiceFacts, SliceFacts
from tether.destination.watcher.listeners import Address, AddressSet, EndpointListener
from tether.destination.watcher.topology import TopologyFilter, select_family

log = logging.getLogger(__name__)


class PortPublisher:
    """The endpoints of one Service port (and hostname, when asked for one), and the listeners that want them.

    ``addresses`` follows the index as events arrive; ``published`` is what
    the listeners have been told.  Changes only mark the publisher dirty; the
    watcher's ``flush`` (once per event-loop turn) sends the difference.
    """

    def __init__(self, service: "ServicePublisher", port: int, hostname: str | None = None) -> None:
        self._service = service
        self.port = port
        self.hostname = hostname
        self.listeners: list[EndpointListener] = []
        self._labels = {"namespace": service.key[0], "service": service.key[1]}
        # Its streams' series; on a platform with Nodes each node's TopologyFilter keeps its own instead.
        self._gauges = None if service.index.has_nodes else EndpointGauges(
            service.metrics, service.key[0], service.key[1], port, hostname, "")
        self.missing: set[Key] = set()  # pods and external workloads its endpoints name that the index lacks
        self.addresses: dict[str, Address] = self._compute()  # by backing object and ip:port
        self.published: dict[str, Address] = dict(self.addresses)
        self._snapshot: AddressSet | None = None
        self._dirty_since: float | None = None  # when the oldest unpublished change was seen
        self.update_gauges()

    # -- computing -------------------------------------------------------------

    def _target_port(self, service: ServiceFacts, slice_: SliceFacts) -> int | None:
        service_port = service.port(self.port)
        if service_port is None:
            return self.port  # a port the Service does not define: used as is (Linkerd's rule)
        return slice_.port_named(service_port.name or "")

    def _compute(self) -> dict[str, Address]:
        service = self._service.service
        self.missing = set()
        if service is None:
            return {}
        index = self._service.index
        addresses: dict[str, Address] = {}
        for slice_ in index.slices_of(service.namespace, service.name):
            if slice_.address_type == "FQDN":
                continue
            port = self._target_port(service, slice_)
            if port is None:
                continue  # the slice does not carry the Service port's target: no endpoints here
            for endpoint in slice_.endpoints:
                if not endpoint.is_ready or (self.hostname is not None and endpoint.hostname != self.hostname):
                    continue
                ip = endpoint.addresses[0]
                ref = endpoint.target_ref
                pod = external = None
                if ref is not None and ref.kind in ("Pod", "ExternalWorkload"):
                    key = (ref.namespace or service.namespace, ref.name)
                    if ref.kind == "Pod":
                        pod = index.pods.get(key)
                    else:
                        external = index.external_workloads.get(key)
                    if pod is None and external is None:
                        # Not seen yet (its event may follow the slice's): left out until it is, as Linkerd
                        # skips an endpoint whose pod it cannot read, never sent without its identity.
                        self.missing.add(key)
                        continue
                opaque = index.is_opaque(pod, port) if pod is not None else port in index.service_opaque_ports(
                    service.namespace, service.name)
                # A pod may sit in two slices for a moment (its ports changed): one address per slice entry.
                name = f"{ip}:{port}" if ref is None else f"{ref.kind}/{ref.name}/{ip}:{port}"
                addresses[name] = Address(ip, port, pod, opaque, endpoint.zone or "", external, endpoint.hostname,
                                          endpoint.for_zones, index.owner_of(pod) if pod is not None else None)
        if index.has_nodes:
            return addresses  # each node's TopologyFilter chooses the family after filtering, as Linkerd does
        kept = {id(a) for a in select_family(addresses.values(), enable_ipv6=self._service.enable_ipv6)}
        return {name: a for name, a in addresses.items() if id(a) in kept}

    # -- subscribing -----------------------------------------------------------

    def snapshot(self) -> AddressSet:
        """Every published address, as one set (shared by every subscriber until the next flush)."""
        if self._snapshot is None:
            self._snapshot = AddressSet(tuple(self.published.values()), self._labels, None)
        return self._snapshot

    def subscribe(self, listener: EndpointListener) -> None:
        self.listeners.append(listener)
        self.update_gauges()
        listener.add(self.snapshot())

    def unsubscribe(self, listener: EndpointListener) -> None:
        try:
            self.listeners.remove(listener)
        except ValueError:
            return
        self.update_gauges()

    # -- changes -----------------------------------------------------------------

    def _mark(self, at: float) -> None:
        if self._dirty_since is None:
            self._dirty_since = at
            self._service.mark_dirty(self)

    def refresh(self, at: float) -> None:
        """Recompute every address (Service, Server or namespace changed)."""
        self.addresses = self._compute()
        self._mark(at)

    def service_gone(self, at: float) -> None:
        """Tell everyone at once (no coalescing): the Service itself is gone."""
        gone = tuple(self.published.values())
        self.addresses, self.published, self._snapshot, self._dirty_since = {}, {}, None, None
        self.update_gauges()
        removed = AddressSet(gone, self._labels, at, service_exists=False)
        for listener in tuple(self.listeners):
            listener.remove(removed)

    def service_back(self, at: float) -> None:
        """The Service exists again: everyone gets a fresh snapshot (maybe empty)."""
        self.addresses = self._compute()
        self.published, self._snapshot, self._dirty_since = dict(self.addresses), None, None
        self.update_gauges()
        snapshot = self.snapshot()
        for listener in tuple(self.listeners):
            listener.add(snapshot)

    def flush(self) -> None:
        """Publish the difference between what listeners were told and the current addresses."""
        at, self._dirty_since = self._dirty_since, None
        if at is None:
            return
        before, current = self.published, self.addresses
        added = [a for name, a in current.items()
                 if (b := before.get(name)) is None or a.key != b.key or a.changed_from(b)]
        still = {a.key for a in current.values()}
        # An address another pod still serves (host-network pods share IPs) is not removed.
        removed = [b for name, b in before.items()
                   if ((a := current.get(name)) is None or a.key != b.key) and b.key not in still]
        self.published = dict(current)
        if not added and not removed:
            return
        self._snapshot = None
        if self._gauges is not None:
            self._gauges.updated()
        self.update_gauges()
        listeners = tuple(self.listeners)
        if added:
            added_set = AddressSet(tuple(added), self._labels, at)
            for listener in listeners:
                listener.add(added_set)
        if removed:
            removed_set = AddressSet(tuple(removed), self._labels, at)
            for listener in listeners:
                listener.remove(removed_set)

    def update_gauges(self) -> None:
        if self._gauges is not None:
            self._gauges.set(subscribers=len(self.listeners), pods=len(self.published),
                             exists=self._service.service is not None)

    def forget_metrics(self) -> None:
        if self._gauges is not None:
            self._gauges.forget()


class ServicePublisher:
    """One subscribed Service: its facts and a ``PortPublisher`` per requested (port, hostname)."""

    def __init__(
        self, key: Key, service: ServiceFacts, index: ClusterIndex, metrics: DestinationMetrics,
        mark_dirty: Callable[[PortPublisher], None], discard_dirty: Callable[[PortPublisher], None], *,
        enable_ipv6: bool,
    ) -> None:
        self.key = key
        self.enable_ipv6 = enable_ipv6
        self.service: ServiceFacts | None = service
        self.index = index
        self.metrics = metrics
        self.mark_dirty = mark_dirty  # the watcher flushes a dirty port publisher on the next loop turn
        self.discard_dirty = discard_dirty
        self.ports: dict[tuple[int, str | None], PortPublisher] = {}

    def subscribe(self, port: int, hostname: str | None, listener: EndpointListener) -> None:
        publisher = self.ports.get((port, hostname))
        if publisher is None:
            publisher = self.ports[(port, hostname)] = PortPublisher(self, port, hostname)
        publisher.subscribe(listener)

    def unsubscribe(self, port: int, hostname: str | None, listener: EndpointListener) -> bool:
        """Remove a listener; True when nobody listens to this Service any more."""
        publisher = self.ports.get((port, hostname))
        if publisher is not None:
            publisher.unsubscribe(listener)
            if not publisher.listeners:
                publisher.forget_metrics()
                del self.ports[(port, hostname)]
                self.discard_dirty(publisher)
        return not self.ports

    def service_changed(self, service: ServiceFacts | None, at: float) -> None:
        existed = self.service is not None
        self.service = service
        for publisher in self.ports.values():
            if service is None:
                if existed:
                    publisher.service_gone(at)
            elif not existed:
                publisher.service_back(at)
            else:
                publisher.refresh(at)

    def object_changed(self, key: Key, at: float) -> None:
        """A pod or external workload appeared: recompute the ports whose endpoints wait for it.

        Other changes to a pod reach its endpoints through the EndpointSlice (readiness) or a
        Server (opaque ports), as with Linkerd, where pod updates alone publish nothing.
        """
        for publisher in self.ports.values():
            if key in publisher.missing:
                publisher.refresh(at)

    def refresh(self, at: float) -> None:
        for publisher in self.ports.values():
            publisher.refresh(at)


class EndpointsWatcher:
    """Service -> (port, hostname) -> listeners, fed by the cluster index.

    ``enable_ipv6`` is Linkerd's ``-enable-ipv6``: IPv6 pod endpoints are sent, and preferred.
    """

    def __init__(self, index: ClusterIndex, metrics: DestinationMetrics, *, enable_ipv6: bool = True) -> None:
        self._index = index
        self._metrics = metrics
        self._enable_ipv6 = enable_ipv6
        self._publishers: dict[Key, ServicePublisher] = {}
        self._by_namespace: dict[str, set[Key]] = {}
        # Port publishers with unpublished changes; flushed once per event-loop turn, so a burst of
        # events (a store batch, a rollout) becomes one add and one remove per stream, not one per event.
        self._dirty: dict[PortPublisher, None] = {}
        self._flush_scheduled = False
        self._reported: dict[Key, tuple[str, ...]] = {}  # slice -> the problems already reported
        # Topology filters (platforms with Nodes): one per Service port, hostname and node; and each listener's.
        self._groups: dict[tuple[Key, int, str | None, str], TopologyFilter] = {}
        self._filters: dict[EndpointListener, TopologyFilter] = {}
        self._filters_of_service: dict[Key, set[TopologyFilter]] = {}
        self._filters_on_node: dict[str, set[TopologyFilter]] = {}
        self._warned_local: set[Key] = set()  # Services warned about settings a platform without Nodes cannot honour
        index.observe(self._on_change)

    @property
    def publishers(self) -> int:
        return len(self._publishers)

    def subscribe(
        self, namespace: str, service: str, port: int, listener: EndpointListener, hostname: str | None = None,
        node_name: str = "",
    ) -> None:
        """Subscribe ``listener`` to a Service port (only the endpoints with ``hostname``, if given).

        ``node_name`` is the subscriber's node (its context token's ``nodeName``): on a
        platform with Nodes it sees only the endpoints topology gives that node.  The
        listener gets the snapshot at once.  Raises ``ServiceNotFound`` for an
        unknown Service and ``InvalidService`` for an ExternalName one.
        """
        key = (namespace, service)
        facts = self._index.services.get(key)
        if facts is None:
            raise ServiceNotFound(f"Service {namespace}/{service} not found")
        if facts.is_external_name:
            raise InvalidService(f"Service {namespace}/{service} is an ExternalName service: no endpoints to discover")
        publisher = self._publishers.get(key)
        if publisher is None:
            publisher = self._publishers[key] = ServicePublisher(
                key, facts, self._index, self._metrics, self._mark_dirty, self._discard_dirty,
                enable_ipv6=self._enable_ipv6)
            self._by_namespace.setdefault(namespace, set()).add(key)
        if self._index.has_nodes:
            group = self._groups.get((key, port, hostname, node_name))
            if group is not None:  # streams on one node share one filter (and its sets)
                self._filters[listener] = group
                group.join(listener)
                return
            gauges = EndpointGauges(self._metrics, namespace, service, port, hostname, node_name)
            filter_ = self._filters[listener] = self._groups[(key, port, hostname, node_name)] = TopologyFilter(
                listener, self._index, key, port, hostname, node_name, gauges, enable_ipv6=self._enable_ipv6)
            self._filters_of_service.setdefault(key, set()).add(filter_)
            self._filters_on_node.setdefault(node_name, set()).add(filter_)
            listener = filter_
        else:
            self._warn_local_platform(facts)
        publisher.subscribe(port, hostname, listener)

    def _warn_local_platform(self, service: ServiceFacts) -> None:
        """Say once per Service which of its settings the local platform cannot honour."""
        key = (service.namespace, service.name)
        if key in self._warned_local:
            return
        if service.internal_traffic_policy == "Local":
            self._warned_local.add(key)
            log.warning("Service %s/%s: internalTrafficPolicy Local has no effect on a platform without Nodes", *key)
        if service.wants_ipv6 and not service.selector.selects_nothing:  # hand-written slices may carry IPv6
            self._warned_local.add(key)
            log.warning("Service %s/%s: ipFamilies/ipFamilyPolicy ask for IPv6, which the local platform does not "
                        "give pods: only their IPv4 endpoints exist", *key)

    def unsubscribe(
        self, namespace: str, service: str, port: int, listener: EndpointListener, hostname: str | None = None
    ) -> None:
        key = (namespace, service)
        publisher = self._publishers.get(key)
        filter_ = self._filters.pop(listener, None)
        if filter_ is not None:
            filter_.listeners.remove(listener)
            if filter_.listeners:  # others on its node still listen
                filter_.update_gauges()
                return
            filter_.forget_metrics()
            del self._groups[(key, port, hostname, filter_.node_name)]
            discard_member(self._filters_of_service, key, filter_)
            discard_member(self._filters_on_node, filter_.node_name, filter_)
            listener = filter_
        if publisher is not None and publisher.unsubscribe(port, hostname, listener):
            del self._publishers[key]
            members = self._by_namespace[namespace]
            members.discard(key)
            if not members:
                del self._by_namespace[namespace]

    def _mark_dirty(self, publisher: PortPublisher) -> None:
        self._dirty[publisher] = None
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _discard_dirty(self, publisher: PortPublisher) -> None:
        self._dirty.pop(publisher, None)

    def flush(self) -> None:
        """Publish every pending change (scheduled automatically; callable directly)."""
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, {}
        for publisher in dirty:
            publisher.flush()

    def _node_changed(self, change: Change) -> None:
        """A Node's zone changed (or it came or went): its subscribers' hints and zone labels follow."""
        zones = {n.zone if isinstance(n, NodeFacts) else "" for n in (change.old, change.new)}
        if len(zones) == 1:
            return
        for filter_ in tuple(self._filters_on_node.get(change.key[1], ())):
            filter_.refilter(change.at)

    def _report(self, change: Change) -> None:
        """Say once per slice version which of its entries were left out (bad addresses or ports)."""
        new = change.new
        if not isinstance(new, SliceFacts) or not new.problems:
            self._reported.pop(change.key, None)
            return
        if self._reported.get(change.key) == new.problems:
            return
        self._reported[change.key] = new.problems
        self._metrics.endpointslice_invalid_entries.labels(new.namespace).inc(len(new.problems))
        for problem in new.problems:
            log.warning("EndpointSlice %s/%s: skipping an entry: %s", new.namespace, new.name, problem)

    def _on_change(self, change: Change) -> None:
        if change.kind == "slice":
            self._report(change)
        if not self._publishers:
            return
        if change.kind == "node":
            self._node_changed(change)
        elif change.kind in ("pod", "external_workload"):
            if change.new is None:
                return
            for key in tuple(self._by_namespace.get(change.namespace, ())):
                self._publishers[key].object_changed(change.key, change.at)
        elif change.kind == "slice":
            services = {s.service for s in (change.old, change.new) if isinstance(s, SliceFacts) and s.service}
            for name in services:
                publisher = self._publishers.get((change.namespace, name))
                if publisher is not None:
                    publisher.refresh(change.at)
        elif change.kind == "service":
            publisher = self._publishers.get(change.key)
            if publisher is not None:
                assert change.new is None or isinstance(change.new, ServiceFacts)
                publisher.service_changed(change.new, change.at)
                if change.new is not None:  # its internalTrafficPolicy may have changed
                    for filter_ in tuple(self._filters_of_service.get(change.key, ())):
                        filter_.refilter(change.at)
        elif change.kind in ("server", "namespace"):
            for key in tuple(self._by_namespace.get(change.namespace, ())):
                self._publishers[key].refresh(change.at)

