"""The listener interfaces the watchers publish to, and the values they publish.

Listeners are tiny (one or two methods) and are called synchronously from the
index's event handling, so they must never block: the translators behind them
only encode and enqueue.  ``at`` is the monotonic time the platform received
the change that caused the call (for the delivery-lag metric), None for the
answer a listener gets when it subscribes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tether.destination.watcher.facts import ExternalWorkloadFacts, PodFacts, ProfileFacts
from tether.ports import PortSet


@dataclass(frozen=True, slots=True)
class Address:
    """One endpoint: an IP and port, the pod or external workload behind it (None when none is
    known), whether the port is opaque, and the endpoint's zone, hostname and zone hints
    (``hints.forZones``) from its EndpointSlice; ``owner`` is the pod's owner label (key, name)
    as the index read it when the endpoint was built (``ClusterIndex.owner_of``)."""

    ip: str
    port: int
    pod: PodFacts | None
    opaque: bool
    zone: str = ""
    external: ExternalWorkloadFacts | None = None
    hostname: str | None = None
    for_zones: tuple[str, ...] = ()
    owner: tuple[str, str] | None = None

    @property
    def key(self) -> tuple[str, int]:
        return self.ip, self.port

    def changed_from(self, before: "Address") -> bool:
        """Whether a client must be told again (Linkerd's rule: the backing object's version, opaque flag or
        zone hints differ)."""
        if self.opaque != before.opaque or self.zone != before.zone or self.for_zones != before.for_zones:
            return True
        if (self.external is None) != (before.external is None):
            return True
        if self.external is not None and before.external is not None:
            return (self.external.resource_version != before.external.resource_version
                    or self.external.name != before.external.name)
        if self.pod is None or before.pod is None:
            return self.pod is not before.pod
        return self.pod.resource_version != before.pod.resource_version or self.pod.name != before.pod.name


@dataclass(slots=True, eq=False)
class AddressSet:
    """Addresses delivered together, with the labels every one of them shares (service, namespace).

    ``service_exists`` is False only in the ``remove`` that reports the Service
    itself went away.  ``subscriber_zone`` is the zone of the subscriber's node
    when a topology filter made the set for one subscriber ("" otherwise), for the
    endpoints' ``zone_locality`` label.  ``at`` is None for snapshots (no platform event caused them).
    ``memo`` lets translators encode a set once however many
    listeners receive it, and topology filters derive one set per subscriber zone
    from it (``tether.destination.watcher.topology``).
    """

    addresses: tuple[Address, ...]
    labels: Mapping[str, str]
    at: float | None
    service_exists: bool = True
    subscriber_zone: str = ""
    memo: dict[object, object] = field(default_factory=dict)


class EndpointListener(Protocol):
    def add(self, addresses: AddressSet) -> None:
        """These endpoints are new or changed; the first call after subscribing is the snapshot (maybe empty)."""

    def remove(self, addresses: AddressSet) -> None:
        """These endpoints are gone (all of them, and the Service too, when ``service_exists`` is False)."""


class ProfileListener(Protocol):
    def update(self, profile: ProfileFacts | None, at: float | None) -> None:
        """The ServiceProfile now in force (None: there is none); called at once on subscribe."""


@dataclass(frozen=True, slots=True)
class ServicePorts:
    """What a Service says of its ports: which are opaque, and which it defines (None: no such Service)."""

    opaque: PortSet
    defined: frozenset[int] | None


class OpaquePortsListener(Protocol):
    def update_ports(self, ports: ServicePorts, at: float | None) -> None:
        """The Service's opaque and defined ports now; called at once on subscribe."""


class WorkloadListener(Protocol):
    def update(self, target: Address, at: float | None) -> None:
        """What is at the watched IP:port now (``target.pod`` None when nothing runs there)."""

    def became_service(self) -> None:
        """The watched IP is a Service's cluster IP now: the stream must be asked for again (as a service)."""
