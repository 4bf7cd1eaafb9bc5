"""The I/O side of one HTTP/1 connection: transports' callbacks in, ``core.http1_proxy.Http1Proxy`` out.

``Http1Io`` is the core's ``Http1Sink``. It becomes the ``handler`` of the
accepted connection's ``Stream`` and of each upstream connection the core
checks out, so every read goes straight from ``data_received`` (``buffer_updated`` over TLS) into the core,
and the core's writes go straight to the transports -- as ``link()`` does for
opaque bytes. Backpressure both ways: while the client's write buffer is over
its high-water mark the upstream in hand is not read, and while that
upstream's is, the client is not (nor while the core holds too much, which it
asks for with ``pause_down``).

A connection idle between requests for ``IdleClients.timeout`` is closed
(``IdleClients``: one timer for all of a direction's connections).

What must wait runs as a task that calls back into the core: a new upstream
connection (``Driver.open_upstream``), a discovery wait. An idle pooled
connection comes back at once: the one this client connection's last request
used, kept with it (``kept``: ``io.pool``'s affinity), else one from
``io.pool.Pool``. The connection ends
with ``close`` (the core's), or after a protocol switch when both joined
connections have ended.

Caller: ``io.driver.Driver`` (the ``ServeHttp1`` command).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tether.proxy.core.commands import Command, Connect, Failed, Revocable
from tether.proxy.core.http import HttpSettings, Router
from tether.proxy.core.http1_proxy import Http1Proxy, Timer
from tether.proxy.core.http_commands import Upstream

from tether.proxy.io.pool import Waiter, usable
from tether.proxy.io.streams import Stream, abort, client_addr, link

if TYPE_CHECKING:
    from tether.proxy.io.driver import Driver, _Conn


class Http1Io:
    """One accepted connection served as HTTP/1 (see the module docstring)."""

    __slots__ = ("driver", "idle", "conn", "down", "core", "up", "finished", "loop", "core_paused", "up_full",
                 "down_full", "down_reading", "up_reading_paused", "closed", "to_down", "to_up",
                 "waiting", "pool", "send_down", "send_up", "kept", "kept_since", "__weakref__")

    def __init__(self, driver: Driver, conn: _Conn, down: Stream, router: Router, settings: HttpSettings,
                 idle: IdleClients) -> None:
        self.driver = driver
        self.idle = idle
        self.conn = conn
        self.down = down
        self.loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.up: Upstream | None = None  # the upstream connection in hand (its reads come to the core)
        self.core_paused = False  # the core holds enough of the client's bytes
        self.up_full = False  # the upstream in hand has a full write buffer
        self.down_full = False  # the client has a full write buffer
        self.down_reading = True
        self.up_reading_paused = False
        self.closed = False
        # What the core wrote during the callback in hand, written once when it returns: one syscall (and one
        # TLS record, for a small message) per side per read, however many events that read completed.
        self.to_down: list[bytes] = []
        # Http1Sink.send_down: the list's own append (a call in C, not a Python method: two per request). An
        # empty write the core hands over is written as nothing.
        self.send_down = self.to_down.append
        # For the upstream connection in hand (``up``): Http1Sink.send_up, the same way (a Python call less per
        # request); written before that connection is checked in or joined.
        self.to_up: list[bytes] = []
        self.send_up = self.to_up.append
        self.waiting: set[Waiter] = set()  # the pool's waits for the core's checkouts
        # The direction's pool, asked directly at check-out and check-in (not through the driver: two calls per
        # request less).
        self.pool = driver.pool(conn.direction)
        # The upstream connection this client connection keeps (io.pool's Keeper: in use while it is ``up``, else
        # idle since ``kept_since``, the loop's time), for its next request to the same endpoint.
        self.kept: Upstream | None = None
        self.kept_since = 0.0
        # The core holds its sink weakly: this object holds the core, and a cycle would leave every closed
        # connection to the cyclic garbage collector, whose full passes stall the loop (docs/benchmarks.md).
        # Whatever calls into the core comes through this object (its streams' callbacks, its timers', its
        # waits'), which is alive while they can. The client's address only for tap, its one reader.
        self.core = Http1Proxy(router, settings, weakref.proxy(self),
                               client=client_addr(down) if settings.observer is not None else None)

    def start(self) -> None:
        """Take over the client's stream, with what it already holds (sniffed bytes, an EOF)."""
        down = self.down
        down.handler = self
        self.idle.add(self)
        if down.buffer:
            self.core.down_data(down.take())
        if down.lost:
            self.core.down_lost()
        elif down.eof:
            self.core.down_eof()
        self.flush()

    # -- Stream handler (called from the streams' protocol callbacks) --------------------------------------------

    def on_data(self, stream: Stream, data: bytes) -> None:
        if stream is self.down:
            self.core.down_data(data)
        elif self.up is not None and stream is self.up.io:
            self.core.up_data(self.up, data)
        if self.to_down or self.to_up:
            self.flush()

    def on_eof(self, stream: Stream) -> None:
        if stream is self.down:
            self.core.down_eof()
        elif self.up is not None and stream is self.up.io:
            self.core.up_eof(self.up)
        self.flush()

    def on_lost(self, stream: Stream) -> None:
        if stream is self.down:
            self.core.down_lost()
            self._finish()
        elif self.up is not None and stream is self.up.io and not stream.eof:
            self.core.up_eof(self.up)
        self.flush()

    def flush(self) -> None:
        """Write what the core wrote since the last flush, one write per side."""
        to_up = self.to_up
        if to_up:
            up = self.up
            assert up is not None
            data = to_up[0] if len(to_up) == 1 else b"".join(to_up)
            to_up.clear()  # the same list: send_up appends to it
            stream = up.io
            if not stream.lost and data:
                stream.tx += len(data)
                stream.transport.write(data)
        to_down = self.to_down
        if to_down:
            data = to_down[0] if len(to_down) == 1 else b"".join(to_down)
            to_down.clear()  # the same list: send_down appends to it
            stream = self.down
            if not stream.lost and data:
                stream.tx += len(data)
                stream.transport.write(data)

    def on_write_paused(self, stream: Stream) -> None:
        if stream is self.down:
            self.down_full = True
            self._up_reading()
        else:
            self.up_full = True
            self._down_reading()

    def on_write_resumed(self, stream: Stream) -> None:
        if stream is self.down:
            self.down_full = False
            self._up_reading()
        else:
            self.up_full = False
            self._down_reading()

    def _down_reading(self) -> None:
        want = not (self.core_paused or self.up_full)
        if want != self.down_reading and not self.down.lost:
            self.down_reading = want
            if want:
                self.down.transport.resume_reading()
            else:
                self.down.transport.pause_reading()

    def _up_reading(self) -> None:
        up = self.up
        if up is None or up.io.lost:
            return
        pause = self.down_full
        if pause != self.up_reading_paused:
            self.up_reading_paused = pause
            if pause:
                up.io.transport.pause_reading()
            else:
                up.io.transport.resume_reading()

    # -- Http1Sink ------------------------------------------------------------------------------------------------

    def pause_down(self) -> None:
        self.core_paused = True
        self._down_reading()

    def resume_down(self) -> None:
        self.core_paused = False
        self._down_reading()

    def close(self) -> None:
        self.flush()
        self._finish()

    def checkout(self, connect: Connect, header: bytes | None,
                 done: Callable[[Upstream | Failed], None]) -> Upstream | None:
        kept = self.kept
        if kept is not None:
            if kept.key == connect.pool_key and kept is not self.up and usable(kept.io):
                # The connection the last request used, taken back without the pool (its take, put, _reused and
                # a usable check: four Python calls less per request).
                kept.reused = True
                kept.elapsed = 0.0
                self._hold(kept)
                return kept
            self._let_go()  # another endpoint now (or closed meanwhile): the pool has it (or closes it)
        up = self.pool.take(connect.pool_key)
        if up is not None:
            self._hold(up)
            return up
        waiter = self.driver.pool_wait(self.conn.direction, connect, header,
                                       lambda reply: self._ready(waiter, reply, done))
        self.waiting.add(waiter)
        return None

    def _ready(self, waiter: Waiter, reply: Upstream | Failed, done: Callable[[Upstream | Failed], None]) -> None:
        """The pool has a connection (or a failed connect) for a request that waited."""
        self.waiting.discard(waiter)
        if isinstance(reply, Upstream):
            if self.closed:  # not reached: a closed connection's waits are cancelled; kept safe all the same
                self.pool.put(reply)
                return
            if self.up is None:  # else a wait of a request that ended, answered while the next one has its own
                self._hold(reply)  # connection: the core checks this one in at once, the one in hand stays ``up``
        done(reply)
        self.flush()

    def _hold(self, up: Upstream) -> None:
        """``up`` is the core's now: its reads go to the core, its backpressure is the client's."""
        self.conn.checked_out.add(up)
        up.io.handler = self
        self.up = up
        self.up_full = up.io.paused
        # Each only when it may change something (the usual check-out: nothing paused either way).
        if self.down_full or self.up_reading_paused:
            self._up_reading()
        if self.up_full or self.core_paused or not self.down_reading:
            self._down_reading()

    def checkin(self, up: Upstream, reuse: bool) -> None:
        if self.up is up and self.to_up:
            self.flush()
        stream = up.io
        stream.handler = None
        self.conn.checked_out.discard(up)
        if self.up is up:
            self.up = None
            if self.up_reading_paused:
                self.up_reading_paused = False
                if not stream.lost:
                    stream.transport.resume_reading()
            self.up_full = False
            if self.core_paused or not self.down_reading:
                self._down_reading()
        if reuse and not self.closed:
            kept = self.kept
            if kept is up and up.key not in self.pool.wanted:
                self.kept_since = self.loop.time()  # kept for the next request (see checkout)
                return
            if kept is None and self.pool.keep(self, up):
                self.kept = up
                self.kept_since = self.loop.time()
                return
            if kept is up:  # requests wait for its endpoint: it goes to them
                self.kept = None
                self.pool.unkeep(self, up)
            self.pool.put(up)
            return
        if self.kept is up:
            self.kept = None
            self.pool.unkeep(self, up)
        if not stream.lost:
            stream.transport.close()

    def _let_go(self) -> None:
        """The kept connection is no longer this client connection's: back to the pool (which closes it if it is
        not usable any more), unless a request of this connection still has it in hand."""
        kept = self.kept
        assert kept is not None
        self.kept = None
        self.pool.unkeep(self, kept)
        if kept is not self.up:
            self.pool.put(kept)

    def wait(self, command: Command, done: Callable[[Any], None]) -> None:
        def waited(reply: Any) -> None:
            done(reply)
            self.flush()

        self.driver.run_then(self.conn, command, waited)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        def fire() -> None:
            callback()
            self.flush()

        return self.loop.call_later(delay, fire)

    def count(self, name: str, labels: str) -> None:
        self.driver.count(name, labels)

    def tunnel(self, up: Upstream, to_up: bytes, to_down: bytes, done: Callable[[], None],
               authz: Revocable | None) -> None:
        self.flush()
        down, stream = self.down, up.io
        down.handler = None
        stream.handler = None
        self.up = None
        if self.kept is up:  # the tunnel's now, never to be pooled
            self.kept = None
            self.pool.unkeep(self, up)
        for side, paused in ((down, not self.down_reading), (stream, self.up_reading_paused)):
            if paused and not side.lost:
                side.transport.resume_reading()
        down.buffer[:0] = to_up
        stream.buffer[:0] = to_down
        link(down, stream)
        both = asyncio.gather(down.done, stream.done)
        stop = authz.watch(lambda: abort(down, stream)) if authz is not None else None

        def ended(_: object) -> None:
            if stop is not None:
                stop()
            done()
            self._finish()

        both.add_done_callback(ended)

    def _finish(self) -> None:
        if not self.closed:
            self.closed = True
            if self.kept is not None:
                self._let_go()
            for waiter in self.waiting:
                waiter.cancel()
            self.waiting.clear()
            self.idle.discard(self)
            if not self.finished.done():
                self.finished.set_result(None)


class IdleClients:
    """HTTP/1 client connections of one direction, each closed once idle between requests for ``timeout``.

    One timer for all of them, every ``timeout``: a connection that moved no byte since the last sweep and has
    no request in hand is closed, so an idle connection lasts between one and two ``timeout``s. A keep-alive
    client that sends nothing cannot hold the proxy's descriptors for ever.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._served: dict[Http1Io, tuple[int, int]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, served: Http1Io) -> None:
        self._served[served] = (-1, -1)
        if self._timer is None:
            self._timer = served.loop.call_later(self.timeout, self._sweep)

    def discard(self, served: Http1Io) -> None:
        self._served.pop(served, None)

    def _sweep(self) -> None:
        self._timer = None
        for served, seen in list(self._served.items()):
            moved = (served.down.rx, served.down.tx)
            if moved == seen and served.core.idle:
                served.core.expire()  # closes: the connection leaves the set
            else:
                self._served[served] = moved
        if self._served:
            self._timer = asyncio.get_running_loop().call_later(self.timeout, self._sweep)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
