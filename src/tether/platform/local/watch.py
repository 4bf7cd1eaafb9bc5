"""The local platform's ``ResourceWatcher``: list-then-watch over the SQLite store, relisting and reconnecting.

Used by the control-plane processes on the local platform (``tether destination
serve`` builds one over the store file).  It follows the contract of
``tether.platform.watch``: ADDED for each stored object, SYNCED, then changes.
``Gone`` (the store dropped the history the watch needed) relists at once and
yields only the difference; any other ``StoreError`` (file busy, replaced,
briefly unreadable) is logged and retried with exponential backoff, then
relisted the same way.  Listing runs in a worker thread so a large listing
never stalls the event loop.  Ends only when the store is closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any

from tether.platform.watch import ResourceEvent
from tether.store import Gone, ListResult, Store, StoreError

log = logging.getLogger(__name__)

# (namespace or "", name) -> (resourceVersion, apiVersion, kind) of each object yielded: enough to
# tell a changed object after a relist and to name a vanished one, without keeping whole objects.
_Known = dict[tuple[str, str], tuple[str, str, str]]


def _remember(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    return obj["metadata"].get("resourceVersion", ""), obj.get("apiVersion", ""), obj.get("kind", "")


def _stub(key: tuple[str, str], known: tuple[str, str, str]) -> dict[str, Any]:
    """A DELETED event's object after a relist: its type, name and namespace."""
    namespace, name = key
    metadata: dict[str, Any] = {"name": name, "resourceVersion": known[0]}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": known[1], "kind": known[2], "metadata": metadata}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj["metadata"]
    return metadata.get("namespace") or "", metadata["name"]


class LocalResourceWatcher:
    """``ResourceWatcher`` over a ``Store``; ``retry_initial``/``retry_max`` bound the reconnect backoff (seconds)."""

    def __init__(
        self,
        store: Store,
        *,
        retry_initial: float = 0.1,
        retry_max: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._store = store
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._clock = clock
        self._sleep = sleep

    async def watch(self, type_key: str, namespace: str | None = None) -> AsyncIterator[ResourceEvent]:
        known: _Known = {}
        delay = self._retry_initial
        while True:
            try:
                listed = await asyncio.to_thread(self._store.list, type_key, namespace)
            except StoreError as exc:
                if self._store_closed():
                    return
                log.warning("listing %s failed, retrying in %.1fs: %s", type_key, delay, exc)
                await self._sleep(delay)
                delay = min(delay * 2, self._retry_max)
                continue
            version = listed.resource_version
            events = self._resync(known, listed)
            del listed  # the listing may be large: keep nothing of it but what was yielded
            while events:
                yield events.pop()
            yield ResourceEvent("SYNCED", None, str(version), self._clock())
            try:
                async with aclosing(self._store.watch(type_key, version, namespace)) as changes:
                    async for change in changes:
                        delay = self._retry_initial  # the store answers again
                        obj = change.object
                        if change.type == "DELETED":
                            known.pop(_key(obj), None)
                        else:
                            known[_key(obj)] = _remember(obj)
                        yield ResourceEvent(change.type, obj, str(change.resource_version), self._clock())
                return  # the store was closed
            except Gone as exc:
                log.info("watch of %s fell behind the store's history, listing again: %s", type_key, exc)
            except StoreError as exc:
                if self._store_closed():
                    return
                log.warning("watch of %s failed, retrying in %.1fs: %s", type_key, delay, exc)
                await self._sleep(delay)
                delay = min(delay * 2, self._retry_max)

    def _resync(self, known: _Known, listed: ListResult) -> list[ResourceEvent]:
        """Events turning what was yielded (``known``) into ``listed``; updates ``known``."""
        now = self._clock()
        version = str(listed.resource_version)
        fresh = {_key(obj): obj for obj in listed.items}
        events = [
            ResourceEvent("DELETED", _stub(key, known.pop(key)), version, now)
            for key in [k for k in known if k not in fresh]
        ]
        for key, obj in fresh.items():
            remembered = _remember(obj)
            before = known.get(key)
            if before is not None and before[0] == remembered[0]:
                continue
            known[key] = remembered
            events.append(ResourceEvent("ADDED" if before is None else "MODIFIED", obj, remembered[0], now))
        # Yielded from the end (``pop()``), so each object is released as soon as it is consumed.
        events.reverse()
        return events

    def _store_closed(self) -> bool:
        return self._store.closed
