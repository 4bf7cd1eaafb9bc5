"""Typed specs of the kinds that run code: Pod, Deployment (its pod template), ExternalWorkload.

`model.parse` calls the ``parse_*`` functions. The local platform starts
containers from `PodSpec`; the destination and policy indexes read container
ports, probes, service accounts and `PodStatus`; the injector reads templates.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.resources import formats
from tether.resources.core import PROTOCOLS
from tether.resources.fields import Fields
from tether.resources.meta import (
    Condition,
    ConditionsStatus,
    ObjectMeta,
    TemplateMeta,
    find_condition,
    parse_conditions,
    parse_conditions_status,
    parse_template_metadata,
)
from tether.resources.selectors import LabelSelector

RESTART_POLICIES = ("Always", "OnFailure", "Never")


@dataclass(frozen=True, slots=True)
class ContainerPort:
    container_port: int
    name: str | None = None
    protocol: str = "TCP"
    host_port: int | None = None


@dataclass(frozen=True, slots=True)
class EnvVar:
    """An environment variable: a literal ``value`` or a downward-API ``field_path``.

    Other ``valueFrom`` sources (secrets, config maps) are left in ``raw``.
    """

    name: str
    value: str | None = None
    field_path: str | None = None


@dataclass(frozen=True, slots=True)
class HttpGet:
    port: int | str
    path: str = "/"
    scheme: str = "HTTP"
    host: str | None = None


@dataclass(frozen=True, slots=True)
class Probe:
    http_get: HttpGet | None = None
    tcp_socket_port: int | str | None = None
    initial_delay_seconds: int = 0
    period_seconds: int = 10
    timeout_seconds: int = 1
    failure_threshold: int = 3
    success_threshold: int = 1


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    working_dir: str | None = None
    env: tuple[EnvVar, ...] = ()
    ports: tuple[ContainerPort, ...] = ()
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    startup_probe: Probe | None = None
    # "Always" on an init container makes it a native sidecar (how the proxy is injected by default).
    restart_policy: str | None = None


@dataclass(frozen=True, slots=True)
class PodSpec:
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...] = ()
    service_account_name: str = "default"
    automount_service_account_token: bool | None = None
    host_network: bool = False
    node_name: str | None = None
    restart_policy: str = "Always"
    termination_grace_period_seconds: int = 30

    def ports_named(self, name: str) -> tuple[ContainerPort, ...]:
        """Every container port with this name (a Server's named ``port`` selects them all)."""
        return tuple(p for c in self.containers for p in c.ports if p.name == name)


@dataclass(frozen=True, slots=True)
class PodStatus:
    phase: str | None = None
    pod_ip: str | None = None
    pod_ips: tuple[str, ...] = ()
    host_ip: str | None = None
    host_ips: tuple[str, ...] = ()
    conditions: tuple[Condition, ...] = ()

    @property
    def ready(self) -> bool:
        condition = find_condition(self.conditions, "Ready")
        return condition is not None and condition.is_true


@dataclass(frozen=True, slots=True)
class PodTemplate:
    metadata: TemplateMeta
    spec: PodSpec


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    selector: LabelSelector
    template: PodTemplate
    replicas: int = 1
    paused: bool = False


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    observed_generation: int | None = None
    replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    updated_replicas: int = 0
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadMeshTLS:
    identity: str
    server_name: str


@dataclass(frozen=True, slots=True)
class WorkloadPort:
    port: int
    name: str | None = None
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class ExternalWorkloadSpec:
    mesh_tls: WorkloadMeshTLS
    ports: tuple[WorkloadPort, ...] = ()
    workload_ips: tuple[str, ...] = ()


def parse_pod(doc: Fields, meta: ObjectMeta) -> tuple[PodSpec, PodStatus]:
    status = doc.child("status", None)
    if status is None:
        return _pod_spec(doc.child("spec")), PodStatus()
    pod_ips = tuple(node.string("ip", check=formats.ip_address) for node in status.children("podIPs"))
    return (
        _pod_spec(doc.child("spec")),
        PodStatus(
            phase=status.choice("phase", ("Pending", "Running", "Succeeded", "Failed", "Unknown"), None),
            pod_ip=status.string("podIP", None, check=formats.ip_address),
            pod_ips=pod_ips,
            host_ip=status.string("hostIP", None, check=formats.ip_address),
            host_ips=tuple(node.string("ip", check=formats.ip_address) for node in status.children("hostIPs")),
            conditions=parse_conditions(status),
        ),
    )


def parse_deployment(doc: Fields, meta: ObjectMeta) -> tuple[DeploymentSpec, DeploymentStatus]:
    spec = doc.child("spec")
    selector = LabelSelector.from_spec(spec.child("selector").data, spec.at("selector"))
    if selector.is_empty:
        raise spec.error("selector", "must not be empty")
    template = spec.child("template")
    template_meta = parse_template_metadata(template)
    if not selector.matches(template_meta.labels):
        raise template.error("metadata.labels", "does not match spec.selector")
    pod_spec = _pod_spec(template.child("spec"))
    if pod_spec.restart_policy != "Always":
        raise template.error("spec.restartPolicy", "must be Always for a Deployment")
    status = doc.child("status", None)
    return (
        DeploymentSpec(
            selector=selector,
            template=PodTemplate(template_meta, pod_spec),
            replicas=spec.integer("replicas", 1, minimum=0),
            paused=spec.boolean("paused", False),
        ),
        DeploymentStatus()
        if status is None
        else DeploymentStatus(
            observed_generation=status.integer("observedGeneration", None, minimum=0),
            replicas=status.integer("replicas", 0, minimum=0),
            ready_replicas=status.integer("readyReplicas", 0, minimum=0),
            available_replicas=status.integer("availableReplicas", 0, minimum=0),
            updated_replicas=status.integer("updatedReplicas", 0, minimum=0),
            conditions=parse_conditions(status),
        ),
    )


def parse_external_workload(doc: Fields, meta: ObjectMeta) -> tuple[ExternalWorkloadSpec, ConditionsStatus]:
    spec = doc.child("spec")
    mesh_tls = spec.child("meshTLS")
    ips = spec.children("workloadIPs")
    if len(ips) > 1:
        raise spec.error("workloadIPs", "must have at most 1 item")
    ports = tuple(
        WorkloadPort(
            port=node.port("port"),
            name=node.string("name", None, check=formats.iana_svc_name),
            protocol=node.choice("protocol", ("TCP", "UDP"), "TCP"),
        )
        for node in spec.children("ports")
    )
    return (
        ExternalWorkloadSpec(
            mesh_tls=WorkloadMeshTLS(
                identity=mesh_tls.string("identity", check=formats.non_empty),
                server_name=mesh_tls.string("serverName", check=formats.non_empty),
            ),
            ports=ports,
            workload_ips=tuple(node.string("ip", check=formats.ip_address) for node in ips),
        ),
        parse_conditions_status(doc),
    )


def _pod_spec(spec: Fields) -> PodSpec:
    names: set[str] = set()  # container names are unique across containers and init containers
    containers = _containers(spec, "containers", names)
    init_containers = _containers(spec, "initContainers", names)
    # ``serviceAccount`` is the deprecated spelling Kubernetes still honours.
    service_account = spec.string("serviceAccountName", None, check=formats.dns1123_subdomain)
    if service_account is None:
        service_account = spec.string("serviceAccount", "default", check=formats.dns1123_subdomain)
    return PodSpec(
        containers=containers,
        init_containers=init_containers,
        service_account_name=service_account,
        automount_service_account_token=spec.boolean("automountServiceAccountToken", None),
        host_network=spec.boolean("hostNetwork", False),
        node_name=spec.string("nodeName", None),
        restart_policy=spec.choice("restartPolicy", RESTART_POLICIES, "Always"),
        termination_grace_period_seconds=spec.integer("terminationGracePeriodSeconds", 30, minimum=0),
    )


def _containers(spec: Fields, key: str, names: set[str]) -> tuple[Container, ...]:
    required = key == "containers"
    out = []
    for node in spec.children(key, required=required, non_empty=required):
        container = _container(node)
        if container.name in names:
            raise node.error("name", f"duplicate container name {container.name!r}")
        names.add(container.name)
        out.append(container)
    return tuple(out)


def _container(node: Fields) -> Container:
    ports = []
    seen: set[str] = set()
    for port in node.children("ports"):
        name = port.string("name", None, check=formats.iana_svc_name)
        if name is not None and name in seen:
            raise port.error("name", f"duplicate port name {name!r}")
        seen.add(name or "")
        ports.append(
            ContainerPort(
                container_port=port.port("containerPort"),
                name=name,
                protocol=port.choice("protocol", PROTOCOLS, "TCP"),
                host_port=port.port("hostPort", None),
            )
        )
    return Container(
        name=node.string("name", check=formats.dns1123_label),
        image=node.string("image"),
        command=node.strings("command"),
        args=node.strings("args"),
        working_dir=node.string("workingDir", None),
        env=tuple(_env_var(env) for env in node.children("env")),
        ports=tuple(ports),
        liveness_probe=_probe(node.child("livenessProbe", None)),
        readiness_probe=_probe(node.child("readinessProbe", None)),
        startup_probe=_probe(node.child("startupProbe", None)),
        restart_policy=node.choice("restartPolicy", ("Always",), None),
    )


def _env_var(env: Fields) -> EnvVar:
    value_from = env.child("valueFrom", None)
    field_ref = value_from.child("fieldRef", None) if value_from else None
    return EnvVar(
        name=env.string("name", check=formats.non_empty),
        value=env.string("value", None),
        field_path=field_ref.string("fieldPath") if field_ref else None,
    )


def _probe(probe: Fields | None) -> Probe | None:
    if probe is None:
        return None
    http_get = probe.child("httpGet", None)
    tcp_socket = probe.child("tcpSocket", None)
    return Probe(
        http_get=None
        if http_get is None
        else HttpGet(
            port=http_get.int_or_string("port", check=formats.iana_svc_name),
            path=http_get.string("path", "/"),
            scheme=http_get.choice("scheme", ("HTTP", "HTTPS"), "HTTP"),
            host=http_get.string("host", None),
        ),
        tcp_socket_port=None if tcp_socket is None else tcp_socket.int_or_string("port", check=formats.iana_svc_name),
        initial_delay_seconds=probe.integer("initialDelaySeconds", 0, minimum=0),
        period_seconds=probe.integer("periodSeconds", 10, minimum=1),
        timeout_seconds=probe.integer("timeoutSeconds", 1, minimum=1),
        failure_threshold=probe.integer("failureThreshold", 3, minimum=1),
        success_threshold=probe.integer("successThreshold", 1, minimum=1),
    )
