"""What a meshed local pod carries: proxy-init and the proxy as containers of the Pod object. Pure.

The local platform meshes a pod the way Linkerd's injector does by default (native sidecar):
an init container ``linkerd-init`` (``tether init`` with proxy-init's flags) and a restartable
init container ``linkerd-proxy`` (``tether proxy`` as uid 2102, configured by the
``LINKERD2_PROXY_*`` environment, with ``/ready`` as startup and readiness probe), plus
Linkerd's labels and annotations.  The pod runner then runs them like any other containers,
so the Pod object in the store says exactly what runs, and the destination recognises the
pod as meshed from it.

Differences from the Kubernetes patch, all forced by having no containers or cluster DNS:
the control plane is addressed by the host bridge's gateway IP, the token is a file the
platform writes under its run directory, and the trust anchors are inline (as in Linkerd).
Names come from ``tether.naming``.  Caller: ``tether.platform.local.pods``.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.naming import WorkloadIdentity, control_plane_identity
from tether.platform.local import injection
from tether.ports import DEFAULT_OPAQUE_PORTS

PROXY_CONTAINER = "linkerd-proxy"
INIT_CONTAINER = "linkerd-init"
INBOUND_PORT, OUTBOUND_PORT, ADMIN_PORT, CONTROL_PORT = 4143, 4140, 4191, 4190


@dataclass(frozen=True)
class MeshContext:
    """What the platform knows about the mesh when it builds a pod."""

    version: str
    proxy_command: tuple[str, ...]
    init_command: tuple[str, ...]
    host_ip: str
    identity_port: int
    destination_port: int
    policy_port: int
    trust_anchors_pem: str
    cluster_domain: str
    trust_domain: str
    control_plane_ns: str
    cluster_networks: str
    default_log_level: str
    token_file: Callable[[str, str], Path]  # (namespace, pod) -> path
    identity_dir: Callable[[str, str], Path]


def _container_ports(spec: Mapping[str, Any]) -> tuple[dict[str, int], list[int]]:
    named: dict[str, int] = {}
    numbers: list[int] = []
    for container in spec.get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("protocol", "TCP") != "TCP":
                continue
            numbers.append(int(port["containerPort"]))
            if port.get("name"):
                named.setdefault(port["name"], int(port["containerPort"]))
    return named, numbers


def mesh(
    pod: Mapping[str, Any], namespace_annotations: Mapping[str, str], ctx: MeshContext
) -> tuple[dict[str, Any], injection.Decision, tuple[str, ...]]:
    """The Pod object as the platform runs it: meshed when the annotations say so.

    Returns the new object, the decision and the annotation problems that were ignored.
    Every pod also gets Linkerd's default opaque-ports annotation when it exposes one of
    those ports and nothing set it (the injector's annotation-only patch).
    """
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    spec = out.setdefault("spec", {})
    annotations = meta.setdefault("annotations", {})
    named, numbers = _container_ports(spec)
    decision = injection.decide(out, namespace_annotations)
    merged = injection.effective_annotations(annotations, namespace_annotations)
    if injection.OPAQUE_PORTS not in merged:
        default = injection.default_opaque_ports(numbers)
        if default:
            annotations[injection.OPAQUE_PORTS] = default
            merged[injection.OPAQUE_PORTS] = default
    if not decision.inject:
        return out, decision, ()
    settings = injection.settings(merged, named, default_log_level=ctx.default_log_level)
    # Linkerd copies the inheritable namespace annotations onto the pod.
    for key in injection.INHERITED:
        if key in namespace_annotations and key not in annotations:
            annotations[key] = namespace_annotations[key]
    annotations["linkerd.io/created-by"] = f"tether/local-platform {ctx.version}"
    annotations["linkerd.io/proxy-version"] = ctx.version
    annotations["linkerd.io/trust-root-sha256"] = hashlib.sha256(ctx.trust_anchors_pem.encode()).hexdigest()
    labels = meta.setdefault("labels", {})
    labels["linkerd.io/control-plane-ns"] = ctx.control_plane_ns
    labels["linkerd.io/workload-ns"] = meta["namespace"]
    owner = annotations.get("local.tether.io/deployment")
    if owner:
        labels["linkerd.io/proxy-deployment"] = owner
    spec["initContainers"] = [
        _init_container(settings, ctx),
        _proxy_container(out, settings, decision.mode, sorted({str(p) for p in numbers}), ctx),
        *(spec.get("initContainers") or ()),
    ]
    return out, decision, settings.problems


def _init_container(settings: injection.MeshSettings, ctx: MeshContext) -> dict[str, Any]:
    inbound_skip = ",".join(p for p in (f"{CONTROL_PORT},{ADMIN_PORT}", settings.skip_inbound_ports) if p)
    args = [
        "--incoming-proxy-port", str(INBOUND_PORT),
        "--outgoing-proxy-port", str(OUTBOUND_PORT),
        "--proxy-uid", str(settings.proxy_uid),
        "--inbound-ports-to-ignore", inbound_skip,
    ]
    if settings.skip_outbound_ports:
        args += ["--outbound-ports-to-ignore", settings.skip_outbound_ports]
    if settings.skip_subnets:
        args += ["--subnets-to-ignore", settings.skip_subnets]
    args.append("--ipv6=false")  # local pods have IPv4 addresses only
    return {
        "name": INIT_CONTAINER,
        "image": f"tether/proxy:{ctx.version}",
        "command": list(ctx.init_command),
        "args": args,
        "securityContext": {
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]},
            "runAsUser": 0,
            "readOnlyRootFilesystem": True,
        },
    }


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _value(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _proxy_container(
    pod: Mapping[str, Any], settings: injection.MeshSettings, mode: str, inbound_ports: list[str], ctx: MeshContext
) -> dict[str, Any]:
    meta = pod["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    service_account = pod["spec"].get("serviceAccountName") or "default"
    local = WorkloadIdentity(service_account, namespace, ctx.control_plane_ns, ctx.trust_domain)
    identity_svc = control_plane_identity("identity", ctx.control_plane_ns, ctx.trust_domain)
    destination_svc = control_plane_identity("destination", ctx.control_plane_ns, ctx.trust_domain)
    opaque = settings.opaque_ports or str(DEFAULT_OPAQUE_PORTS)
    env = [
        _field("_pod_name", "metadata.name"),
        _field("_pod_ns", "metadata.namespace"),
        _field("_pod_uid", "metadata.uid"),
        _field("_pod_nodeName", "spec.nodeName"),
        _field("_pod_sa", "spec.serviceAccountName"),
        _value("_pod_containerName", PROXY_CONTAINER),
        _value("_l5d_ns", ctx.control_plane_ns),
        _value("_l5d_trustdomain", ctx.trust_domain),
        _value("LINKERD2_PROXY_LOG", settings.log_level),
        _value("LINKERD2_PROXY_LOG_FORMAT", settings.log_format.lower()),
        _value("LINKERD2_PROXY_DESTINATION_SVC_ADDR", f"{ctx.host_ip}:{ctx.destination_port}"),
        _value("LINKERD2_PROXY_DESTINATION_SVC_NAME", destination_svc.dns_name),
        _value("LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS", ctx.cluster_networks),
        _value("LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES", f"svc.{ctx.cluster_domain}."),
        _value("LINKERD2_PROXY_DESTINATION_CONTEXT",
               '{"ns":"$(_pod_ns)", "nodeName":"$(_pod_nodeName)", "pod":"$(_pod_name)"}'),
        _value("LINKERD2_PROXY_POLICY_SVC_ADDR", f"{ctx.host_ip}:{ctx.policy_port}"),
        _value("LINKERD2_PROXY_POLICY_SVC_NAME", destination_svc.dns_name),
        _value("LINKERD2_PROXY_POLICY_WORKLOAD", '{"ns":"$(_pod_ns)", "pod":"$(_pod_name)"}'),
        _value("LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS", ctx.cluster_networks),
        _value("LINKERD2_PROXY_INBOUND_DEFAULT_POLICY", settings.default_inbound_policy),
        _value("LINKERD2_PROXY_CONTROL_STREAM_INITIAL_TIMEOUT", "3s"),
        _value("LINKERD2_PROXY_CONTROL_STREAM_IDLE_TIMEOUT", "5m"),
        _value("LINKERD2_PROXY_CONTROL_STREAM_LIFETIME", "1h"),
        _value("LINKERD2_PROXY_INBOUND_CONNECT_TIMEOUT", "100ms"),
        _value("LINKERD2_PROXY_OUTBOUND_CONNECT_TIMEOUT", "1000ms"),
        _value("LINKERD2_PROXY_OUTBOUND_DISCOVERY_IDLE_TIMEOUT", "5s"),
        _value("LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT", "90s"),
        _value("LINKERD2_PROXY_CONTROL_LISTEN_ADDR", f"0.0.0.0:{CONTROL_PORT}"),
        _value("LINKERD2_PROXY_ADMIN_LISTEN_ADDR", f"0.0.0.0:{ADMIN_PORT}"),
        _value("LINKERD2_PROXY_OUTBOUND_LISTEN_ADDR", f"127.0.0.1:{OUTBOUND_PORT}"),
        _value("LINKERD2_PROXY_OUTBOUND_LISTEN_ADDRS", f"127.0.0.1:{OUTBOUND_PORT}"),
        _value("LINKERD2_PROXY_INBOUND_LISTEN_ADDR", f"0.0.0.0:{INBOUND_PORT}"),
        _field("LINKERD2_PROXY_INBOUND_IPS", "status.podIPs"),
        _value("LINKERD2_PROXY_INBOUND_PORTS", ",".join(inbound_ports)),
        _value("LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION", opaque),
        _value("LINKERD2_PROXY_INBOUND_ACCEPT_KEEPALIVE", "10000ms"),
        _value("LINKERD2_PROXY_OUTBOUND_CONNECT_KEEPALIVE", "10000ms"),
        _value("LINKERD2_PROXY_INBOUND_ACCEPT_USER_TIMEOUT", "30s"),
        _value("LINKERD2_PROXY_OUTBOUND_CONNECT_USER_TIMEOUT", "30s"),
        _value("LINKERD2_PROXY_IDENTITY_DIR", str(ctx.identity_dir(namespace, name))),
        _value("LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS", ctx.trust_anchors_pem),
        _value("LINKERD2_PROXY_IDENTITY_TOKEN_FILE", str(ctx.token_file(namespace, name))),
        _value("LINKERD2_PROXY_IDENTITY_SVC_ADDR", f"{ctx.host_ip}:{ctx.identity_port}"),
        _value("LINKERD2_PROXY_IDENTITY_LOCAL_NAME", local.dns_name),
        _value("LINKERD2_PROXY_IDENTITY_SVC_NAME", identity_svc.dns_name),
    ]
    if mode == injection.INGRESS:
        env.append(_value("LINKERD2_PROXY_INGRESS_MODE", "true"))
    ready = {"httpGet": {"path": "/ready", "port": ADMIN_PORT}}
    return {
        "name": PROXY_CONTAINER,
        "image": f"tether/proxy:{ctx.version}",
        "command": list(ctx.proxy_command),
        "restartPolicy": "Always",
        "env": env,
        "ports": [
            {"name": "linkerd-proxy", "containerPort": INBOUND_PORT},
            {"name": "linkerd-admin", "containerPort": ADMIN_PORT},
        ],
        "startupProbe": {**ready, "periodSeconds": 1, "failureThreshold": 120},
        "readinessProbe": {**ready, "periodSeconds": 1, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/live", "port": ADMIN_PORT}, "periodSeconds": 10,
                          "failureThreshold": 3},
        "securityContext": {
            "runAsUser": settings.proxy_uid,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
        },
    }


def is_meshed(pod: Mapping[str, Any]) -> bool:
    return any(c.get("name") == PROXY_CONTAINER for c in (pod.get("spec") or {}).get("initContainers") or ())
