"""Objects and child-process bodies shared by the store tests.

Children are started with the ``spawn`` method, so each one imports this module
fresh and opens its own ``Store``, as separate Tether processes would.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from contextlib import aclosing
from multiprocessing.connection import Connection
from typing import Any

from tether.store import Conflict, Store

SPAWN = multiprocessing.get_context("spawn")
COUNTER = ("Pod", "ns", "counter")


def pod(name: str, namespace: str = "ns", labels: dict[str, str] | None = None, image: str = "app:1") -> dict:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        metadata["labels"] = labels
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": image}]},
    }


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def write_and_increment(path: str, worker: int, creates: int, increments: int) -> list[int]:
    """Create ``creates`` pods of its own and bump the shared counter ``increments`` times.

    The counter is read-modify-write with the read's resourceVersion, retried on
    Conflict, so a lost update would show as a short count.  Returns the versions
    of this worker's writes, in the order they were made.
    """
    versions: list[int] = []
    with Store(path) as store:
        for i in range(max(creates, increments)):
            if i < creates:
                versions.append(int(store.apply(pod(f"w{worker}-{i}"))["metadata"]["resourceVersion"]))
            if i < increments:
                while True:
                    current = store.get(*COUNTER)
                    assert current is not None
                    annotations = current["metadata"].setdefault("annotations", {})
                    annotations["count"] = str(int(annotations.get("count", "0")) + 1)
                    try:
                        stored = store.apply(current)
                    except Conflict:
                        continue
                    versions.append(int(stored["metadata"]["resourceVersion"]))
                    break
    return versions


def watch_pods(path: str, since: int, count: int, out: multiprocessing.Queue) -> None:
    """Report ``count`` Pod events after ``since`` on ``out``, relying on wake-ups alone (no useful poll)."""

    async def main() -> None:
        with Store(path, poll_interval=3600) as store:
            seen = 0
            async with aclosing(store.watch("Pod", since)) as events:
                async for event in events:
                    metadata = event.object["metadata"]
                    out.put((event.type, metadata["name"], metadata.get("labels"), event.resource_version))
                    seen += 1
                    if seen == count:
                        return

    asyncio.run(main())


def watch_then_vanish(path: str, ready: Connection) -> None:
    """Start a watch (binding a wake-up socket), say so, then die without any cleanup."""

    async def main() -> None:
        store = Store(path, poll_interval=3600)
        events = store.watch("Pod", 0)
        await anext(events)
        # A pipe, not a Queue: a Queue's feeder thread would not flush before _exit.
        ready.send(sorted(os.listdir(path + "-watch")))
        os._exit(0)

    asyncio.run(main())


def create_pods(path: str, count: int, partway: int, reached: Any) -> None:
    """Create pods ``p0..p<count-1>`` one by one, setting ``reached`` after ``partway`` of them."""
    with Store(path) as store:
        for i in range(count):
            store.apply(pod(f"p{i}"))
            if i + 1 == partway:
                reached.set()


def open_fresh_and_apply(path: str, worker: int, start: Any) -> None:
    """Open a store that may not exist yet, at the same moment as other processes, and write to it."""
    start.wait()
    with Store(path) as store:
        store.apply(pod(f"first-{worker}"))
