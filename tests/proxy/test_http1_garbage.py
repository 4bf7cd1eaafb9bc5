"""A closed HTTP/1 connection leaves no reference cycle: reference counting frees it, not the cyclic collector.

The serving proxy makes Python's cyclic garbage collector rare (``tether.proxy.main``, docs/benchmarks.md):
its passes stall the event loop. That is only safe if connections do not need it, so every object of a
closed connection -- its I/O side and core, its streams, its llhttp parsers, the pool's waits -- must be freed
when the last reference goes. Through two in-process proxies (client side: outbound; server side: inbound),
each way an HTTP/1 connection ends, then the pooled upstream connections closed too; with
``gc.DEBUG_SAVEALL`` a collection keeps what it would have freed, and none of it may be the data path's.
"""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from proxy_harness import Mesh, connection, run
from test_http1_mesh import Web, request

from tether.proxy.app import Proxy
from tether.proxy.core.config import ProxyConfig
from tether.proxy.io.http1_io import Http1Io
from tether.proxy.io.streams import Stream

# The modules of what one HTTP/1 connection is made of (the control plane's h2 connections are not in them).
DATA_PATH = ("tether.proxy.io.http1_io", "tether.proxy.core.http1_proxy", "tether.proxy.codec.http1",
             "tether.proxy.io.streams", "tether.proxy.io.driver", "tether.proxy.io.pool",
             "tether.proxy.core.http_commands", "httptools", "uvloop")


# Of a connection's objects: the modules above, and the core's decisions (compiled by mypyc, a router's closures
# that called one another were a cycle per connection: ``core.routes.outbound_router``).
CONNECTION = DATA_PATH + ("tether.proxy.core",)


@contextmanager
def cyclic_garbage() -> Iterator[Callable[[tuple[str, ...]], Counter[str]]]:
    """For the block, a collection keeps what it would have freed (``gc.DEBUG_SAVEALL``); the block is given
    ``cyclic(modules)``: collect, and count by type what was kept of the objects of ``modules`` (prefixes)."""
    gc.collect()  # what came before the block is not the block's
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.garbage.clear()

    def cyclic(modules: tuple[str, ...]) -> Counter[str]:
        gc.collect()
        return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                       if (type(o).__module__ or "").startswith(modules))

    try:
        yield cyclic
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def closed_streams_lost() -> None:
    """Wait until every stream whose transport is closing has seen its connection lost (its last callback)."""
    while pending := [o.done for o in gc.get_objects()
                      if type(o) is Stream and not o.lost and o.transport is not None
                      and o.transport.is_closing()]:
        await asyncio.gather(*pending)


def test_closed_connections_leave_no_cyclic_garbage(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("web", 8080, 80)
            async with Web(server.ip, 8080, "web-0"):
                async with connection(svc, 80) as (reader, writer):  # discovery and policy settled first
                    assert (await request(reader, writer, "GET", "/warm"))[0].status == 200
                with cyclic_garbage() as cyclic:
                    # Keep-alive: several requests, then the client closes between requests.
                    async with connection(svc, 80) as (reader, writer):
                        for i in range(3):
                            head, body = await request(reader, writer, "POST", "/echo", body=b"x" * (i * 1000))
                            assert (head.status, body) == (200, b"x" * (i * 1000))
                    # The client asks to close; the app closes after its answer (not pooled: until-close body).
                    async with connection(svc, 80) as (reader, writer):
                        head, _ = await request(reader, writer, "GET", "/until-close",
                                                headers=((b"connection", b"close"),))
                        assert head.status == 200 and await reader.read() == b""
                    # A protocol switch: the two connections joined byte for byte, then closed.
                    async with connection(svc, 80) as (reader, writer):
                        writer.write(b"GET /ws HTTP/1.1\r\nhost: web\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n")
                        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
                        writer.write(b"hi")
                        assert await reader.readexactly(2) == b"HI"
                    # The client leaves in the middle of a request body.
                    async with connection(svc, 80) as (reader, writer):
                        writer.write(b"POST /echo HTTP/1.1\r\nhost: web\r\ncontent-length: 100\r\n\r\nhalf")
                        await writer.drain()
                    # A request the proxy refuses (400: both Content-Length and Transfer-Encoding).
                    async with connection(svc, 80) as (reader, writer):
                        writer.write(b"POST / HTTP/1.1\r\nhost: web\r\ncontent-length: 1\r\n"
                                     b"transfer-encoding: chunked\r\n\r\n")
                        assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 400")
                    # Not HTTP/1 after all (detection sees only a prefix): carried as opaque bytes.
                    async with connection(svc, 80) as (reader, writer):
                        writer.write(b"NOT-AN-HTTP-METHOD-" * 1000)
                        await writer.drain()
                    # Every connection over, the pooled upstream ones (client proxy to server proxy, server
                    # proxy to app) closed as well, and each stream's last callback run.
                    await a.idle()
                    await b.idle()
                    await closed_streams_lost()
                    assert cyclic(CONNECTION) == Counter()
                # And they were freed, not kept: no HTTP/1 connection is left in either proxy.
                assert [o for o in gc.get_objects() if type(o) is Http1Io] == []

    run(scenario())


def test_requests_on_a_kept_alive_connection_leave_no_cyclic_garbage(tmp_path: Path) -> None:
    """Per request too: the server proxy's route metrics (``core.inbound_route_metrics``) gave each request
    closures that called one another, which compiled by mypyc share an environment referring to them -- three
    objects of cyclic garbage per request, the collector's work under load."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("web", 8080, 80)
            async with Web(server.ip, 8080, "web-0"), connection(svc, 80) as (reader, writer):
                assert (await request(reader, writer, "GET", "/warm"))[0].status == 200
                with cyclic_garbage() as cyclic:
                    for i in range(20):
                        assert (await request(reader, writer, "GET", f"/{i}"))[0].status == 200
                    assert cyclic(CONNECTION) == Counter()

    run(scenario())


def test_the_process_entry_is_told_once_the_proxy_serves(tmp_path: Path) -> None:
    """``on_serving`` (where ``tether.proxy.main`` freezes the start-up heap and makes full collections rare)
    is called once, when the listeners accept: connections are served from then on."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc = mesh.one_served_pod("web", 8080, 80)
            await mesh.start_proxy(server)
            env = mesh.proxy_env(client, outbound_to=[f"{svc}:80"])
            serving = asyncio.Event()
            calls: list[bool] = []

            def on_serving() -> None:
                calls.append(proxy.ready)
                serving.set()

            proxy = Proxy(ProxyConfig.from_env(env), env, on_serving=on_serving)
            await proxy.start()
            try:
                await serving.wait()
                async with Web(server.ip, 8080, "web-0"), connection(svc, 80) as (reader, writer):
                    assert (await request(reader, writer, "GET", "/x"))[0].status == 200
                assert calls == [True]
            finally:
                await proxy.stop()

    run(scenario())
