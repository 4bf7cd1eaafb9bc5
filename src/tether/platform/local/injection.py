"""Whether a local pod gets the proxy, and the ``config.linkerd.io`` settings that shape it.

The local platform decides injection the way Linkerd's webhook does (control-plane.md §4.2):
``linkerd.io/inject`` on the namespace or on the pod template (``enabled``, ``ingress`` or
``disabled``); a namespace that enables injects unless the pod says ``disabled``; otherwise
only a pod that enables is injected.  Invalid values, ``hostNetwork`` and a proxy already in
the template skip injection, with Linkerd's reason names.  The inheritable
``config.linkerd.io/*`` annotations come from the namespace when the template lacks them.

Pure.  The platform keeps its own copy of this small rule because it sits below
``tether.injector`` in the layers; the two follow the same table.  Caller:
``tether.platform.local.sidecar``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.ports import DEFAULT_OPAQUE_PORTS, format_span, read_port_list

INJECT = "linkerd.io/inject"
CONFIG = "config.linkerd.io/"
SKIP_INBOUND_PORTS = CONFIG + "skip-inbound-ports"
SKIP_OUTBOUND_PORTS = CONFIG + "skip-outbound-ports"
OPAQUE_PORTS = CONFIG + "opaque-ports"
PROXY_LOG_LEVEL = CONFIG + "proxy-log-level"
PROXY_LOG_FORMAT = CONFIG + "proxy-log-format"
DEFAULT_INBOUND_POLICY = CONFIG + "default-inbound-policy"
SKIP_SUBNETS = CONFIG + "skip-subnets"
PROXY_UID = CONFIG + "proxy-uid"

# Which annotations a pod inherits from its namespace (the part of Linkerd's ProxyAnnotations
# the local platform reads).
INHERITED = (
    SKIP_INBOUND_PORTS,
    SKIP_OUTBOUND_PORTS,
    OPAQUE_PORTS,
    PROXY_LOG_LEVEL,
    PROXY_LOG_FORMAT,
    DEFAULT_INBOUND_POLICY,
    SKIP_SUBNETS,
    PROXY_UID,
)

ENABLED, DISABLED, INGRESS = "enabled", "disabled", "ingress"
_VALUES = (ENABLED, DISABLED, INGRESS)
_PROXY_CONTAINERS = ("linkerd-proxy", "istio-proxy")
_INIT_CONTAINERS = ("linkerd-init", "linkerd-network-validator", "istio-init")

DEFAULT_SKIP_PORTS = "4567,4568"
DEFAULT_POLICIES = (
    "all-unauthenticated",
    "all-authenticated",
    "cluster-unauthenticated",
    "cluster-authenticated",
    "deny",
    "audit",
)


@dataclass(frozen=True)
class Decision:
    """``reason`` is None when the pod is injected; ``mode`` is ``enabled`` or ``ingress`` then."""

    reason: str | None
    mode: str = ""

    @property
    def inject(self) -> bool:
        return self.reason is None


def decide(template: Mapping[str, Any], namespace_annotations: Mapping[str, str]) -> Decision:
    """The webhook's decision for a pod template (``{"metadata": ..., "spec": ...}``)."""
    spec = template.get("spec") or {}
    if spec.get("hostNetwork") is True:
        return Decision("host_network_enabled")
    if _has_sidecar(spec):
        return Decision("sidecar_already_exists")
    pod = ((template.get("metadata") or {}).get("annotations") or {}).get(INJECT, "")
    ns = namespace_annotations.get(INJECT, "")
    if ns and ns not in _VALUES:
        return Decision("invalid_inject_annotation_at_ns")
    if pod and pod not in _VALUES:
        return Decision("invalid_inject_annotation_at_workload")
    if pod == DISABLED:
        return Decision("injection_disable_annotation_present")
    if pod in (ENABLED, INGRESS):
        return Decision(None, pod)
    if ns in (ENABLED, INGRESS):
        return Decision(None, ns)
    return Decision("injection_enable_annotation_absent")


def _has_sidecar(spec: Mapping[str, Any]) -> bool:
    names = {c.get("name") for c in spec.get("containers") or ()}
    init_names = {c.get("name") for c in spec.get("initContainers") or ()}
    return bool(names & set(_PROXY_CONTAINERS) or init_names & set(_PROXY_CONTAINERS + _INIT_CONTAINERS))


def effective_annotations(pod_annotations: Mapping[str, str], namespace_annotations: Mapping[str, str]) -> dict[str, str]:
    """The pod's annotations plus the inheritable ones it lacks, taken from its namespace."""
    merged = dict(pod_annotations)
    for key in INHERITED:
        if key not in merged and key in namespace_annotations:
            merged[key] = namespace_annotations[key]
    return merged


@dataclass(frozen=True)
class MeshSettings:
    """What the annotations ask of the proxy and of proxy-init for one pod."""

    skip_inbound_ports: str
    skip_outbound_ports: str
    opaque_ports: str  # "" when neither the pod nor its namespace says
    log_level: str
    log_format: str
    default_inbound_policy: str
    skip_subnets: str
    proxy_uid: int
    problems: tuple[str, ...] = ()  # invalid values that were ignored


def settings(
    annotations: Mapping[str, str],
    container_ports: Mapping[str, int],
    *,
    default_log_level: str,
    default_policy: str = "all-unauthenticated",
) -> MeshSettings:
    """Read the (already namespace-merged) annotations; bad values fall back to the defaults."""
    problems: list[str] = []

    def ports(key: str, default: str) -> str:
        if key not in annotations:
            return default
        spans, errors = read_port_list(annotations[key], names=container_ports)
        if errors:
            problems.append(f"{key}: ignored {', '.join(err.item for err in errors)}")
        # Written order, repeats dropped: the value reaches proxy-init and the proxy as the user wrote it.
        return ",".join(format_span(span) for span in dict.fromkeys(spans))

    policy = annotations.get(DEFAULT_INBOUND_POLICY, default_policy)
    if policy not in DEFAULT_POLICIES:
        problems.append(f"{DEFAULT_INBOUND_POLICY}: {policy!r} is not one of {', '.join(DEFAULT_POLICIES)}")
        policy = default_policy
    uid_text = annotations.get(PROXY_UID, "2102")
    try:
        uid = int(uid_text)
        if uid <= 0:
            raise ValueError
    except ValueError:
        problems.append(f"{PROXY_UID}: {uid_text!r} is not a non-root uid")
        uid = 2102
    log_format = annotations.get(PROXY_LOG_FORMAT, "plain").upper()
    if log_format not in ("PLAIN", "JSON"):
        problems.append(f"{PROXY_LOG_FORMAT}: {log_format!r} is not plain or json")
        log_format = "PLAIN"
    return MeshSettings(
        skip_inbound_ports=ports(SKIP_INBOUND_PORTS, DEFAULT_SKIP_PORTS),
        skip_outbound_ports=ports(SKIP_OUTBOUND_PORTS, DEFAULT_SKIP_PORTS),
        opaque_ports=ports(OPAQUE_PORTS, ""),
        log_level=annotations.get(PROXY_LOG_LEVEL) or default_log_level,
        log_format=log_format,
        default_inbound_policy=policy,
        skip_subnets=annotations.get(SKIP_SUBNETS, ""),
        proxy_uid=uid,
        problems=tuple(problems),
    )


def default_opaque_ports(container_ports: Mapping[str, int] | list[int]) -> str:
    """Linkerd's default opaque ports that the pod actually exposes, as an annotation value ("" if none)."""
    exposed = set(container_ports.values() if isinstance(container_ports, Mapping) else container_ports)
    return ",".join(str(p) for p in DEFAULT_OPAQUE_PORTS if p in exposed)
