"""The store: resources in one SQLite file, with apply/get/list/delete and watches by resource version.

``Store`` is opened by the CLI (``tether apply/get/delete``) and by the local
platform, which feeds the controllers from ``watch``/``list_then_watch``.  Any
number of processes may open the same file at once: SQLite's WAL mode lets
readers run beside the single writer, every write is one short ``BEGIN
IMMEDIATE`` transaction, and ``tether.store.wakeup`` tells watchers in other
processes that something was committed.

Every change gets the next value of one global counter, the resource version;
the object is stored with it and the change is appended to a bounded event
history that watches replay (older events are dropped on write: a watch from
before them raises ``Gone``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from tether.resources.selectors import LabelSelector
from tether.resources.kinds import REGISTRY
from tether.store.errors import CorruptObject, Gone, StoreError
from tether.store.objects import Key, created, describe, prepare, updated
from tether.store.schema import open_store, sqlite_errors
from tether.store.wakeup import Listener, WakeDir

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]

DEFAULT_HISTORY = 10_000
# The history is also cut to this many bytes of bodies: a burst of big objects must not keep
# the file large long after they are deleted.
DEFAULT_HISTORY_BYTES = 32 * 1024 * 1024
# Free pages are handed back once they are this share of the file (and at least _VACUUM_MIN_PAGES).
_VACUUM_SHARE = 4
_VACUUM_MIN_PAGES = 256
# Events a watch reads per transaction, so that a far-behind watch never holds one long read.
_WATCH_BATCH = 500


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change: the object after it (before it, with the deletion's version, for DELETED)."""

    type: EventType
    object: dict
    resource_version: int


@dataclass(frozen=True, slots=True)
class ListResult:
    """The objects a ``list`` matched, and the store's version in that same snapshot.

    ``unreadable`` names the objects left out because their stored body is corrupt.
    """

    items: list[dict]
    resource_version: int
    unreadable: tuple[str, ...] = ()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _counter(db: sqlite3.Connection, name: str) -> int:
    return db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()[0]


def _decode(body: str, key: Key) -> dict:
    """A stored body as an object, or ``CorruptObject`` naming it (a damaged row must not hide the rest)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise CorruptObject(f"{describe(key)}: the stored object is corrupt ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise CorruptObject(f"{describe(key)}: the stored object is corrupt (not an object with metadata)")
    return obj


class Store:
    """A resource store backed by the SQLite file at ``path`` (created with its directory if absent).

    ``history`` is how many events are kept for watches, ``history_bytes`` how many bytes of
    them at most (the oldest go first either way); ``poll_interval`` is how
    often (seconds) a watch looks for changes when no wake-up came, a fallback
    only; ``busy_timeout`` is how long (seconds) to wait for another process's
    write to finish before failing with ``StoreError``.  Methods may be called
    from several threads; watches and ``close`` belong to the event loop thread.
    A ``Store`` must not be used across ``fork``: open one per process.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        history: int = DEFAULT_HISTORY,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        poll_interval: float = 2.0,
        busy_timeout: float = 30.0,
    ) -> None:
        if history < 1:
            raise ValueError(f"history must be at least 1, not {history}")
        self.path = Path(path)
        self._history = history
        self._history_bytes = history_bytes
        self._poll_interval = poll_interval
        self._conn = open_store(self.path, busy_timeout)
        try:
            self._wake = WakeDir(self.path.with_name(self.path.name + "-watch"))
        except BaseException:
            self._conn.close()
            raise
        self._lock = threading.Lock()
        self._listeners: dict[asyncio.AbstractEventLoop, Listener] = {}
        self._closed = False

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the file; running watches end (their iteration stops) at their next step."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for listener in self._listeners.values():
                listener.wake_all()
                listener.close()
            self._listeners.clear()
            self._conn.close()
            self._wake.close()

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction; after a write transaction that changed rows, every watcher is woken."""
        with self._lock, sqlite_errors(self.path):
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            changes = self._conn.total_changes
            # IMMEDIATE takes the write lock up front: a deferred transaction that
            # upgrades later can fail with SQLITE_BUSY without waiting.
            self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield self._conn
            except BaseException:
                # SQLite may have rolled back already (on a full disk, say).
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            # Still under the lock, so that close() cannot pull the watch directory away meanwhile.
            if self._conn.total_changes != changes:
                self._wake.notify()

    # -- reading -------------------------------------------------------------

    def resource_version(self) -> int:
        """The version of the latest change (0 for a new store)."""
        with self._transaction(write=False) as db:
            return _counter(db, "resource_version")

    def get(self, type_key: str, namespace: str | None, name: str) -> dict | None:
        """The stored object, or None.  ``type_key`` is ``ResourceType.key``, e.g. ``"Pod"``."""
        with self._transaction(write=False) as db:
            row = db.execute(
                "SELECT body FROM objects WHERE type_key = ? AND namespace = ? AND name = ?",
                (type_key, namespace or "", name),
            ).fetchone()
        return None if row is None else _decode(row[0], (type_key, namespace or "", name))

    def list(
        self, type_key: str, namespace: str | None = None, selector: LabelSelector | None = None
    ) -> ListResult:
        """Objects of one type (in one namespace, or all when None) whose labels match ``selector``.

        Sorted by namespace then name.  ``resource_version`` belongs to the same
        snapshot: ``watch(since=result.resource_version)`` continues exactly after it.
        """
        query = "SELECT namespace, name, body FROM objects WHERE type_key = ?"
        params: tuple[str, ...] = (type_key,)
        if namespace is not None:
            query += " AND namespace = ?"
            params += (namespace,)
        with self._transaction(write=False) as db:
            version = _counter(db, "resource_version")
            rows = db.execute(query + " ORDER BY namespace, name", params).fetchall()
        items, unreadable = [], []
        for ns, name, body in rows:
            try:
                items.append(_decode(body, (type_key, ns, name)))
            except CorruptObject as e:
                log.error("%s: %s", self.path, e)
                unreadable.append(str(e))
        if selector is not None:
            items = [item for item in items if selector.matches(item["metadata"].get("labels") or {})]
        return ListResult(items=items, resource_version=version, unreadable=tuple(unreadable))

    # -- writing -------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any]) -> dict:
        """Create or update ``obj`` and return it as stored (unchanged and with no new version if identical).

        Raises ``ValidationError`` for an invalid object and ``Conflict`` when it
        carries a ``metadata.resourceVersion`` other than the stored one.
        """
        return self.apply_many([obj])[0]

    def apply_many(self, objs: Sequence[Mapping[str, Any]]) -> list[dict]:
        """Apply every object in one transaction, in order: all are stored, or (on any error) none."""
        prepared = [prepare(obj) for obj in objs]
        now = _now()
        results: list[dict] = []
        added = 0
        with self._transaction(write=True) as db:
            first = version = _counter(db, "resource_version")
            for key, incoming in prepared:
                stored = self._stored(db, key)
                if stored is None:
                    obj = created(key, incoming, uid=str(uuid.uuid4()), now=now)
                    change: EventType = "ADDED"
                else:
                    obj = updated(key, incoming, stored)
                    if obj is None:
                        results.append(stored)
                        continue
                    change = "MODIFIED"
                version += 1
                obj["metadata"]["resourceVersion"] = str(version)
                added += self._record(db, key, change, obj, version)
                results.append(obj)
            self._advance(db, first, version, added)
        self._reclaim()
        return results

    def delete(self, type_key: str, namespace: str | None, name: str) -> dict | None:
        """Delete one object; return it (with the deletion's resourceVersion), or None if it was absent."""
        return self.delete_many([(type_key, namespace, name)])[0]

    def delete_many(self, keys: Sequence[tuple[str, str | None, str]]) -> list[dict | None]:
        """Delete ``(type_key, namespace, name)`` objects in one transaction; None for each that was absent."""
        results: list[dict | None] = []
        added = 0
        with self._transaction(write=True) as db:
            first = version = _counter(db, "resource_version")
            for type_key, namespace, name in keys:
                key = (type_key, namespace or "", name)
                obj = self._stored(db, key)
                if obj is None and self._exists(db, key):
                    obj = _stand_in(key)  # a corrupt row: deleting it is how a user gets rid of it
                if obj is not None:
                    version += 1
                    obj["metadata"]["resourceVersion"] = str(version)
                    added += self._record(db, key, "DELETED", obj, version)
                results.append(obj)
            self._advance(db, first, version, added)
        self._reclaim()
        return results

    def _stored(self, db: sqlite3.Connection, key: Key) -> dict | None:
        """The stored object; a corrupt one counts as absent, so writing over it replaces it."""
        row = db.execute(
            "SELECT body FROM objects WHERE type_key = ? AND namespace = ? AND name = ?", key
        ).fetchone()
        if row is None:
            return None
        try:
            return _decode(row[0], key)
        except CorruptObject as e:
            log.warning("%s: %s; it is replaced", self.path, e)
            return None

    @staticmethod
    def _exists(db: sqlite3.Connection, key: Key) -> bool:
        query = "SELECT 1 FROM objects WHERE type_key = ? AND namespace = ? AND name = ?"
        return db.execute(query, key).fetchone() is not None

    @staticmethod
    def _record(db: sqlite3.Connection, key: Key, change: EventType, obj: dict, version: int) -> int:
        """Write the change and its event; returns the event body's size in bytes."""
        body = json.dumps(obj, separators=(",", ":"))
        if change == "DELETED":
            db.execute("DELETE FROM objects WHERE type_key = ? AND namespace = ? AND name = ?", key)
        else:
            db.execute("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)", (*key, body))
        db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", (version, change, key[0], key[1], body))
        return len(body.encode())

    def _advance(self, db: sqlite3.Connection, first: int, version: int, added: int) -> None:
        """Store the new version and drop the events that fall out of the history (by count, then by bytes)."""
        if version == first:
            return
        db.execute("UPDATE counters SET value = ? WHERE name = 'resource_version'", (version,))
        kept = _counter(db, "history_bytes") + added
        floor = max(version - self._history, _counter(db, "compacted_through"))
        oldest = db.execute(
            "SELECT resource_version, length(CAST(body AS BLOB)) FROM events WHERE resource_version > ? "
            "ORDER BY resource_version",
            (floor,),
        )
        kept -= self._dropped_bytes(db, floor)
        for rv, size in oldest:
            if kept <= self._history_bytes or rv == version:
                break
            kept -= size
            floor = rv
        oldest.close()
        db.execute("DELETE FROM events WHERE resource_version <= ?", (floor,))
        db.execute("UPDATE counters SET value = max(value, ?) WHERE name = 'compacted_through'", (floor,))
        db.execute("UPDATE counters SET value = ? WHERE name = 'history_bytes'", (max(kept, 0),))

    @staticmethod
    def _dropped_bytes(db: sqlite3.Connection, floor: int) -> int:
        query = "SELECT coalesce(sum(length(CAST(body AS BLOB))), 0) FROM events WHERE resource_version <= ?"
        return db.execute(query, (floor,)).fetchone()[0]

    def _reclaim(self) -> None:
        """Hand free pages back to the file system once they are a large share of the file."""
        with self._lock, sqlite_errors(self.path):
            if self._closed:
                return
            free = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
            pages = self._conn.execute("PRAGMA page_count").fetchone()[0]
            if free < max(_VACUUM_MIN_PAGES, pages // _VACUUM_SHARE):
                return
            # executescript: the pragma frees one page per step, and a script steps it to the end.
            self._conn.executescript("PRAGMA incremental_vacuum;")
            # Readers hold only short transactions, so waiting for them to truncate the log is brief.
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- watching ------------------------------------------------------------

    async def watch(
        self, type_key: str | None, since: int, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        """Every change after version ``since``, in order, then each new one as it is committed by any process.

        ``type_key`` None watches every type, ``namespace`` None every namespace.
        Raises ``Gone`` (on the first step, or later if the watch falls behind the
        history) when ``since`` is older than the oldest retained event; the caller
        lists again.  Ends when the store is closed; cancel it or ``aclose()`` it
        to stop earlier (``contextlib.aclosing`` makes the latter certain).
        """
        loop = asyncio.get_running_loop()
        listener, wake = self._subscribe(loop)
        try:
            cursor = int(since)
            while not self._closed:
                # Clear before reading: a commit after this read's snapshot wakes us again.
                wake.clear()
                events, cursor, more = self._events_after(cursor, type_key, namespace)
                for event in events:
                    yield event
                if not more:
                    await wake.wait()
        finally:
            self._unsubscribe(loop, listener, wake)

    def _subscribe(self, loop: asyncio.AbstractEventLoop) -> tuple[Listener, asyncio.Event]:
        # The socket is bound before the first read, so no commit after that read goes unnoticed.
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed")
        listener = self._listeners.get(loop)
        if listener is None:
            listener = self._listeners[loop] = Listener(self._wake, loop, self._poll_interval)
        return listener, listener.subscribe()

    def _unsubscribe(self, loop: asyncio.AbstractEventLoop, listener: Listener, wake: asyncio.Event) -> None:
        if self._listeners.get(loop) is listener and listener.unsubscribe(wake):
            del self._listeners[loop]
            listener.close()

    def _events_after(
        self, cursor: int, type_key: str | None, namespace: str | None
    ) -> tuple[list[WatchEvent], int, bool]:
        """The next events after ``cursor`` matching the filters, the new cursor, and whether more are waiting."""
        query = "SELECT resource_version, type, type_key, namespace, body FROM events WHERE resource_version > ?"
        params: tuple[object, ...] = (cursor,)
        if type_key is not None:
            query += " AND type_key = ?"
            params += (type_key,)
        if namespace is not None:
            query += " AND namespace = ?"
            params += (namespace,)
        with self._transaction(write=False) as db:
            counters = dict(db.execute("SELECT name, value FROM counters"))
            current, compacted = counters["resource_version"], counters["compacted_through"]
            if cursor < compacted:
                raise Gone(
                    f"{self.path}: resource version {cursor} is older than the kept history "
                    f"(which starts after {compacted}); list again"
                )
            if cursor > current:
                raise Gone(
                    f"{self.path}: resource version {cursor} is newer than the store's ({current}); "
                    "was the file replaced? list again"
                )
            rows = db.execute(query + " ORDER BY resource_version LIMIT ?", (*params, _WATCH_BATCH)).fetchall()
        more = len(rows) == _WATCH_BATCH
        # With nothing more to read, skip past the events of other types too.
        cursor = rows[-1][0] if more else current
        events = []
        for version, change, type_key_, ns, body in rows:
            try:
                events.append(WatchEvent(change, _decode(body, (type_key_, ns, "?")), version))
            except CorruptObject as e:
                log.error("%s: event %d skipped: %s", self.path, version, e)
        return events, cursor, more


def _stand_in(key: Key) -> dict:
    """What ``delete`` returns for an object whose body was unreadable: its kind and name only."""
    type_key, namespace, name = key
    rtype = next((t for t in REGISTRY if t.key == type_key), None)
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    head = {"apiVersion": rtype.api_version, "kind": rtype.kind} if rtype is not None else {}
    return {**head, "metadata": meta}
