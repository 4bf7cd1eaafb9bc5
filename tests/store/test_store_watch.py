"""Watches: in order across processes, woken without polling, consistent with a list, Gone past the history."""

from __future__ import annotations

import asyncio
import os
from contextlib import aclosing
from pathlib import Path

import pytest
from store_workers import SPAWN, create_pods, namespace, pod, watch_pods, watch_then_vanish

from tether.resources.selectors import LabelSelector
from tether.store import Gone, Store, WatchEvent, list_then_watch

# A failing test should fail, not hang: the deadline for a message from a child process.
DEADLINE = 60


def _summary(events: list[WatchEvent]) -> list[tuple[str, str, int]]:
    return [(e.type, e.object["metadata"]["name"], e.resource_version) for e in events]


def test_a_watch_in_another_process_sees_every_change_in_order(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    with Store(path) as store:
        since = store.apply(pod("other"))["metadata"]["resourceVersion"]
        store.apply(pod("web", labels={"v": "1"}))
        out = SPAWN.Queue()
        child = SPAWN.Process(target=watch_pods, args=(path, int(since), 4, out))
        child.start()
        try:
            # The child has read the history and is now waiting; its poll is an hour,
            # so everything after this arrives through the wake-up sockets.
            assert out.get(timeout=DEADLINE) == ("ADDED", "web", {"v": "1"}, 2)
            store.apply(namespace("unwatched"))
            store.apply(pod("web", labels={"v": "2"}))
            store.delete("Pod", "ns", "web")
            store.apply_many([pod("api"), pod("other", image="app:2")])
            got = [out.get(timeout=DEADLINE) for _ in range(3)]
        finally:
            child.join(DEADLINE)
    assert got == [
        ("MODIFIED", "web", {"v": "2"}, 4),
        ("DELETED", "web", {"v": "2"}, 5),
        ("ADDED", "api", None, 6),
    ]
    assert child.exitcode == 0


def test_a_watch_is_woken_by_writes_of_its_own_process(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db", poll_interval=3600) as store:
        store.apply(pod("web"))

        async def scenario() -> list[tuple[str, str, int]]:
            async with aclosing(store.watch("Pod", 0)) as events:
                seen = [await anext(events)]
                await asyncio.to_thread(store.apply, pod("from-a-thread"))
                seen.append(await anext(events))
                store.delete("Pod", "ns", "web")
                seen.append(await anext(events))
            return _summary(seen)

        assert asyncio.run(scenario()) == [("ADDED", "web", 1), ("ADDED", "from-a-thread", 2), ("DELETED", "web", 3)]


def test_a_watch_whose_wake_ups_are_lost_still_gets_changes_by_polling(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db", poll_interval=0.05) as store:
        store.apply(pod("web"))

        async def scenario() -> list[tuple[str, str, int]]:
            async with aclosing(store.watch("Pod", 0)) as events:
                seen = [await anext(events)]
                for socket_file in (tmp_path / "store.db-watch").iterdir():
                    socket_file.unlink()  # no writer can reach this watch any more
                store.apply(pod("api"))
                seen.append(await anext(events))
            return _summary(seen)

        assert asyncio.run(scenario()) == [("ADDED", "web", 1), ("ADDED", "api", 2)]


def test_list_then_watch_with_a_concurrent_writer_sees_each_object_once(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    count = 300
    reached = SPAWN.Event()
    with Store(path, poll_interval=3600) as store:
        writer = SPAWN.Process(target=create_pods, args=(path, count, count // 3, reached))
        writer.start()
        assert reached.wait(DEADLINE)
        listed = store.list("Pod")
        assert len(listed.items) >= count // 3

        async def watch_until_all() -> list[WatchEvent]:
            seen: list[WatchEvent] = []
            names = {o["metadata"]["name"] for o in listed.items}
            async with aclosing(store.watch("Pod", listed.resource_version)) as events:
                async for event in events:
                    seen.append(event)
                    names.add(event.object["metadata"]["name"])
                    if len(names) == count:
                        return seen
            return seen

        watched = asyncio.run(asyncio.wait_for(watch_until_all(), DEADLINE))
        writer.join(DEADLINE)
        assert writer.exitcode == 0
        # Everything the writer did is now either listed or watched; nothing came after.
        assert store.resource_version() == count

    assert {e.type for e in watched} == {"ADDED"}
    names = [o["metadata"]["name"] for o in listed.items] + [e.object["metadata"]["name"] for e in watched]
    assert sorted(names) == sorted(f"p{i}" for i in range(count))
    versions = [e.resource_version for e in watched]
    assert versions == list(range(listed.resource_version + 1, count + 1))


def test_watch_filters_by_type_and_namespace(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db") as store:
        store.apply_many([pod("a", "one"), pod("b", "two"), namespace("one"), pod("c", "one")])

        async def collect(type_key: str | None, ns: str | None, count: int) -> list[tuple[str, str, int]]:
            async with aclosing(store.watch(type_key, 0, ns)) as events:
                seen = [await anext(events) for _ in range(count)]
            return _summary(seen)

        assert asyncio.run(collect("Pod", "one", 2)) == [("ADDED", "a", 1), ("ADDED", "c", 4)]
        assert asyncio.run(collect("Pod", "two", 1)) == [("ADDED", "b", 2)]
        assert asyncio.run(collect("Namespace", None, 1)) == [("ADDED", "one", 3)]
        assert asyncio.run(collect(None, None, 4)) == [
            ("ADDED", "a", 1), ("ADDED", "b", 2), ("ADDED", "one", 3), ("ADDED", "c", 4)
        ]


def test_a_watch_older_than_the_history_is_gone(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db", history=5) as store:
        store.apply_many([pod(f"p{i}") for i in range(10)])

        async def first(since: int) -> WatchEvent:
            async with aclosing(store.watch("Pod", since)) as events:
                return await anext(events)

        with pytest.raises(Gone, match=r"store\.db: resource version 4 is older than the kept history"):
            asyncio.run(first(4))
        assert asyncio.run(first(5)).resource_version == 6
        with pytest.raises(Gone, match="newer than the store's"):
            asyncio.run(first(11))


def test_a_watch_that_falls_behind_the_history_is_gone(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db", history=5) as store:
        store.apply(pod("first"))

        async def fall_behind() -> None:
            async with aclosing(store.watch("Pod", 0)) as events:
                assert (await anext(events)).object["metadata"]["name"] == "first"
                store.apply_many([pod(f"p{i}") for i in range(6)])
                await anext(events)

        with pytest.raises(Gone):
            asyncio.run(fall_behind())


def test_list_then_watch_relists_after_gone_and_yields_the_difference(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db", history=3) as store:
        store.apply_many([pod("keep"), pod("change"), pod("drop")])

        async def follow() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
            async with aclosing(list_then_watch(store, "Pod", "ns")) as events:
                initial = [(e.type, e.object["metadata"]["name"]) for e in [await anext(events) for _ in range(3)]]
                # Five changes with a history of three: the watch is Gone and must relist.
                store.delete("Pod", "ns", "drop")
                store.apply(pod("change", image="app:2"))
                store.apply_many([pod("new-1"), pod("new-2"), pod("new-3")])
                after = [(e.type, e.object["metadata"]["name"]) for e in [await anext(events) for _ in range(5)]]
            return initial, after

        initial, after = asyncio.run(follow())
    assert initial == [("ADDED", "change"), ("ADDED", "drop"), ("ADDED", "keep")]
    assert after == [
        ("DELETED", "drop"), ("MODIFIED", "change"), ("ADDED", "new-1"), ("ADDED", "new-2"), ("ADDED", "new-3")
    ]


def test_list_then_watch_follows_objects_into_and_out_of_a_selector(tmp_path: Path) -> None:
    with Store(tmp_path / "store.db") as store:
        store.apply_many([pod("a", labels={"app": "web"}), pod("b", labels={"app": "db"})])

        async def follow() -> list[tuple[str, str]]:
            async with aclosing(list_then_watch(store, "Pod", selector=LabelSelector.parse("app=web"))) as events:
                seen = [await anext(events)]
                store.apply(pod("b", labels={"app": "web"}))
                store.apply(pod("a", labels={"app": "db"}))
                store.apply(pod("a", labels={"app": "db"}, image="app:2"))
                store.apply(pod("b", labels={"app": "web"}, image="app:2"))
                store.delete("Pod", "ns", "a")
                store.delete("Pod", "ns", "b")
                seen += [await anext(events) for _ in range(4)]
            return [(e.type, e.object["metadata"]["name"]) for e in seen]

        assert asyncio.run(follow()) == [
            ("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a"), ("MODIFIED", "b"), ("DELETED", "b")
        ]


def test_cancelling_or_closing_ends_watches_and_removes_their_socket(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.db")
    watch_dir = tmp_path / "store.db-watch"
    store.apply(pod("web"))

    async def scenario() -> list[str]:
        waiting = asyncio.Event()

        async def consume() -> list[str]:
            names = []
            async for event in store.watch("Pod", 0):
                names.append(event.object["metadata"]["name"])
                waiting.set()
            return names

        first = asyncio.create_task(consume())
        await waiting.wait()
        assert len(os.listdir(watch_dir)) == 1, "one socket serves the process"
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert os.listdir(watch_dir) == []

        waiting.clear()
        second = asyncio.create_task(consume())
        await waiting.wait()
        store.close()
        return await second

    assert asyncio.run(scenario()) == ["web"]
    assert os.listdir(watch_dir) == []


def test_a_writer_removes_the_socket_of_a_dead_watcher(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    with Store(path) as store:
        store.apply(pod("web"))
        ready, child_end = SPAWN.Pipe(duplex=False)
        child = SPAWN.Process(target=watch_then_vanish, args=(path, child_end))
        child.start()
        assert ready.poll(DEADLINE)
        sockets = ready.recv()
        child.join(DEADLINE)
        assert len(sockets) == 1 and os.listdir(path + "-watch") == sockets
        store.apply(pod("api"))
        assert os.listdir(path + "-watch") == []
