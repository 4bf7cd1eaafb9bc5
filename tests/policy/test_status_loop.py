"""The status loop as it runs in ``tether policy serve``: the policy controller with its status writer.

Each test awaits the store's own events (a watch from the version its check read), never a
sleep.  The regressions: ``stop`` arriving in the turn a change woke the loop used to be
swallowed by Python 3.11's ``wait_for`` (the task went on running and ``stop`` never
returned); and a status write waiting on another process's write lock used to block the
whole event loop, gRPC and watches included.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from policy_helpers import NS, WAIT, Harness, Pki, http_route, namespace, pod, server, stored

from tether.policy.status import CONTROLLER_NAME, Key, LocalStatusWriter, Status
from tether.resources import kinds

ROUTE = kinds.POLICY_HTTP_ROUTE.key


def accepted(obj: dict[str, Any] | None) -> tuple[str, str] | None:
    """Our ``Accepted`` condition on the route's first parent: (status, reason), or None before any."""
    parents = ((obj or {}).get("status") or {}).get("parents") or []
    for parent in parents:
        if parent.get("controllerName") == CONTROLLER_NAME:
            condition = next(c for c in parent["conditions"] if c["type"] == "Accepted")
            return condition["status"], condition["reason"]
    return None


async def test_the_running_loop_writes_status_after_each_change(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), http_route("r", "web"), status_writer=LocalStatusWriter) as h:
        await stored(h.store, ROUTE, "r", lambda o: accepted(o) == ("False", "NoMatchingParent"))
        h.apply(server("web"))
        await stored(h.store, ROUTE, "r", lambda o: accepted(o) == ("True", "Accepted"))
        h.delete("srv", "web")
        await stored(h.store, ROUTE, "r", lambda o: accepted(o) == ("False", "NoMatchingParent"))


async def test_stop_ends_the_loop_even_when_a_change_wakes_it_in_the_same_turn(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), status_writer=LocalStatusWriter) as h:
        status = h.service.status
        assert status is not None
        await asyncio.wait_for(status.idle.wait(), WAIT)  # parked, waiting for a change
        status.changed()  # a change lands ...
        await asyncio.wait_for(h.service.stop(), WAIT)  # ... as stop cancels the loop: it must end


class Observed:
    """The real local writer, with events set when a write for ``key`` begins and when it is over."""

    def __init__(self, inner: LocalStatusWriter, key: Key) -> None:
        self.inner = inner
        self.key = key
        self.entered = asyncio.Event()
        self.returned = asyncio.Event()
        self.writes = 0

    async def write(self, key: Key, resource_version: str, status: dict[str, Any]) -> str | None:
        if key != self.key:
            return await self.inner.write(key, resource_version, status)
        self.entered.set()
        try:
            return await self.inner.write(key, resource_version, status)
        finally:
            self.writes += 1
            self.returned.set()

    def close(self) -> None:
        self.inner.close()


def observing(writers: list[Observed], name: str) -> Callable[[Path], Observed]:
    def make(path: Path) -> Observed:
        writers.append(Observed(LocalStatusWriter(path), (ROUTE, NS, name)))
        return writers[-1]
    return make


async def test_a_status_already_written_is_not_written_again(workdir: Path, pki: Pki) -> None:
    writers: list[Observed] = []
    async with Harness(workdir, pki, namespace(), pod(), http_route("r", "web"),
                       status_writer=observing(writers, "r")) as h:
        [observed] = writers
        await stored(h.store, ROUTE, "r", lambda o: accepted(o) == ("False", "NoMatchingParent"))
        await asyncio.wait_for(observed.returned.wait(), WAIT)  # the loop has taken note of its write
        status = h.service.status
        assert status is not None
        assert await status.reconcile() == 0  # the watch's echo of its own write changes nothing
        h.apply(http_route("r", "web", rules=[{"matches": [{"path": {"value": "/other"}}]}]))  # a spec change
        await stored(h.store, ROUTE, "r", lambda o: o is not None and o["metadata"]["generation"] == 2)
        assert await status.reconcile() == 0  # the status stands: no write
        assert observed.writes == 1
        # Another writer drops our entry: the object moved on, so the loop looks again (a round that found
        # nothing to write skips an object only while neither its version nor its wanted status moves).
        clobbered = {**http_route("r", "web", rules=[{"matches": [{"path": {"value": "/other"}}]}]),
                     "status": {"parents": []}}
        h.apply(clobbered)
        back = await stored(h.store, ROUTE, "r", lambda o: accepted(o) == ("False", "NoMatchingParent"))
        assert back is not None and back["metadata"]["generation"] == 2


async def test_a_write_waiting_for_another_process_holds_up_neither_grpc_nor_the_watches(
        workdir: Path, pki: Pki) -> None:
    writers: list[Observed] = []
    # A patch timeout longer than the test: here the write must wait for the lock, not be given up on.
    async with Harness(workdir, pki, namespace(), pod(), http_route("r", "web"),
                       status_writer=observing(writers, "r"), patch_timeout=600.0) as h:
        await stored(h.store, ROUTE, "r", lambda o: accepted(o) == ("False", "NoMatchingParent"))
        watch = h.watch(8080)
        assert (await watch.next())["labels"]["kind"] == "default"
        [observed] = writers
        await asyncio.wait_for(observed.returned.wait(), WAIT)  # the first write is over
        observed.entered.clear()
        observed.returned.clear()
        h.apply(server("web"))
        # Another process takes the store's write lock before the status loop can write (WAL readers go on).
        other = sqlite3.connect(h.store.path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            await asyncio.wait_for(observed.entered.wait(), WAIT)  # the loop is writing r's status: it waits
            # Meanwhile the watches feed the index and gRPC answers, on the same event loop.
            assert (await watch.next())["labels"] == {"group": "policy.linkerd.io", "kind": "server", "name": "web"}
            assert (await h.get())["labels"]["name"] == "web"
            assert not observed.returned.is_set()  # the write still waits for the lock
            assert accepted(h.store.get(ROUTE, NS, "r")) == ("False", "NoMatchingParent")
        finally:
            other.execute("ROLLBACK")
            other.close()
        await stored(h.store, ROUTE, "r", lambda o: accepted(o) == ("True", "Accepted"))
        watch.call.cancel()


class Stuck:
    """The real local writer, except that writes for ``key`` never finish until ``release`` is set."""

    def __init__(self, inner: LocalStatusWriter, key: Key) -> None:
        self.inner = inner
        self.key = key
        self.release = asyncio.Event()
        self.given_up = 0

    async def write(self, key: Key, resource_version: str, status: dict[str, Any]) -> str | None:
        if key == self.key and not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.given_up += 1
                raise
        return await self.inner.write(key, resource_version, status)

    def close(self) -> None:
        self.inner.close()


async def test_a_write_past_the_patch_timeout_is_given_up_counted_and_retried(workdir: Path, pki: Pki) -> None:
    writers: list[Stuck] = []

    def make(path: Path) -> Stuck:
        writers.append(Stuck(LocalStatusWriter(path), (ROUTE, NS, "stuck")))
        return writers[-1]

    # Linkerd's --patch-timeout-ms: a write that does not finish in time is abandoned, the others go on.
    async with Harness(workdir, pki, namespace(), pod(), http_route("stuck", "web"), http_route("fine", "web"),
                       status_writer=make, patch_timeout=0.05) as h:
        [writer] = writers
        await stored(h.store, ROUTE, "fine", lambda o: accepted(o) == ("False", "NoMatchingParent"))
        status = h.service.status
        assert status is not None
        while writer.given_up == 0:
            await status.reconcile()
        assert accepted(h.store.get(ROUTE, NS, "stuck")) is None  # never written
        timeouts = h.service.metrics.registry.get_sample_value(
            "resource_status_patch_timeouts_total", {"kind": "HTTPRoute"})
        assert timeouts is not None and timeouts >= 1
        writer.release.set()  # the platform answers again: the next round writes it
        await status.reconcile()
        await stored(h.store, ROUTE, "stuck", lambda o: accepted(o) == ("False", "NoMatchingParent"))
