"""Endpoints of services: one publisher per subscribed Service, one per requested port, listeners below.

``EndpointsWatcher.subscribe`` is what ``Get`` calls.  The address set of a
port is computed from the pods the Service selects, as Kubernetes' EndpointSlice
controller would list them (a pod IP, Running, Ready, not terminating), with
the Service's ``targetPort`` resolved per pod when it names a container port.
A requested port the Service does not define is used as the target port as is
(Linkerd's rule).  New listeners get the snapshot, then diffs: ``add`` for new
or changed addresses, ``remove`` for gone ones; a deleted Service is one
``remove`` with ``service_exists`` False, and its re-creation a fresh snapshot.

Changes are coalesced per event-loop turn: events only update a publisher's
current addresses and mark it dirty; one scheduled ``flush`` then sends each
listener the difference from what it was last told.  A burst (a store batch,
a rollout) thus costs a stream one ``add`` and one ``remove``, not one message
per event, and a single change still goes out on the very next loop turn.

Publishers exist only while someone listens, so an unwatched pod event costs a
dictionary lookup per label.  Everything runs on the event loop thread; the
listeners only enqueue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tether.destination.metrics import DestinationMetrics
from tether.destination.watcher.cluster import Change, ClusterIndex, Key, selector_bucket
from tether.destination.watcher.errors import InvalidService, ServiceNotFound
from tether.destination.watcher.facts import PodFacts, ServiceFacts
from tether.destination.watcher.listeners import Address, AddressSet, EndpointListener

log = logging.getLogger(__name__)


class PortPublisher:
    """The endpoints of one Service port, and the listeners that want them.

    ``addresses`` follows the index as events arrive; ``published`` is what
    the listeners have been told.  Changes only mark the publisher dirty; the
    watcher's ``flush`` (once per event-loop turn) sends the difference.
    """

    def __init__(self, service: "ServicePublisher", port: int) -> None:
        self._service = service
        self.port = port
        self.listeners: list[EndpointListener] = []
        self._labels = {"namespace": service.key[0], "service": service.key[1]}
        self._metric_labels = (service.key[0], service.key[1], str(port))
        self.addresses: dict[str, Address] = self._compute()  # by pod name (one namespace)
        self.published: dict[str, Address] = dict(self.addresses)
        self._snapshot: AddressSet | None = None
        self._dirty_since: float | None = None  # when the oldest unpublished change was seen
        self._update_gauges()

    # -- computing -------------------------------------------------------------

    def _address(self, pod: PodFacts, service: ServiceFacts) -> Address | None:
        if not pod.is_endpoint or not service.selector.matches(pod.labels):
            return None
        service_port = service.port(self.port)
        target = service_port.target_port if service_port is not None else self.port
        port = pod.resolve_port(target)
        if port is None:
            return None  # a named targetPort this pod does not declare: not an endpoint of it
        assert pod.ip is not None
        return Address(pod.ip, port, pod, self._service.index.is_opaque(pod, port))

    def _compute(self) -> dict[str, Address]:
        service = self._service.service
        if service is None:
            return {}
        addresses = {}
        for pod in self._service.index.pods_selected(service.namespace, service.selector):
            address = self._address(pod, service)
            if address is not None:
                addresses[pod.name] = address
        return addresses

    # -- subscribing -----------------------------------------------------------

    def snapshot(self) -> AddressSet:
        """Every published address, as one set (shared by every subscriber until the next flush)."""
        if self._snapshot is None:
            self._snapshot = AddressSet(tuple(self.published.values()), self._labels, None)
        return self._snapshot

    def subscribe(self, listener: EndpointListener) -> None:
        self.listeners.append(listener)
        self._update_gauges()
        listener.add(self.snapshot())

    def unsubscribe(self, listener: EndpointListener) -> None:
        try:
            self.listeners.remove(listener)
        except ValueError:
            return
        self._update_gauges()

    # -- changes -----------------------------------------------------------------

    def _mark(self, at: float) -> None:
        if self._dirty_since is None:
            self._dirty_since = at
            self._service.mark_dirty(self)

    def refresh(self, at: float) -> None:
        """Recompute every address (Service, Server or namespace changed)."""
        self.addresses = self._compute()
        self._mark(at)

    def pod_changed(self, old: PodFacts | None, new: PodFacts | None, at: float) -> None:
        service = self._service.service
        if service is None:
            return
        name = (new or old).name  # type: ignore[union-attr]
        address = self._address(new, service) if new is not None else None
        if address is None:
            if self.addresses.pop(name, None) is not None:
                self._mark(at)
        else:
            self.addresses[name] = address
            self._mark(at)

    def service_gone(self, at: float) -> None:
        """Tell everyone at once (no coalescing): the Service itself is gone."""
        gone = tuple(self.published.values())
        self.addresses, self.published, self._snapshot, self._dirty_since = {}, {}, None, None
        self._update_gauges()
        removed = AddressSet(gone, self._labels, at, service_exists=False)
        for listener in tuple(self.listeners):
            listener.remove(removed)

    def service_back(self, at: float) -> None:
        """The Service exists again: everyone gets a fresh snapshot (maybe empty)."""
        self.addresses = self._compute()
        self.published, self._snapshot, self._dirty_since = dict(self.addresses), None, None
        self._update_gauges()
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
        self._service.metrics.endpoints_updates.labels(*self._metric_labels).inc()
        self._update_gauges()
        listeners = tuple(self.listeners)
        if added:
            added_set = AddressSet(tuple(added), self._labels, at)
            for listener in listeners:
                listener.add(added_set)
        if removed:
            removed_set = AddressSet(tuple(removed), self._labels, at)
            for listener in listeners:
                listener.remove(removed_set)

    def _update_gauges(self) -> None:
        metrics = self._service.metrics
        metrics.endpoints_subscribers.labels(*self._metric_labels).set(len(self.listeners))
        metrics.endpoints_pods.labels(*self._metric_labels).set(len(self.published))
        metrics.endpoints_exists.labels(*self._metric_labels).set(1 if self._service.service is not None else 0)

    def forget_metrics(self) -> None:
        metrics = self._service.metrics
        for series in (metrics.endpoints_subscribers, metrics.endpoints_pods, metrics.endpoints_exists,
                       metrics.endpoints_updates):
            try:
                series.remove(*self._metric_labels)
            except KeyError:
                pass


class ServicePublisher:
    """One subscribed Service: its facts and a ``PortPublisher`` per requested port."""

    def __init__(
        self, key: Key, service: ServiceFacts, index: ClusterIndex, metrics: DestinationMetrics,
        mark_dirty: Callable[[PortPublisher], None], discard_dirty: Callable[[PortPublisher], None],
    ) -> None:
        self.key = key
        self.service: ServiceFacts | None = service
        self.index = index
        self.metrics = metrics
        self.mark_dirty = mark_dirty  # the watcher flushes a dirty port publisher on the next loop turn
        self.discard_dirty = discard_dirty
        self.ports: dict[int, PortPublisher] = {}
        # Where ``EndpointsWatcher`` filed this publisher for pod lookups: (index, key).
        self.filed_under: tuple[dict, object] | None = None

    @property
    def bucket(self) -> tuple[str, str] | None:
        return None if self.service is None else selector_bucket(self.service.selector)

    def subscribe(self, port: int, listener: EndpointListener) -> None:
        publisher = self.ports.get(port)
        if publisher is None:
            publisher = self.ports[port] = PortPublisher(self, port)
        publisher.subscribe(listener)

    def unsubscribe(self, port: int, listener: EndpointListener) -> bool:
        """Remove a listener; True when nobody listens to this Service any more."""
        publisher = self.ports.get(port)
        if publisher is not None:
            publisher.unsubscribe(listener)
            if not publisher.listeners:
                publisher.forget_metrics()
                del self.ports[port]
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

    def pod_changed(self, old: PodFacts | None, new: PodFacts | None, at: float) -> None:
        for publisher in self.ports.values():
            publisher.pod_changed(old, new, at)

    def refresh(self, at: float) -> None:
        for publisher in self.ports.values():
            publisher.refresh(at)


class EndpointsWatcher:
    """Service -> port -> listeners, fed by the cluster index."""

    def __init__(self, index: ClusterIndex, metrics: DestinationMetrics) -> None:
        self._index = index
        self._metrics = metrics
        self._publishers: dict[Key, ServicePublisher] = {}
        # Publishers by the (label, value) their selector requires, so a pod event finds its Services fast.
        self._by_label: dict[tuple[str, str, str], set[Key]] = {}
        # Publishers whose selector has no such label (only set-based terms), per namespace: always checked.
        self._unbucketed: dict[str, set[Key]] = {}
        # Port publishers with unpublished changes; flushed once per event-loop turn, so a burst of
        # events (a store batch, a rollout) becomes one add and one remove per stream, not one per event.
        self._dirty: dict[PortPublisher, None] = {}
        self._flush_scheduled = False
        index.observe(self._on_change)

    @property
    def publishers(self) -> int:
        return len(self._publishers)

    def subscribe(self, namespace: str, service: str, port: int, listener: EndpointListener) -> None:
        """Subscribe ``listener`` to a Service port; it gets the snapshot at once.

        Raises ``ServiceNotFound`` for an unknown Service and ``InvalidService``
        for an ExternalName one.
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
                key, facts, self._index, self._metrics, self._mark_dirty, self._discard_dirty
            )
            self._file(publisher)
        publisher.subscribe(port, listener)

    def unsubscribe(self, namespace: str, service: str, port: int, listener: EndpointListener) -> None:
        key = (namespace, service)
        publisher = self._publishers.get(key)
        if publisher is not None and publisher.unsubscribe(port, listener):
            self._unfile(publisher)
            del self._publishers[key]

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

    def _file(self, publisher: ServicePublisher) -> None:
        bucket = publisher.bucket
        namespace = publisher.key[0]
        index: dict = self._unbucketed if bucket is None else self._by_label
        index_key: object = namespace if bucket is None else (namespace, *bucket)
        index.setdefault(index_key, set()).add(publisher.key)
        publisher.filed_under = (index, index_key)

    def _unfile(self, publisher: ServicePublisher) -> None:
        if publisher.filed_under is None:
            return
        index, index_key = publisher.filed_under
        members = index.get(index_key)
        if members is not None:
            members.discard(publisher.key)
            if not members:
                del index[index_key]
        publisher.filed_under = None

    def _candidates(self, namespace: str, pods: tuple[PodFacts | None, ...]) -> set[Key]:
        keys = set(self._unbucketed.get(namespace, ()))
        for pod in pods:
            if pod is not None:
                for label, value in pod.labels.items():
                    keys.update(self._by_label.get((namespace, label, value), ()))
        return keys

    def _on_change(self, change: Change) -> None:
        if not self._publishers:
            return
        if change.kind == "pod":
            old, new = change.old, change.new
            assert old is None or isinstance(old, PodFacts)
            assert new is None or isinstance(new, PodFacts)
            for key in self._candidates(change.namespace, (old, new)):
                self._publishers[key].pod_changed(old, new, change.at)
        elif change.kind == "service":
            publisher = self._publishers.get(change.key)
            if publisher is not None:
                assert change.new is None or isinstance(change.new, ServiceFacts)
                self._unfile(publisher)
                publisher.service_changed(change.new, change.at)
                self._file(publisher)
        elif change.kind in ("server", "namespace"):
            for key, publisher in list(self._publishers.items()):
                if key[0] == change.namespace:
                    publisher.refresh(change.at)
