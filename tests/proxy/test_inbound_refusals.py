"""Bad input, forged peers: each refused and counted, the connection closed, the proxy unaffected.

The inbound side is attacked on its direct port (mTLS + transport header); the
outbound side is pointed, through the destination's inbound-port hint, at
forged servers: one with a valid mesh certificate for the wrong identity, one
whose certificate chains to another trust anchor.
"""

from __future__ import annotations

import asyncio
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

from proxy_harness import (
    Ca,
    EchoServer,
    Mesh,
    closed_without_answer,
    connection,
    identity_of,
    run,
    samples,
    scrape,
)

from tether.proxy.app import Proxy
from tether.proxy.codec.transport_header import PREFACE, TransportHeader, encode

ALPN = ["transport.l5d.io/v1"]


async def still_serves(mesh: Mesh, svc: str) -> None:
    async with connection(svc, 7000) as (reader, writer):
        writer.write(b"ok?")
        assert await reader.readline() == b"echo-0\n"
        assert await reader.readexactly(3) == b"ok?"


async def errors(proxy: Proxy, direction: str) -> dict[str, float]:
    await proxy.idle()
    metrics = await scrape(proxy)
    return {labels["error"]: value for labels, value in samples(metrics, f"{direction}_tcp_errors_total")}


def test_bad_input_on_the_direct_port(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, _ = await mesh.two_proxies(
                "echo", 7000, server_env={"LINKERD2_PROXY_INBOUND_DETECT_TIMEOUT": "500ms"})
            host = server.ip
            meshed = mesh.ca.client_context(identity_of("attacker"), alpn=ALPN)

            async def send_raw(data: bytes) -> None:
                async with connection(host, 4143) as (reader, writer):
                    writer.write(data)
                    assert await closed_without_answer(reader)

            async def send_in_tls(data: bytes, ctx: ssl.SSLContext = meshed, close: bool = True) -> None:
                async with connection(host, 4143, ssl=ctx, server_hostname=server.identity) as (reader, writer):
                    if data:
                        writer.write(data)
                    if close:
                        writer.transport.abort()  # the header never completes
                        return
                    assert await closed_without_answer(reader)

            async with EchoServer(server.ip, 7000, "echo-0"):
                await still_serves(mesh, svc)
                # A record header that promises a ClientHello, then garbage.
                await send_raw(b"\x16\x03\x01\x00\x40\x01\x00\x00\x3c" + bytes(range(60)))
                await send_raw(b"\x16\x03\x03" + b"\xff" * 200)
                # A transport header cut short, then an oversized one, then none at all before the timeout.
                header = encode(TransportHeader(port=7000))
                await send_in_tls(header[:-3])
                await send_in_tls(PREFACE + (1 << 20).to_bytes(4, "big") + b"\x08", close=False)
                await send_in_tls(b"", close=False)
                # A header for the inbound port itself (a loop).
                await send_in_tls(encode(TransportHeader(port=4143)), close=False)
                await still_serves(mesh, svc)
            counted = await errors(b, "inbound")
            assert counted["direct connections must be mutually authenticated"] == 2
            assert counted["invalid transport header"] == 2
            assert counted["transport header timeout"] == 1
            assert counted["loop"] == 1

    run(scenario())


def test_untrusted_or_expired_client_certificates_are_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, _ = await mesh.two_proxies("echo", 7000)
            stranger = Ca.create(tmp_path / "other-ca")
            untrusted = stranger.client_context(identity_of("client"), alpn=ALPN)
            untrusted.load_verify_locations(cadata=mesh.ca.anchors_pem.decode())  # it trusts us; we do not trust it
            expired = mesh.ca.client_context(identity_of("client"), alpn=ALPN,
                                             valid_from=datetime.now(UTC) - timedelta(days=2),
                                             valid_for=timedelta(days=1))
            async with EchoServer(server.ip, 7000, "echo-0"):
                for ctx in (untrusted, expired):
                    try:
                        async with connection(server.ip, 4143, ssl=ctx, server_hostname=server.identity) as (r, w):
                            w.write(encode(TransportHeader(port=7000)) + b"let me in")
                            assert await closed_without_answer(r)
                    except (ssl.SSLError, ConnectionError):
                        pass  # refused during the handshake
                await still_serves(mesh, svc)
            counted = await errors(b, "inbound")
            assert counted["untrusted client certificate"] == 2

    run(scenario())


class _ForgedServer:
    """A TLS server at ``ip:port`` presenting ``ctx``'s certificate; counts handshakes it got through."""

    def __init__(self, ip: str, port: int, ctx: ssl.SSLContext) -> None:
        self.ip, self.port, self.ctx = ip, port, ctx
        self.served = 0

    async def __aenter__(self) -> _ForgedServer:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                data = await reader.read(65536)
                if data:
                    self.served += 1
                    writer.write(b"stolen: " + data)
                    await writer.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(serve, self.ip, self.port, ssl=self.ctx)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()


def test_outbound_refuses_a_server_with_the_wrong_identity_or_untrusted_anchors(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            # The destination sends peers to port 15143, where a forged server listens instead of the proxy.
            server, client, svc = mesh.one_served_pod("echo", 7000, inbound_port=15143)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:7000"])
            impostor = mesh.ca.server_context(identity_of("impostor"))  # a valid mesh certificate, wrong name
            stranger = Ca.create(tmp_path / "other-ca").server_context(server.identity)  # right name, wrong anchor
            for ctx in (impostor, stranger):
                async with _ForgedServer(server.ip, 15143, ctx) as forged:
                    async with connection(svc, 7000) as (reader, writer):
                        writer.write(b"secret")
                        assert await closed_without_answer(reader)
                    assert forged.served == 0
            counted = await errors(a, "outbound")
            assert counted == {"unexpected server identity": 1, "untrusted server certificate": 1}

    run(scenario())
