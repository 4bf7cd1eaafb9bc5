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


def test_an_endpoint_keeps_at_most_max_idle_connections_and_a_bound_of_zero_keeps_none() -> None:
    async def scenario() -> None:
        pool = Pool(max_idle=1)  # LINKERD2_PROXY_*MAX_IDLE_CONNS_PER_ENDPOINT=1
        first, second, elsewhere = conn(), conn(), conn("other")
        pool.put(first)
        pool.put(elsewhere)  # another endpoint's bound is its own
        pool.put(second)  # a second idle connection to the same endpoint: the one idle longest is closed
        assert first.io.transport.closed and not second.io.transport.closed
        assert not elsewhere.io.transport.closed
        assert pool.take("k") is second and pool.take("k") is None
        pool.close()
        none = Pool(max_idle=0)
        idle = conn()
        none.put(idle)
        assert idle.io.transport.closed and none.take("k") is None
        assert not none.keep(Keeper(), conn()) and not none._keys  # nothing kept, no key left behind
        none.close()

    run(scenario)


class Keeper:
    """A client connection keeping an upstream connection (as io.http1_io.Http1Io does): ``up`` is in use."""

    def __init__(self) -> None:
        self.kept: Upstream | None = None
        self.kept_since = 0.0
        self.up: Upstream | None = None

    def keep(self, pool: Pool, up: Upstream) -> bool:
        if not pool.keep(self, up):
            return False
        self.kept, self.kept_since = up, asyncio.get_running_loop().time()
        return True


def test_a_kept_connection_is_taken_by_another_request_only_while_idle() -> None:
    async def scenario() -> None:
        pool = Pool()
        keeper, a = Keeper(), conn()
        assert keeper.keep(pool, a)
        keeper.up = a  # its own next request has it in hand: nobody else's
        assert pool.take("k") is None and keeper.kept is a
        keeper.up = None  # idle again: another client connection's request takes it rather than a new one
        assert pool.take("k") is a and a.reused and keeper.kept is None
        b = conn()
        assert keeper.keep(pool, b)
        b.io.eof = True  # the server closed it while kept: dropped, not handed out
        assert pool.take("k") is None and b.io.transport.closed and keeper.kept is None
        pool.close()

    run(scenario)


def test_no_connection_is_kept_while_requests_wait_for_its_endpoint() -> None:
    async def scenario() -> None:
        pool = Pool()
        opener = Opener(asyncio.get_running_loop())
        got: list[Upstream | Failed] = []
        pool.wait("k", opener, got.append)
        keeper, freed = Keeper(), conn()
        assert not keeper.keep(pool, freed) and "k" in pool.wanted
        pool.put(freed)  # what the keeper does instead: the waiting request gets it
        assert got == [freed] and "k" not in pool.wanted
        assert keeper.keep(pool, conn())  # nobody waits any more
        await opener.finish(conn())  # the connection opened for the wait: idle in the pool
        pool.close()

    run(scenario)


def test_kept_connections_count_against_the_endpoints_idle_bound() -> None:
    async def scenario() -> None:
        pool = Pool(max_idle=1)
        first, second = Keeper(), Keeper()
        a, b = conn(), conn()
        assert first.keep(pool, a)
        assert not second.keep(pool, b)  # the bound is reached by the kept one
        pool.put(b)  # a second idle connection to the same endpoint: closed
        assert b.io.transport.closed and not a.io.transport.closed
        first.kept = None
        pool.unkeep(first, a)  # its client connection ended: back to the pool, within the bound
        pool.put(a)
        assert pool.take("k") is a
        pool.close()

    run(scenario)


def test_kept_connections_idle_for_the_timeout_are_closed_and_those_in_use_are_not() -> None:
    async def scenario() -> None:
        pool = Pool(idle_timeout=0.0)  # due at the sweeper's first run
        idle, busy = Keeper(), Keeper()
        a, b = conn(), conn("other")
        assert idle.keep(pool, a) and busy.keep(pool, b)
        busy.up = b
        while not a.io.transport.closed:  # the sweeper runs on a coming loop iteration
            await asyncio.sleep(0)
        assert idle.kept is None and busy.kept is b and not b.io.transport.closed
        pool.close_idle()  # a test settling its metrics: what is in use stays
        assert busy.kept is b and not b.io.transport.closed
        pool.close()  # the shutdown: taken away from its keeper, closed at its check-in
        assert busy.kept is None and not b.io.transport.closed
        pool.put(b)
        assert b.io.transport.closed

    run(scenario)
