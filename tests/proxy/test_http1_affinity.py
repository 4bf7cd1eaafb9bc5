"""A client connection keeps the upstream connection its last request used (io.pool's affinity, issue 13).

Through two in-process proxies and a real control plane: the app counts the
connections the server's inbound proxy opens to it and sees them end. The
next request of a client connection takes its kept connection back (no new
one), another client connection takes it while it is idle, a closed client
connection gives it back to the pool, it closes after the pool's idle timeout
as a pooled one does, a connection the app closed is not used again, and kept
connections count against ``LINKERD2_PROXY_MAX_IDLE_CONNS_PER_ENDPOINT``.
(The pool's own rules: tests/proxy/test_upstream_pool.py; a request going to
another endpoint: test_http1_mesh.py's endpoints test.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from proxy_harness import Mesh, connection, read_request, run, until
from test_http1_mesh import Web, request


class Counted(Web):
    """``Web``, counting its connections that ended; ``/bye`` answers then closes (no ``connection: close``),
    ``/hold`` answers once ``release`` is set."""

    def __init__(self, ip: str, port: int, name: str) -> None:
        super().__init__(ip, port, name)
        self.ended = 0
        self.holding = 0
        self.release = asyncio.Event()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (req := await read_request(reader)) is not None:
                if req.path == "/hold":
                    self.holding += 1
                    self._changed.set()
                    await self.release.wait()
                answer = f"{self.name} {req.path}".encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer))
                await writer.drain()
                if req.path == "/bye":
                    return
        finally:
            self.ended += 1
            self._changed.set()


async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str = "/") -> bytes:
    head, body = await request(reader, writer, "GET", path)
    assert head.status == 200, (head, body)
    return body


def test_a_client_connection_keeps_its_upstream_connection_and_gives_it_up_while_idle(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, _, svc, _, _ = await mesh.two_proxies("web", 8080, 80)
            async with Counted(server.ip, 8080, "web-0") as web:
                async with connection(svc, 80) as (r1, w1):
                    for _ in range(3):
                        await ok(r1, w1)
                    assert len(web.peers) == 1  # the first request's connection, taken back by the next ones
                    # Pipelined: one request at a time on the kept connection, answered in order.
                    w1.write(b"GET /a HTTP/1.1\r\nhost: web\r\n\r\nGET /b HTTP/1.1\r\nhost: web\r\n\r\n")
                    data = b""
                    while not data.endswith(b"web-0 /b"):
                        data += await r1.read(65536)
                    assert data.count(b"HTTP/1.1 200") == 2 and data.index(b"web-0 /a") < data.index(b"web-0 /b")
                    assert len(web.peers) == 1
                    async with connection(svc, 80) as (r2, w2):
                        await ok(r2, w2)  # another client connection takes the one the first keeps idle
                        assert len(web.peers) == 1
                        await ok(r1, w1)  # and the first takes it back
                        assert len(web.peers) == 1
                # Both client connections closed: what they kept is the pool's, for a new client connection.
                async with connection(svc, 80) as (r3, w3):
                    await ok(r3, w3)
                assert len(web.peers) == 1 and web.ended == 0

    run(scenario())


def test_a_kept_connection_closes_when_idle_or_when_the_app_closed_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, _, svc, _, _ = await mesh.two_proxies(
                "web", 8080, 80, server_env={"LINKERD2_PROXY_INBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT": "300ms"})
            async with Counted(server.ip, 8080, "web-0") as web, connection(svc, 80) as (reader, writer):
                await ok(reader, writer)
                # Kept idle past the pool's idle timeout: closed, as a pooled one is; the client's stays open.
                await until(lambda: web.ended == 1, web.changed)
                await ok(reader, writer)
                assert len(web.peers) == 2
                # The app closes the kept connection after its answer: the next request goes on a new one.
                await ok(reader, writer, "/bye")
                await until(lambda: web.ended == 2, web.changed)
                assert await ok(reader, writer) == b"web-0 /"
                assert len(web.peers) == 3

    run(scenario())


def test_kept_connections_count_against_the_idle_bound_per_endpoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, _, svc, _, _ = await mesh.two_proxies(
                "web", 8080, 80, server_env={"LINKERD2_PROXY_MAX_IDLE_CONNS_PER_ENDPOINT": "1"})
            async with Counted(server.ip, 8080, "web-0") as web, \
                    connection(svc, 80) as (r1, w1), connection(svc, 80) as (r2, w2):
                first = asyncio.ensure_future(ok(r1, w1, "/hold"))
                second = asyncio.ensure_future(ok(r2, w2, "/hold"))
                await until(lambda: web.holding == 2, web.changed)  # in flight at once: two connections
                web.release.set()
                await asyncio.gather(first, second)
                # Both free now, and an endpoint keeps at most one idle: the second is closed.
                await until(lambda: web.ended == 1, web.changed)
                assert len(web.peers) == 2
                await ok(r1, w1)
                await ok(r2, w2)
                assert len(web.peers) == 2 and web.ended == 1  # the one left serves both client connections

    run(scenario())


def test_a_drain_finishes_the_request_on_a_kept_connection_then_closes_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, _, svc, server_proxy, _ = await mesh.two_proxies("web", 8080, 80)
            async with Counted(server.ip, 8080, "web-0") as web, connection(svc, 80) as (reader, writer):
                await ok(reader, writer)  # the server proxy's connection to the app: kept
                held = asyncio.ensure_future(ok(reader, writer, "/hold"))  # on it again
                await until(lambda: web.holding == 1, web.changed)
                stopping = asyncio.ensure_future(server_proxy.stop(grace=60))
                web.release.set()
                assert await held == b"web-0 /hold"  # the request in hand finishes
                await stopping  # drained: the client connection closed, what it kept closed with the pool
                await until(lambda: web.ended == 1, web.changed)
                assert len(web.peers) == 1

    run(scenario())
