"""Topology-aware endpoints: what one subscriber on one node may see of a Service port.

Linkerd filters the endpoints it sends a ``Get`` subscriber by where the
subscriber runs (the ``nodeName`` of its context token), in this order
(``filtered_listener_group.go``):

1. a Service with ``internalTrafficPolicy: Local`` keeps only endpoints of pods
   on the subscriber's node (nothing else: no pod, no node match);
2. otherwise, when *every* candidate endpoint carries zone hints
   (``hints.forZones`` of its EndpointSlice), those whose hints include the zone
   of the subscriber's node (its ``topology.kubernetes.io/zone`` label) are
   kept; if that leaves none, all of them are;
3. then the address family (``select_family``, which the local platform applies
   too): a pod endpoint of an IPv6 slice is left out when IPv6 is disabled;
   when it is enabled, a pod's IPv4 endpoint is left out if the same pod has an
   IPv6 one among those kept (IPv6 preferred on a dual-stack cluster).

``TopologyFilter`` applies this for the subscribers of one Service port (and
hostname) on one node, as Linkerd's ``filteredListenerGroup`` does: it sits
between a ``PortPublisher`` and those subscribers' translators, keeps every
endpoint the publisher announced, and tells the translators only the
difference of the filtered view, one set for all of them (filtering once per
node, not once per stream).  The ``EndpointsWatcher`` asks it to filter again when the
Service (its traffic policy) or the subscriber's Node (its zone) changes; a new
zone re-sends every kept endpoint, because their ``zone_locality`` labels
(``local``/``remote`` against the subscriber's zone) change with it.  Only
platforms with Nodes (Kubernetes) use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from tether.destination.metrics import EndpointGauges
from tether.destination.watcher.cluster import ClusterIndex, Key
from tether.destination.watcher.listeners import Address, AddressSet, EndpointListener


def select(candidates: Iterable[Address], *, local_only: bool, node_name: str, zone: str) -> list[Address]:
    """The endpoints a subscriber on ``node_name`` (in ``zone``, "" if unknown) is sent (Linkerd's rule)."""
    if local_only:
        return [a for a in candidates if a.pod is not None and (a.pod.node_name or "") == node_name]
    candidates = list(candidates)
    if not candidates or any(not a.for_zones for a in candidates):
        return candidates
    in_zone = [a for a in candidates if zone in a.for_zones]
    return in_zone or candidates


def select_family(addresses: Iterable[Address], *, enable_ipv6: bool) -> list[Address]:
    """Linkerd's address family choice (``selectAddressFamily``); only pod endpoints have a family there.

    Linkerd keys a pod endpoint by (namespace, pod, the slice's address type); bare
    addresses and ExternalWorkloads are keyed without a family and always pass.
    """
    addresses = list(addresses)
    if not enable_ipv6:
        return [a for a in addresses if a.pod is None or not is_ipv6(a.ip)]
    dual = {(a.pod.namespace, a.pod.name) for a in addresses if a.pod is not None and is_ipv6(a.ip)}
    if not dual:
        return addresses
    return [a for a in addresses if a.pod is None or is_ipv6(a.ip) or (a.pod.namespace, a.pod.name) not in dual]


def is_ipv6(ip: str) -> bool:
    """Whether an endpoint address (validated against its slice's ``addressType``) is an IPv6 one."""
    return ":" in ip


def zone_locality(subscriber_zone: str, endpoint_zone: str) -> str:
    """The ``zone_locality`` metric label of an endpoint: ``local``/``remote`` when both zones are known."""
    if not subscriber_zone or not endpoint_zone:
        return "unknown"
    return "local" if subscriber_zone == endpoint_zone else "remote"


class TopologyFilter:
    """The ``EndpointListener`` of the subscribers on one node (platforms with Nodes); forwards their view."""

    __slots__ = ("listeners", "_index", "service", "port", "hostname", "node_name", "_gauges", "_enable_ipv6",
                 "_available", "_sent", "_zone", "_labels", "_snapshot")

    def __init__(self, first: EndpointListener, index: ClusterIndex, service: Key, port: int, hostname: str | None,
                 node_name: str, gauges: EndpointGauges, *, enable_ipv6: bool) -> None:
        self.listeners = [first]
        self._index = index
        self.service = service
        self.port = port
        self.hostname = hostname
        self.node_name = node_name
        self._gauges = gauges  # the endpoints_* series of the streams on this node
        self._enable_ipv6 = enable_ipv6
        self._available: dict[tuple[str, int], Address] = {}  # every endpoint the publisher announced
        self._sent: dict[tuple[str, int], Address] = {}  # what the subscriber was told
        self._zone = ""  # the subscriber's zone when it was last told
        self._labels: dict[str, str] = {}
        self._snapshot: AddressSet | None = None  # what a joining subscriber is told; until the next change

    def join(self, listener: EndpointListener) -> None:
        """Another subscriber on this node: it hears what the others were told, at once."""
        self.listeners.append(listener)
        self.update_gauges()
        if self._snapshot is None:
            self._snapshot = AddressSet(tuple(self._sent.values()), self._labels, None, subscriber_zone=self._zone)
        listener.add(self._snapshot)

    def update_gauges(self) -> None:
        self._gauges.set(subscribers=len(self.listeners), pods=len(self._sent),
                         exists=self.service in self._index.services)

    def forget_metrics(self) -> None:
        self._gauges.forget()

    def add(self, addresses: AddressSet) -> None:
        self._labels = dict(addresses.labels)
        for address in addresses.addresses:
            self._available[address.key] = address
        # A snapshot (no ``at``) is always forwarded, so an empty one still gets its first message.
        self._publish(addresses.at, snapshot=addresses.at is None, added_from=addresses)

    def remove(self, addresses: AddressSet) -> None:
        if not addresses.service_exists:
            gone = AddressSet(tuple(self._sent.values()), addresses.labels, addresses.at, service_exists=False)
            self._available, self._sent, self._snapshot = {}, {}, None
            self.update_gauges()
            for listener in tuple(self.listeners):
                listener.remove(gone)
            return
        for address in addresses.addresses:
            self._available.pop(address.key, None)
        self._publish(addresses.at, removed_from=addresses)

    def refilter(self, at: float) -> None:
        """The Service's traffic policy or the node's zone may have changed: tell the difference."""
        self._publish(at)

    def _publish(self, at: float | None, *, snapshot: bool = False, added_from: AddressSet | None = None,
                 removed_from: AddressSet | None = None) -> None:
        """Tell the subscriber the difference; ``added_from``/``removed_from``: the publisher's set, if any."""
        service = self._index.services.get(self.service)
        local_only = service is not None and service.internal_traffic_policy == "Local"
        zone = self._index.node_zone(self.node_name)
        topology = select(self._available.values(), local_only=local_only, node_name=self.node_name, zone=zone)
        kept = {a.key: a for a in select_family(topology, enable_ipv6=self._enable_ipv6)}
        rezoned, self._zone = zone != self._zone, zone
        before = self._sent
        added = [a for key, a in kept.items() if rezoned or (b := before.get(key)) is None or a.changed_from(b)]
        removed = [b for key, b in before.items() if key not in kept]
        self._sent, self._snapshot = kept, None
        self.update_gauges()
        if (added or removed) and not snapshot:
            self._gauges.updated()
        listeners = tuple(self.listeners)
        if added or snapshot:
            shared = _passed_on(added_from, added, zone)
            added_set = shared or AddressSet(tuple(added), self._labels, at, subscriber_zone=zone)
            for listener in listeners:
                listener.add(added_set)
        if removed:
            shared = _passed_on(removed_from, removed, zone)
            removed_set = shared or AddressSet(tuple(removed), self._labels, at, subscriber_zone=zone)
            for listener in listeners:
                listener.remove(removed_set)


def _passed_on(source: AddressSet | None, addresses: list[Address], zone: str) -> AddressSet | None:
    """The publisher's set as every subscriber in ``zone`` is told it, when this one is told all of it.

    That is the usual case (no hints, no local policy, or nothing they leave out):
    one set per zone in the source's memo then carries one encoding for every
    stream in that zone, instead of one per stream.
    """
    if source is None or len(addresses) != len(source.addresses):
        return None
    ids = {id(a) for a in source.addresses}
    if any(id(a) not in ids for a in addresses):
        return None
    shared = source.memo.get(("zone", zone))
    if shared is None:
        shared = source.memo[("zone", zone)] = AddressSet(
            source.addresses, source.labels, source.at, subscriber_zone=zone)
    assert isinstance(shared, AddressSet)
    return shared
