"""io.http1_io: a pool wait answered after its request ended does not take the place of the connection the next
request has in hand (the eighth session's "late answer" fix, fd4fa0a).

The I/O side of one client connection (``Http1Io``) with its real core and the real ``io.pool.Pool``; the
client's stream, the upstream streams and the connects are fakes the test drives. A client policy route's
timeout ends the first request while its connect is still on its way (a 504 that keeps the connection, as
Linkerd's non-fatal timeout), the second request goes to another endpoint, whose idle connection it takes at
once; the first request's connection then arrives. Before the fix it became the connection in hand: the second
request's answer, read from its own connection, was dropped and the client waited for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.core import commands as cmd
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import HttpSettings, Pick
from tether.proxy.core.http_commands import Upstream
from tether.proxy.core.policy_routes import PolicyRoute
from tether.proxy.core.profiles import MATCH_ALL
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.io.http1_io import Http1Io
from tether.proxy.io.pool import Pool

SLOW = cmd.Connect(SocketAddr(parse_ip("10.0.0.1"), 8080), None, 1.0, "x")
WARM = cmd.Connect(SocketAddr(parse_ip("10.0.0.2"), 8080), None, 1.0, "x")
ROUTE = PolicyRoute(MATCH_ALL, timeout=0.05)


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Stream:
    """What Http1Io and the pool use of ``io.streams.Stream``."""

    def __init__(self) -> None:
        self.handler: Any = None
        self.buffer = bytearray()
        self.lost = self.eof = self.paused = False
        self.tx = self.rx = 0
        self.transport = Transport()

    def take(self) -> bytes:
        data = bytes(self.buffer)
        self.buffer.clear()
        return data


class Driver:
    """The driver's part Http1Io calls: its pool, waits on it with connects the test finishes, counters."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pool_ = Pool()
        self.loop = loop
        self.connects: list[asyncio.Future[Upstream | cmd.Failed]] = []

    def pool(self, direction: str) -> Pool:
        return self.pool_

    def pool_wait(self, direction: str, connect: cmd.Connect, header: bytes | None, done: Any) -> Any:
        def opener() -> asyncio.Future[Upstream | cmd.Failed]:
            future: asyncio.Future[Upstream | cmd.Failed] = self.loop.create_future()
            self.connects.append(future)
            return future

        return self.pool_.wait(connect.pool_key, opener, done)

    def count(self, name: str, labels: str) -> None:
        pass


class Conn:
    direction = "outbound"

    def __init__(self) -> None:
        self.checked_out: set[Upstream] = set()


class Idle:
    def add(self, served: object) -> None:
        pass

    def discard(self, served: object) -> None:
        pass


def router(request: RequestHead) -> Generator[cmd.Command, Any, Pick | ProxyError]:
    connect = SLOW if request.target == b"/slow" else WARM
    pick = Pick(connect, None, 'direction="outbound"', b"web:80")
    pick.route = ROUTE
    return pick
    yield  # a generator that answers at once


def test_a_wait_answered_after_its_request_ended_leaves_the_next_requests_connection_in_hand() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        driver = Driver(loop)
        warm = Upstream(WARM.pool_key, Stream(), 0.001, False)
        driver.pool_.put(warm)  # the second endpoint has an idle connection
        down = Stream()
        settings = HttpSettings("outbound", loop.time, None)
        io = Http1Io(driver, Conn(), down, router, settings, Idle())  # type: ignore[arg-type]
        io.start()
        io.on_data(down, b"GET /slow HTTP/1.1\r\nhost: web\r\n\r\n")  # waits for a connect to the first endpoint
        assert len(driver.connects) == 1
        while b"504" not in down.transport.written:  # the route's timeout: 504, the client connection kept
            await asyncio.sleep(0.01)
        down.transport.written = b""
        io.on_data(down, b"GET /warm HTTP/1.1\r\nhost: web\r\n\r\n")
        assert warm.io.transport.written.startswith(b"GET /warm")  # the idle connection, at once
        late = Upstream(SLOW.pool_key, Stream(), 0.001, False)
        driver.connects[0].set_result(late)  # the first request's connect ends now
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert late.io.transport.written == b""  # nothing of the second request went there
        warm.io.handler.on_data(warm.io, b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nwarm")
        assert down.transport.written == b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nwarm"

    asyncio.run(scenario())
