"""Object metadata, pod-template metadata and status conditions, shared by every kind.

`model.parse` reads ``metadata`` here; the per-kind modules read template
metadata (Deployment) and ``status.conditions`` (Pod, routes, policies) here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from tether.resources import formats, limits
from tether.resources.fields import Fields, NameCheck
from tether.resources.kinds import NAMESPACE, SERVICE, ResourceType

# Kubernetes names most objects as DNS-1123 subdomains; these kinds are stricter.
_NAME_RULES: dict[ResourceType, NameCheck] = {
    NAMESPACE: formats.dns1123_label,
    SERVICE: formats.dns1035_label,
}


def _annotation_key(key: str) -> str | None:
    # apimachinery checks annotation keys case-insensitively.
    return formats.qualified_name(key.lower())


@dataclass(frozen=True, slots=True)
class OwnerReference:
    api_version: str
    kind: str
    name: str
    uid: str | None = None
    controller: bool = False


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    name: str
    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    owner_references: tuple[OwnerReference, ...] = ()

    @property
    def controller(self) -> OwnerReference | None:
        """The owner with ``controller: true`` (a Pod's ReplicaSet, say), if any."""
        return next((o for o in self.owner_references if o.controller), None)


@dataclass(frozen=True, slots=True)
class TemplateMeta:
    """The metadata of a pod template: only labels and annotations matter."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    observed_generation: int | None = None

    @property
    def is_true(self) -> bool:
        return self.status == "True"


def find_condition(conditions: tuple[Condition, ...], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


@dataclass(frozen=True, slots=True)
class ConditionsStatus:
    """A ``status`` that is only a list of conditions (ExternalWorkload, EgressNetwork, ...)."""

    conditions: tuple[Condition, ...] = ()

    def condition(self, type_: str) -> Condition | None:
        return find_condition(self.conditions, type_)


def parse_metadata(doc: Fields, rtype: ResourceType) -> ObjectMeta:
    """``metadata`` of a top-level object.

    A cluster-scoped object's namespace is ignored, as the API server ignores it;
    a missing namespace stays None (the CLI supplies the default).
    """
    meta = doc.child("metadata")
    namespace = meta.string("namespace", None, check=formats.dns1123_label) if rtype.namespaced else None
    return ObjectMeta(
        name=meta.string("name", check=_NAME_RULES.get(rtype, formats.dns1123_subdomain)),
        namespace=namespace,
        labels=meta.string_map("labels", key_check=formats.qualified_name, value_check=formats.label_value),
        annotations=_annotations(meta),
        uid=meta.string("uid", None),
        resource_version=meta.string("resourceVersion", None),
        generation=meta.integer("generation", None, minimum=0),
        creation_timestamp=_timestamp(meta, "creationTimestamp"),
        deletion_timestamp=_timestamp(meta, "deletionTimestamp"),
        owner_references=tuple(
            OwnerReference(
                api_version=ref.string("apiVersion"),
                kind=ref.string("kind"),
                name=ref.string("name"),
                uid=ref.string("uid", None),
                controller=ref.boolean("controller", False),
            )
            for ref in meta.children("ownerReferences")
        ),
    )


def parse_template_metadata(template: Fields) -> TemplateMeta:
    meta = template.child("metadata", None)
    if meta is None:
        return TemplateMeta()
    return TemplateMeta(
        labels=meta.string_map("labels", key_check=formats.qualified_name, value_check=formats.label_value),
        annotations=_annotations(meta),
    )


def _annotations(meta: Fields) -> dict[str, str]:
    annotations = meta.string_map("annotations", key_check=_annotation_key)
    limits.check_annotations(annotations, meta.at("annotations"))
    return annotations


def parse_conditions_status(doc: Fields) -> ConditionsStatus:
    return ConditionsStatus(parse_conditions(doc.child("status", None)))


def parse_conditions(status: Fields | None) -> tuple[Condition, ...]:
    """``status.conditions``; () when there is no status yet."""
    if status is None:
        return ()
    return tuple(
        Condition(
            type=c.string("type"),
            status=c.choice("status", ("True", "False", "Unknown")),
            reason=c.string("reason", None),
            message=c.string("message", None),
            last_transition_time=c.string("lastTransitionTime", None),
            observed_generation=c.integer("observedGeneration", None, minimum=0),
        )
        for c in status.children("conditions")
    )


def _timestamp(node: Fields, key: str) -> datetime | None:
    text = node.string(key, None)
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise node.error(key, "expected an RFC 3339 time such as 2024-01-31T12:00:00Z") from None
