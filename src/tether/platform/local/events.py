"""Events on the local platform: core/v1 Event objects in the store, as the API server keeps them.

`StoreEvents` is the local `tether.platform.problems.EventSink`, and records the injector's
``Injected``/``InjectionSkipped`` on a Deployment whose pod the pod controller meshed (or not), as
the webhook records them on a pod's owner on Kubernetes. Each is an ``Event`` in the object's
namespace, named ``<object>.<digest of reason and message>`` so that the same
problem reported again (after a restart of ``tether platform run``) counts up ``count`` and
``lastTimestamp`` on one Event, as Kubernetes aggregates repeats, instead of adding another.
``tether get events -n <ns>`` lists them (TYPE, REASON, OBJECT, MESSAGE). As the API server
drops Events an hour after their last occurrence (``--event-ttl``), `expire_events` (run by
``tether platform run``) deletes those whose ``lastTimestamp`` is older than `EVENT_TTL`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from datetime import UTC, datetime, timedelta

from tether.platform.local.sandbox import now_text
from tether.platform.problems import Involved
from tether.resources.errors import ValidationError
from tether.resources.kinds import EVENT
from tether.store import Store, StoreError

log = logging.getLogger(__name__)

COMPONENT = "tether-platform"
EVENT_TTL = timedelta(hours=1)  # the API server's default --event-ttl
EXPIRE_EVERY_S = 300.0


class StoreEvents:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def warn(self, involved: Involved, reason: str, message: str) -> None:
        await asyncio.to_thread(self.record, involved, reason, message, "Warning")

    def record(self, involved: Involved, reason: str, message: str, event_type: str = "Normal") -> None:
        """Write the Event (or count a repeat of it) now; a failure is logged, never raised."""
        digest = hashlib.sha256(f"{involved.kind}\0{reason}\0{message}".encode()).hexdigest()[:10]
        name = f"{involved.name}.{digest}"
        now = now_text()
        try:
            stored = self._store.get(EVENT.key, involved.namespace, name)
            count = int(stored.get("count", 1)) + 1 if stored else 1
            self._store.apply({
                "apiVersion": EVENT.api_version,
                "kind": EVENT.kind,
                "metadata": {"name": name, "namespace": involved.namespace},
                "involvedObject": {"apiVersion": involved.api_version, "kind": involved.kind, "name": involved.name,
                                   "namespace": involved.namespace, "uid": involved.uid},
                "reason": reason,
                "message": message,
                "type": event_type,
                "count": count,
                "source": {"component": COMPONENT},
                "firstTimestamp": (stored or {}).get("firstTimestamp", now),
                "lastTimestamp": now,
            })
        except (StoreError, ValidationError) as exc:
            log.warning("cannot record event %s on %s %s/%s: %s", reason, involved.kind, involved.namespace,
                        involved.name, exc)


def expired(store: Store, now: datetime, ttl: timedelta = EVENT_TTL) -> list[tuple[str, str | None, str]]:
    """The keys of Events last seen more than ``ttl`` before ``now`` (an unreadable time counts as old)."""
    keys = []
    for event in store.list(EVENT.key).items:
        try:
            last = datetime.strptime(str(event.get("lastTimestamp")), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            last = datetime.min.replace(tzinfo=UTC)
        if now - last > ttl:
            meta = event["metadata"]
            keys.append((EVENT.key, meta.get("namespace"), meta["name"]))
    return keys


async def expire_events(store: Store, every: float = EXPIRE_EVERY_S) -> None:
    """Delete expired Events now and every ``every`` seconds, until cancelled."""
    while True:
        try:
            keys = await asyncio.to_thread(expired, store, datetime.now(UTC))
            if keys:
                await asyncio.to_thread(store.delete_many, keys)
                log.debug("deleted %d expired events", len(keys))
        except StoreError as exc:
            log.warning("cannot expire events: %s", exc)
        await asyncio.sleep(every)
