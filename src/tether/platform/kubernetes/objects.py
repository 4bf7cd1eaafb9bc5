"""Single objects read and Events written over the API, for callers on worker threads.

The proxy injector answers admission reviews on worker threads (``tether.injector.server``)
while the API client lives on the event loop (``client.KubeClient``). `OwnerReader` and
`EventWriter` hand their work to that loop:

- `OwnerReader(namespace, kind, name)` GETs one object of an owner kind (ReplicaSet, Job,
  Deployment...) and returns its ``metadata``, None on 404; waits at most ``timeout``.
- `EventWriter.record(involved, reason, message)` creates a core/v1 ``Event`` about
  ``involved`` (an object with ``api_version``, ``kind``, ``namespace``, ``name``, ``uid``),
  named ``<name>.<hex nanoseconds>`` as client-go names them; it returns at once, and a failure
  is logged, never raised (Events are advice).
- `WarningEvents.warn(involved, reason, message)` creates a Warning Event and returns when it is
  written: the EndpointSlice controllers' ``tether.platform.problems.EventSink``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

from tether.platform.kubernetes.client import ApiError, KubeClient, KubeError
from tether.platform.kubernetes.resources import EVENT, OWNER_KINDS, UnknownResourceType, api_resource

log = logging.getLogger(__name__)


class Involved(Protocol):
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str


_OWNERS = {r.kind: r for r in (*OWNER_KINDS, api_resource("Deployment.apps"), api_resource("Pod"))}


class OwnerReader:
    """``(namespace, kind, name) -> metadata | None`` from the API, callable from any thread but the loop's."""

    def __init__(self, client: KubeClient, loop: asyncio.AbstractEventLoop, *, timeout: float = 2.0) -> None:
        self._client = client
        self._loop = loop
        self._timeout = timeout

    def __call__(self, namespace: str, kind: str, name: str) -> Mapping[str, Any] | None:
        future = asyncio.run_coroutine_threadsafe(self.get(namespace, kind, name), self._loop)
        try:
            return future.result(self._timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def get(self, namespace: str, kind: str, name: str) -> Mapping[str, Any] | None:
        resource = _OWNERS.get(kind)
        if resource is None:
            raise UnknownResourceType(f"no Kubernetes resource for owner kind {kind!r}")
        path = f"{resource.collection_path(namespace)}/{quote(name, safe='')}"
        try:
            obj = await self._client.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        metadata = obj.get("metadata")
        return metadata if isinstance(metadata, dict) else {}


class EventWriter:
    """Creates Events on the loop; ``record`` may be called from any thread."""

    def __init__(self, client: KubeClient, loop: asyncio.AbstractEventLoop, *, component: str) -> None:
        self._client = client
        self._loop = loop
        self._component = component
        self._tasks: set[asyncio.Task] = set()

    def record(self, involved: Involved, reason: str, message: str) -> None:
        self._loop.call_soon_threadsafe(self._spawn, involved, reason, message)

    def _spawn(self, involved: Involved, reason: str, message: str) -> None:
        task = self._loop.create_task(self.create(involved, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def create(self, involved: Involved, reason: str, message: str, event_type: str = "Normal") -> None:
        await create_event(self._client, self._component, involved, reason, message, event_type)


class WarningEvents:
    """The Kubernetes `tether.platform.problems.EventSink`: Warning Events created over the API."""

    def __init__(self, client: KubeClient, *, component: str) -> None:
        self._client = client
        self._component = component

    async def warn(self, involved: Involved, reason: str, message: str) -> None:
        await create_event(self._client, self._component, involved, reason, message, "Warning")


async def create_event(client: KubeClient, component: str, involved: Involved, reason: str, message: str,
                       event_type: str) -> None:
    """Create a core/v1 Event about ``involved``; a failure is logged, never raised (Events are advice)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved.name}.{time.time_ns():x}", "namespace": involved.namespace},
        "involvedObject": {"apiVersion": involved.api_version, "kind": involved.kind, "name": involved.name,
                           "namespace": involved.namespace, "uid": involved.uid},
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await client.post(EVENT.collection_path(involved.namespace), body)
    except KubeError as exc:
        log.warning("cannot record event %s on %s %s/%s: %s", reason, involved.kind, involved.namespace,
                    involved.name, exc)
