"""Whether a pod (template) gets the proxy, and if not, every reason why not (Linkerd's ``report.go``).

Caller: `patch`. Pure: it reads the template, the namespace's annotations and the mesh
configuration. Reasons keep Linkerd's names, which the webhook's metrics use as labels.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.injector import annotations as a
from tether.injector.workloads import PodTemplate

PROXY_CONTAINER = "linkerd-proxy"
INIT_CONTAINER = "linkerd-init"
VALIDATOR_CONTAINER = "linkerd-network-validator"
DEBUG_CONTAINER = "linkerd-debug"

_PROXY_NAMES = (PROXY_CONTAINER, "istio-proxy")
_INIT_NAMES = (INIT_CONTAINER, VALIDATOR_CONTAINER, "istio-init")
_PROXY_IMAGE_PREFIXES = ("cr.l5d.io/linkerd/proxy:", "gcr.io/istio-release/proxyv2:")
_INIT_IMAGE_PREFIXES = ("cr.l5d.io/linkerd/proxy-init:", "gcr.io/istio-release/proxy_init:")


class Origin(enum.Enum):
    """Who asks: the webhook follows the annotations; the CLI injects unless the workload opts out."""

    WEBHOOK = "webhook"
    CLI = "cli"


class SkipReason(enum.Enum):
    HOST_NETWORK = "host_network_enabled"
    SIDECAR_EXISTS = "sidecar_already_exists"
    UNSUPPORTED_RESOURCE = "unsupported_resource"
    INJECT_ANNOTATION_ABSENT = "injection_enable_annotation_absent"
    INJECT_DISABLED = "injection_disable_annotation_present"
    INVALID_AT_WORKLOAD = "invalid_inject_annotation_at_workload"
    INVALID_AT_NAMESPACE = "invalid_inject_annotation_at_ns"
    AUTOMOUNT_DISABLED = "disabled_automount_service_account_token_account"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    SkipReason.HOST_NETWORK: "hostNetwork is enabled: the proxy would capture the node's traffic",
    SkipReason.SIDECAR_EXISTS: "a proxy (or its init container) is already injected",
    SkipReason.UNSUPPORTED_RESOURCE: "not a workload (no pod template)",
    SkipReason.INJECT_ANNOTATION_ABSENT: (
        'neither the namespace nor the pod has the annotation "linkerd.io/inject: enabled"'
    ),
    SkipReason.INJECT_DISABLED: 'the pod has the annotation "linkerd.io/inject: disabled"',
    SkipReason.INVALID_AT_WORKLOAD: 'invalid "linkerd.io/inject" value on the workload (enabled, disabled or ingress)',
    SkipReason.INVALID_AT_NAMESPACE: 'invalid "linkerd.io/inject" value on the namespace (enabled, disabled or ingress)',
    SkipReason.AUTOMOUNT_DISABLED: (
        "automountServiceAccountToken is false and service account token projection is off"
    ),
}


@dataclass(frozen=True, slots=True)
class Decision:
    reasons: tuple[SkipReason, ...]
    mode: str  # the effective linkerd.io/inject value: enabled or ingress ("" when skipped)
    annotation_at: str  # where the deciding annotation was: workload, namespace or "" (metrics)

    @property
    def inject(self) -> bool:
        return not self.reasons


def has_sidecar(spec: Mapping[str, Any], proxy_image: str) -> bool:
    """A proxy or proxy-init container, ours, Linkerd's or Istio's (``pkg/healthcheck/sidecar.go``)."""
    own = f"{proxy_image}:"
    for container in spec.get("containers") or ():
        if container.get("name") in _PROXY_NAMES or _image_startswith(container, (*_PROXY_IMAGE_PREFIXES, own)):
            return True
    for container in spec.get("initContainers") or ():
        if container.get("name") in _PROXY_NAMES + _INIT_NAMES:
            return True
        if _image_startswith(container, (*_PROXY_IMAGE_PREFIXES, *_INIT_IMAGE_PREFIXES, own)):
            return True
    return False


def _image_startswith(container: Mapping[str, Any], prefixes: tuple[str, ...]) -> bool:
    image = container.get("image")
    return isinstance(image, str) and image.startswith(prefixes)


def decide(
    template: PodTemplate,
    namespace_annotations: Mapping[str, str],
    origin: Origin,
    *,
    proxy_image: str,
    token_projection: bool = True,
) -> Decision:
    """Every reason not to inject, in Linkerd's order; none means inject.

    ``proxy_image`` (without tag) is recognised as a proxy already there; ``token_projection``
    is ``identity.serviceAccountTokenProjection`` (without it a pod needs its mounted token).
    """
    reasons: list[SkipReason] = []
    if template.spec.get("hostNetwork") is True:
        reasons.append(SkipReason.HOST_NETWORK)
    if has_sidecar(template.spec, proxy_image):
        reasons.append(SkipReason.SIDECAR_EXISTS)
    pod_value = (template.metadata.get("annotations") or {}).get(a.INJECT, "")
    ns_value = namespace_annotations.get(a.INJECT, "")
    by_annotation, mode, at = _by_annotation(pod_value, ns_value, origin)
    if by_annotation is not None:
        reasons.append(by_annotation)
    if template.spec.get("automountServiceAccountToken") is False and not token_projection:
        reasons.append(SkipReason.AUTOMOUNT_DISABLED)
    return Decision(tuple(reasons), "" if reasons else mode, at)


def unsupported() -> Decision:
    return Decision((SkipReason.UNSUPPORTED_RESOURCE,), "", "")


def _by_annotation(pod: str, ns: str, origin: Origin) -> tuple[SkipReason | None, str, str]:
    if origin is Origin.CLI:
        if pod == a.INJECT_DISABLED:
            return SkipReason.INJECT_DISABLED, "", "workload"
        return None, a.INJECT_INGRESS if pod == a.INJECT_INGRESS else a.INJECT_ENABLED, "workload" if pod else ""
    if ns and ns not in a.INJECT_VALUES:
        return SkipReason.INVALID_AT_NAMESPACE, "", "namespace"
    if pod and pod not in a.INJECT_VALUES:
        return SkipReason.INVALID_AT_WORKLOAD, "", "workload"
    if ns in (a.INJECT_ENABLED, a.INJECT_INGRESS):
        if pod == a.INJECT_DISABLED:
            return SkipReason.INJECT_DISABLED, "", "workload"
        if pod in (a.INJECT_ENABLED, a.INJECT_INGRESS):
            return None, pod, "workload"
        return None, ns, "namespace"
    if pod in (a.INJECT_ENABLED, a.INJECT_INGRESS):
        return None, pod, "workload"
    if pod == a.INJECT_DISABLED:
        return SkipReason.INJECT_DISABLED, "", "workload"
    return SkipReason.INJECT_ANNOTATION_ABSENT, "", "namespace" if ns else ""
