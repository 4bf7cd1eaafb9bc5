"""How an applied object becomes the stored one: its key, the store-owned metadata, generation, no-op detection.

Pure functions, called by ``tether.store.store`` inside its write transaction;
they decide what to write, the caller writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tether.resources import limits
from tether.resources.errors import ValidationError
from tether.resources.kinds import type_of
from tether.store.errors import Conflict

# (type key, namespace or "" for cluster-scoped kinds, name): the primary key of a stored object.
Key = tuple[str, str, str]

# Spec fields the platform allocates (as the API server does for a Service's cluster IP): an
# apply that leaves them out keeps the allocated value instead of releasing it.
ALLOCATED_SPEC_FIELDS: dict[str, tuple[str, ...]] = {"Service": ("clusterIP", "clusterIPs")}


def describe(key: Key) -> str:
    """``Pod emojivoto/web-1`` or ``Namespace emojivoto``: how messages name an object."""
    type_key, namespace, name = key
    return f"{type_key} {namespace}/{name}" if namespace else f"{type_key} {name}"


def prepare(obj: Mapping[str, Any]) -> tuple[Key, dict]:
    """Validate ``obj`` and return its key and a private JSON copy (so the caller's dict is never touched).

    Raises ``ValidationError`` for anything ``tether.resources`` rejects, for a
    namespaced kind without ``metadata.namespace`` and for a cluster-scoped kind with one.
    """
    # The typed model (every kind's dataclasses) is imported by writers only: a reader such as
    # ``tether diagnose`` would spend most of its CPU time building classes it never uses.
    from tether.resources.model import parse

    limits.check_depth(obj)  # before parse: a writer that bypassed loading must not exhaust the stack
    parse(obj)
    rtype = type_of(obj)
    metadata = obj["metadata"]
    name = metadata["name"]
    namespace = metadata.get("namespace")
    if rtype.namespaced and not namespace:
        raise ValidationError(
            f"required: {rtype.key} is namespaced", path="metadata.namespace", kind=rtype.kind, name=name
        )
    if not rtype.namespaced and namespace:
        raise ValidationError(
            f"must be absent: {rtype.key} is cluster-scoped", path="metadata.namespace", kind=rtype.kind, name=name
        )
    try:
        # A JSON round trip both deep-copies and normalises (tuples become lists), so the
        # no-op comparison with what was stored (also JSON) is exact.
        text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
        private = json.loads(text)
    except (TypeError, ValueError) as e:
        raise ValidationError(f"not representable as JSON ({e})", kind=rtype.kind, name=name) from None
    try:
        limits.check_object_bytes(len(text.encode()))
    except ValidationError as e:
        raise e.located(kind=rtype.kind, name=name) from None
    return (rtype.key, namespace or "", name), private


def _requested_version(obj: Mapping[str, Any]) -> str | None:
    # Kubernetes treats an empty resourceVersion as "none given".
    requested = obj["metadata"].get("resourceVersion")
    return None if requested in (None, "") else str(requested)


def _spec_part(obj: Mapping[str, Any]) -> dict:
    """Everything a generation counts: the object without metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def created(key: Key, incoming: dict, *, uid: str, now: str) -> dict:
    """The object to store when ``incoming`` creates ``key``; the caller sets its resourceVersion.

    Raises ``Conflict`` when ``incoming`` carries a resourceVersion: the writer
    expected to update an object that no longer exists.
    """
    requested = _requested_version(incoming)
    if requested is not None:
        raise Conflict(f"{describe(key)}: does not exist (the write expected resourceVersion {requested})")
    incoming["metadata"].update(uid=uid, creationTimestamp=now, generation=1)
    return incoming


def _keep_allocated(type_key: str, incoming: dict, stored: Mapping[str, Any]) -> None:
    stored_spec = stored.get("spec")
    incoming_spec = incoming.get("spec")
    if not isinstance(stored_spec, dict) or not isinstance(incoming_spec, dict):
        return
    for field in ALLOCATED_SPEC_FIELDS.get(type_key, ()):
        if field not in incoming_spec and field in stored_spec:
            incoming_spec[field] = stored_spec[field]


def updated(key: Key, incoming: dict, stored: Mapping[str, Any]) -> dict | None:
    """The object to store when ``incoming`` is applied over ``stored``, or None when nothing would change.

    The returned object keeps the stored resourceVersion; the caller sets the new
    one.  An ``incoming`` without ``status`` keeps the stored status, so that
    re-applying a manifest never wipes what a controller reported.  Raises
    ``Conflict`` when ``incoming`` carries a resourceVersion other than the stored one.
    """
    stored_meta = stored["metadata"]
    requested = _requested_version(incoming)
    if requested is not None and requested != stored_meta["resourceVersion"]:
        raise Conflict(
            f"{describe(key)}: resourceVersion {requested} is stale, the stored one is "
            f"{stored_meta['resourceVersion']}; read it again and retry"
        )
    if "status" not in incoming and "status" in stored:
        incoming["status"] = stored["status"]
    _keep_allocated(key[0], incoming, stored)
    bump = 1 if _spec_part(incoming) != _spec_part(stored) else 0
    incoming["metadata"].update(
        uid=stored_meta["uid"],
        creationTimestamp=stored_meta["creationTimestamp"],
        generation=stored_meta["generation"] + bump,
        resourceVersion=stored_meta["resourceVersion"],
    )
    return None if incoming == stored else incoming
