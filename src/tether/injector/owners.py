"""A pod's owners as the API knows them, and the Events the webhook records on them.

An admission request carries the pod with its ``ownerReferences`` but not the owners. Linkerd's
injector asks its metadata API for the owner: a ReplicaSet made by a Deployment and a Job made by
a CronJob are labelled ``linkerd.io/proxy-deployment``/``proxy-cronjob`` after the grandparent;
and the object the pod names (its parent) gets a Kubernetes Event, ``Injected`` or
``InjectionSkipped`` with the reasons. Two seams carry this, both called from the webhook's
worker thread and allowed to fail (the webhook then carries on without them):

- `OwnerLookup`: ``lookup(namespace, kind, name) -> metadata or None``; the Kubernetes platform
  answers from the API server (``tether.platform.kubernetes.objects``).
- `EventRecorder`: ``record(parent, reason, message)``; the Kubernetes platform writes core/v1
  Events (``tether.platform.kubernetes.events``).

`resolve` is the pure rule between them. Caller: `admission`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tether.injector.workloads import KINDS, Owner

log = logging.getLogger(__name__)

INJECTED = "Injected"
SKIPPED = "InjectionSkipped"
INJECTED_MESSAGE = "Linkerd sidecar proxy injected"
SKIPPED_MESSAGE = "Linkerd sidecar proxy injection skipped: {reasons}"

def event_for(injected: bool, reasons: tuple[str, ...]) -> tuple[str, str]:
    """The (reason, message) of the Event on the pod's parent, as Linkerd's webhook records it."""
    return (INJECTED, INJECTED_MESSAGE) if injected else (SKIPPED, SKIPPED_MESSAGE.format(reasons=", ".join(reasons)))


# The owner kinds whose own owner names the workload (Linkerd's GetOwnerKindAndName).
_COLLAPSED = ("ReplicaSet", "Job")
_OWNER_LABELS = {k.kind: k.owner_label for k in KINDS.values() if k.owner_label}


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (its ``involvedObject``)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""


class OwnerLookup(Protocol):
    def __call__(self, namespace: str, kind: str, name: str) -> Mapping[str, Any] | None:
        """The ``metadata`` of that object (None when it does not exist); may raise."""
        ...


class EventRecorder(Protocol):
    def record(self, involved: ObjectRef, reason: str, message: str) -> None:
        """Record a Normal Event on ``involved``; must not block on the API (fire and forget)."""
        ...


@dataclass(frozen=True, slots=True)
class Resolved:
    owner: Owner | None  # for the linkerd.io/proxy-<kind> label; None: decide by the pod alone
    parent: ObjectRef | None  # where the Event goes; None: no owner, or it could not be found


def resolve(pod: Mapping[str, Any], namespace: str, lookup: OwnerLookup | None) -> Resolved:
    """The pod's labelled owner and the parent its Events go to, asking ``lookup`` for the parent."""
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    refs = [r for r in metadata.get("ownerReferences") or () if isinstance(r, Mapping)]
    if len(refs) != 1 or lookup is None:
        return Resolved(None, None)
    ref = refs[0]
    kind, name, api_version = ref.get("kind"), ref.get("name"), ref.get("apiVersion")
    if not (isinstance(kind, str) and isinstance(name, str) and isinstance(api_version, str)):
        return Resolved(None, None)
    try:
        parent_meta = lookup(namespace, kind, name)
    except Exception as exc:  # noqa: BLE001 - the API may be down: label by the pod's own reference
        log.warning("cannot look up %s %s/%s, the owner of a new pod: %s", kind, namespace, name, exc)
        parent_meta = None
    if parent_meta is None:
        return Resolved(_label(kind, name), None)
    parent = ObjectRef(api_version, kind, namespace, name, str(parent_meta.get("uid") or ""))
    grand = [r for r in parent_meta.get("ownerReferences") or () if isinstance(r, Mapping)]
    if kind in _COLLAPSED and len(grand) == 1:
        g_kind, g_name = grand[0].get("kind"), grand[0].get("name")
        if isinstance(g_kind, str) and isinstance(g_name, str):
            return Resolved(_label(g_kind, g_name), parent)
    return Resolved(_label(kind, name), parent)


def _label(kind: str, name: str) -> Owner | None:
    label = _OWNER_LABELS.get(kind)
    return Owner(label, name) if label else None
