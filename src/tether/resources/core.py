"""Typed specs of the core kinds that are not workloads: Namespace, ServiceAccount, Service, Event.

`model.parse` calls the ``parse_*`` functions; the destination reads
`ServiceSpec` (ports, target ports, selector, cluster IP) and the injector and
identity read namespaces and service accounts.  Events are what the local
platform's controllers record about an object they cannot use
(``tether.platform.problems``), shown by ``tether get events``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.resources import formats
from tether.resources.fields import REQUIRED, Fields
from tether.resources.meta import ObjectMeta
from tether.resources.selectors import LabelSelector

PROTOCOLS = ("TCP", "UDP", "SCTP")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
HEADLESS = "None"


@dataclass(frozen=True, slots=True)
class NamespaceSpec:
    finalizers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServiceAccountSpec:
    """A ServiceAccount has no ``spec``; this holds its top-level settings."""

    automount_service_account_token: bool | None = None


@dataclass(frozen=True, slots=True)
class ServicePort:
    port: int
    target_port: int | str
    name: str | None = None
    protocol: str = "TCP"
    app_protocol: str | None = None
    node_port: int | None = None


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """What the destination needs from a Service.

    ``selector`` is `LabelSelector.nothing()` when the Service has no selector:
    such a Service selects no pods (its endpoints are managed by hand).
    """

    selector: LabelSelector
    ports: tuple[ServicePort, ...] = ()
    type: str = "ClusterIP"
    cluster_ip: str | None = None
    cluster_ips: tuple[str, ...] = ()
    external_name: str | None = None
    internal_traffic_policy: str = "Cluster"

    @property
    def is_headless(self) -> bool:
        return self.cluster_ip == HEADLESS

    def port_by_number(self, port: int) -> ServicePort | None:
        return next((p for p in self.ports if p.port == port), None)


EVENT_TYPES = ("Normal", "Warning")


@dataclass(frozen=True, slots=True)
class InvolvedObject:
    kind: str
    name: str
    namespace: str | None = None
    api_version: str | None = None
    uid: str | None = None


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A core/v1 Event has no ``spec``: this holds its top-level fields."""

    involved_object: InvolvedObject
    reason: str
    message: str = ""
    type: str = "Normal"
    count: int = 1


def parse_event(doc: Fields, meta: ObjectMeta) -> tuple[EventSpec, None]:
    involved = doc.child("involvedObject")
    return EventSpec(
        InvolvedObject(involved.string("kind"), involved.string("name"), involved.string("namespace", None),
                       involved.string("apiVersion", None), involved.string("uid", None)),
        reason=doc.string("reason"),
        message=doc.string("message", ""),
        type=doc.choice("type", EVENT_TYPES, "Normal"),
        count=doc.integer("count", 1, minimum=1),
    ), None


def parse_namespace(doc: Fields, meta: ObjectMeta) -> tuple[NamespaceSpec, None]:
    spec = doc.child("spec", None)
    return NamespaceSpec(spec.strings("finalizers") if spec else ()), None


def parse_service_account(doc: Fields, meta: ObjectMeta) -> tuple[ServiceAccountSpec, None]:
    return ServiceAccountSpec(doc.boolean("automountServiceAccountToken", None)), None


def parse_service(doc: Fields, meta: ObjectMeta) -> tuple[ServiceSpec, None]:
    spec = doc.child("spec")
    service_type = spec.choice("type", SERVICE_TYPES, "ClusterIP")
    cluster_ip = spec.string("clusterIP", None, check=_cluster_ip)
    cluster_ips = spec.strings("clusterIPs", check=_cluster_ip)
    ports = _service_ports(spec)
    if not ports and service_type != "ExternalName" and cluster_ip != HEADLESS:
        raise spec.error("ports", "required")
    return (
        ServiceSpec(
            selector=LabelSelector.for_service(spec.raw("selector"), spec.at("selector")),
            ports=ports,
            type=service_type,
            cluster_ip=cluster_ip or (cluster_ips[0] if cluster_ips else None),
            cluster_ips=cluster_ips,
            external_name=spec.string(
                "externalName", REQUIRED if service_type == "ExternalName" else None, check=formats.dns1123_subdomain
            ),
            internal_traffic_policy=spec.choice("internalTrafficPolicy", ("Cluster", "Local"), "Cluster"),
        ),
        None,
    )


def _service_ports(spec: Fields) -> tuple[ServicePort, ...]:
    nodes = spec.children("ports")
    ports = []
    seen_names: set[str] = set()
    seen_ports: set[tuple[int, str]] = set()
    for node in nodes:
        port = node.port("port")
        name = node.string("name", None, check=formats.dns1123_label)
        if name is None and len(nodes) > 1:
            raise node.error("name", "required when a Service has more than one port")
        if name is not None and name in seen_names:
            raise node.error("name", f"duplicate port name {name!r}")
        protocol = node.choice("protocol", PROTOCOLS, "TCP")
        if (port, protocol) in seen_ports:
            raise node.error("port", f"duplicate port {port}/{protocol}")
        seen_names.add(name or "")
        seen_ports.add((port, protocol))
        ports.append(
            ServicePort(
                port=port,
                # An absent targetPort means "the same number as port".
                target_port=node.int_or_string("targetPort", port, check=formats.iana_svc_name),
                name=name,
                protocol=protocol,
                app_protocol=node.string("appProtocol", None),
                node_port=node.port("nodePort", None),
            )
        )
    return tuple(ports)


def _cluster_ip(value: str) -> str | None:
    if value in ("", HEADLESS) or formats.ip_address(value) is None:
        return None
    return f"must be {HEADLESS!r}, empty, or an IP address"

