"""The platform's watch seam: "list then watch one resource type, forever", as one stream of events.

Controllers (the destination's cluster index, later the policy controller) call
``ResourceWatcher.watch`` once per resource type they index; each platform
supplies the implementation: ``tether.platform.local.watch`` reads the SQLite
store, and the Kubernetes platform will read the API server's list and watch
endpoints.  Callers see the same contract on both:

* first an ``ADDED`` event for every object that exists, then one ``SYNCED``
  event (the caller's index is now complete and may serve);
* then every change, in order, as ``ADDED``/``MODIFIED``/``DELETED``;
* when the platform loses its place (the store compacted its history, or the
  API server answered 410 Gone) or its connection (an error, retried with
  backoff), it lists again and yields only the *difference* from what it had
  yielded before (``DELETED`` for objects that went away meanwhile), followed
  by another ``SYNCED``.  Callers never relist by themselves.

The stream never ends on its own while the platform is open; callers cancel the
iteration (or ``aclose()`` it) to stop.  Events carry the raw object (a JSON
mapping as stored, never a generated protobuf) and the monotonic time the
platform received it, so controllers can report how long a change took to
reach their clients.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

EventType = Literal["ADDED", "MODIFIED", "DELETED", "SYNCED"]


@dataclass(frozen=True, slots=True)
class ResourceEvent:
    """One change to one object, or the ``SYNCED`` marker (``object`` None) after a complete listing.

    For ``DELETED``, ``object`` is the object as last seen, or after a relist at
    least its ``apiVersion``, ``kind`` and ``metadata.name``/``namespace``.
    ``resource_version`` is the version the platform gave the change;
    ``received_at`` is ``time.monotonic()`` when the platform read it.
    """

    type: EventType
    object: Mapping[str, Any] | None
    resource_version: str
    received_at: float

    @property
    def key(self) -> tuple[str, str]:
        """``(namespace or "", name)`` of the object; not for ``SYNCED``."""
        assert self.object is not None, "SYNCED carries no object"
        metadata = self.object["metadata"]
        return metadata.get("namespace") or "", metadata["name"]


class ResourceWatcher(Protocol):
    """Something that can list-then-watch resources by type key (``ResourceType.key``, e.g. ``"Pod"``)."""

    def watch(self, type_key: str, namespace: str | None = None) -> AsyncIterator[ResourceEvent]:
        """Events for objects of ``type_key`` (in ``namespace``, or all when None), per the module contract."""
        ...
