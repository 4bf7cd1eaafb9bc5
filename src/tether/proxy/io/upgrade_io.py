"""The I/O side of the ``l5d-orig-proto`` upgrade: one HTTP/2 connection per h2-hinted endpoint, its legs as streams.

``Upgrades`` (one per driver) opens and keeps the HTTP/2 connection to each
endpoint (``Connect.upgrade``; mTLS and the transport header with session
protocol HTTP/2, as ``Driver.open_connection`` makes any), shared by every
client connection of the proxy, and hands out ``LegStream``s: what the
HTTP/1 I/O side (``io.http1_io``) and the pool (``io.pool``) take for a
``Stream``, with the leg (``core.orig_proto.Leg``) as the ``Upstream``'s
codec. The core's requests queue frames on the connection, written once per
loop iteration for all legs (``UpgradeConnection.on_output``); the handler is told when the
leg has response events for the core (``on_data`` with a token: the core
then takes the events from the leg), EOF when the leg's stream failed, and
write-buffer changes as the leg's bytes wait for the peer's window or go. A
connection with no leg for ``IDLE_TIMEOUT`` is ended (GOAWAY, then closed);
one the peer ended, or that failed, is replaced by a new one for the next
leg. With the endpoint's keep-alive from discovery
(``Connect.h2_keep_alive``: interval, timeout, while idle) a PING goes every
interval (while legs are open, or always with while-idle); one not answered
within the timeout closes the connection and fails its streams.

Callers: ``io.driver`` (``open_upstream`` for a ``Connect`` with ``upgrade``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable

from tether.proxy.codec.http2 import DEFAULT_PARAMS, Http2Params
from tether.proxy.core.commands import Connect, Failed
from tether.proxy.core.http_commands import Upstream
from tether.proxy.core.orig_proto import SEND_LIMIT, Leg, UpgradeConnection
from tether.proxy.io.streams import Stream, StreamHandler

log = logging.getLogger(__name__)

# Seconds without a leg (each pooled leg is closed after the pool's idle timeout) before a shared connection is
# ended: as linkerd2-proxy's outbound stacks, and the connections they hold, live 5 s after their last use.
IDLE_TIMEOUT = 5.0
# What a leg's stream "reads" when it has response events: the core hands it to the leg's codec, which answers
# with the events (``Leg.receive_data``); empty would mean the end of the connection.
EVENTS = b"\x00"

Opener = Callable[[Connect, bytes | None], Awaitable["Upstream | Failed"]]


class LegStream:
    """A ``Leg`` as a ``Stream`` for the HTTP/1 I/O side and the pool."""

    __slots__ = ("link", "leg", "transport", "handler", "lost", "eof", "buffer", "paused", "tx", "rx", "errno",
                 "__weakref__")

    def __init__(self, link: H2Link, leg: Leg) -> None:
        self.link = link
        self.leg = leg
        leg.user = weakref.ref(self)  # weakly: a cycle would leave every closed leg to the cyclic collector
        self.transport = LegTransport(self)
        self.handler: StreamHandler | None = None
        self.lost = False
        self.eof = False
        self.buffer = bytearray()  # never holds anything: the pool's check for unread bytes
        self.paused = False  # the leg's request bytes wait for the peer's window (SEND_LIMIT)
        self.tx = 0
        self.rx = 0
        self.errno = ""

    # -- what the link tells it (``H2Link.after``) ----------------------------------------------------------------

    def broke(self, handler: StreamHandler | None) -> None:
        """The leg's stream failed: the handler sees the connection end. The leg is closed here: a lost stream
        is not closed by its user (the HTTP/1 side checks it in as it is), and the connection counts its legs to
        idle out."""
        self.eof = True
        self.lost = True
        if handler is not None:
            handler.on_eof(self)  # type: ignore[arg-type]
        self.leg.close()

    def sent(self, handler: StreamHandler | None) -> None:
        """The leg's request bytes went or wait: the handler hears when they wait above ``SEND_LIMIT``."""
        self.leg.sending = False
        full = self.leg.buffered > SEND_LIMIT
        if full != self.paused:
            self.paused = full
            if handler is not None:
                if full:
                    handler.on_write_paused(self)  # type: ignore[arg-type]
                else:
                    handler.on_write_resumed(self)  # type: ignore[arg-type]


class LegTransport:
    """What the HTTP/1 side and the pool call on a ``LegStream``'s transport (the core writes nothing: its codec
    is the leg). An object of its own, holding the stream weakly: the stream's ``transport`` is a plain
    attribute (the pool reads it twice a request), without a reference cycle."""

    __slots__ = ("stream", "leg", "link")

    def __init__(self, stream: LegStream) -> None:
        self.stream = weakref.ref(stream)
        self.leg = stream.leg
        self.link = stream.link

    def pause_reading(self) -> None:
        self.leg.pause()

    def resume_reading(self) -> None:
        self.leg.resume()
        self.link.after()

    def close(self) -> None:
        stream = self.stream()
        if stream is not None:
            stream.lost = True
        if not self.leg.closed:
            self.leg.close()
            self.link.after()

    abort = close

    def is_closing(self) -> bool:
        """Closed (by its user, or as its stream failed), or its connection takes no new stream (a GOAWAY): the
        pool then drops it, not reuses it."""
        leg = self.leg
        return leg.closed or leg.broken or not leg.conn.usable


class H2Link:
    """The HTTP/2 connection to one endpoint (the handler of its ``Stream``), and its legs."""

    def __init__(self, upgrades: Upgrades, key: str, stream: Stream, elapsed: float, params: Http2Params,
                 keep_alive: tuple[float, float, bool] | None = None) -> None:
        self.upgrades = upgrades
        self.key = key
        self.stream = stream
        self.elapsed = elapsed
        self.core = UpgradeConnection(params)
        # The core queued frames: they are written at the next loop iteration, with whatever else queued by then
        # (the core asks once until they are written: ``UpgradeConnection.woken``). A cycle until the stream is
        # lost (on_lost breaks it).
        self.core.on_output = functools.partial(asyncio.get_running_loop().call_soon, self.after)
        self.idle_timer: asyncio.TimerHandle | None = None
        self.busy = False  # inside after(): a leg's handler writing again is taken in the same pass
        self.keep_alive = keep_alive
        self.ping_timer: asyncio.TimerHandle | None = None
        if keep_alive is not None:
            self.ping_timer = asyncio.get_running_loop().call_later(keep_alive[0], self._ping)
        stream.handler = self
        if stream.buffer:
            self.core.receive(stream.take())
        if stream.lost or stream.eof:
            self.core.lost()
        self.after()

    @property
    def usable(self) -> bool:
        """Whether new legs may use it (its stream's end or loss makes the core's ``usable`` false)."""
        return self.core.usable

    def leg(self) -> LegStream:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        return LegStream(self, self.core.leg())

    def after(self) -> None:
        """Tell the legs what moved, and write what the connection has for the peer."""
        if self.busy:
            return
        self.busy = True
        try:
            core = self.core
            while core.touched or core.unsent:  # a leg's handler may move legs again
                for leg in core.take_touched():
                    stream = leg.user()
                    if stream is None:
                        continue
                    # What moved, told to the stream's handler (here, not in a method of the stream: a call
                    # a response saved).
                    handler = stream.handler
                    if leg.events and handler is not None:
                        handler.on_data(stream, EVENTS)
                    if leg.broken and not stream.eof:
                        stream.broke(handler)
                    elif leg.sending or stream.paused:  # else nothing queued since last time: no more waits
                        stream.sent(handler)
            data = core.data_to_send()
            stream = self.stream
            if data and not stream.lost:
                stream.tx += len(data)
                stream.transport.write(data)
        finally:
            self.busy = False
        if core.usable:
            if core.legs == 0 and self.idle_timer is None:
                self.idle_timer = asyncio.get_running_loop().call_later(IDLE_TIMEOUT, self._idle)
            return
        self.upgrades.forget(self)
        if self.core.legs == 0 and not self.stream.lost:  # its last leg is done: nothing more will use it
            self.stream.transport.close()

    def _ping(self) -> None:
        keep_alive = self.keep_alive
        assert keep_alive is not None
        interval, timeout, while_idle = keep_alive
        loop = asyncio.get_running_loop()
        self.ping_timer = None
        if self.stream.lost:
            return
        if self.core.legs or while_idle:
            self.core.ping()
            self.after()
            self.ping_timer = loop.call_later(timeout, self._pong_due)
        else:
            self.ping_timer = loop.call_later(interval, self._ping)

    def _pong_due(self) -> None:
        keep_alive = self.keep_alive
        assert keep_alive is not None
        self.ping_timer = None
        if self.stream.lost:
            return
        if self.core.pings:
            log.info("HTTP/2 connection %s: no answer to a keep-alive PING within %ss; closed", self.key,
                     keep_alive[1])
            self.upgrades.forget(self)
            self.core.lost()
            self.after()
            self.stream.transport.abort()
            return
        self.ping_timer = asyncio.get_running_loop().call_later(max(keep_alive[0] - keep_alive[1], 0.0), self._ping)

    def _stop_timers(self) -> None:
        for timer in (self.idle_timer, self.ping_timer):
            if timer is not None:
                timer.cancel()
        self.idle_timer = self.ping_timer = None

    def _idle(self) -> None:
        self.idle_timer = None
        if self.core.legs == 0:
            self.upgrades.forget(self)
            self.core.end()
            self.after()
            if not self.stream.lost:
                self.stream.transport.close()

    def close(self) -> None:
        self._stop_timers()
        if not self.stream.lost:
            self.stream.transport.close()

    # -- StreamHandler ---------------------------------------------------------------------------------------

    def on_data(self, stream: Stream, data: bytes) -> None:
        self.core.receive(data)
        self.after()

    def on_eof(self, stream: Stream) -> None:
        self.core.lost()
        self.after()
        if not stream.lost:
            stream.transport.close()

    def on_lost(self, stream: Stream) -> None:
        self.core.lost()
        self.after()
        self._stop_timers()
        self.core.on_output = _nothing

    def on_write_paused(self, stream: Stream) -> None:
        """The peer reads slowly: the windows bound what is written to it, so nothing else to do."""

    def on_write_resumed(self, stream: Stream) -> None:
        """See ``on_write_paused``."""


class Upgrades:
    """The shared HTTP/2 connections of one proxy to h2-hinted endpoints, by ``Connect.pool_key``."""

    def __init__(self, opener: Opener, params: Http2Params = DEFAULT_PARAMS) -> None:
        self.opener = opener  # a new upstream connection (the driver's: metered, its transport header sent)
        self.params = params  # the HTTP/2 client settings (LINKERD2_PROXY_HTTP2_INITIAL_*_WINDOW_SIZE)
        self.links: dict[str, H2Link] = {}
        self.opening: dict[str, asyncio.Future[H2Link | Failed]] = {}
        self.closed = False

    async def open(self, connect: Connect, header: bytes | None) -> Upstream | Failed:
        """A new leg on the endpoint's connection (opened first if there is none usable)."""
        key = connect.pool_key
        link = self.links.get(key)
        elapsed = 0.0
        if link is None or not link.usable:
            job = self.opening.get(key)
            if job is None:
                job = self.opening[key] = asyncio.ensure_future(self._connect(connect, header))
            result = await asyncio.shield(job)
            if isinstance(result, Failed):
                return result
            link = result
            elapsed = link.elapsed
        # Marked reused: a leg that fails before its response head (its stream reset or refused, above a GOAWAY's
        # last stream, its connection lost) has its request sent once more on a new leg when nothing of it is
        # lost by that (no body), as the HTTP/1 core does after a pooled connection found closed.
        up = Upstream(key, link.leg(), elapsed, reused=True)
        up.codec = up.io.leg  # the core talks to the leg directly (no HTTP/1 bytes)
        return up

    async def _connect(self, connect: Connect, header: bytes | None) -> H2Link | Failed:
        key = connect.pool_key
        try:
            opened = await self.opener(connect, header)
        finally:
            self.opening.pop(key, None)
        if isinstance(opened, Failed):
            return opened
        if self.closed:
            opened.io.transport.close()
            return Failed("proxy stopping")
        link = H2Link(self, key, opened.io, opened.elapsed, self.params, connect.h2_keep_alive)
        self.links[key] = link  # one that went unusable finishes its legs' streams, then idles out
        return link

    def forget(self, link: H2Link) -> None:
        if self.links.get(link.key) is link:
            del self.links[link.key]

    def close_idle(self) -> None:
        """End the connections no leg uses (tests settling their metrics); new ones are opened on demand."""
        for link in list(self.links.values()):
            if link.core.legs == 0:
                self.forget(link)
                link.close()

    def close(self) -> None:
        self.closed = True
        links, self.links = self.links, {}
        for link in links.values():
            link.close()


def _nothing() -> None:
    """No one to write for any more."""
