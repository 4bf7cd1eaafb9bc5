"""What a client cannot take from the proxy: an idle keep-alive connection is closed, the accepted connections
are bounded (with /ready saying so), on real loopback sockets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from playbook import Checkout, Close, Connected, DownData, Playbook, SendUp
from proxy_harness import EchoServer, Mesh, connection, run
from test_http1_proxy import ADDR, GET, OK, router, settings
from test_proxy_driver import TARGET, accepted_pair

from tether.proxy.app import Proxy
from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.core.config import ProxyConfig
from tether.proxy.core.http import HttpSettings
from tether.proxy.core.http1_proxy import http1
from tether.proxy.core.routes import inbound_router
from tether.proxy.core.metrics import Registry
from tether.proxy.io.driver import Driver
from tether.proxy.io.tls import TlsState


def test_expiry_closes_an_idle_connection_and_spares_a_busy_one() -> None:
    events: list[str] = []
    play = Playbook(router(events), settings())
    assert (play
            >> DownData(GET)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, GET))
    core = play.core
    assert core is not None
    core.expire()  # a request in hand: not idle
    assert play.sink.calls == []
    core.up_data(play.sink.ups[0], OK)
    play.sink.calls.clear()
    core.expire()
    assert play.sink.calls == [Close()]
    assert (Playbook(router([]), settings()) >> DownData(b"") << Close())  # and a client's EOF closes too


def test_an_idle_keep_alive_client_is_closed_by_the_proxy() -> None:
    async def scenario() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(OK)

        backend = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = backend.sockets[0].getsockname()[1]
        no_tls = TlsState(lambda material, alpn: (None, None))  # type: ignore[arg-type,return-value]
        driver = Driver(Registry(retain_idle=600), no_tls, client_idle_timeout=0.2)
        loop = asyncio.get_running_loop()
        async with accepted_pair() as (client, server):
            target = SocketAddr(parse_ip("127.0.0.1"), port)
            layer = http1(inbound_router(target, 1.0, 'direction="inbound"'), HttpSettings("inbound", time.monotonic))
            served = asyncio.ensure_future(driver.run("inbound", server, TARGET, layer))
            await loop.sock_sendall(client, GET)
            got = b""
            while not got.endswith(b"ok"):
                got += await loop.sock_recv(client, 65536)
            assert got.startswith(b"HTTP/1.1 200 OK\r\n")
            # Nothing more from the client: the proxy closes the connection (EOF), well before this guard.
            assert await asyncio.wait_for(loop.sock_recv(client, 65536), 30) == b""
            await served
        driver.close()
        backend.close()

    asyncio.run(scenario())


def test_accepted_connections_are_bounded_and_ready_says_so(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc = mesh.one_served_pod("echo", 7000)
            await mesh.start_proxy(server)
            env = mesh.proxy_env(client, outbound_to=[f"{svc}:7000"])
            proxy = Proxy(ProxyConfig.from_env(env), env, max_connections=1)
            await proxy.start()
            try:
                await proxy.identity.ready()
                assert proxy.ready
                async with EchoServer(server.ip, 7000, "echo-0"):
                    async with connection(svc, 7000) as (reader, writer):
                        writer.write(b"one")
                        assert await reader.readexactly(10) == b"echo-0\none"
                        assert not proxy.ready  # at the bound: the pod should leave its services' endpoints
                        async with connection(svc, 7000) as (reader2, writer2):
                            writer2.write(b"two")  # waits in the backlog, not accepted yet
                            writer.close()
                            # The first one ends: the second is accepted and served.
                            assert await asyncio.wait_for(reader2.readexactly(10), 30) == b"echo-0\ntwo"
                await proxy.idle()
                assert proxy.ready
            finally:
                await proxy.stop()

    run(scenario())


def test_an_http2_client_that_does_not_answer_keep_alive_pings_is_closed(tmp_path: Path) -> None:
    import h2.config
    import h2.connection

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            empty, _ = await mesh.proxy_to_nowhere(
                LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_KEEP_ALIVE_INTERVAL="100ms",
                LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_KEEP_ALIVE_TIMEOUT="100ms")
            async with connection(empty, 80) as (reader, writer):
                conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
                conn.initiate_connection()
                writer.write(conn.data_to_send())  # then silence: PINGs are never answered
                frames = b""
                while chunk := await asyncio.wait_for(reader.read(65536), 30):
                    frames += chunk
                types = []
                while len(frames) >= 9:
                    length = int.from_bytes(frames[:3], "big")
                    types.append((frames[3], frames[4]))
                    frames = frames[9 + length:]
                assert (6, 0) in types  # a PING (not an ACK)
                assert types[-1][0] == 7  # then GOAWAY, and the connection closed

    run(scenario())


def test_keep_alive_needs_both_variables(minimal_env: dict[str, str]) -> None:
    import pytest

    from tether.proxy.core.config import ConfigError

    env = {"LINKERD2_PROXY_INBOUND_SERVER_HTTP2_KEEP_ALIVE_INTERVAL": "10s"}
    with pytest.raises(ConfigError, match="LINKERD2_PROXY_INBOUND_SERVER_HTTP2_KEEP_ALIVE_TIMEOUT"):
        ProxyConfig.from_env({**minimal_env, **env})
    both = {**env, "LINKERD2_PROXY_INBOUND_SERVER_HTTP2_KEEP_ALIVE_TIMEOUT": "3s"}
    keep_alive = ProxyConfig.from_env({**minimal_env, **both}).inbound.server_h2_keep_alive
    assert keep_alive is not None and keep_alive.interval.total_seconds() == 10.0
    assert keep_alive.timeout.total_seconds() == 3.0
    assert ProxyConfig.from_env(minimal_env).outbound.server_h2_keep_alive is None  # unset: no PINGs
