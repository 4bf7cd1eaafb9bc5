"""tether.proxy.io.pool: idle upstream connections reused and swept, and requests that find none waiting for the
next one checked in or a new one, with a bounded number being opened at once (no handshake storm)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from tether.proxy.core.commands import Failed
from tether.proxy.core.http_commands import Upstream
from tether.proxy.io.pool import MAX_CONNECTING, Pool


class Transport:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Stream:
    def __init__(self) -> None:
        self.lost = self.eof = False
        self.buffer = bytearray()
        self.transport = Transport()


def conn(key: str = "k") -> Upstream:
    return Upstream(key, Stream(), 0.01, False)


class Opener:
    """Connects that finish when the test says so (``finish``), counted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[asyncio.Future[Upstream | Failed]] = []

    def __call__(self) -> asyncio.Future[Upstream | Failed]:
        future: asyncio.Future[Upstream | Failed] = self.loop.create_future()
        self.pending.append(future)
        return future

    async def finish(self, reply: Upstream | Failed) -> None:
        self.pending.pop(0).set_result(reply)
        await asyncio.sleep(0)  # the pool's done-callback runs on the next loop iteration


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def test_pool_reuses_open_connections_and_sweeps_idle_ones() -> None:
    async def scenario() -> None:
        pool = Pool(idle_timeout=0.0)  # every idle connection is due at the sweeper's first run
        a, b, c = conn(), conn(), conn()
        pool.put(a)
        pool.put(b)
        b.io.eof = True  # the server closed it while idle
        assert pool.take("k") is a and a.reused and b.io.transport.closed
        assert pool.take("k") is None and pool.take("other") is None
        pool.put(c)
        while not c.io.transport.closed:  # the sweeper runs on a coming loop iteration
            await asyncio.sleep(0)
        assert c.io.transport.closed and pool.take("k") is None
        pool.close()

    run(scenario)


def test_a_waiting_request_takes_the_next_connection_checked_in_and_the_new_one_is_kept() -> None:
    async def scenario() -> None:
        pool = Pool()
        opener = Opener(asyncio.get_running_loop())
        got: list[Upstream | Failed] = []
        pool.wait("k", opener, got.append)
        assert len(opener.pending) == 1 and got == []  # a connect started; nothing handed out from within wait
        busy = conn()
        pool.put(busy)  # another request's connection comes back first: the waiting request takes it
        assert got == [busy] and busy.reused
        fresh = conn()
        await opener.finish(fresh)  # nobody waits any more: the new connection is idle in the pool
        assert not fresh.io.transport.closed and pool.take("k") is fresh
        pool.close()

    run(scenario)


def test_a_burst_opens_a_bounded_number_of_connections_at_once_and_grows_while_requests_wait() -> None:
    async def scenario() -> None:
        pool = Pool()
        opener = Opener(asyncio.get_running_loop())
        got: list[Upstream | Failed] = []
        for _ in range(10):
            pool.wait("k", opener, got.append)
        assert len(opener.pending) == MAX_CONNECTING  # not ten handshakes at once
        first = conn()
        await opener.finish(first)
        assert got == [first] and not first.reused
        assert len(opener.pending) == MAX_CONNECTING  # nine still wait: another connect replaces the one done
        for _ in range(7):  # requests finishing hand their connections on
            pool.put(conn())
        assert len(got) == 8
        opened = 1
        while opener.pending:
            await opener.finish(conn())
            opened += 1
        assert len(got) == 10 and all(isinstance(g, Upstream) for g in got)
        assert opened == 3  # new connections only while more requests waited than were being opened
        pool.close()

    run(scenario)


def test_a_failed_connect_fails_every_request_waiting_for_that_key_only() -> None:
    async def scenario() -> None:
        pool = Pool(max_connecting=1)
        opener = Opener(asyncio.get_running_loop())
        got: list[Upstream | Failed] = []
        other: list[Upstream | Failed] = []
        for _ in range(3):
            pool.wait("k", opener, got.append)
        pool.wait("elsewhere", opener, other.append)
        refused = Failed("connect", "ECONNREFUSED")
        await opener.finish(refused)
        assert got == [refused] * 3 and other == []
        assert len(opener.pending) == 1  # only "elsewhere"'s connect: the failed key has nobody waiting
        pool.close()

    run(scenario)


def test_a_cancelled_wait_is_skipped() -> None:
    async def scenario() -> None:
        pool = Pool()
        opener = Opener(asyncio.get_running_loop())
        gone: list[Upstream | Failed] = []
        got: list[Upstream | Failed] = []
        pool.wait("k", opener, gone.append).cancel()  # its client went away
        pool.wait("k", opener, got.append)
        up = conn()
        pool.put(up)
        assert gone == [] and got == [up]
        pool.close()

    run(scenario)


def test_connections_still_being_opened_when_the_pool_closes_are_closed() -> None:
    async def scenario() -> None:
        pool = Pool()
        opener = Opener(asyncio.get_running_loop())
        got: list[Upstream | Failed] = []
        pool.wait("k", opener, got.append)
        pool.close()
        late = conn()
        await opener.finish(late)
        assert late.io.transport.closed and got == []

    run(scenario)


def test_close_idle_closes_what_is_idle_and_the_pool_keeps_serving() -> None:
    async def scenario() -> None:
        pool = Pool()
        idle = conn()
        pool.put(idle)
        pool.close_idle()
        assert idle.io.transport.closed and pool.take("k") is None
        again = conn()
        pool.put(again)
        assert pool.take("k") is again
        pool.close()

    run(scenario)
