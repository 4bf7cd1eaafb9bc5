"""Upstream HTTP/1 connections per endpoint: idle ones kept for the next request, new ones opened a few at a time.

A connection goes back in the pool after a request when both ends allow
keep-alive; ``take`` hands out the most recently used one still open with
nothing unread (a server that closed or spoke out of turn is dropped). An
idle connection is closed after ``idle_timeout`` (the driver keeps one pool
per direction, each with its configured timeout) and each key keeps at most
``max_idle`` (the oldest closed to make room; 0 keeps none). The key is the
``Connect`` command's address and TLS, so two endpoints, or one reached with
and without mTLS, never share a connection.

**Affinity.** A client connection keeps the upstream connection its last
request used (``keep``: ``io.http1_io.Http1Io`` is the ``Keeper``) and its
next request to the same endpoint takes it back without asking the pool;
it comes back here when the client connection ends or its next request goes
to another endpoint (``unkeep`` and ``put``), and closes after
``idle_timeout`` idle as the pooled ones do (the sweep looks at the keepers
too). A kept connection counts against its endpoint's ``max_idle`` while
kept (in use or not); a request finding no idle connection here takes one
another client connection keeps idle (``take``), and none is kept while
requests wait for its endpoint (``wanted``: it goes to them). This spares
the pool's round trip, four Python calls per request (docs/benchmarks.md).

A request that finds no idle connection **waits** (``wait``): for the next
connection of its key checked in by another request, or for a new one,
whichever comes first. At most ``MAX_CONNECTING`` new connections per key
are being opened at once, and another is started only while requests are
still waiting when one is ready; what a request no longer waits for goes
to the next waiter or into the pool. Opening a connection per waiting request instead (what
this pool did before) turned any burst into a storm of mutual TLS
handshakes on the CPU the requests needed: at 1,000 req/s, a hiccup of a
few milliseconds opened dozens of connections and the tail grew to a
quarter of a second (docs/benchmarks.md). A failed connect fails every
request waiting for that key (each is routed again: the endpoint is in
trouble, and the balancer's backoff moves them to another one).

Callers: ``tether.proxy.io.http1_io`` (``checkout``/``checkin`` of the
HTTP/1 core) and ``tether.proxy.io.driver`` (``Checkout``/``Checkin``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from tether.proxy.core.commands import Failed
from tether.proxy.core.http_commands import Upstream

IDLE_TIMEOUT = 3.0  # seconds: Linkerd's default (LINKERD2_PROXY_*_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT)
MAX_IDLE = 10_000  # per key: Linkerd's default (LINKERD2_PROXY_OUTBOUND_MAX_IDLE_CONNS_PER_ENDPOINT and inbound's)
# New connections being opened at once per key. More than one, so a burst towards a slow upstream grows the
# pool faster than one handshake at a time; few, so a burst on a busy CPU does not turn into a handshake storm.
MAX_CONNECTING = 2

Opener = Callable[[], Awaitable["Upstream | Failed"]]


class Keeper(Protocol):
    """A client connection keeping an upstream connection (``io.http1_io.Http1Io``): ``kept`` (None: none) is in
    use while it is also ``up``, else idle since the loop time ``kept_since``. The pool sets ``kept`` to None when
    it takes the connection away (another request's, the idle timeout's, the shutdown's)."""

    kept: Upstream | None
    kept_since: float
    up: Upstream | None


class Waiter:
    """A request waiting for a connection of ``key``; ``cancel`` when it no longer needs one.

    ``done`` is let go once called or cancelled: it usually holds its connection's I/O side, which holds this
    waiter, and a cycle would leave the connection for the cyclic garbage collector."""

    __slots__ = ("key", "done", "live")

    def __init__(self, key: object, done: Callable[[Upstream | Failed], None]) -> None:
        self.key = key
        self.done = done
        self.live = True

    def answer(self, reply: Upstream | Failed) -> None:
        done = self.done
        self.done = _unwanted
        done(reply)

    def cancel(self) -> None:
        self.live = False
        self.done = _unwanted


def _unwanted(reply: Upstream | Failed) -> None:
    """What a cancelled waiter is answered with: nothing (``next_waiter`` skips it)."""


class _Key:
    """What the pool holds for one key: idle connections (with the loop time they went idle, oldest first),
    the client connections keeping one, the requests waiting, and how many new connections are being opened."""

    __slots__ = ("idle", "kept", "waiters", "connecting")

    def __init__(self) -> None:
        self.idle: list[tuple[Upstream, float]] = []
        self.kept: set[Keeper] = set()
        self.waiters: deque[Waiter] = deque()
        self.connecting = 0

    def next_waiter(self) -> Waiter | None:
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if waiter.live:
                waiter.live = False
                return waiter
        return None

    def waiting(self) -> int:
        return sum(1 for w in self.waiters if w.live)


class Pool:
    def __init__(self, idle_timeout: float = IDLE_TIMEOUT, max_idle: int = MAX_IDLE,
                 max_connecting: int = MAX_CONNECTING) -> None:
        self._keys: dict[object, _Key] = {}
        self._idle_timeout = idle_timeout
        self._max_idle = max_idle
        self._max_connecting = max_connecting
        self._sweeper: asyncio.TimerHandle | None = None  # one timer for the pool, not one per check-in
        self._connects: set[asyncio.Future[Any]] = set()
        self._closed = False
        # The keys requests wait for (maybe a few more: a cancelled wait leaves its key until the next ``put``): a
        # connection of one of them is not kept by its client connection (``keep``), it goes to them.
        self.wanted: set[object] = set()
        # The loop, once known (every check-in stamps the loop's time; asyncio.get_running_loop() costs a getpid()
        # system call per call on Python 3.11).
        self._loop: asyncio.AbstractEventLoop | None = None

    def take(self, key: object) -> Upstream | None:
        """The most recently used idle connection of ``key`` still usable, or None."""
        state = self._keys.get(key)
        if state is None:
            return None
        entries = state.idle
        while entries:
            up, _ = entries.pop()
            if usable(up.io):
                _reused(up)
                return up
            up.io.transport.close()
        # None idle here: one another client connection keeps idle, rather than a new one (or a wait).
        for keeper in list(state.kept):
            other = keeper.kept
            if other is None or other is keeper.up:
                continue
            keeper.kept = None
            state.kept.discard(keeper)
            if usable(other.io):
                _reused(other)
                return other
            other.io.transport.close()
        return None

    def keep(self, keeper: Keeper, up: Upstream) -> bool:
        """Whether ``keeper`` may keep ``up``, free after its request, for its next one (see the module
        docstring): not while requests wait for its key, nor beyond the key's ``max_idle``. The keeper sets
        ``kept`` and ``kept_since``; each later check-in of the same connection only stamps ``kept_since``."""
        key = up.key
        if self._closed or key in self.wanted:
            return False
        state = self._keys.get(key)
        if (len(state.idle) + len(state.kept) if state is not None else 0) >= self._max_idle:
            return False
        if state is None:
            state = self._keys[key] = _Key()
        state.kept.add(keeper)
        if self._sweeper is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self._idle_timeout, self._sweep)
        return True

    def unkeep(self, keeper: Keeper, up: Upstream) -> None:
        """``keeper`` no longer keeps ``up`` (it closed it, or hands it to ``put``); it has set ``kept`` to None."""
        state = self._keys.get(up.key)
        if state is not None:
            state.kept.discard(keeper)
            self._forget(up.key, state)

    def wait(self, key: object, opener: Opener, done: Callable[[Upstream | Failed], None]) -> Waiter:
        """Wait for a connection of ``key`` (after ``take`` found none): ``done`` gets the next one checked in,
        or one ``opener`` opens, or the ``Failed`` of such an attempt; never called from within ``wait``."""
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key()
        waiter = Waiter(key, done)
        state.waiters.append(waiter)
        self.wanted.add(key)
        if state.connecting < self._max_connecting:
            self._open(key, state, opener)
        return waiter

    def _open(self, key: object, state: _Key, opener: Opener) -> None:
        state.connecting += 1
        job = asyncio.ensure_future(opener())
        self._connects.add(job)
        job.add_done_callback(lambda j: self._opened(key, state, opener, j))

    def _opened(self, key: object, state: _Key, opener: Opener, job: asyncio.Future[Upstream | Failed]) -> None:
        self._connects.discard(job)
        state.connecting -= 1
        if job.cancelled():
            return
        reply = job.result()
        if self._closed:
            if isinstance(reply, Upstream):
                reply.io.transport.close()
            return
        if isinstance(reply, Failed):
            while (waiter := state.next_waiter()) is not None:
                waiter.answer(reply)
            self.wanted.discard(key)
            self._forget(key, state)
            return
        self.put(reply, fresh=True)
        if state.connecting < self._max_connecting and state.waiting() > state.connecting:
            self._open(key, state, opener)  # still more waiting than being opened: the pool grows by demand

    def put(self, up: Upstream, fresh: bool = False) -> None:
        """A connection free for another request: to the first request waiting for its key, else idle."""
        stream = up.io
        if self._closed or not usable(stream):
            stream.transport.close()
            return
        state = self._keys.get(up.key)
        if state is None:
            state = self._keys[up.key] = _Key()
        waiter = state.next_waiter() if state.waiters else None
        if not state.waiters:
            self.wanted.discard(up.key)
        if waiter is not None:
            if not fresh:
                _reused(up)
            waiter.answer(up)
            return
        entries = state.idle
        if len(entries) + len(state.kept) >= self._max_idle:  # the endpoint's bound: the one idle longest makes room
            if not entries:  # none idle here (a bound of 0, or all kept by client connections): this one goes
                stream.transport.close()
                self._forget(up.key, state)
                return
            old, _ = entries.pop(0)
            old.io.transport.close()
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        entries.append((up, loop.time()))
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._idle_timeout, self._sweep)

    def _forget(self, key: object, state: _Key) -> None:
        if not state.idle and not state.kept and not state.connecting and not state.waiting() \
                and self._keys.get(key) is state:
            del self._keys[key]

    def _sweep(self) -> None:
        """Close the connections idle for ``idle_timeout``, pooled or kept; come back while any are left."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        horizon = loop.time() - self._idle_timeout
        left = False
        for key, state in list(self._keys.items()):
            entries = state.idle
            while entries and entries[0][1] <= horizon:
                entries.pop(0)[0].io.transport.close()
            for keeper in list(state.kept):
                up = keeper.kept
                if up is not None and up is not keeper.up and keeper.kept_since <= horizon:
                    keeper.kept = None
                    state.kept.discard(keeper)
                    up.io.transport.close()
            if entries or state.kept:
                left = True
            else:
                self._forget(key, state)
        if left:
            self._sweeper = loop.call_later(self._idle_timeout / 2, self._sweep)

    def close(self) -> None:
        """Close every idle connection, and what connects still under way open (shutdown)."""
        self._closed = True
        keys, self._keys = self._keys, {}
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.wanted.clear()
        for state in keys.values():
            for up, _ in state.idle:
                up.io.transport.close()
            _let_go_kept(state, in_use=True)

    def close_idle(self) -> None:
        """Close every idle connection, pooled or kept, and keep serving (a test settling its metrics)."""
        for state in self._keys.values():
            idle, state.idle = state.idle, []
            for up, _ in idle:
                up.io.transport.close()
            _let_go_kept(state, in_use=False)


def _let_go_kept(state: _Key, in_use: bool) -> None:
    """The connections client connections keep idle closed, and taken from them; with ``in_use``, those in use
    taken from them too (closed at their check-in: the pool is closed)."""
    for keeper in list(state.kept):
        up = keeper.kept
        idle = up is not None and up is not keeper.up
        if idle or in_use:
            keeper.kept = None
            state.kept.discard(keeper)
            if idle and up is not None:
                up.io.transport.close()


def _reused(up: Upstream) -> None:
    up.reused = True
    up.elapsed = 0.0


def usable(stream: Any) -> bool:
    """Whether an idle connection's stream can carry a request: open, nothing unread (a server that closed or
    spoke out of turn is dropped)."""
    return not (stream.lost or stream.eof or stream.buffer or stream.transport.is_closing())
