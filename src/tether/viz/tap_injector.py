"""The tap injector's rule (Linkerd viz's tap-injector): which meshed pods get tap, and the patch that gives it.

A pod gets tap when it has a ``linkerd-proxy`` container (a native sidecar in
``initContainers`` or a classic one in ``containers``) and neither it nor its
namespace carries ``viz.linkerd.io/disable-tap: "true"``.  The patch (RFC 6902
operations, as an admission webhook answers) adds to that container the
variable ``LINKERD2_PROXY_TAP_SVC_NAME=tap.<viz-ns>.serviceaccount.identity.<cp-ns>.<td>``
-- the one identity its proxy will serve ``Observe`` to -- and the annotation
``viz.linkerd.io/tap-enabled: "true"``.  A pod that already has the variable
gets no patch.  ``decide`` says why a pod is skipped, in words a log or an
Event can carry.

Pure.  Callers: a Kubernetes admission webhook, and a platform that injects
proxies itself (the local platform, once it asks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.naming import DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN, WorkloadIdentity
from tether.viz.workloads import PROXY_CONTAINER

DISABLE_TAP = "viz.linkerd.io/disable-tap"
TAP_ENABLED = "viz.linkerd.io/tap-enabled"
TAP_ENV = "LINKERD2_PROXY_TAP_SVC_NAME"
DEFAULT_VIZ_NS = "linkerd-viz"


def tap_identity(viz_ns: str = DEFAULT_VIZ_NS, control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS,
                 trust_domain: str = DEFAULT_TRUST_DOMAIN) -> str:
    """``tap.<viz-ns>.serviceaccount.identity.<cp-ns>.<td>``: the tap server's identity."""
    return WorkloadIdentity("tap", viz_ns, control_plane_ns, trust_domain).dns_name


@dataclass(frozen=True, slots=True)
class Decision:
    inject: bool
    reason: str  # why not, or "" when injected


def _escape(key: str) -> str:
    """A key as a JSON-pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _proxy(pod: Mapping[str, Any]) -> tuple[str, int, Mapping[str, Any]] | None:
    spec = pod.get("spec") or {}
    for field in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field) or ()):
            if container.get("name") == PROXY_CONTAINER:
                return field, index, container
    return None


def decide(pod: Mapping[str, Any], namespace_annotations: Mapping[str, str]) -> Decision:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(DISABLE_TAP) == "true":
        return Decision(False, f"the pod is annotated {DISABLE_TAP}")
    if namespace_annotations.get(DISABLE_TAP) == "true":
        return Decision(False, f"its namespace is annotated {DISABLE_TAP}")
    found = _proxy(pod)
    if found is None:
        return Decision(False, f"it has no {PROXY_CONTAINER} container (not meshed)")
    if any(e.get("name") == TAP_ENV for e in found[2].get("env") or ()):
        return Decision(False, f"its proxy already has {TAP_ENV}")
    return Decision(True, "")


def patch(pod: Mapping[str, Any], namespace_annotations: Mapping[str, str], identity: str) -> list[dict[str, Any]]:
    """The JSON patch that enables tap on ``pod`` (empty when ``decide`` says no)."""
    if not decide(pod, namespace_annotations).inject:
        return []
    found = _proxy(pod)
    assert found is not None
    field, index, container = found
    ops: list[dict[str, Any]] = []
    env = {"name": TAP_ENV, "value": identity}
    base = f"/spec/{field}/{index}/env"
    if container.get("env"):
        ops.append({"op": "add", "path": f"{base}/-", "value": env})
    else:
        ops.append({"op": "add", "path": base, "value": [env]})
    if (pod.get("metadata") or {}).get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {TAP_ENABLED: "true"}})
    else:
        ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(TAP_ENABLED)}", "value": "true"})
    return ops
