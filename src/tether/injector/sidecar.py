"""What the patch adds to a pod: the proxy container and its environment, ``linkerd-init`` or the
network validator, the debug container and the identity volumes (Linkerd's ``charts/partials``).

Caller: `patch`, which first resolves one `Settings` from the mesh configuration and the pod's
effective annotations (`resolve`), then asks for each piece. Everything returns fresh plain
dicts in Kubernetes' JSON shape; nothing here reads or changes the pod.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tether.injector import annotations as a
from tether.injector.config import DEFAULT_POLICIES, IDENTITY_AUDIENCE, MeshConfig, ProbeTiming
from tether.injector.decision import DEBUG_CONTAINER, INIT_CONTAINER, PROXY_CONTAINER, VALIDATOR_CONTAINER
from tether.naming import ServiceAuthority, WorkloadIdentity, control_plane_identity
from tether.ports import PortSet
from tether.resources.quantities import parse_quantity

END_ENTITY_VOLUME = "linkerd-identity-end-entity"
TOKEN_VOLUME = "linkerd-identity-token"
XTABLES_VOLUME = "linkerd-proxy-init-xtables-lock"
VOLUMES = (END_ENTITY_VOLUME, TOKEN_VOLUME, XTABLES_VOLUME, "linkerd-podinfo")
CONTAINERS = (PROXY_CONTAINER, INIT_CONTAINER, VALIDATOR_CONTAINER, DEBUG_CONTAINER)

END_ENTITY_DIR = "/var/run/linkerd/identity/end-entity"
TOKEN_DIR = "/var/run/secrets/tokens"
TOKEN_FILE = f"{TOKEN_DIR}/{TOKEN_VOLUME}"
SA_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
TOKEN_EXPIRATION_SECONDS = 86400

# Kept as Linkerd's chart writes them: keepalives and TCP user timeouts.
_KEEPALIVE = "10000ms"
_USER_TIMEOUT = "30s"
_DETECT_TIMEOUT_DISABLED = "365d"


@dataclass(frozen=True, slots=True)
class Settings:
    """One pod's proxy configuration: the mesh defaults with its annotations applied."""

    config: MeshConfig
    admin_port: int
    control_port: int
    inbound_port: int
    outbound_port: int
    image: str
    version: str
    pull_policy: str
    uid: int
    gid: int | None
    log_filter: str
    log_format: str
    resources: dict[str, dict[str, str]]
    cores_min: int
    cores_max: int | None
    cores_max_ratio: float | None
    opaque_ports: str  # for LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION
    inbound_ports: str  # for LINKERD2_PROXY_INBOUND_PORTS
    skip_inbound_ports: str
    skip_outbound_ports: str
    skip_subnets: str
    native_sidecar: bool
    await_: bool
    wait_before_exit_seconds: int
    default_policy: str
    access_log: str
    shutdown_grace_period: str
    outbound_connect_timeout: str
    inbound_connect_timeout: str
    outbound_discovery_timeout: str
    inbound_discovery_timeout: str
    disable_outbound_detect_timeout: bool
    disable_inbound_detect_timeout: bool
    external_profiles: bool
    shutdown_endpoint: bool
    hostname_labels: bool
    require_identity_ports: str
    ingress: bool
    gateway: bool
    additional_env: tuple[Mapping[str, Any], ...]
    debug: bool
    debug_image: str
    debug_pull_policy: str
    capabilities: Mapping[str, Any] | None


def resolve(
    config: MeshConfig,
    reader: a.AnnotationReader,
    spec: Mapping[str, Any],
    *,
    pod_annotations: Mapping[str, str],
    namespace_annotations: Mapping[str, str],
    mode: str,
    control_plane_pod: bool,
) -> Settings:
    """The pod's settings; invalid annotation values land in ``reader.warnings``."""
    c = config
    key = a.CONFIG
    containers = spec.get("containers") or []
    port_names = _container_port_names(containers)
    version = reader.text(key + "proxy-version", c.proxy_version)
    headers = reader.choice(key + "proxy-log-http-headers", ("off", "insecure"), c.log_http_headers)
    log_level = reader.text(key + "proxy-log-level", c.log_level)
    skip_outbound = reader.ports(key + "skip-outbound-ports", c.proxy_init.ignore_outbound_ports)
    if control_plane_pod:
        skip_outbound += a.parse_port_list(c.proxy_init.kube_api_server_ports)
    admin = reader.port(key + "admin-port", c.ports.admin)
    control = reader.port(key + "control-port", c.ports.control)
    cpu_request = reader.quantity(key + "proxy-cpu-request", c.resources.cpu_request)
    cpu_limit = reader.quantity(key + "proxy-cpu-limit", c.resources.cpu_limit)
    resources = _resources(
        {
            "cpu": (cpu_request, cpu_limit),
            "memory": (
                reader.quantity(key + "proxy-memory-request", c.resources.memory_request),
                reader.quantity(key + "proxy-memory-limit", c.resources.memory_limit),
            ),
            "ephemeral-storage": (
                reader.quantity(key + "proxy-ephemeral-storage-request", c.resources.ephemeral_storage_request),
                reader.quantity(key + "proxy-ephemeral-storage-limit", c.resources.ephemeral_storage_limit),
            ),
        }
    )
    gid = reader.integer(key + "proxy-gid", c.proxy_gid, minimum=-1)
    debug_version = reader.text(key + "debug-image-version", c.debug_image_version or version)
    first_security = containers[0].get("securityContext") if containers else None
    return Settings(
        config=c,
        admin_port=admin,
        control_port=control,
        inbound_port=reader.port(key + "inbound-port", c.ports.inbound),
        outbound_port=reader.port(key + "outbound-port", c.ports.outbound),
        image=reader.text(key + "proxy-image", c.proxy_image),
        version=version,
        pull_policy=reader.choice(key + "image-pull-policy", ("Always", "IfNotPresent", "Never"), c.image_pull_policy),
        uid=reader.integer(key + "proxy-uid", c.proxy_uid, minimum=0),
        gid=gid if gid >= 0 else None,
        log_filter=log_level if headers == "insecure" else f"{log_level},[{{headers}}]=off,[{{request}}]=off",
        log_format=reader.choice(key + "proxy-log-format", ("plain", "json"), c.log_format),
        resources=resources,
        cores_min=_cores(cpu_request) or c.workers_minimum,
        cores_max=_cores(cpu_limit) or c.workers_maximum,
        cores_max_ratio=reader.ratio(key + "proxy-cpu-ratio-limit") or c.workers_maximum_cpu_ratio,
        opaque_ports=",".join(reader.ports(a.OPAQUE_PORTS, c.opaque_ports, names=port_names)),
        inbound_ports=",".join(_inbound_ports(containers)),
        skip_inbound_ports=",".join(
            [str(control), str(admin), *reader.ports(key + "skip-inbound-ports", c.proxy_init.ignore_inbound_ports)]
        ),
        skip_outbound_ports=",".join(skip_outbound),
        skip_subnets=_subnets(reader, key + "skip-subnets", c.proxy_init.skip_subnets),
        native_sidecar=_native_sidecar(reader, c.native_sidecar),
        await_=reader.enabled(key + "proxy-await", c.await_),
        wait_before_exit_seconds=reader.integer(a.WAIT_BEFORE_EXIT, c.wait_before_exit_seconds, minimum=0),
        default_policy=reader.choice(key + "default-inbound-policy", DEFAULT_POLICIES, c.default_inbound_policy),
        access_log=reader.choice(key + "access-log", ("apache", "json"), c.access_log),
        shutdown_grace_period=_millis(reader.duration(key + "shutdown-grace-period", None), c.shutdown_grace_period),
        outbound_connect_timeout=_millis(
            reader.duration(key + "proxy-outbound-connect-timeout", None), c.outbound_connect_timeout
        ),
        inbound_connect_timeout=_millis(
            reader.duration(key + "proxy-inbound-connect-timeout", None), c.inbound_connect_timeout
        ),
        outbound_discovery_timeout=_seconds(
            reader.duration(key + "proxy-outbound-discovery-cache-unused-timeout", None),
            c.outbound_discovery_cache_unused_timeout,
        ),
        inbound_discovery_timeout=_seconds(
            reader.duration(key + "proxy-inbound-discovery-cache-unused-timeout", None),
            c.inbound_discovery_cache_unused_timeout,
        ),
        disable_outbound_detect_timeout=reader.boolean(
            key + "proxy-disable-outbound-protocol-detect-timeout", c.disable_outbound_protocol_detect_timeout
        ),
        disable_inbound_detect_timeout=reader.boolean(
            key + "proxy-disable-inbound-protocol-detect-timeout", c.disable_inbound_protocol_detect_timeout
        ),
        external_profiles=reader.boolean(key + "enable-external-profiles", c.enable_external_profiles),
        shutdown_endpoint=reader.enabled(key + "proxy-admin-shutdown", c.enable_shutdown_endpoint),
        hostname_labels=reader.boolean(key + "proxy-metrics-hostname-labels", c.metrics_hostname_labels),
        require_identity_ports=",".join(
            reader.ports(key + "proxy-require-identity-inbound-ports", c.require_identity_on_inbound_ports)
        ),
        ingress=mode == a.INJECT_INGRESS,
        gateway=reader.boolean(key + "enable-gateway", False),
        additional_env=_additional_env(
            reader, c.additional_env, namespace_annotations.get(a.ADDITIONAL_ENV), pod_annotations.get(a.ADDITIONAL_ENV)
        ),
        debug=reader.boolean(key + "enable-debug-sidecar", False),
        debug_image=f"{reader.text(key + 'debug-image', c.debug_image)}:{debug_version}",
        debug_pull_policy=reader.choice(
            key + "debug-image-pull-policy", ("Always", "IfNotPresent", "Never"), c.image_pull_policy
        ),
        capabilities=first_security.get("capabilities") if isinstance(first_security, Mapping) else None,
    )


def default_opaque_ports(config: MeshConfig, spec: Mapping[str, Any]) -> str:
    """The default opaque ports the pod exposes as container ports (what the patch annotates)."""
    defaults = PortSet.parse(config.opaque_ports)
    exposed = {p for c in spec.get("containers") or [] for p in _ports_of(c)}
    return ",".join(str(p) for p in sorted(p for p in exposed if p in defaults))


def _ports_of(container: Mapping[str, Any]) -> list[int]:
    out = []
    for port in container.get("ports") or []:
        number = port.get("containerPort") if isinstance(port, Mapping) else None
        if isinstance(number, int) and not isinstance(number, bool):
            out.append(number)
    return out


def _container_port_names(containers: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    names: dict[str, int] = {}
    for container in containers:
        for port in container.get("ports") or []:
            if isinstance(port, Mapping) and isinstance(port.get("name"), str) and isinstance(port.get("containerPort"), int):
                names.setdefault(port["name"], port["containerPort"])
    return names


def _inbound_ports(containers: Sequence[Mapping[str, Any]]) -> list[str]:
    """Container ports and numeric HTTP probe ports, string-sorted as Linkerd does."""
    ports = {str(p) for c in containers for p in _ports_of(c)}
    for container in containers:
        for name in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = container.get(name)
            http_get = probe.get("httpGet") if isinstance(probe, Mapping) else None
            port = http_get.get("port") if isinstance(http_get, Mapping) else None
            if isinstance(port, int) and not isinstance(port, bool):
                ports.add(str(port))
    return sorted(ports)


def _native_sidecar(reader: a.AnnotationReader, default: bool) -> bool:
    """Stable, then beta, then alpha annotation; the first present wins."""
    for key in (a.NATIVE_SIDECAR, a.NATIVE_SIDECAR_BETA, a.NATIVE_SIDECAR_ALPHA):
        if reader.has(key):
            return reader.boolean(key, default)
    return default


def _subnets(reader: a.AnnotationReader, key: str, default: str) -> str:
    def parse(text: str) -> str:
        items = [s.strip() for s in text.split(",") if s.strip()]
        for item in items:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not a CIDR") from None
        return ",".join(items)

    return reader.read(key, parse, default)


def _resources(pairs: Mapping[str, tuple[str, str]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for resource, (request, limit) in pairs.items():
        if request:
            out.setdefault("requests", {})[resource] = request
        if limit:
            out.setdefault("limits", {})[resource] = limit
    return out


def _cores(quantity: str) -> int | None:
    if not quantity:
        return None
    return max(1, math.ceil(parse_quantity(quantity).value))


def _millis(seconds: float | None, default: str) -> str:
    return default if seconds is None else f"{round(seconds * 1000)}ms"


def _seconds(seconds: float | None, default: str) -> str:
    return default if seconds is None else f"{int(seconds)}s"


def _additional_env(
    reader: a.AnnotationReader, base: Sequence[Mapping[str, Any]], ns_text: str | None, pod_text: str | None
) -> tuple[Mapping[str, Any], ...]:
    """Helm ``proxy.additionalEnv`` < namespace annotation < workload annotation, merged by name."""
    merged: dict[str, Mapping[str, Any]] = {e["name"]: e for e in base}
    for where, text in (("namespace", ns_text), ("workload", pod_text)):
        if text is None:
            continue
        try:
            items = json.loads(text)
            if not isinstance(items, list) or not all(
                isinstance(i, dict) and isinstance(i.get("name"), str) and i["name"] for i in items
            ):
                raise ValueError("expected a JSON list of {name, value} objects")
        except ValueError as err:
            reader.warnings.append(f"ignoring {a.ADDITIONAL_ENV} on the {where}: {err}")
            continue
        for item in items:
            merged[item["name"]] = item
    return tuple(merged.values())


# --- the containers ---------------------------------------------------------------------------------


def _image(s: Settings) -> str:
    return f"{s.image}:{s.version}"


def _listen(s: Settings, port: int, *, loopback: bool = False) -> str:
    if loopback:
        return f"127.0.0.1:{port}" if s.config.disable_ipv6 else f"127.0.0.1:{port},[::1]:{port}"
    return f"0.0.0.0:{port}" if s.config.disable_ipv6 else f"[::]:{port}"


def _svc_addr(s: Settings, service: str, port: int, placed: str) -> str:
    if placed:
        return placed
    fqdn = ServiceAuthority(service, s.config.control_plane_ns, port, s.config.cluster_domain).fqdn
    return f"{fqdn}.:{port}"


def _identity_of(s: Settings, component: str) -> str:
    return control_plane_identity(component, s.config.control_plane_ns, s.config.effective_trust_domain).dns_name


def _local_name_template(s: Settings) -> str:
    """``$(_pod_sa).$(_pod_ns).<suffix>``: the kubelet fills in the pod's service account and namespace."""
    sample = WorkloadIdentity("sa", "ns", s.config.control_plane_ns, s.config.effective_trust_domain).dns_name
    suffix = sample.split(".", 2)[2]
    return f"$(_pod_sa).$(_pod_ns).{suffix}"


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _var(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def proxy_env(s: Settings) -> list[dict[str, Any]]:
    """The ``LINKERD2_PROXY_*`` environment, in the chart's order (a ``$(var)`` follows its definition)."""
    c = s.config
    p = "LINKERD2_PROXY_"
    cd = c.cluster_domain
    env = [
        _field("_pod_name", "metadata.name"),
        _field("_pod_ns", "metadata.namespace"),
        _field("_pod_uid", "metadata.uid"),
        _field("_pod_ip", "status.podIP"),
        _field("_pod_nodeName", "spec.nodeName"),
        _var("_pod_containerName", PROXY_CONTAINER),
        _field("_pod_sa", "spec.serviceAccountName"),
        _var("_l5d_ns", c.control_plane_ns),
        _var("_l5d_trustdomain", c.effective_trust_domain),
    ]
    if s.cores_max is not None:
        env.append(_var(p + "CORES", str(s.cores_max)))
    env.append(_var(p + "CORES_MIN", str(s.cores_min)))
    if s.cores_max is not None:
        env.append(_var(p + "CORES_MAX", str(s.cores_max)))
    if s.cores_max_ratio is not None:
        env.append(_var(p + "CORES_MAX_RATIO", repr(s.cores_max_ratio)))
    if s.require_identity_ports:
        env.append(_var(p + "INBOUND_PORTS_REQUIRE_IDENTITY", s.require_identity_ports))
    env += [
        _var(p + "SHUTDOWN_ENDPOINT_ENABLED", "true" if s.shutdown_endpoint else "false"),
        _var(p + "LOG", s.log_filter),
        _var(p + "LOG_FORMAT", s.log_format),
        _var(p + "DESTINATION_SVC_ADDR", _svc_addr(s, "linkerd-dst-headless", 8086, c.placement.destination_addr)),
        _var(p + "DESTINATION_PROFILE_NETWORKS", c.cluster_networks),
        _var(p + "POLICY_SVC_ADDR", _svc_addr(s, "linkerd-policy", 8090, c.placement.policy_addr)),
        _var(p + "POLICY_WORKLOAD", '{"ns":"$(_pod_ns)", "pod":"$(_pod_name)"}'),
        _var(p + "INBOUND_DEFAULT_POLICY", s.default_policy),
        _var(p + "POLICY_CLUSTER_NETWORKS", c.cluster_networks),
        _var(p + "CONTROL_STREAM_INITIAL_TIMEOUT", c.control_stream_initial_timeout),
        _var(p + "CONTROL_STREAM_IDLE_TIMEOUT", c.control_stream_idle_timeout),
        _var(p + "CONTROL_STREAM_LIFETIME", c.control_stream_lifetime),
        _var(p + "INBOUND_CONNECT_TIMEOUT", s.inbound_connect_timeout),
        _var(p + "OUTBOUND_CONNECT_TIMEOUT", s.outbound_connect_timeout),
        _var(p + "OUTBOUND_DISCOVERY_IDLE_TIMEOUT", s.outbound_discovery_timeout),
        _var(p + "INBOUND_DISCOVERY_IDLE_TIMEOUT", s.inbound_discovery_timeout),
    ]
    if s.disable_outbound_detect_timeout:
        env.append(_var(p + "OUTBOUND_DETECT_TIMEOUT", _DETECT_TIMEOUT_DISABLED))
    if s.disable_inbound_detect_timeout:
        env.append(_var(p + "INBOUND_DETECT_TIMEOUT", _DETECT_TIMEOUT_DISABLED))
    env += [
        _var(p + "CONTROL_LISTEN_ADDR", _listen(s, s.control_port)),
        _var(p + "ADMIN_LISTEN_ADDR", _listen(s, s.admin_port)),
        _var(p + "OUTBOUND_LISTEN_ADDR", f"127.0.0.1:{s.outbound_port}"),
        _var(p + "OUTBOUND_LISTEN_ADDRS", _listen(s, s.outbound_port, loopback=True)),
        _var(p + "INBOUND_LISTEN_ADDR", _listen(s, s.inbound_port)),
        _field(p + "INBOUND_IPS", "status.podIPs"),
        _var(p + "INBOUND_PORTS", s.inbound_ports),
    ]
    if s.gateway:
        env.append(_var(p + "INBOUND_GATEWAY_SUFFIXES", f"svc.{cd}."))
    if s.ingress:
        env.append(_var(p + "INGRESS_MODE", "true"))
    env += [
        _var(p + "DESTINATION_PROFILE_SUFFIXES", "." if s.external_profiles else f"svc.{cd}."),
        _var(p + "INBOUND_ACCEPT_KEEPALIVE", _KEEPALIVE),
        _var(p + "OUTBOUND_CONNECT_KEEPALIVE", _KEEPALIVE),
        _var(p + "INBOUND_ACCEPT_USER_TIMEOUT", _USER_TIMEOUT),
        _var(p + "OUTBOUND_CONNECT_USER_TIMEOUT", _USER_TIMEOUT),
    ]
    if s.hostname_labels:
        env.append(_var(p + "OUTBOUND_METRICS_HOSTNAME_LABELS", "true"))
    for direction in ("INBOUND", "OUTBOUND"):
        env += [
            _var(f"{p}{direction}_SERVER_HTTP2_KEEP_ALIVE_INTERVAL", c.http2_keep_alive_interval),
            _var(f"{p}{direction}_SERVER_HTTP2_KEEP_ALIVE_TIMEOUT", c.http2_keep_alive_timeout),
        ]
    env += [
        _var(p + "INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION", s.opaque_ports),
        _var(p + "DESTINATION_CONTEXT", '{"ns":"$(_pod_ns)", "nodeName":"$(_pod_nodeName)", "pod":"$(_pod_name)"}'),
        _var(p + "IDENTITY_DIR", c.placement.identity_dir or END_ENTITY_DIR),
        _var(p + "IDENTITY_TRUST_ANCHORS", c.trust_anchors_pem),
        _var(p + "IDENTITY_TOKEN_FILE", c.placement.token_file or (TOKEN_FILE if c.token_projection else SA_TOKEN_FILE)),
        _var(p + "IDENTITY_SVC_ADDR", _svc_addr(s, "linkerd-identity-headless", 8080, c.placement.identity_addr)),
        _var(p + "IDENTITY_LOCAL_NAME", _local_name_template(s)),
        _var(p + "IDENTITY_SVC_NAME", _identity_of(s, "identity")),
        _var(p + "DESTINATION_SVC_NAME", _identity_of(s, "destination")),
        _var(p + "POLICY_SVC_NAME", _identity_of(s, "destination")),
    ]
    if s.access_log:
        env.append(_var(p + "ACCESS_LOG", s.access_log))
    if s.shutdown_grace_period:
        env.append(_var(p + "SHUTDOWN_GRACE_PERIOD", s.shutdown_grace_period))
    # Additional variables replace a standard one of the same name in place, else follow.
    index = {e["name"]: i for i, e in enumerate(env)}
    for extra in s.additional_env:
        if extra["name"] in index:
            env[index[extra["name"]]] = dict(extra)
        else:
            env.append(dict(extra))
    return env


def _http_probe(path: str, port: int, timing: ProbeTiming) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": path, "port": port}, "initialDelaySeconds": timing.initial_delay_seconds}
    if timing.period_seconds is not None:
        probe["periodSeconds"] = timing.period_seconds
    if timing.failure_threshold is not None:
        probe["failureThreshold"] = timing.failure_threshold
    probe["timeoutSeconds"] = timing.timeout_seconds
    return probe


def proxy_container(s: Settings) -> dict[str, Any]:
    """``linkerd-proxy``: as a native sidecar (an init container) or a classic one, per ``s``."""
    c = s.config
    container: dict[str, Any] = {"name": PROXY_CONTAINER, "image": _image(s), "imagePullPolicy": s.pull_policy}
    if c.commands.proxy:
        container["command"] = list(c.commands.proxy)
    container["env"] = proxy_env(s)
    if not s.native_sidecar:
        lifecycle: dict[str, Any] = {}
        if s.await_:
            lifecycle["postStart"] = {
                "exec": {"command": [*c.commands.await_, "--timeout=2m", f"--port={s.admin_port}"]}
            }
        if s.wait_before_exit_seconds > 0:
            lifecycle["preStop"] = {"exec": {"command": ["/bin/sleep", str(s.wait_before_exit_seconds)]}}
        if lifecycle:
            container["lifecycle"] = lifecycle
    container["livenessProbe"] = _http_probe("/live", s.admin_port, c.liveness_probe)
    container["ports"] = [
        {"containerPort": s.inbound_port, "name": "linkerd-proxy"},
        {"containerPort": s.admin_port, "name": "linkerd-admin"},
    ]
    container["readinessProbe"] = _http_probe("/ready", s.admin_port, c.readiness_probe)
    if s.resources:
        container["resources"] = s.resources
    if s.native_sidecar:
        container["restartPolicy"] = "Always"
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": s.uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if s.gid is not None:
        security["runAsGroup"] = s.gid
    if s.capabilities:
        security["capabilities"] = dict(s.capabilities)
    container["securityContext"] = security
    if s.native_sidecar and s.await_:
        container["startupProbe"] = _http_probe("/ready", s.admin_port, c.startup_probe)
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    mounts = [{"mountPath": END_ENTITY_DIR, "name": END_ENTITY_VOLUME}]
    if c.token_projection:
        mounts.append({"mountPath": TOKEN_DIR, "name": TOKEN_VOLUME})
    container["volumeMounts"] = mounts
    return container


def init_args(s: Settings) -> list[str]:
    """``tether init`` flags (linkerd2-proxy-init's names)."""
    c = s.config
    args: list[str] = []
    if c.proxy_init.iptables_mode == "nft":
        args += ["--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save"]
    elif c.proxy_init.iptables_mode == "legacy":
        args += ["--firewall-bin-path", "iptables-legacy", "--firewall-save-bin-path", "iptables-legacy-save"]
    # HOST_IPTABLES: the host's own `iptables` (tether init's default), as the local platform's other rules use.
    if c.disable_ipv6:
        args.append("--ipv6=false")
    args += [
        "--incoming-proxy-port", str(s.inbound_port),
        "--outgoing-proxy-port", str(s.outbound_port),
        "--proxy-uid", str(s.uid),
    ]  # fmt: skip
    if s.gid is not None:
        args += ["--proxy-gid", str(s.gid)]
    args += ["--inbound-ports-to-ignore", s.skip_inbound_ports, "--outbound-ports-to-ignore", s.skip_outbound_ports]
    if s.skip_subnets:
        args += ["--subnets-to-ignore", s.skip_subnets]
    return args


def init_container(s: Settings) -> dict[str, Any]:
    """``linkerd-init``: ``tether init`` sets the pod's nat rules, then exits."""
    init = s.config.proxy_init
    root = init.run_as_root
    return {
        "name": INIT_CONTAINER,
        "image": _image(s),
        "imagePullPolicy": s.pull_policy,
        "command": list(s.config.commands.init),
        "args": init_args(s),
        "securityContext": {
            "allowPrivilegeEscalation": init.privileged,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]},
            "privileged": init.privileged,
            "readOnlyRootFilesystem": True,
            "runAsGroup": 0 if root else init.run_as_group,
            "runAsNonRoot": not root,
            "runAsUser": 0 if root else init.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"mountPath": init.xt_mount_path, "name": XTABLES_VOLUME}],
    }


def validator_container(s: Settings) -> dict[str, Any]:
    """``linkerd-network-validator``: with CNI, proves redirection works before the pod starts."""
    v = s.config.network_validator
    host = v.listen_addr.rpartition(":")[0] or "0.0.0.0"
    return {
        "name": VALIDATOR_CONTAINER,
        "image": _image(s),
        "imagePullPolicy": s.pull_policy,
        "command": list(s.config.commands.network_validator),
        "args": [
            "--log-format", v.log_format,
            "--log-level", v.log_level,
            "--connect-addr", v.connect_addr,
            "--listen-addr", f"{host}:{s.outbound_port}",
            "--timeout", v.timeout,
        ],  # fmt: skip
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsGroup": s.config.proxy_init.run_as_group,
            "runAsNonRoot": True,
            "runAsUser": s.config.proxy_init.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def debug_container(s: Settings) -> dict[str, Any]:
    return {
        "name": DEBUG_CONTAINER,
        "image": s.debug_image,
        "imagePullPolicy": s.debug_pull_policy,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def volumes(s: Settings) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not s.config.cni_enabled:
        out.append({"name": XTABLES_VOLUME, "emptyDir": {}})
    out.append({"name": END_ENTITY_VOLUME, "emptyDir": {"medium": "Memory"}})
    if s.config.token_projection:
        out.append(
            {
                "name": TOKEN_VOLUME,
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": IDENTITY_AUDIENCE,
                                "expirationSeconds": TOKEN_EXPIRATION_SECONDS,
                                "path": TOKEN_VOLUME,
                            }
                        }
                    ]
                },
            }
        )
    return out
