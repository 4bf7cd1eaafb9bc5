"""The driver's commands for the HTTP/2 layer on loopback sockets: ``Poll``, ``Start`` and ``OpenUp``."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from test_proxy_driver import TARGET, accepted_pair, new_driver

from tether.proxy.core import commands as cmd
from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core.http_commands import Checkin, OpenUp, Poll, Polled, Start, Upstream


class Source:
    """A discovery source that answers when told to."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def wait(self, timeout: float) -> str:
        return await self.answer


def test_poll_reads_writes_and_collects_background_commands() -> None:
    async def scenario() -> None:
        driver, _ = new_driver()
        loop = asyncio.get_running_loop()
        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        source = Source()
        seen: list[Any] = []

        def layer() -> cmd.Layer:
            yield Start("wait", cmd.Wait(source, 5.0))  # type: ignore[arg-type]
            yield Start("up", OpenUp(cmd.Connect(parse_socket_addr(f"127.0.0.1:{port}"), None, 1.0, "x")))
            ups: list[Upstream] = []
            writes: tuple[tuple[Upstream | None, bytes], ...] = ((None, b"hello"),)
            while len(seen) < 4:
                polled: Polled = yield Poll(True, tuple(ups), writes)
                writes = ()
                for tag, reply in polled.done:
                    seen.append((tag, type(reply).__name__))
                    if isinstance(reply, Upstream):
                        ups.append(reply)
                        writes = ((reply, b"ping"),)
                if polled.down is not None:
                    seen.append(("down", polled.down))
                    source.answer.set_result("slot")
                for _, data in polled.ups:
                    seen.append(("up", data))
            yield Checkin(ups[0], reuse=False)

        async with accepted_pair() as (client, server):
            run = asyncio.ensure_future(driver.run("outbound", server, TARGET, layer()))
            assert await loop.sock_recv(client, 5) == b"hello"
            await loop.sock_sendall(client, b"hi")
            await asyncio.wait_for(run, 10)
        upstream.close()
        assert sorted(seen, key=str) == sorted([("up", "Upstream"), ("down", b"hi"), ("wait", "str"),
                                                ("up", b"ping")], key=str)

    asyncio.run(scenario())


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
    writer.close()


def test_poll_reports_a_full_write_buffer_and_its_draining() -> None:
    async def scenario() -> None:
        driver, _ = new_driver()
        loop = asyncio.get_running_loop()
        states: list[tuple[frozenset[Any], bytes | None]] = []
        first = asyncio.Event()

        def layer() -> cmd.Layer:
            # More than the kernel takes (small socket buffers), less than the flood limit.
            polled: Polled = yield Poll(True, (), ((None, b"x" * 2_000_000),))
            states.append((polled.blocked, polled.down))
            first.set()  # now the client reads
            while polled.blocked:
                polled = yield Poll(True, ())  # returns when the buffer has drained
                states.append((polled.blocked, polled.down))

        async with accepted_pair() as (client, server):
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            await loop.sock_sendall(client, b"go")
            run = asyncio.ensure_future(driver.run("outbound", server, TARGET, layer()))
            await first.wait()
            received = 0
            while received < 2_000_000:
                received += len(await loop.sock_recv(client, 1 << 20))
            await asyncio.wait_for(run, 10)
        assert states[0] == (frozenset({None}), b"go")
        assert states[-1] == (frozenset(), None)

    asyncio.run(scenario())


def test_a_connect_that_ends_after_its_connection_is_closed() -> None:
    """The client leaves while a background connect is in flight: what it opens is closed, nothing leaks."""

    async def scenario() -> None:
        driver, _ = new_driver()
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        port = listener.getsockname()[1]
        opened: list[Any] = []

        def layer() -> cmd.Layer:
            yield Start("up", OpenUp(cmd.Connect(parse_socket_addr(f"127.0.0.1:{port}"), None, 1.0, "x")))
            polled: Polled = yield Poll(True, ())
            opened.append(polled)

        async with accepted_pair() as (client, server):
            client.close()  # EOF at once: the layer ends before the connect completes
            await driver.run("outbound", server, TARGET, layer())
        loop = asyncio.get_running_loop()
        accepted, _ = await asyncio.wait_for(loop.sock_accept(listener), 5)
        accepted.setblocking(False)
        assert await asyncio.wait_for(loop.sock_recv(accepted, 1), 5) == b""  # closed by the driver
        accepted.close()
        listener.close()
        assert opened and opened[0].down == b""

    asyncio.run(scenario())


def test_poll_with_a_timeout_returns_empty_when_nothing_comes() -> None:
    """``Poll.timeout`` (a profile route's deadline): an empty ``Polled`` once it passes; data still wins."""

    async def scenario() -> None:
        driver, _ = new_driver()
        loop = asyncio.get_running_loop()
        seen: list[tuple[bytes | None, float]] = []
        waited = asyncio.Event()

        def layer() -> cmd.Layer:
            begun = loop.time()
            polled: Polled = yield Poll(True, (), timeout=0.05)
            seen.append((polled.down, loop.time() - begun))
            waited.set()
            polled = yield Poll(True, (), timeout=30.0)
            seen.append((polled.down, 0.0))

        async with accepted_pair() as (client, server):
            run = asyncio.ensure_future(driver.run("outbound", server, TARGET, layer()))
            await waited.wait()  # the client sends only once the first Poll has timed out
            await loop.sock_sendall(client, b"late")
            await asyncio.wait_for(run, 10)
        assert seen[0][0] is None and seen[0][1] >= 0.04
        assert seen[1][0] == b"late"

    asyncio.run(scenario())
