"""The Kubernetes platform's ``ResourceWatcher``: list then watch over the API server, relisting as needed.

The controllers' processes get one from ``tether.cli.platform_opts`` when started
with ``--platform kubernetes``.  It keeps the contract of ``tether.platform.watch``:

* list the collection (paginated, a consistent read), yield ``ADDED`` for each
  object and ``SYNCED`` with the list's resource version;
* watch from that version with bookmarks allowed and a server-side timeout; pass
  on ``ADDED``/``MODIFIED``/``DELETED``; a ``BOOKMARK`` only moves the version on;
  when the server ends a watch normally, watch again from the last version;
* on ``410 Gone`` (as a status or as a watch ``ERROR`` event) list again at once;
  on any other failure (connection lost, timeout, 5xx, 403, a missing CRD) wait
  with exponential backoff and jitter, then list again.  Only a missing or
  unusable cluster configuration (``ConfigError``) ends the stream, by raising.  After each relist only
  the difference from what was yielded before goes out (``DELETED`` for objects
  gone meanwhile, ``MODIFIED`` for changed ones), then ``SYNCED``.
* a type whose CRD may be missing (``ApiResource.optional``: the Gateway API
  routes, which Linkerd watches only where their CRDs exist) that lists as
  ``404`` is an empty collection: ``SYNCED`` (after ``DELETED`` for what was
  seen), logged once, and listed again every ``retry_max`` until it is served.

A type watched as metadata only (``ApiResource.metadata_only``: Nodes, ReplicaSets,
Jobs) is listed and watched with client-go's metadata ``Accept`` header, so the
server sends each object as a ``PartialObjectMetadata``; every object is handed on
as its own kind (``v1`` ``Node``...) with its ``metadata`` alone, also from a
server that fell back to whole objects.

Duplicates are dropped: an event whose object has the resource version already
passed on (or, when a server gives no versions, the same content) is not repeated,
and ``ADDED``/``MODIFIED`` are named by what the caller has seen, not by the
server's word.  All watches of one watcher share one ``KubeClient``, opened by the
first watch and closed when the last one ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from tether.platform.kubernetes.client import (
    JSON_TYPE,
    METADATA_LIST,
    METADATA_WATCH,
    ApiError,
    ApiUnreachable,
    ClientSettings,
    ConfigError,
    KubeClient,
    KubeError,
    ResourceGone,
)
from tether.platform.kubernetes.metrics import WatchMetrics
from tether.platform.kubernetes.resources import ApiResource, api_resource
from tether.platform.watch import ResourceEvent

log = logging.getLogger(__name__)

Key = tuple[str, str]


class _Seen:
    """What was yielded for one object: its version (or content digest) and a stub naming it."""

    __slots__ = ("version", "digest", "stub")

    def __init__(self, version: str, digest: int | None, stub: dict[str, Any]) -> None:
        self.version = version
        self.digest = digest
        self.stub = stub


def _key(obj: Mapping[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return metadata.get("namespace") or "", metadata.get("name") or ""


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _seen(obj: Mapping[str, Any], resource: ApiResource) -> _Seen:
    version = _version(obj)
    metadata = obj.get("metadata") or {}
    stub_meta: dict[str, Any] = {"name": metadata.get("name"), "resourceVersion": version}
    if metadata.get("namespace"):
        stub_meta["namespace"] = metadata["namespace"]
    stub = {"apiVersion": obj.get("apiVersion") or resource.api_version, "kind": obj.get("kind") or resource.kind,
            "metadata": stub_meta}
    # Without versions (some emulators), equality of content is the only way to spot a repeat.
    digest = None if version else hash(json.dumps(obj, sort_keys=True, default=str))
    return _Seen(version, digest, stub)


def _same(before: _Seen, now: _Seen) -> bool:
    if before.version or now.version:
        return before.version == now.version
    return before.digest == now.digest


def _with_kind(obj: dict[str, Any], resource: ApiResource) -> dict[str, Any]:
    """List items carry no ``apiVersion``/``kind``; the seam promises them, so fill them in.

    A metadata-only type's objects (``PartialObjectMetadata``, or whole ones from a server that
    did not convert them) become their own kind with their metadata alone.
    """
    if resource.metadata_only:
        return {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": obj.get("metadata") or {}}
    if "kind" not in obj or "apiVersion" not in obj:
        obj = {"apiVersion": resource.api_version, "kind": resource.kind, **obj}
    return obj


def change_time(obj: Mapping[str, Any]) -> float | None:
    """Unix time of the newest timestamp on the object's metadata, if any parses."""
    metadata = obj.get("metadata") or {}
    stamps = [metadata.get("creationTimestamp"), metadata.get("deletionTimestamp")]
    stamps += [entry.get("time") for entry in metadata.get("managedFields") or () if isinstance(entry, dict)]
    newest = None
    for stamp in stamps:
        if not isinstance(stamp, str):
            continue
        try:
            value = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        newest = value if newest is None else max(newest, value)
    return newest


class KubernetesResourceWatcher:
    """``ResourceWatcher`` over the Kubernetes API.

    ``watch_timeout`` is the shortest server-side watch timeout in seconds (each watch
    asks for a random one between it and twice it, as client-go does); a watch silent
    for longer than its timeout plus ``read_margin`` counts as a lost connection.
    ``retry_initial``/``retry_max`` bound the backoff; ``page_size`` the list pages.
    """

    # The cluster has Nodes (``Node`` can be watched): the destination then filters endpoints by topology.
    has_nodes = True

    def __init__(
        self,
        client: KubeClient | ClientSettings | None = None,
        *,
        metrics: WatchMetrics | None = None,
        page_size: int = 500,
        watch_timeout: float = 300.0,
        read_margin: float = 30.0,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client if isinstance(client, KubeClient) else KubeClient(client)
        self.metrics = metrics or WatchMetrics()
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._read_margin = read_margin
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._active = 0

    @property
    def client(self) -> KubeClient:
        return self._client

    async def aclose(self) -> None:
        """Close the shared client now (watches still running reopen it)."""
        await self._client.close()

    async def watch(self, type_key: str, namespace: str | None = None) -> AsyncIterator[ResourceEvent]:
        resource = api_resource(type_key)
        self._active += 1
        try:
            async for event in self._watch(resource, namespace):
                yield event
        finally:
            self._active -= 1
            if self._active == 0:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._client.close())

    async def _watch(self, resource: ApiResource, namespace: str | None) -> AsyncIterator[ResourceEvent]:
        label = resource.key
        known: dict[Key, _Seen] = {}
        failures = 0
        reason = "start"
        absent = False  # an optional type whose CRD is missing, already announced as empty
        while True:
            try:
                items, version = await self._list(resource, namespace)
            except ResourceGone as exc:  # a continue token expired mid-listing: start over (at once, the first time)
                failures += 1
                log.info("listing %s expired, listing again: %s", label, exc)
                if failures > 1:
                    await self._backoff(label, "list", exc, failures - 1)
                continue
            except KubeError as exc:
                if resource.optional and isinstance(exc, ApiError) and exc.status == 404:
                    if not absent:
                        absent = True
                        log.info("%s is not served (its CRD is not installed): empty until it is", label)
                        for event in self._resync(resource, known, [], ""):
                            yield event
                        self.metrics.synced.labels(label).set(1)
                        yield ResourceEvent("SYNCED", None, "", self._clock())
                    await self._sleep(self._retry_max)
                    continue
                failures += 1
                await self._backoff(label, "list", exc, failures)
                continue
            absent = False
            self.metrics.lists.labels(label, reason).inc()
            for event in self._resync(resource, known, items, version):
                yield event
            self.metrics.synced.labels(label).set(1)
            yield ResourceEvent("SYNCED", None, version, self._clock())
            try:
                while True:
                    started, received = self._clock(), 0
                    async for raw in self._client.stream(
                        resource.collection_path(namespace), self._watch_params(version),
                        read_timeout=self._watch_timeout * 2 + self._read_margin,
                        accept=METADATA_WATCH if resource.metadata_only else JSON_TYPE,
                    ):
                        received += 1
                        failures = 0
                        self.metrics.last_message.labels(label).set(self._wall_clock())
                        event, version = self._on_watch_event(resource, known, raw, version)
                        if event is not None:
                            self.metrics.events.labels(label, event.type).inc()
                            yield event
                    if received == 0 and self._clock() - started < 1.0:
                        # A server that ends watches at once would make this loop spin: slow it down.
                        failures += 1
                        await self._sleep(self._delay(failures))
            except ResourceGone as exc:
                log.info("watch of %s fell behind the server's history (%s), listing again", label, exc)
                reason = "gone"
                self.metrics.synced.labels(label).set(0)
            except KubeError as exc:
                failures += 1
                reason = "error"
                self.metrics.synced.labels(label).set(0)
                await self._backoff(label, "watch", exc, failures)

    def _watch_params(self, version: str) -> dict[str, Any]:
        timeout = int(self._watch_timeout * (1 + self._rng.random()))
        return {"watch": True, "resourceVersion": version, "allowWatchBookmarks": True,
                "timeoutSeconds": max(1, timeout)}

    async def _list(self, resource: ApiResource, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self._client.get(
                resource.collection_path(namespace), {"limit": self._page_size, "continue": token},
                accept=METADATA_LIST if resource.metadata_only else JSON_TYPE,
            )
            metadata = page.get("metadata") or {}
            items.extend(_with_kind(item, resource) for item in page.get("items") or () if isinstance(item, dict))
            token = metadata.get("continue") or None
            if token is None:
                return items, str(metadata.get("resourceVersion") or "")

    def _resync(
        self, resource: ApiResource, known: dict[Key, _Seen], items: list[dict[str, Any]], version: str
    ) -> list[ResourceEvent]:
        now = self._clock()
        fresh = {_key(obj): obj for obj in items}
        events = [ResourceEvent("DELETED", known.pop(key).stub, version, now) for key in [k for k in known if k not in fresh]]
        for key, obj in fresh.items():
            seen = _seen(obj, resource)
            before = known.get(key)
            if before is not None and _same(before, seen):
                continue
            known[key] = seen
            events.append(ResourceEvent("ADDED" if before is None else "MODIFIED", obj, seen.version or version, now))
        for event in events:
            self.metrics.events.labels(resource.key, event.type).inc()
        return events

    def _on_watch_event(
        self, resource: ApiResource, known: dict[Key, _Seen], raw: Mapping[str, Any], version: str
    ) -> tuple[ResourceEvent | None, str]:
        """The event to yield for one watch message (None to skip it) and the version to resume from."""
        kind = raw.get("type")
        obj = raw.get("object")
        if not isinstance(obj, dict):
            raise ApiUnreachable(f"watch of {resource.key}: a {kind} event without an object")
        if kind == "ERROR":
            raise ApiError.from_status(obj)
        if kind == "BOOKMARK":
            self.metrics.bookmarks.labels(resource.key).inc()
            return None, _version(obj) or version
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("watch of %s: ignoring an event of type %r", resource.key, kind)
            return None, version
        obj = _with_kind(obj, resource)
        now = self._clock()
        seen = _seen(obj, resource)
        resume = seen.version or version
        key = _key(obj)
        before = known.get(key)
        if kind == "DELETED":
            if before is None:
                return None, resume
            del known[key]
            self._observe_lag(resource, obj)
            return ResourceEvent("DELETED", obj, resume, now), resume
        if before is not None and _same(before, seen):
            return None, resume
        known[key] = seen
        self._observe_lag(resource, obj)
        return ResourceEvent("ADDED" if before is None else "MODIFIED", obj, resume, now), resume

    def _observe_lag(self, resource: ApiResource, obj: Mapping[str, Any]) -> None:
        stamp = change_time(obj)
        if stamp is not None:
            self.metrics.lag.labels(resource.key).observe(max(0.0, self._wall_clock() - stamp))

    def _delay(self, failures: int) -> float:
        base = min(self._retry_max, self._retry_initial * 2 ** min(failures - 1, 30))
        return base * (0.5 + 0.5 * self._rng.random())  # "equal jitter": between half and all of it

    async def _backoff(self, label: str, what: str, exc: KubeError, failures: int) -> None:
        if isinstance(exc, ConfigError):
            raise exc  # no cluster to talk to: waiting will not help, and the caller should say so
        error = "unreachable" if isinstance(exc, ApiUnreachable) else (
            str(exc.status) if isinstance(exc, ApiError) else type(exc).__name__
        )
        self.metrics.errors.labels(label, error).inc()
        delay = self._delay(failures)
        hint = ""
        if isinstance(exc, ApiError) and exc.status == 404:
            hint = " (is the CRD installed? `tether install --crds | kubectl apply -f -`)"
        log.warning("%s of %s failed (%s)%s; retrying in %.1fs", what, label, exc, hint, delay)
        await self._sleep(delay)
