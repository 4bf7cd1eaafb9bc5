"""What the destination keeps of each object: small frozen facts read once from the typed resource model.

``tether.destination.watcher.cluster`` turns every watched object into one of
these (``facts_of``) and indexes only the facts, never the whole object, so the
index stays small and every question the watchers ask (is this pod ready, which
port does a named target port mean, is a proxy there, which control plane) is
answered in one place.  No protobufs here.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tether.ports import PortSet, parse_port_set, port_of_address
from tether.resources import kinds
from tether.resources.core import ServicePort, ServiceSpec
from tether.resources.discovery import SERVICE_NAME_LABEL, EndpointSliceSpec, SliceEndpoint, SlicePort
from tether.resources.errors import ValidationError
from tether.resources.model import Resource, parse
from tether.resources.policy import ServerSpec
from tether.resources.profiles import ServiceProfileSpec
from tether.resources.selectors import LabelSelector
from tether.resources.workloads import Container, ExternalWorkloadSpec, PodSpec, PodStatus

log = logging.getLogger(__name__)

# Linkerd's label and annotation names (pkg/k8s/labels.go).
CONTROL_PLANE_NS_LABEL = "linkerd.io/control-plane-ns"
PROXY_VERSION_ANNOTATION = "linkerd.io/proxy-version"
OPAQUE_PORTS_ANNOTATION = "config.linkerd.io/opaque-ports"
SKIP_INBOUND_PORTS_ANNOTATION = "config.linkerd.io/skip-inbound-ports"
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"
ZONE_LABEL = "topology.kubernetes.io/zone"  # a Node's zone (Kubernetes' well-known label)
PROXY_CONTAINER = "linkerd-proxy"
PROXY_PORT_NAME = "linkerd-proxy"
ADMIN_PORT_NAME = "linkerd-admin"
DEFAULT_INBOUND_PORT = 4143
INBOUND_ADDR_ENV = "LINKERD2_PROXY_INBOUND_LISTEN_ADDR"
META_ADDR_ENVS = ("LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "LINKERD2_PROXY_CONTROL_LISTEN_ADDR")

# An owner kind as a metric label key (Linkerd's proxy labels: ``deployment``, ``k8s_job``...).
_OWNER_LABEL = {"Job": "k8s_job"}
# The kinds of a pod's owner whose own owner stands for it in the labels (Linkerd reads them as metadata, on
# Kubernetes): a Job's CronJob, a ReplicaSet's Deployment (or StatefulSet, DaemonSet, Job).
_OWNER_OBJECT_KINDS = {("batch/v1", "Job"), ("apps/v1", "ReplicaSet")}
_RS_PARENT_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def owner_label(kind: str) -> str:
    """The metric label key for an owner of ``kind`` (``Deployment`` -> ``deployment``, ``Job`` -> ``k8s_job``)."""
    return _OWNER_LABEL.get(kind, kind.lower())


@dataclass(frozen=True, slots=True)
class ProxyFacts:
    """The pod's Linkerd proxy: where it accepts meshed traffic, and its own (meta) ports."""

    inbound_port: int
    meta_ports: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    resource_version: str
    labels: Mapping[str, str]
    ips: tuple[str, ...]  # status.podIPs (one per address family on a dual-stack cluster), podIP first
    phase: str | None
    ready: bool
    terminating: bool
    service_account: str
    owner_kind: str  # the metric label key: deployment, statefulset, replicaset, k8s_job, pod...
    owner_name: str
    # Set when the pod says which control plane meshed it (label), else None.
    control_plane_ns: str | None
    # A proxy runs in the pod (a linkerd-proxy container or sidecar, or the proxy-version annotation).
    proxy: ProxyFacts | None
    opaque_ports: PortSet | None  # the pod's own annotation; None when absent
    skip_inbound_ports: PortSet
    container_ports: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    host_network: bool = False
    node_name: str | None = None
    owner_refs: tuple[tuple[str, str], ...] = ()  # (kind, name) of each owner reference
    host_ips: tuple[str, ...] = ()  # status.hostIPs, else hostIP: its node's addresses
    host_ports: Mapping[int, str] = field(default_factory=dict)  # hostPort -> its port's name ("" when unnamed)

    @property
    def ip(self) -> str | None:
        """The pod's primary IP (``status.podIP``)."""
        return self.ips[0] if self.ips else None

    @property
    def pod_template_hash(self) -> str | None:
        return self.labels.get(POD_TEMPLATE_HASH_LABEL)

    @property
    def is_endpoint(self) -> bool:
        """Whether an EndpointSlice controller would list this pod as a ready endpoint."""
        return self.ip is not None and self.phase == "Running" and self.ready and not self.terminating

    @property
    def is_running(self) -> bool:
        """What endpoint profiles follow: running (readiness deliberately ignored, as Linkerd does)."""
        return self.ip is not None and self.phase == "Running" and not self.terminating

    def resolve_port(self, target: int | str) -> int | None:
        """The port a Service ``targetPort`` means on this pod: the number, or the first container port so named."""
        if isinstance(target, int):
            return target
        ports = self.container_ports.get(target)
        return ports[0] if ports else None


@dataclass(frozen=True, slots=True)
class ServiceFacts:
    namespace: str
    name: str
    resource_version: str
    selector: LabelSelector
    ports: tuple[ServicePort, ...]
    type: str
    cluster_ips: tuple[str, ...]
    opaque_ports: PortSet | None  # the Service's own annotation (names resolved to service ports); None if absent
    labels: Mapping[str, str] = field(default_factory=dict)
    internal_traffic_policy: str = "Cluster"
    # Asks for IPv6 endpoints (``ipFamilies`` names IPv6, or ``ipFamilyPolicy: RequireDualStack``): only a
    # cluster's EndpointSlice controller can give them (the local platform's pods have IPv4 addresses only).
    wants_ipv6: bool = False

    @property
    def is_external_name(self) -> bool:
        return self.type == "ExternalName"

    def port(self, number: int) -> ServicePort | None:
        return next((p for p in self.ports if p.port == number), None)


@dataclass(frozen=True, slots=True)
class ServerFacts:
    namespace: str
    name: str
    pod_selector: LabelSelector | None
    port: int | str
    opaque: bool

    def marks_opaque(self, pod: PodFacts, port: int) -> bool:
        """Whether this Server makes ``port`` of ``pod`` opaque (number, or the name of a container port
        whose number or host port it is, as Linkerd matches names)."""
        if not self.opaque or self.pod_selector is None or not self.pod_selector.matches(pod.labels):
            return False
        if isinstance(self.port, int):
            return self.port == port
        return port in pod.container_ports.get(self.port, ()) or pod.host_ports.get(port) == self.port


@dataclass(frozen=True, slots=True)
class ProfileFacts:
    namespace: str
    name: str
    resource_version: str
    spec: ServiceProfileSpec


@dataclass(frozen=True, slots=True)
class NamespaceFacts:
    name: str
    opaque_ports_annotation: str | None  # names resolve against each pod or service, so kept as text


@dataclass(frozen=True, slots=True)
class SliceFacts:
    """An EndpointSlice of a Service (``service`` from its ``kubernetes.io/service-name`` label)."""

    namespace: str
    name: str
    service: str | None
    address_type: str
    endpoints: tuple[SliceEndpoint, ...]
    ports: tuple[SlicePort, ...]
    problems: tuple[str, ...] = ()

    def port_named(self, name: str) -> int | None:
        """The number of the slice port called ``name`` ("" for the unnamed one), if any."""
        return next((p.port for p in self.ports if p.name == name and p.port is not None), None)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """A Node: only its zone (its ``topology.kubernetes.io/zone`` label, "" when unlabelled) matters here."""

    name: str
    zone: str


@dataclass(frozen=True, slots=True)
class OwnerFacts:
    """A Job or ReplicaSet that owns pods (watched as metadata, on Kubernetes): its owner, when it has exactly one."""

    namespace: str
    name: str
    kind: str
    parent: tuple[str, str] | None  # (kind, name)

    def stands_for_it(self) -> tuple[str, str] | None:
        """The owner that names this object's pods in their labels, as Linkerd's ``GetOwnerKindAndName`` picks it:
        a Job's single owner (a CronJob); a ReplicaSet's single owner of a kind that rolls ReplicaSets out."""
        if self.parent is None or (self.kind == "ReplicaSet" and self.parent[0] not in _RS_PARENT_KINDS):
            return None
        return self.parent


@dataclass(frozen=True, slots=True)
class ExternalWorkloadFacts:
    """A workload outside the cluster (a VM) that joined the mesh: its SPIFFE identity and ports."""

    namespace: str
    name: str
    resource_version: str
    labels: Mapping[str, str]
    identity: str  # spec.meshTLS.identity, a URI (spiffe://...)
    server_name: str  # spec.meshTLS.serverName, the SNI its proxy answers to
    ports: Mapping[str, int]  # named ports
    owner_kind: str  # the metric label key of its single owner, if any
    owner_name: str
    ips: tuple[str, ...] = ()  # spec.workloadIPs
    port_numbers: frozenset[int] = frozenset()  # every port of spec.ports

    @property
    def inbound_port(self) -> int:
        """Where its proxy accepts meshed traffic: the port named ``linkerd-proxy``, else 4143."""
        return self.ports.get(PROXY_PORT_NAME, DEFAULT_INBOUND_PORT)


Facts = (PodFacts | ServiceFacts | ServerFacts | ProfileFacts | NamespaceFacts | SliceFacts | ExternalWorkloadFacts
         | NodeFacts | OwnerFacts)


def facts_of(obj: Mapping[str, Any]) -> Facts | None:
    """The facts of one watched object, or None when it can't be read (logged) or is of another kind."""
    if obj.get("kind") == "Node" and obj.get("apiVersion") == "v1":
        return _node(obj)  # not in the resource model (only the Kubernetes platform has Nodes): read its label here
    if (obj.get("apiVersion"), obj.get("kind")) in _OWNER_OBJECT_KINDS:
        return _owner_object(obj)  # metadata only, on Kubernetes, as for Nodes
    try:
        resource = parse(obj)
    except ValidationError as exc:
        log.warning("ignoring an object the destination can't read: %s", exc)
        return None
    rtype = resource.type
    if rtype is kinds.POD:
        return _pod(resource)
    if rtype is kinds.SERVICE:
        return _service(resource)
    if rtype is kinds.SERVER:
        return _server(resource)
    if rtype is kinds.SERVICE_PROFILE:
        assert isinstance(resource.spec, ServiceProfileSpec)
        version = resource.metadata.resource_version or ""
        return ProfileFacts(resource.namespace or "", resource.name, version, resource.spec)
    if rtype is kinds.NAMESPACE:
        return NamespaceFacts(resource.name, resource.annotations.get(OPAQUE_PORTS_ANNOTATION))
    if rtype is kinds.ENDPOINT_SLICE:
        return _slice(resource)
    if rtype is kinds.EXTERNAL_WORKLOAD:
        return _external_workload(resource)
    return None


def _node(obj: Mapping[str, Any]) -> NodeFacts | None:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        log.warning("ignoring a Node without a name")
        return None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    zone = labels.get(ZONE_LABEL) if isinstance(labels, Mapping) else None
    return NodeFacts(name, zone if isinstance(zone, str) else "")


def _owner_object(obj: Mapping[str, Any]) -> OwnerFacts | None:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        log.warning("ignoring a %s without a name", obj.get("kind"))
        return None
    refs = [r for r in metadata.get("ownerReferences") or () if isinstance(r, Mapping)]
    parent = None
    if len(refs) == 1 and isinstance(refs[0].get("kind"), str) and isinstance(refs[0].get("name"), str):
        parent = (refs[0]["kind"], refs[0]["name"])
    return OwnerFacts(str(metadata.get("namespace") or ""), metadata["name"], str(obj["kind"]), parent)


def _slice(resource: Resource) -> SliceFacts:
    spec = resource.spec
    assert isinstance(spec, EndpointSliceSpec)
    return SliceFacts(
        namespace=resource.namespace or "",
        name=resource.name,
        service=resource.labels.get(SERVICE_NAME_LABEL),
        address_type=spec.address_type,
        endpoints=spec.endpoints,
        ports=spec.ports,
        problems=spec.problems,
    )


def _external_workload(resource: Resource) -> ExternalWorkloadFacts:
    spec = resource.spec
    assert isinstance(spec, ExternalWorkloadSpec)
    refs = resource.metadata.owner_references
    owner_kind, owner_name = ("", "")
    if len(refs) == 1:  # its kind in lower case, as Linkerd labels an ExternalWorkload's owner (no ``k8s_job``)
        owner_kind, owner_name = refs[0].kind.lower(), refs[0].name
    return ExternalWorkloadFacts(
        namespace=resource.namespace or "",
        name=resource.name,
        resource_version=resource.metadata.resource_version or "",
        labels=resource.labels,
        identity=spec.mesh_tls.identity,
        server_name=spec.mesh_tls.server_name,
        ports={p.name: p.port for p in spec.ports if p.name},
        owner_kind=owner_kind,
        owner_name=owner_name,
        ips=spec.workload_ips,
        port_numbers=frozenset(p.port for p in spec.ports),
    )


def _ports_annotation(
    annotations: Mapping[str, str], key: str, names: Mapping[str, tuple[int, ...]], what: str
) -> PortSet | None:
    text = annotations.get(key)
    if text is None:
        return None
    ports, skipped = parse_port_set(text, names)
    if skipped:
        log.warning("%s: %s: skipping invalid or unknown ports %s", what, key, ", ".join(skipped))
    return ports


def _pod(resource: Resource) -> PodFacts:
    spec, status = resource.spec, resource.status
    assert isinstance(spec, PodSpec)
    status = status if isinstance(status, PodStatus) else PodStatus()
    namespace = resource.namespace or ""
    container_ports: dict[str, tuple[int, ...]] = {}
    host_ports: dict[int, str] = {}
    for container in (*spec.containers, *spec.init_containers):
        for port in container.ports:
            if port.name:
                container_ports[port.name] = (*container_ports.get(port.name, ()), port.container_port)
            # On the host network a container port is its host port (the API server defaults hostPort so).
            host_port = port.host_port or (port.container_port if spec.host_network else None)
            if host_port:
                host_ports.setdefault(host_port, port.name or "")
    owner_kind, owner_name = _owner(resource)
    what = f"pod {namespace}/{resource.name}"
    return PodFacts(
        namespace=sys.intern(namespace),
        name=resource.name,
        resource_version=resource.metadata.resource_version or "",
        labels=_interned(resource.labels),
        ips=tuple(sys.intern(ip) for ip in dict.fromkeys((status.pod_ip, *status.pod_ips)) if ip),
        phase=status.phase,
        ready=status.ready,
        terminating=resource.metadata.deletion_timestamp is not None,
        service_account=sys.intern(spec.service_account_name or "default"),
        owner_kind=sys.intern(owner_kind),
        owner_name=sys.intern(owner_name),
        control_plane_ns=resource.labels.get(CONTROL_PLANE_NS_LABEL) or None,
        proxy=_proxy(spec, resource.annotations, container_ports),
        opaque_ports=_ports_annotation(resource.annotations, OPAQUE_PORTS_ANNOTATION, container_ports, what),
        skip_inbound_ports=_ports_annotation(resource.annotations, SKIP_INBOUND_PORTS_ANNOTATION, container_ports, what)
        or PortSet(),
        container_ports=container_ports,
        host_network=spec.host_network,
        node_name=spec.node_name,
        owner_refs=tuple((ref.kind, ref.name) for ref in resource.metadata.owner_references),
        host_ips=tuple(sys.intern(ip) for ip in status.host_ips or ((status.host_ip,) if status.host_ip else ())),
        host_ports=host_ports or _NO_HOST_PORTS,
    )


_NO_HOST_PORTS: Mapping[int, str] = MappingProxyType({})  # nearly every pod's: one shared empty mapping


def _proxy_container(spec: PodSpec) -> Container | None:
    for container in spec.containers:
        if container.name == PROXY_CONTAINER:
            return container
    # The native-sidecar form: an init container that keeps running.
    for container in spec.init_containers:
        if container.name == PROXY_CONTAINER:
            return container
    return None


def _proxy(
    spec: PodSpec, annotations: Mapping[str, str], container_ports: Mapping[str, tuple[int, ...]]
) -> ProxyFacts | None:
    """Whether a proxy runs in the pod, and its ports (from its env, as Linkerd reads them, else its port names)."""
    container = _proxy_container(spec)
    if container is None and PROXY_VERSION_ANNOTATION not in annotations:
        return None
    env = {var.name: var.value for var in container.env} if container is not None else {}
    inbound = port_of_address(env.get(INBOUND_ADDR_ENV) or "")
    if inbound is None:
        named = container_ports.get(PROXY_PORT_NAME)
        inbound = named[0] if named else DEFAULT_INBOUND_PORT
    meta = {port for name in META_ADDR_ENVS if (port := port_of_address(env.get(name) or "")) is not None}
    if not meta:
        meta.update(container_ports.get(ADMIN_PORT_NAME, ()))
    return _proxy_facts(inbound, frozenset(meta))


@functools.lru_cache(maxsize=256)
def _proxy_facts(inbound: int, meta: frozenset[int]) -> ProxyFacts:
    # Nearly every pod's proxy looks the same: share one object (the index holds one per pod).
    return ProxyFacts(inbound, meta)


def _interned(labels: Mapping[str, str]) -> dict[str, str]:
    # Label keys and values repeat across thousands of pods (app, pod-template-hash, linkerd.io/...).
    return {sys.intern(k): sys.intern(v) for k, v in labels.items()}


def _owner(resource: Resource) -> tuple[str, str]:
    """The pod's owner as the pod alone tells it, collapsing ReplicaSet -> Deployment by the pod-template-hash
    (the local platform's reading; on Kubernetes ``ClusterIndex.owner_of`` reads the owner objects, as Linkerd)."""
    refs = resource.metadata.owner_references
    owner = resource.metadata.controller or (refs[0] if refs else None)
    if owner is None:
        return "pod", resource.name
    if owner.kind == "ReplicaSet":
        template_hash = resource.labels.get(POD_TEMPLATE_HASH_LABEL)
        # A Deployment names its ReplicaSets ``<deployment>-<pod-template-hash>``.
        if template_hash and owner.name.endswith(f"-{template_hash}"):
            return "deployment", owner.name[: -len(template_hash) - 1]
        return "replicaset", owner.name
    return owner_label(owner.kind), owner.name


def _service(resource: Resource) -> ServiceFacts:
    spec = resource.spec
    assert isinstance(spec, ServiceSpec)
    names = {p.name: (p.port,) for p in spec.ports if p.name}
    namespace = resource.namespace or ""
    return ServiceFacts(
        namespace=namespace,
        name=resource.name,
        resource_version=resource.metadata.resource_version or "",
        selector=spec.selector,
        ports=spec.ports,
        type=spec.type,
        cluster_ips=tuple(dict.fromkeys(ip for ip in (spec.cluster_ip, *spec.cluster_ips) if ip)),
        opaque_ports=_ports_annotation(
            resource.annotations, OPAQUE_PORTS_ANNOTATION, names, f"service {namespace}/{resource.name}"
        ),
        labels=resource.labels,
        internal_traffic_policy=spec.internal_traffic_policy,
        wants_ipv6=_wants_ipv6(resource.raw.get("spec")),
    )


def _wants_ipv6(spec: object) -> bool:
    # Read here, not by the resource model: only the destination's warning on the local platform uses them.
    if not isinstance(spec, Mapping):
        return False
    families = spec.get("ipFamilies")
    return spec.get("ipFamilyPolicy") == "RequireDualStack" or (
        isinstance(families, list) and "IPv6" in families)


def _server(resource: Resource) -> ServerFacts:
    spec = resource.spec
    assert isinstance(spec, ServerSpec)
    return ServerFacts(
        namespace=resource.namespace or "",
        name=resource.name,
        pod_selector=spec.pod_selector,
        port=spec.port,
        opaque=spec.proxy_protocol == "opaque",
    )
