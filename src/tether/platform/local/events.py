"""Events on the local platform: core/v1 Event objects in the store, as the API server keeps them.

`StoreEvents` is the local `tether.platform.problems.EventSink`, and records the injector's
``Injected``/``InjectionSkipped`` on a Deployment whose pod the pod controller meshed (or not), as
the webhook records them on a pod's owner on Kubernetes. Each is an ``Event`` in the object's
namespace, named ``<object>.<digest of reason and message>`` so that the same
problem reported again (after a restart of ``tether platform run``) counts up ``count`` and
``lastTimestamp`` on one Event, as Kubernetes aggregates repeats, instead of adding another.
``tether get events -n <ns>`` lists them (TYPE, REASON, OBJECT, MESSAGE).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

from tether.platform.local.sandbox import now_text
from tether.platform.problems import Involved
from tether.resources.errors import ValidationError
from tether.resources.kinds import EVENT
from tether.store import Store, StoreError

log = logging.getLogger(__name__)

COMPONENT = "tether-platform"


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
