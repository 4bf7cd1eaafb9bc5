"""Which kinds carry a pod template and where, and which owner a pod's ``linkerd.io/proxy-<kind>`` names.

Callers: `patch` (to find the template to patch and the owner label), the webhook's
metrics (owner kind). Objects are plain decoded manifests (dicts); nothing here copies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.resources.errors import ValidationError


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    """A kind with a pod template at ``template_path`` (empty: the object is the pod)."""

    kind: str
    template_path: tuple[str, ...]
    owner_label: str | None  # the <kind> of linkerd.io/proxy-<kind>; None for Pods

    @property
    def template_field(self) -> str:
        return ".".join(self.template_path)


_TEMPLATE = ("spec", "template")
KINDS: dict[str, WorkloadKind] = {
    k.kind: k
    for k in (
        WorkloadKind("Pod", (), None),
        WorkloadKind("Deployment", _TEMPLATE, "deployment"),
        WorkloadKind("StatefulSet", _TEMPLATE, "statefulset"),
        WorkloadKind("DaemonSet", _TEMPLATE, "daemonset"),
        WorkloadKind("ReplicaSet", _TEMPLATE, "replicaset"),
        WorkloadKind("ReplicationController", _TEMPLATE, "replicationcontroller"),
        WorkloadKind("Job", _TEMPLATE, "job"),
        WorkloadKind("CronJob", ("spec", "jobTemplate", "spec", "template"), "cronjob"),
    )
}
# Owner kinds a pod's controller reference may name (Linkerd labels these).
_OWNER_LABELS = {k.kind: k.owner_label for k in KINDS.values() if k.owner_label}
_POD_TEMPLATE_HASH = "pod-template-hash"


def workload_kind(obj: Mapping[str, Any]) -> WorkloadKind | None:
    """The kind's entry, or None for kinds that run no pods (Service, ConfigMap...)."""
    kind = obj.get("kind")
    return KINDS.get(kind) if isinstance(kind, str) else None


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """The pod template inside an object: its metadata and spec mappings (the object's own dicts)."""

    metadata: dict[str, Any]
    spec: dict[str, Any]
    path: str  # where it sits, for error messages: "" for a Pod, "spec.template" ...
    node: dict[str, Any]  # the mapping holding metadata and spec (the object itself for a Pod)


def pod_template(obj: dict[str, Any], kind: WorkloadKind) -> PodTemplate:
    """The template of ``obj`` (metadata created if missing); `ValidationError` if the shape is wrong."""
    node: Any = obj
    path = ""
    for key in kind.template_path:
        path = f"{path}.{key}" if path else key
        child = node.get(key)
        if not isinstance(child, dict):
            raise ValidationError("required" if child is None else "expected a mapping", path=path)
        node = child
    spec = node.get("spec")
    spec_path = f"{path}.spec" if path else "spec"
    if not isinstance(spec, dict):
        raise ValidationError("required" if spec is None else "expected a mapping", path=spec_path)
    meta_path = f"{path}.metadata" if path else "metadata"
    metadata = node.get("metadata")
    if metadata is None:
        metadata = node["metadata"] = {}
    if not isinstance(metadata, dict):
        raise ValidationError("expected a mapping", path=meta_path)
    for key in ("labels", "annotations"):
        value = metadata.get(key)
        if value is not None and not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
            raise ValidationError("expected a map of strings", path=f"{meta_path}.{key}")
    for key in ("containers", "initContainers", "volumes"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(c, dict) for c in value)):
            raise ValidationError("expected a list of mappings", path=f"{spec_path}.{key}")
    return PodTemplate(metadata=metadata, spec=spec, path=path, node=node)


@dataclass(frozen=True, slots=True)
class Owner:
    """What ``linkerd.io/proxy-<label>: <name>`` records."""

    label: str
    name: str

    @property
    def label_key(self) -> str:
        return f"linkerd.io/proxy-{self.label}"


def owner_of(obj: Mapping[str, Any], kind: WorkloadKind) -> Owner | None:
    """The workload itself; for a Pod, its controller (a ReplicaSet collapsed to its Deployment).

    Linkerd asks the API for the ReplicaSet's owner; without an API, a ReplicaSet made by a
    Deployment is recognised by its name, ``<deployment>-<pod-template-hash>``, as the
    Deployment controller names it. A Job made by a CronJob stays a Job.
    """
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    if kind.owner_label is not None:
        name = metadata.get("name")
        return Owner(kind.owner_label, name) if isinstance(name, str) and name else None
    refs = metadata.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    controller = next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)
    if controller is None:
        return None
    owner_kind, name = controller.get("kind"), controller.get("name")
    if not (isinstance(owner_kind, str) and isinstance(name, str) and owner_kind in _OWNER_LABELS):
        return None
    labels = metadata.get("labels")
    template_hash = labels.get(_POD_TEMPLATE_HASH) if isinstance(labels, Mapping) else None
    if owner_kind == "ReplicaSet" and isinstance(template_hash, str) and name.endswith(f"-{template_hash}"):
        return Owner("deployment", name[: -len(template_hash) - 1])
    return Owner(_OWNER_LABELS[owner_kind], name)
