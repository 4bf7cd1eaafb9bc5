"""Several real processes writing one store at once: no lost update, every version unique and in order."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from pathlib import Path

from store_workers import COUNTER, SPAWN, open_fresh_and_apply, pod, write_and_increment

from tether.store import Store

WORKERS, CREATES, INCREMENTS = 4, 40, 25


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    with Store(path) as store:
        store.apply(pod(COUNTER[2]))
    with SPAWN.Pool(WORKERS) as pool:
        per_worker = pool.starmap(
            write_and_increment, [(path, w, CREATES, INCREMENTS) for w in range(WORKERS)]
        )

    for versions in per_worker:
        assert len(versions) == CREATES + INCREMENTS
        assert versions == sorted(versions) and len(set(versions)) == len(versions)
    every = [v for versions in per_worker for v in versions]
    assert len(set(every)) == len(every), "two writes got the same version"

    changes = 1 + WORKERS * (CREATES + INCREMENTS)
    with Store(path) as store:
        counter = store.get(*COUNTER)
        assert counter is not None
        assert counter["metadata"]["annotations"]["count"] == str(WORKERS * INCREMENTS)
        assert len(store.list("Pod").items) == 1 + WORKERS * CREATES
        assert store.resource_version() == changes
        assert sorted(every) == list(range(2, changes + 1))

        async def replay() -> list[int]:
            seen: list[int] = []
            async with aclosing(store.watch(None, 0)) as events:
                async for event in events:
                    seen.append(event.resource_version)
                    if event.resource_version == changes:
                        return seen
            return seen

        assert asyncio.run(replay()) == list(range(1, changes + 1))


def test_processes_creating_the_same_store_at_once_agree(tmp_path: Path) -> None:
    path = str(tmp_path / "new" / "store.db")
    start = SPAWN.Barrier(WORKERS)
    workers = [SPAWN.Process(target=open_fresh_and_apply, args=(path, w, start)) for w in range(WORKERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0] * WORKERS
    with Store(path) as store:
        assert sorted(o["metadata"]["name"] for o in store.list("Pod").items) == [f"first-{w}" for w in range(WORKERS)]
        assert store.resource_version() == WORKERS
