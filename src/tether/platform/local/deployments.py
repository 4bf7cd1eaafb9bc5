"""Deployments into Pod objects, as Kubernetes' Deployment and ReplicaSet controllers would make them. Pure.

A Deployment's pod template is hashed (``pod-template-hash``); its pods belong to a
ReplicaSet-like owner named ``<deployment>-<hash>`` (no ReplicaSet object is stored: the
destination only reads the owner reference and the label, and collapses the pair to the
Deployment as Linkerd does).  Pods are named ``<deployment>-<hash>-<5 chars>``.

``plan`` says which pods to create and delete: it scales the current template's pods to
``spec.replicas`` (removing not-ready pods first, then the newest), and rolls a changed
template by keeping old pods until as many new pods are ready (a surge rollout, so a caller
never sees fewer ready replicas than asked).  ``status`` is the Deployment status the
controller writes back.  Caller: ``tether.platform.local.pods``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TEMPLATE_HASH_LABEL = "pod-template-hash"
# Marks the pods the local Deployment controller made (and may delete).
MANAGED_BY = "local.tether.io/deployment"
# Kubernetes' "safe" alphabet for generated names: no vowels, no look-alike digits.
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_RS_NAMESPACE = uuid.UUID("6f1d0a55-2b6c-4d6e-9a51-6c1f2b7e0e11")


def _encode(data: bytes, length: int) -> str:
    number = int.from_bytes(data, "big")
    out = []
    for _ in range(length):
        number, digit = divmod(number, len(_ALPHABET))
        out.append(_ALPHABET[digit])
    return "".join(out)


def template_hash(template: Mapping[str, Any]) -> str:
    """A short stable hash of the pod template (the same template always gives the same hash)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    return _encode(hashlib.sha256(canonical).digest()[:8], 10)


def replica_set_name(deployment: str, hash_: str) -> str:
    return f"{deployment}-{hash_}"


def replica_set_uid(deployment_uid: str, hash_: str) -> str:
    """A uid for the (unstored) ReplicaSet, stable per Deployment instance and template."""
    return str(uuid.uuid5(_RS_NAMESPACE, f"{deployment_uid}/{hash_}"))


def new_pod_name(deployment: str, hash_: str) -> str:
    return f"{replica_set_name(deployment, hash_)}-{_encode(secrets.token_bytes(8), 5)}"


def new_pod(deployment: Mapping[str, Any], hash_: str, name: str, node_name: str) -> dict[str, Any]:
    """The Pod object for one replica of ``deployment``'s current template (not yet meshed)."""
    meta = deployment["metadata"]
    template = deployment["spec"]["template"]
    template_meta = template.get("metadata") or {}
    labels = {**(template_meta.get("labels") or {}), TEMPLATE_HASH_LABEL: hash_}
    annotations = {**(template_meta.get("annotations") or {}), MANAGED_BY: meta["name"]}
    spec = copy.deepcopy(template.get("spec") or {})
    spec["nodeName"] = node_name
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": replica_set_name(meta["name"], hash_),
                    "uid": replica_set_uid(meta.get("uid", ""), hash_),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def managed_by(pod: Mapping[str, Any]) -> str | None:
    """The name of the Deployment that made this pod, or None for pods it did not make."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(MANAGED_BY)


def belongs_to(pod: Mapping[str, Any], deployment: Mapping[str, Any]) -> bool:
    """Whether ``pod`` was made by this very Deployment (same name and uid, so not a deleted namesake's)."""
    meta = deployment["metadata"]
    pod_meta = pod["metadata"]
    if managed_by(pod) != meta["name"] or pod_meta.get("namespace") != meta.get("namespace"):
        return False
    hash_ = (pod_meta.get("labels") or {}).get(TEMPLATE_HASH_LABEL, "")
    return any(
        ref.get("controller") and ref.get("uid") == replica_set_uid(meta.get("uid", ""), hash_)
        for ref in pod_meta.get("ownerReferences") or ()
    )


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _pod_hash(pod: Mapping[str, Any]) -> str:
    return (pod["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL, "")


def _removal_order(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Which pods to remove first: not ready before ready, then the newest first."""
    def key(pod: Mapping[str, Any]) -> tuple[bool, str, str]:
        created = pod["metadata"].get("creationTimestamp") or ""
        return pod_ready(pod), _negate(created), pod["metadata"]["name"]

    return sorted(pods, key=key)


def _negate(text: str) -> str:
    # Sort newest first within the same readiness: invert each character of the timestamp.
    return "".join(chr(0x10FFFF - ord(c)) for c in text)


@dataclass(frozen=True)
class Plan:
    create: int = 0
    delete: tuple[str, ...] = field(default_factory=tuple)


def plan(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Plan:
    """What to do about ``pods`` (those that belong to ``deployment``) to reach its spec."""
    spec = deployment["spec"]
    if spec.get("paused"):
        return Plan()
    replicas = int(spec.get("replicas", 1))
    current_hash = template_hash(spec["template"])
    current = [p for p in pods if _pod_hash(p) == current_hash]
    old = [p for p in pods if _pod_hash(p) != current_hash]
    delete: list[str] = []
    create = max(0, replicas - len(current))
    surplus = max(0, len(current) - replicas)
    kept = _removal_order(current)
    delete += [p["metadata"]["name"] for p in kept[:surplus]]
    ready_current = sum(1 for p in kept[surplus:] if pod_ready(p))
    allowed_old = max(0, replicas - ready_current)
    ordered_old = _removal_order(old)
    delete += [p["metadata"]["name"] for p in ordered_old[: max(0, len(old) - allowed_old)]]
    return Plan(create=create, delete=tuple(delete))


def status(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: str) -> dict[str, Any]:
    """The Deployment's status for the pods it owns now (``now``: RFC 3339, for condition transitions)."""
    spec = deployment["spec"]
    replicas = int(spec.get("replicas", 1))
    current_hash = template_hash(spec["template"])
    ready = sum(1 for p in pods if pod_ready(p))
    updated = sum(1 for p in pods if _pod_hash(p) == current_hash)
    available = ready >= replicas
    previous = {c.get("type"): c for c in (deployment.get("status") or {}).get("conditions") or ()}
    condition = {
        "type": "Available",
        "status": "True" if available else "False",
        "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
        "message": "Deployment has minimum availability." if available else "Deployment does not have minimum availability.",
    }
    before = previous.get("Available")
    if before is not None and before.get("status") == condition["status"] and before.get("lastTransitionTime"):
        condition["lastTransitionTime"] = before["lastTransitionTime"]
    else:
        condition["lastTransitionTime"] = now
    return {
        "observedGeneration": deployment["metadata"].get("generation", 1),
        "replicas": len(pods),
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": [condition],
    }
