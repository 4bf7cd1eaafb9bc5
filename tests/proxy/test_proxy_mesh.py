"""Two meshed pods on loopback, a real control plane between them: what an app sees, and what the wire carries.

Each test runs identity and destination in-process over a temp store, a client
pod's proxy and one or more server pods' proxies (``proxy_harness``). The
apps speak to service addresses; the bytes go app -> outbound proxy -> mTLS
(+ transport header) -> inbound proxy -> app.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from cryptography import x509
from proxy_harness import (
    BannerServer,
    closed_without_answer,
    EchoServer,
    HttpServer,
    Mesh,
    RecordingRelay,
    connection,
    http_get,
    run,
    samples,
    scrape,
)

from tether.proxy.app import Proxy
from tether.proxy.codec.client_hello import ClientHello, ClientHelloParser
from tether.proxy.codec.transport_header import PREFACE, TransportHeader, encode


def test_opaque_server_speaks_first(tmp_path: Path) -> None:
    """SMTP on port 25 (opaque by default): the banner arrives although the client has sent nothing."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, _, _ = await mesh.two_proxies("mail", 25)
            async with BannerServer(server.ip, 25):
                async with connection(svc, 25) as (reader, writer):
                    assert await reader.readline() == b"220 tether.test ESMTP ready\r\n"
                    writer.write(b"HELO client\r\n")
                    assert await reader.readline() == b"250 HELO client\r\n"
                    writer.write(b"QUIT\r\n")
                    assert await reader.readline() == b"221 bye\r\n"
                    assert await reader.read() == b""

    run(scenario())


def test_http1_carried_per_connection(tmp_path: Path) -> None:
    """Keep-alive HTTP/1.1: detected, carried on one connection; between the proxies over HTTP/2 (the
    destination hints the meshed pod h2: the l5d-orig-proto upgrade), as the transport header announces."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("web", 8080, 80)
            async with HttpServer(server.ip, 8080, "web-0") as app:
                async with connection(svc, 80) as (reader, writer):
                    for path in ("/", "/books", "/authors/1"):
                        assert await http_get(reader, writer, path) == (200, f"web-0 {path}".encode())
                assert len(app.peers) == 1  # one connection carried all three requests
            await a.idle()
            await b.idle()
            inbound = await scrape(b)
            assert samples(inbound, "inbound_tcp_transport_header_connections_total", session_protocol="http2",
                           target_port="8080", client_id=client.identity) == [
                ({"session_protocol": "http2", "target_port": "8080", "target_name": "",
                  "client_id": client.identity}, 1.0)]

    run(scenario())


def _echo_service() -> grpc.GenericRpcHandler:
    async def say(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"hello " + request

    async def chat(requests, context):  # type: ignore[no-untyped-def]
        async for request in requests:
            yield request.upper()

    return grpc.method_handlers_generic_handler("test.Echo", {
        "Say": grpc.unary_unary_rpc_method_handler(say),
        "Chat": grpc.stream_stream_rpc_method_handler(chat),
    })


def test_grpc_through_the_mesh_with_the_http2_session_protocol(tmp_path: Path) -> None:
    """gRPC (HTTP/2 prior knowledge): unary and bidirectional streaming calls through the mesh; between the
    proxies the transport header says the session is HTTP/2."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, _ = await mesh.two_proxies("echo", 9090)
            app = grpc.aio.server()
            app.add_generic_rpc_handlers((_echo_service(),))
            app.add_insecure_port(f"{server.ip}:9090")
            await app.start()
            try:
                async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                    say = channel.unary_unary("/test.Echo/Say")
                    assert await say(b"tether", timeout=10) == b"hello tether"
                    chat = channel.stream_stream("/test.Echo/Chat")

                    async def requests():  # type: ignore[no-untyped-def]
                        for word in (b"one", b"two", b"three"):
                            yield word

                    answers = [answer async for answer in chat(requests(), timeout=10)]
                    assert answers == [b"ONE", b"TWO", b"THREE"]
            finally:
                await app.stop(None)
            inbound = await scrape(b)
            assert samples(inbound, "inbound_tcp_transport_header_connections_total", session_protocol="http2",
                           client_id=client.identity)

    run(scenario())


def test_bytes_between_the_proxies_are_tls(tmp_path: Path) -> None:
    """A relay taps the connection between the proxies: a TLS 1.3 ClientHello for the server's identity, then
    nothing of the payload or the transport header in clear, in either direction."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            # The destination tells peers to use port 15143, where the relay listens; it forwards to 4143.
            server, client, svc, _, _ = await mesh.two_proxies("echo", 7000, inbound_port=15143)
            secret = b"TETHER-PLAINTEXT-MARKER-" * 2000
            async with RecordingRelay(server.ip, 15143, (server.ip, 4143)) as relay, \
                    EchoServer(server.ip, 7000):
                async with connection(svc, 7000) as (reader, writer):
                    writer.write(secret)
                    assert await reader.readexactly(len(secret)) == secret
            assert len(relay.upstream_bytes) == 1
            upstream, downstream = bytes(relay.upstream_bytes[0]), bytes(relay.downstream_bytes[0])
            assert len(upstream) > len(secret) and len(downstream) > len(secret)
            for wire in (upstream, downstream):
                assert b"TETHER-PLAINTEXT-MARKER" not in wire
                assert PREFACE not in wire
            hello = ClientHelloParser().receive_data(upstream[:8192])
            assert hello == ClientHello(server.identity, (b"transport.l5d.io/v1",))
            # Every record after the handshake is application data (type 23) of TLS 1.3.
            assert downstream[:3] == b"\x16\x03\x03"  # ServerHello

    run(scenario())


def _leaf(proxy: Proxy) -> x509.Certificate:
    """The leaf certificate a running proxy presents now."""
    return x509.load_pem_x509_certificates(proxy.identity.material.certified.chain_pem)[0]


def test_certificate_refresh_during_traffic(tmp_path: Path) -> None:
    """A refresh swaps the certificate for new connections; an open connection keeps flowing."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("echo", 7000)
            async with EchoServer(server.ip, 7000, "echo-0"), connection(svc, 7000) as (reader, writer):
                writer.write(b"before ")
                assert await reader.readline() == b"echo-0\n"
                assert await reader.readexactly(7) == b"before "
                old_server = _leaf(b)
                old_client = _leaf(a)
                await b.identity.refresh_once()
                await a.identity.refresh_once()
                new_server = _leaf(b)
                assert new_server.serial_number != old_server.serial_number
                assert _leaf(a).serial_number != old_client.serial_number
                # The open connection is untouched by the swap.
                writer.write(b"after ")
                assert await reader.readexactly(6) == b"after "
                # A new connection through the mesh works with the new certificates on both ends.
                async with connection(svc, 7000) as (reader2, writer2):
                    writer2.write(b"again")
                    assert await reader2.readline() == b"echo-0\n"
                    assert await reader2.readexactly(5) == b"again"
                writer.write(b"still ")
                assert await reader.readexactly(6) == b"still "
            # And a TLS client of the inbound port is served the new certificate.
            ctx = mesh.ca.client_context(client.identity, alpn=["transport.l5d.io/v1"])
            async with connection(server.ip, 4143, ssl=ctx, server_hostname=server.identity) as (_, writer3):
                peer = writer3.get_extra_info("ssl_object").getpeercert(binary_form=True)
                assert x509.load_der_x509_certificate(peer).serial_number == new_server.serial_number

    run(scenario())


def test_transport_metrics_are_counted(tmp_path: Path) -> None:
    """Exact opens, closes and bytes on all four connection sides, with Linkerd's labels."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("echo", 7000)
            payload = bytes(range(256)) * 100
            greeting = b"echo-0\n"
            async with EchoServer(server.ip, 7000, "echo-0"):
                for _ in range(2):
                    async with connection(svc, 7000) as (reader, writer):
                        writer.write(payload)
                        assert await reader.readline() == greeting
                        assert await reader.readexactly(len(payload)) == payload
                await a.idle()
                await b.idle()
            header = len(encode(TransportHeader(port=7000)))
            outbound, inbound = await scrape(a), await scrape(b)

            def one(metrics, name, **labels):  # type: ignore[no-untyped-def]
                found = samples(metrics, name, **labels)
                assert len(found) == 1, (name, labels, found)
                return found[0][1]

            src = {"direction": "outbound", "peer": "src", "target_addr": f"{svc}:7000", "tls": "no_identity",
                   "no_tls_reason": "loopback"}
            dst = {"direction": "outbound", "peer": "dst", "target_addr": f"{server.ip}:7000", "tls": "true",
                   "server_id": server.identity, "dst_pod": "echo-0", "dst_serviceaccount": "echo",
                   "authority": "echo.emojivoto.svc.cluster.local:7000"}
            accepted = {"direction": "inbound", "peer": "src", "target_addr": f"{server.ip}:7000", "tls": "true",
                        "client_id": client.identity, "srv_kind": "default", "srv_name": "all-unauthenticated"}
            to_app = {"direction": "inbound", "peer": "dst", "target_addr": f"{server.ip}:7000",
                      "tls": "no_identity", "no_tls_reason": "loopback"}
            for metrics, labels, read, written in (
                (outbound, src, len(payload), len(greeting) + len(payload)),
                (outbound, dst, len(greeting) + len(payload), header + len(payload)),
                (inbound, accepted, header + len(payload), len(greeting) + len(payload)),
                (inbound, to_app, len(greeting) + len(payload), len(payload)),
            ):
                assert one(metrics, "tcp_open_total", **labels) == 2
                assert one(metrics, "tcp_open_connections", **labels) == 0
                assert one(metrics, "tcp_close_total", errno="", **labels) == 2
                assert one(metrics, "tcp_read_bytes_total", **labels) == 2 * read
                assert one(metrics, "tcp_write_bytes_total", **labels) == 2 * written
            assert one(inbound, "inbound_tcp_authz_allow_total", target_addr=f"{server.ip}:7000",
                       authz_name="all-unauthenticated", client_id=client.identity) == 2
            expiry = b.identity.material.expires_at.timestamp()
            assert one(inbound, "control_identity_cert_expiration_timestamp_seconds") == expiry
            assert one(inbound, "control_identity_cert_refreshes_total", result="ok") == 1
            assert one(inbound, "process_resident_memory_bytes") > 0
            assert not samples(outbound, "outbound_tcp_errors_total")
            assert not samples(inbound, "inbound_tcp_errors_total")

    run(scenario())


def test_plaintext_to_the_direct_port_is_refused(tmp_path: Path) -> None:
    """The inbound port itself only takes mTLS with a transport header: plaintext is refused, and counted."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server = mesh.pod("echo-0", app="echo", ports=[7000])
            b = await mesh.start_proxy(server)
            async with connection(server.ip, 4143) as (reader, writer):
                writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                assert await closed_without_answer(reader)
            await b.idle()
            inbound = await scrape(b)
            assert samples(inbound, "inbound_tcp_errors_total",
                           error="direct connections must be mutually authenticated")
            assert samples(inbound, "tcp_close_total", direction="inbound", peer="src", tls="no_identity",
                           no_tls_reason="no_tls_from_remote")

    run(scenario())


def test_tls_on_the_inbound_port_needs_the_transport_alpn(tmp_path: Path) -> None:
    """A meshed client without ALPN on the direct port, or without a certificate, is refused."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server = mesh.pod("echo-0", app="echo", ports=[7000])
            b = await mesh.start_proxy(server)
            for ctx in (mesh.ca.client_context("client.emojivoto.serviceaccount.identity.linkerd.cluster.local"),
                        mesh.ca.client_context(None, alpn=["transport.l5d.io/v1"])):
                async with connection(server.ip, 4143, ssl=ctx, server_hostname=server.identity) as (reader, w):
                    w.write(encode(TransportHeader(port=7000)))
                    assert await closed_without_answer(reader)
            await b.idle()
            errors = await scrape(b)
            assert samples(errors, "inbound_tcp_errors_total",
                           error="direct connections require transport header negotiation")
            assert samples(errors, "inbound_tcp_errors_total",
                           error="direct connections must be mutually authenticated")

    run(scenario())
