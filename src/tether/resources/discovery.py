"""The EndpointSlice (``discovery.k8s.io/v1``): who serves a Service, as Kubernetes' controllers write it.

An EndpointSlice has no ``spec``: ``addressType``, ``endpoints`` and ``ports`` sit at the top
level. `parse_endpoint_slice` is lenient below that level, because slices are written by
controllers and by hand (selectorless Services) and one bad entry must not hide the others: an
endpoint whose address does not match ``addressType`` or an unusable port is left out and
described in ``EndpointSliceSpec.problems`` (field path and reason), which readers report.
Only a slice whose shape is wrong (no ``addressType``, ``endpoints`` not a list) fails to parse.

Readers: the destination (``tether.destination.watcher``), the local platform's EndpointSlice
controllers (``tether.platform.local.endpointslices``, ``...external_workloads``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from tether.resources import formats
from tether.resources.errors import ValidationError
from tether.resources.fields import Fields
from tether.resources.meta import ObjectMeta

ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MAX_ENDPOINTS = 1000  # the API server's limit per slice


@dataclass(frozen=True, slots=True)
class TargetRef:
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    """One endpoint; conditions are None when unset (``ready`` unset means ready, as Kubernetes reads it)."""

    addresses: tuple[str, ...]
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None
    hostname: str | None = None
    node_name: str | None = None
    zone: str | None = None
    target_ref: TargetRef | None = None
    for_zones: tuple[str, ...] = ()

    @property
    def is_ready(self) -> bool:
        return self.ready is not False


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str  # "" for an unnamed port
    port: int | None  # None: every port (Kubernetes' "all ports" form)
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class EndpointSliceSpec:
    address_type: str
    endpoints: tuple[SliceEndpoint, ...] = ()
    ports: tuple[SlicePort, ...] = ()
    problems: tuple[str, ...] = ()  # entries left out, each "field: reason"


def parse_endpoint_slice(doc: Fields, meta: ObjectMeta) -> tuple[EndpointSliceSpec, None]:
    address_type = doc.choice("addressType", ADDRESS_TYPES)
    problems: list[str] = []
    endpoints = []
    nodes = doc.children("endpoints")
    if len(nodes) > MAX_ENDPOINTS:
        raise doc.error("endpoints", f"must have at most {MAX_ENDPOINTS} items")
    for node in nodes:
        try:
            endpoints.append(_endpoint(node, address_type))
        except ValidationError as exc:
            problems.append(str(exc))
    ports = []
    for node in doc.children("ports"):
        try:
            ports.append(SlicePort(
                name=node.string("name", "") or "",
                port=node.port("port", None),
                protocol=node.choice("protocol", ("TCP", "UDP", "SCTP"), "TCP"),
            ))
        except ValidationError as exc:
            problems.append(str(exc))
    return EndpointSliceSpec(address_type, tuple(endpoints), tuple(ports), tuple(problems)), None


def _endpoint(node: Fields, address_type: str) -> SliceEndpoint:
    addresses = tuple(node.strings("addresses", non_empty=True))
    for i, address in enumerate(addresses):
        reason = _address_problem(address, address_type)
        if reason:
            raise ValidationError(reason, path=f"{node.at('addresses')}[{i}]")
    conditions = node.child("conditions", None) or Fields({}, node.at("conditions"))
    ref = node.child("targetRef", None)
    target_ref = None
    if ref is not None:
        target_ref = TargetRef(ref.string("kind"), ref.string("name"), ref.string("namespace", None),
                               ref.string("uid", None))
    hints = node.child("hints", None)
    for_zones = tuple(z.string("name") for z in hints.children("forZones")) if hints is not None else ()
    return SliceEndpoint(
        addresses=addresses,
        ready=conditions.boolean("ready", None),
        serving=conditions.boolean("serving", None),
        terminating=conditions.boolean("terminating", None),
        hostname=node.string("hostname", None, check=formats.dns1123_label),
        node_name=node.string("nodeName", None),
        zone=node.string("zone", None),
        target_ref=target_ref,
        for_zones=for_zones,
    )


def _address_problem(address: str, address_type: str) -> str:
    if address_type == "FQDN":
        return ""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{address!r} is not an IP address"
    if (ip.version == 4) != (address_type == "IPv4"):
        return f"{address!r} is not an {address_type} address"
    return ""
