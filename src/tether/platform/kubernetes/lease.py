"""Leader election with a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it.

Linkerd's destination writes ExternalWorkload EndpointSlices only while it holds the Lease
``linkerd-destination-endpoint-write`` in the control-plane namespace (30 s lease, renewed every
10 s, tried every 2 s when not held); every replica serves discovery. `LeaseElector.run`
does the same: it creates the Lease when there is none, takes it when its holder let it expire,
renews it while held, and sets or clears ``leading``. Every write is a JSON merge patch carrying
the ``resourceVersion`` it read, so two replicas cannot both take it; a conflict or an error
means "not leading" until the next try.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from tether.platform.kubernetes.client import ApiError, KubeClient, KubeError

log = logging.getLogger(__name__)

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def _micro_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class LeaseElector:
    """Holds ``name`` in ``namespace`` as ``identity`` while it can; ``leading`` says whether it does now."""

    def __init__(
        self, client: KubeClient, namespace: str, name: str, identity: str, *, duration: float = 30.0,
        renew_every: float = 10.0, retry_every: float = 2.0, clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._collection = LEASES.format(namespace=quote(namespace, safe=""))
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._duration = duration
        self._renew_every = renew_every
        self._retry_every = retry_every
        self._clock = clock
        self._sleep = sleep
        self.leading = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                held = await self.try_once()
            except KubeError as exc:
                log.warning("lease %s/%s: %s", self._namespace, self._name, exc)
                held = False
            if held and not self.leading.is_set():
                log.info("lease %s/%s: leading as %s", self._namespace, self._name, self.identity)
            if not held and self.leading.is_set():
                log.warning("lease %s/%s: lost it", self._namespace, self._name)
            (self.leading.set if held else self.leading.clear)()
            await self._sleep(self._renew_every if held else self._retry_every)

    async def try_once(self) -> bool:
        """One acquire-or-renew; True when this replica holds the Lease afterwards."""
        now = self._clock()
        path = f"{self._collection}/{quote(self._name, safe='')}"
        try:
            lease = await self._client.get(path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return await self._write(None, {"holderIdentity": self.identity, "acquireTime": _micro_time(now),
                                            "renewTime": _micro_time(now), "leaseTransitions": 0,
                                            "leaseDurationSeconds": int(self._duration)})
        spec: Mapping[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse_time(spec.get("renewTime"))
        duration = spec.get("leaseDurationSeconds") or self._duration
        if holder == self.identity:
            changes: dict[str, Any] = {"renewTime": _micro_time(now)}
        elif not holder or renewed is None or renewed + float(duration) < now:
            changes = {"holderIdentity": self.identity, "acquireTime": _micro_time(now), "renewTime": _micro_time(now),
                       "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1,
                       "leaseDurationSeconds": int(self._duration)}
        else:
            return False
        return await self._write(lease, changes)

    async def _write(self, lease: Mapping[str, Any] | None, spec: dict[str, Any]) -> bool:
        try:
            if lease is None:
                await self._client.post(self._collection, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self._name, "namespace": self._namespace}, "spec": spec})
            else:
                version = (lease.get("metadata") or {}).get("resourceVersion")
                await self._client.merge_patch(f"{self._collection}/{quote(self._name, safe='')}",
                                               {"metadata": {"resourceVersion": version}, "spec": spec})
        except ApiError as exc:
            if exc.status == 409:  # another replica wrote first
                return False
            raise
        return True
