"""The I/O side of one HTTP/2 connection: transports' callbacks in, ``core.http2_proxy.Http2Proxy`` out.

``Http2Io`` is the core's ``Http2Sink``. It becomes the ``handler`` of the
accepted connection's ``Stream`` and of every upstream connection the core
opens (HTTP/2 to an endpoint, or HTTP/1 to the app for a downgraded stream),
so every read goes straight from ``buffer_updated`` into the core, and the
core's writes (one per connection per callback: what h2 has to send) go
straight to the transports. A write buffer over its high-water mark is told
to the core (``writable``), which then holds data for that connection within
the windows; a connection with ``FLOOD_LIMIT`` unwritten is not read until it
drains (a peer that sends PINGs or SETTINGS and does not read the answers).

What must wait runs as a task that calls back into the core: a new upstream
connection (``Driver.open_upstream``), a discovery wait; timers are the
loop's. The connection ends with the core's ``close``; the driver then closes
every upstream connection it holds.

Caller: ``io.driver.Driver`` (the ``ServeHttp2`` command).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tether.proxy.core.commands import Command, Connect, Failed
from tether.proxy.core.http import HttpSettings, Router
from tether.proxy.core.http2_proxy import Http2Proxy, Timer
from tether.proxy.core.http_commands import Upstream

from tether.proxy.io.streams import Stream, client_addr

if TYPE_CHECKING:
    from tether.proxy.io.driver import Driver, _Conn

# A connection with this much unwritten is not read until it drains. The core writes data only within the peer's
# windows and holds it while a buffer is over its high-water mark; what grows past this is answers to a peer
# that sends (PINGs, SETTINGS...) and does not read.
FLOOD_LIMIT = 4 * 1024 * 1024


class Http2Io:
    """One accepted connection served as HTTP/2 (see the module docstring)."""

    __slots__ = ("driver", "conn", "down", "core", "ups", "finished", "loop", "closed", "flooded", "__weakref__")

    def __init__(self, driver: Driver, conn: _Conn, down: Stream, router: Router, settings: HttpSettings,
                 downgrade: bool) -> None:
        self.driver = driver
        self.conn = conn
        self.down = down
        self.loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.ups: dict[Stream, Upstream] = {}  # the upstream connections the core holds, by their stream
        self.closed = False
        self.flooded: set[Stream] = set()  # streams not read for FLOOD_LIMIT unwritten
        # The core holds its sink weakly, as the HTTP/1 core does (io/http1_io.py): this object holds the core,
        # and a cycle would leave every closed connection to the cyclic collector. What calls into the core comes
        # through this object (its streams' callbacks, its timers', its jobs'), which is alive while they can.
        self.core = Http2Proxy(router, settings, weakref.proxy(self), downgrade=downgrade,
                               client=client_addr(down) if settings.observer is not None else None)

    def start(self) -> None:
        """Take over the client's stream, with what it already holds (the preface, sniffed)."""
        down = self.down
        down.handler = self
        self.core.start()
        if down.buffer:
            self.core.down_data(down.take())
        if down.lost or down.eof:
            self.core.down_lost()

    # -- Stream handler (called from the streams' protocol callbacks) --------------------------------------------

    def on_data(self, stream: Stream, data: bytes) -> None:
        if stream is self.down:
            self.core.down_data(data)
            return
        up = self.ups.get(stream)
        if up is not None:
            self.core.up_data(up, data)

    def on_eof(self, stream: Stream) -> None:
        self.on_lost(stream)

    def on_lost(self, stream: Stream) -> None:
        if stream is self.down:
            self.core.down_lost()
            self._finish()
            return
        up = self.ups.get(stream)
        if up is not None:
            self.core.up_eof(up)

    def on_write_paused(self, stream: Stream) -> None:
        if stream is self.down:
            self.core.writable(None, False)
        else:
            up = self.ups.get(stream)
            if up is not None:
                self.core.writable(up, False)

    def on_write_resumed(self, stream: Stream) -> None:
        if stream in self.flooded:
            self.flooded.discard(stream)
            if not stream.lost:
                stream.transport.resume_reading()
        if stream is self.down:
            self.core.writable(None, True)
        else:
            up = self.ups.get(stream)
            if up is not None:
                self.core.writable(up, True)

    def _write(self, stream: Stream, data: bytes) -> None:
        if stream.lost:
            return
        stream.tx += len(data)
        transport = stream.transport
        transport.write(data)
        if stream not in self.flooded and transport.get_write_buffer_size() > FLOOD_LIMIT:
            self.flooded.add(stream)
            transport.pause_reading()

    # -- Http2Sink ------------------------------------------------------------------------------------------------

    def send_down(self, data: bytes) -> None:
        self._write(self.down, data)

    def close(self) -> None:
        self._finish()

    def connect(self, connect: Connect, header: bytes | None, done: Callable[[Upstream | Failed], None]) -> None:
        job = asyncio.ensure_future(self.driver.open_upstream(connect, header))
        self.conn.jobs[job] = connect
        job.add_done_callback(lambda j: self._opened(j, done))

    def checkout(self, connect: Connect, header: bytes | None,
                 done: Callable[[Upstream | Failed], None]) -> Upstream | None:
        up = self.driver.pooled(self.conn.direction, connect)
        if up is not None:
            self._hold(up)
            return up
        self.connect(connect, header, done)
        return None

    def _opened(self, job: asyncio.Future[Upstream | Failed], done: Callable[[Upstream | Failed], None]) -> None:
        if self.conn.jobs.pop(job, None) is None or job.cancelled():
            return  # the connection ended first: the driver closes what the job opened
        reply = job.result()
        if isinstance(reply, Upstream):
            if self.closed:
                reply.io.transport.close()
                return
            self._hold(reply)
        done(reply)
        if isinstance(reply, Upstream) and reply.io.handler is self:
            # What the server said before the core held it (an HTTP/2 server's SETTINGS and window updates).
            stream = reply.io
            if stream.paused:
                self.core.writable(reply, False)
            if stream.buffer:
                self.core.up_data(reply, stream.take())
            if (stream.eof or stream.lost) and stream in self.ups:
                self.core.up_eof(reply)

    def _hold(self, up: Upstream) -> None:
        """``up`` is the core's now: its reads, EOF and write-buffer changes go to the core."""
        self.conn.checked_out.add(up)
        up.io.handler = self
        self.ups[up.io] = up

    def send_up(self, up: Upstream, data: bytes) -> None:
        self._write(up.io, data)

    def checkin(self, up: Upstream, reuse: bool) -> None:
        stream = up.io
        stream.handler = None
        self.ups.pop(stream, None)
        self.conn.checked_out.discard(up)
        if stream in self.flooded:
            self.flooded.discard(stream)
            if not stream.lost:
                stream.transport.resume_reading()
        if reuse and not self.closed and not stream.lost:
            self.driver.pool_put(self.conn.direction, up)
        elif not stream.lost:
            stream.transport.close()

    def read_up(self, up: Upstream, reading: bool) -> None:
        stream = up.io
        if stream.lost or stream in self.flooded:
            return
        if reading:
            stream.transport.resume_reading()
        else:
            stream.transport.pause_reading()

    def wait(self, command: Command, done: Callable[[Any], None]) -> None:
        self.driver.run_then(self.conn, command, done)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.loop.call_later(delay, callback)

    def count(self, name: str, labels: str) -> None:
        self.driver.count(name, labels)

    def _finish(self) -> None:
        if not self.closed:
            self.closed = True
            if not self.finished.done():
                self.finished.set_result(None)
