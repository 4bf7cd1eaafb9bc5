"""``list_then_watch``: a consistent, self-healing view of one resource type, as a stream of events.

For the local platform's resource watches (and anything else that keeps an
index of objects).  It lists, yields every listed object as ADDED, then watches
from the list's version, so no change is missed or seen twice.  When the watch
falls behind the store's history (``Gone``) it lists again and yields only the
difference from what it had already yielded, including DELETED for objects
that went away meanwhile.  A label selector is applied to watch events the way
Kubernetes does: an object whose labels stop matching is reported DELETED, one
that starts matching ADDED.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing

from tether.resources.selectors import LabelSelector
from tether.store.errors import Gone
from tether.store.store import ListResult, Store, WatchEvent

# (namespace or "", name) -> the object as last yielded.
_Known = dict[tuple[str, str], dict]


def _name_of(obj: dict) -> tuple[str, str]:
    metadata = obj["metadata"]
    return metadata.get("namespace") or "", metadata["name"]


def _resync(known: _Known, listed: ListResult) -> Iterator[WatchEvent]:
    """Events that turn ``known`` into ``listed``, and update ``known`` to match."""
    fresh = {_name_of(obj): obj for obj in listed.items}
    for name in [n for n in known if n not in fresh]:
        yield WatchEvent("DELETED", known.pop(name), listed.resource_version)
    for name, obj in fresh.items():
        before = known.get(name)
        if before is None or before["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            known[name] = obj
            yield WatchEvent("ADDED" if before is None else "MODIFIED", obj, int(obj["metadata"]["resourceVersion"]))


def _select(known: _Known, event: WatchEvent, selector: LabelSelector | None) -> WatchEvent | None:
    """The event as seen through ``selector`` (None when it concerns no selected object); updates ``known``."""
    name = _name_of(event.object)
    labels = event.object["metadata"].get("labels") or {}
    selected = event.type != "DELETED" and (selector is None or selector.matches(labels))
    if selected:
        change = "MODIFIED" if name in known else "ADDED"
        known[name] = event.object
        return WatchEvent(change, event.object, event.resource_version)
    if name in known:
        del known[name]
        return WatchEvent("DELETED", event.object, event.resource_version)
    return None


async def list_then_watch(
    store: Store, type_key: str, namespace: str | None = None, selector: LabelSelector | None = None
) -> AsyncIterator[WatchEvent]:
    """ADDED for each matching object now stored, then every change to the matching set, forever.

    Ends when the store is closed; cancel or ``aclose()`` it to stop earlier.
    """
    known: _Known = {}
    while True:
        listed = store.list(type_key, namespace, selector)
        for event in _resync(known, listed):
            yield event
        try:
            async with aclosing(store.watch(type_key, listed.resource_version, namespace)) as changes:
                async for change in changes:
                    event = _select(known, change, selector)
                    if event is not None:
                        yield event
            return
        except Gone:
            continue
