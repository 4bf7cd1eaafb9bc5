"""A closed HTTP/2 connection leaves no reference cycle either (see tests/proxy/test_http1_garbage.py).

``io.http2_io.Http2Io`` holds its core (``core.http2_proxy.Http2Proxy``) and hands it ``weakref.proxy(self)`` as
the sink, as the HTTP/1 side does; the core drops what refers back to it (keep-alive timers) when it ends. So a
closed connection is freed by reference counting, not by the cyclic collector, which the serving proxy runs
rarely (``tether.proxy.main``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import grpc
from proxy_harness import Mesh, run
from test_http1_garbage import closed_streams_lost, cyclic_garbage
from test_http2_mesh import Names, grpc_server

# What one HTTP/2 connection is made of on the data path (grpcio's own objects, the client's, are not in them).
DATA_PATH = ("tether.proxy.io.http2_io", "tether.proxy.core.http2_proxy", "tether.proxy.codec.http2",
             "tether.proxy.io.streams", "tether.proxy.io.driver", "tether.proxy.core.http_commands", "uvloop")
# And the core's decisions per connection and stream (routers, route metrics: compiled, closures that call one
# another were cycles).
CONNECTION = DATA_PATH + ("tether.proxy.core",)


def test_closed_http2_connections_leave_no_cyclic_garbage(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("names", 9090)
            app = await grpc_server(server.ip, 9090, Names("names-0"))
            try:
                async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:  # discovery settled first
                    await channel.unary_unary("/test.Names/Who")(b"warm", timeout=10)
                with cyclic_garbage() as cyclic:
                    for i in range(3):  # a channel is a connection: three, with a few calls each
                        async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                            for j in range(3):
                                answer = await channel.unary_unary("/test.Names/Who")(b"%d" % j, timeout=10)
                                assert answer.endswith(b" %d" % j)
                    await a.idle()
                    await b.idle()
                    await closed_streams_lost()
                    assert cyclic(CONNECTION) == Counter()
            finally:
                await app.stop(None)

    run(scenario())


def test_streams_on_a_kept_connection_leave_no_cyclic_garbage(tmp_path: Path) -> None:
    """Per stream too (as tests/proxy/test_http1_garbage.py checks per HTTP/1 request): compiled by mypyc, closures
    that call one another form a cycle per call of what made them, and the serving proxy collects rarely."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("names", 9090)
            app = await grpc_server(server.ip, 9090, Names("names-0"))
            try:
                async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                    await channel.unary_unary("/test.Names/Who")(b"warm", timeout=10)
                    with cyclic_garbage() as cyclic:
                        for j in range(20):
                            assert (await channel.unary_unary("/test.Names/Who")(b"%d" % j, timeout=10)).endswith(
                                b" %d" % j)
                        assert cyclic(CONNECTION) == Counter()
            finally:
                await app.stop(None)

    run(scenario())
