"""The I/O driver on real loopback sockets: peeked detection (nothing consumed), forwarding with half-close and
counted bytes, unknown commands. Fuzzed with hypothesis: random bytes in random pieces never hang or crash it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_tls_helpers import real_client_hello

from tether.proxy.core import commands as cmd
from tether.proxy.codec.addrs import SocketAddr, parse_socket_addr
from tether.proxy.io.driver import Driver, _Conn
from tether.proxy.core.metrics import Registry
from tether.proxy.codec import detect
from tether.proxy.codec.client_hello import ClientHello
from tether.proxy.io.tls import TlsState

NAME = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
TARGET = parse_socket_addr("127.0.0.1:1")


def new_driver() -> tuple[Driver, Registry]:
    registry = Registry(retain_idle=600)
    return Driver(registry, TlsState(lambda material, alpn: (None, None))), registry  # type: ignore[arg-type,return-value]


@contextlib.asynccontextmanager
async def accepted_pair() -> AsyncIterator[tuple[socket.socket, socket.socket]]:
    """(client, accepted server socket), both non-blocking, on loopback."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    client = socket.socket()
    client.setblocking(False)
    try:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(client, listener.getsockname())
        server, _ = await loop.sock_accept(listener)
        server.setblocking(False)
        try:
            yield client, server
        finally:
            server.close()
    finally:
        client.close()
        listener.close()


async def detect_over_socket(data: bytes, cuts: list[int], tls: bool, timeout: float = 5.0) -> tuple[object, bytes]:
    """Send ``data`` in pieces (then EOF), run the driver's Detect, then read what is still in the socket."""
    driver, _ = new_driver()
    loop = asyncio.get_running_loop()
    async with accepted_pair() as (client, server):
        conn = _Conn("inbound", server, TARGET)

        async def send() -> None:
            pieces = sorted({c for c in cuts if 0 < c < len(data)})
            for start, end in zip([0, *pieces], [*pieces, len(data)]):
                await loop.sock_sendall(client, data[start:end])
                await asyncio.sleep(0)  # let the driver look in between (order, not correctness)
            client.shutdown(socket.SHUT_WR)

        sender = asyncio.ensure_future(send())
        verdict = await driver._detect(conn, cmd.Detect(tls=tls, timeout=timeout))
        await sender
        left = b""
        server.setblocking(True)
        server.settimeout(5)
        while chunk := server.recv(65536):
            left += chunk
        return verdict, left


def test_a_split_client_hello_is_detected_and_left_unread() -> None:
    hello = real_client_hello(NAME, ["transport.l5d.io/v1"])

    async def scenario() -> None:
        for cuts in ([], [1], [5], [5, 6, 100], list(range(1, len(hello), 37))):
            verdict, left = await detect_over_socket(hello + b"app bytes", cuts, tls=True)
            assert verdict == detect.Tls(ClientHello(NAME, (b"transport.l5d.io/v1",)))
            assert left == hello + b"app bytes"

    asyncio.run(scenario())


def test_http_and_eof_and_timeouts() -> None:
    async def scenario() -> None:
        verdict, left = await detect_over_socket(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", [], tls=False)
        assert (verdict, left) == (detect.Http1(), b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await detect_over_socket(b"", [], tls=True))[0] == detect.Closed()
        assert (await detect_over_socket(b"\x16\x03\x01\x00", [], tls=True))[0] == detect.Opaque()
        # A client that says nothing: the timeout's verdict.
        driver, _ = new_driver()
        async with accepted_pair() as (_, server):
            verdict = await driver._detect(_Conn("inbound", server, TARGET), cmd.Detect(tls=True, timeout=0.05))
            assert verdict == detect.TlsTimeout()
            verdict = await driver._detect(_Conn("outbound", server, TARGET), cmd.Detect(tls=False, timeout=0.05))
            assert verdict == detect.ReadTimeout()

    asyncio.run(scenario())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.binary(max_size=600), st.lists(st.integers(0, 600), max_size=4))
def test_fuzz_detection_on_a_socket(tls: bool, data: bytes, cuts: list[int]) -> None:
    async def scenario() -> None:
        verdict, left = await detect_over_socket(data, cuts, tls)
        assert isinstance(verdict, detect.Verdict) and not isinstance(verdict, (detect.TlsTimeout,
                                                                                  detect.ReadTimeout))
        assert left == data  # detection never consumes

    asyncio.run(scenario())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 700), max_size=5), st.binary(max_size=50))
def test_fuzz_any_split_of_a_client_hello(cuts: list[int], tail: bytes) -> None:
    hello = real_client_hello(NAME)

    async def scenario() -> None:
        verdict, left = await detect_over_socket(hello + tail, cuts, tls=True)
        assert verdict == detect.Tls(ClientHello(NAME, ()))
        assert left == hello + tail

    asyncio.run(scenario())


def test_forward_passes_half_close_and_counts_bytes() -> None:
    """Plain TCP on both sides: the client's EOF reaches the server, which still answers; bytes are metered."""

    async def scenario() -> None:
        driver, registry = new_driver()
        answered = asyncio.Event()

        async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = await reader.read()  # until the client's half-close
            writer.write(b"got " + request)
            await writer.drain()
            writer.close()
            answered.set()

        app = await asyncio.start_server(server, "127.0.0.1", 0)
        port = app.sockets[0].getsockname()[1]
        app_addr = SocketAddr(parse_socket_addr(f"127.0.0.1:{port}").ip, port)

        def layer() -> cmd.Layer:
            yield cmd.SetLabels('direction="outbound",peer="src"')
            reply = yield cmd.Connect(app_addr, None, 1.0, 'direction="outbound",peer="dst"')
            assert isinstance(reply, cmd.Connected)
            yield cmd.Forward()

        try:
            async with accepted_pair() as (client, accepted):
                run = asyncio.ensure_future(driver.run("outbound", accepted, app_addr, layer()))
                loop = asyncio.get_running_loop()
                await loop.sock_sendall(client, b"request")
                client.shutdown(socket.SHUT_WR)
                answer = b""
                while chunk := await loop.sock_recv(client, 1024):
                    answer += chunk
                assert answer == b"got request"
                await run
        finally:
            app.close()
            await app.wait_closed()
        snapshot = registry.tcp.snapshot()
        assert snapshot['direction="outbound",peer="src"'] == {
            "open_total": 1, "close_total": {"": 1}, "open_connections": 0,
            "read_bytes_total": 7, "write_bytes_total": 11}
        assert snapshot['direction="outbound",peer="dst"']["read_bytes_total"] == 11

    asyncio.run(scenario())


def test_unknown_commands_and_refusals_close_the_connection() -> None:
    class Bogus(cmd.Command):
        __slots__ = ()

    async def scenario() -> None:
        driver, registry = new_driver()

        def bogus() -> cmd.Layer:
            yield cmd.SetLabels('direction="inbound"')
            yield Bogus()

        def refusing() -> cmd.Layer:
            yield cmd.Refuse("nope", 'direction="inbound",peer="src"')

        loop = asyncio.get_running_loop()
        for layer in (bogus(), refusing()):
            async with accepted_pair() as (client, accepted):
                await driver.run("inbound", accepted, TARGET, layer)
                assert await loop.sock_recv(client, 10) == b""
                assert accepted.fileno() == -1
        errors = registry.counters["inbound_tcp_errors_total"].values
        assert errors == {'error="unexpected",target_addr="127.0.0.1:1",target_ip="127.0.0.1",target_port="1"': 1,
                          'error="nope",target_addr="127.0.0.1:1",target_ip="127.0.0.1",target_port="1"': 1}

    asyncio.run(scenario())
