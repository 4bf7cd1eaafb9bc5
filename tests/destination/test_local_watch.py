"""The local platform's ``ResourceWatcher`` over a real store: list, SYNCED, changes, relist on Gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

from destination_helpers import namespace, pod, service

from tether.platform.local.watch import LocalResourceWatcher
from tether.platform.watch import ResourceEvent
from tether.store import Store


async def _take(events: AsyncIterator[ResourceEvent], count: int) -> list[tuple[str, str | None]]:
    out = []
    async for event in events:
        out.append((event.type, None if event.object is None else event.object["metadata"]["name"]))
        if len(out) == count:
            return out
    raise AssertionError("the watch ended")


async def test_lists_then_syncs_then_follows_changes(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db") as store:
        store.apply_many([namespace(), pod("web-1", "10.1.0.1"), pod("web-2", "10.1.0.2"), service()])
        watcher = LocalResourceWatcher(store)
        async with aclosing(watcher.watch("Pod")) as events:
            assert await _take(events, 3) == [("ADDED", "web-1"), ("ADDED", "web-2"), ("SYNCED", None)]
            store.apply(pod("web-3", "10.1.0.3"))
            store.apply(pod("web-1", "10.1.0.1", ready=False))
            store.delete("Pod", "emojivoto", "web-2")
            store.apply(service("other"))  # another type: not seen
            assert await _take(events, 3) == [("ADDED", "web-3"), ("MODIFIED", "web-1"), ("DELETED", "web-2")]


async def test_falling_behind_the_history_relists_and_yields_only_the_difference(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db", history=3) as store:
        store.apply_many([namespace(), pod("keep", "10.1.0.1"), pod("gone", "10.1.0.2"), pod("same", "10.1.0.4")])
        watcher = LocalResourceWatcher(store)
        async with aclosing(watcher.watch("Pod")) as events:
            first = await _take(events, 4)
            assert first[-1] == ("SYNCED", None)
            # While the watcher is not reading, more changes happen than the history keeps.
            store.delete("Pod", "emojivoto", "gone")
            store.apply(pod("keep", "10.1.0.1", ready=False))
            for i in range(5):
                store.apply(service(f"filler-{i}"))
            store.apply(pod("new", "10.1.0.3"))
            # The watcher relists: DELETED for what vanished, MODIFIED/ADDED for what changed, nothing for "same".
            relisted = await _take(events, 4)
            assert sorted(relisted[:3]) == [("ADDED", "new"), ("DELETED", "gone"), ("MODIFIED", "keep")]
            assert relisted[3] == ("SYNCED", None)


async def test_deleted_events_after_a_relist_name_the_object(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db", history=1) as store:
        store.apply_many([namespace(), pod("web-1", "10.1.0.1")])
        watcher = LocalResourceWatcher(store)
        async with aclosing(watcher.watch("Pod", "emojivoto")) as events:
            await _take(events, 2)
            store.delete("Pod", "emojivoto", "web-1")
            store.apply(service())
            store.apply(service("b"))
            async for event in events:
                assert event.type == "DELETED"
                assert event.key == ("emojivoto", "web-1")
                assert event.object is not None and event.object["kind"] == "Pod"
                break


async def test_ends_when_the_store_closes(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.db")
    watcher = LocalResourceWatcher(store)
    events = watcher.watch("Pod")
    assert await _take(events, 1) == [("SYNCED", None)]
    store.close()
    async for _ in events:
        raise AssertionError("no event after close")
