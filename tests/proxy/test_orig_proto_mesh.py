"""The ``l5d-orig-proto`` upgrade end to end (proxy.md §7.7): an HTTP/1 client, its outbound proxy, one
HTTP/2 connection over mTLS to the server's inbound proxy (the destination hints the meshed pod ``h2``), and
an HTTP/1 app. Two real Tether proxies and a real control plane (identity, destination); the protocol
between the proxies is read from the inbound proxy's own metrics: each connection's transport header names
its session protocol (``inbound_tcp_transport_header_connections_total{session_protocol}``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import h2.config
import h2.connection
from proxy_harness import App, Mesh, connection, read_all, read_request, run, samples, scrape
from test_http1_mesh import Web, header, request
from test_http2_mesh import TRANSPORT_ALPN, h2_exchange
from test_http2_mesh import Web as VersionWeb

from tether.proxy.codec.transport_header import SessionProtocol, TransportHeader, encode


def protocols(metrics: dict[str, dict[frozenset[tuple[str, str]], float]]) -> dict[str, float]:
    """Connections the inbound proxy accepted, by the session protocol their transport header named."""
    found: dict[str, float] = {}
    for labels, value in samples(metrics, "inbound_tcp_transport_header_connections_total"):
        found[labels["session_protocol"]] = found.get(labels["session_protocol"], 0) + value
    return found


class Held(App):
    """Answers nothing until ``n`` requests are in (so they are all in flight at once), then all of them."""

    def __init__(self, ip: str, port: int, n: int) -> None:
        super().__init__(ip, port)
        self.n = n
        self.arrived = 0
        self.all_in = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (req := await read_request(reader)) is not None:
            self.arrived += 1
            if self.arrived >= self.n:
                self.all_in.set()
            await self.all_in.wait()
            body = req.path.encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()


def test_http1_requests_in_flight_at_once_share_one_http2_connection(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("web", 8080, 80)
            async with Held(server.ip, 8080, 4) as app:

                async def one(i: int) -> tuple[int, bytes]:
                    async with connection(svc, 80) as (reader, writer):
                        head, body = await request(reader, writer, "GET", f"/r{i}")
                        return head.status, body

                # Four HTTP/1 client connections, four requests the app holds until all four are in: over
                # HTTP/1 they would take four connections between the proxies.
                answers = await asyncio.gather(*(one(i) for i in range(4)))
                assert sorted(answers) == [(200, f"/r{i}".encode()) for i in range(4)]
                assert len(app.peers) == 4  # the inbound proxy speaks HTTP/1 to the app, one request each
                assert protocols(await scrape(b)) == {"http2": 1}
                out = await scrape(a)
                ok = samples(out, "response_total", direction="outbound", status_code="200",
                             classification="success")
                assert sum(v for _, v in ok) == 4
                assert all(labels["tls"] == "true" and labels["dst_pod"] == "web-0" for labels, _ in ok)
                inbound = samples(await scrape(b), "response_total", direction="inbound", status_code="200",
                                  client_id=client.identity)
                assert sum(v for _, v in inbound) == 4

    run(scenario())


def test_bodies_framing_keep_alive_and_what_is_not_upgraded(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, _ = await mesh.two_proxies("web", 8080, 80)
            async with Web(server.ip, 8080, "web-0") as app:
                async with connection(svc, 80) as (reader, writer):
                    big = bytes(range(256)) * 8192  # 2 MiB each way: both windows fill and reopen
                    head, body = await request(reader, writer, "POST", "/echo", body=big)
                    assert (head.status, body) == (200, big)
                    assert header(head, b"content-length") == str(len(big)).encode()
                    head, body = await request(reader, writer, "POST", "/echo", chunks=[b"a" * 10, b"b" * 70000])
                    assert body == b"a" * 10 + b"b" * 70000
                    head, body = await request(reader, writer, "GET", "/stream")
                    assert body == b"one two three" and header(head, b"transfer-encoding") == b"chunked"
                    head, body = await request(reader, writer, "GET", "/fail")
                    assert head.status == 500
                    head, body = await request(reader, writer, "GET", "/until-close")
                    assert body == b"all of it"  # the client's connection stays: re-framed as chunked
                    head, body = await request(reader, writer, "HEAD", "/x")
                    assert head.status == 200 and body == b""
                    head, body = await request(reader, writer, "GET", "/after", headers=((b"x-app", b"1"),))
                    assert body == b"web-0 GET /after 0"
                    assert header(head, b"l5d-orig-proto") is None  # the peer's mark is not the client's
                seen = [r[2] for r in app.requests if r[1] == "/after"][0]
                assert seen.get("x-app") == "1" and "l5d-orig-proto" not in seen
                assert seen.get("l5d-client-id") == client.identity
                # Absolute-form is restored for the app.
                async with connection(svc, 80) as (reader, writer):
                    writer.write(b"GET http://web/abs HTTP/1.1\r\nhost: web\r\ncontent-length: 0\r\n\r\n")
                    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
                assert ("GET", "http://web/abs") in [(m, p) for m, p, _ in app.requests]
                assert protocols(await scrape(b)) == {"http2": 1}
                # A protocol switch is not upgraded: it takes an HTTP/1 connection of its own.
                async with connection(svc, 80) as (reader, writer):
                    writer.write(b"GET /ws HTTP/1.1\r\nhost: web\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\nhi")
                    answer = await reader.readuntil(b"\r\n\r\n")
                    assert answer.startswith(b"HTTP/1.1 101")
                    assert await reader.readexactly(2) == b"HI"
                assert protocols(await scrape(b)) == {"http2": 1, "http1": 1}

    run(scenario())


def test_errors_of_the_inbound_side_reach_the_http1_client(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, a = await mesh.two_proxies("web", 8080, 80)
            async with connection(svc, 80) as (reader, writer):
                # No app listening: the inbound proxy answers 502 with l5d-proxy-error on the HTTP/2 stream;
                # the outbound proxy removes the peer's l5d-proxy-error and the client's connection stays.
                head, _ = await request(reader, writer, "GET", "/")
                assert head.status == 502
                assert header(head, b"l5d-proxy-error") is None and header(head, b"l5d-proxy-connection") is None
                async with Web(server.ip, 8080, "web-0"):
                    head, body = await request(reader, writer, "GET", "/now")
                    assert (head.status, body) == (200, b"web-0 GET /now 0")
            assert protocols(await scrape(b)) == {"http2": 1}
            inbound = samples(await scrape(b), "response_total", direction="inbound", status_code="502",
                              classification="failure")
            assert sum(v for _, v in inbound) == 1
            out = samples(await scrape(a), "response_total", direction="outbound", status_code="502",
                          classification="failure")
            assert sum(v for _, v in out) == 1

    run(scenario())


def test_an_http_1_0_request_reaches_the_app_as_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, _ = await mesh.two_proxies("web", 8080, 80)
            async with VersionWeb(server.ip, 8080, "web-0") as app:  # answers with the version it was sent
                async with connection(svc, 80) as (reader, writer):
                    writer.write(b"GET /old HTTP/1.0\r\nHost: web\r\n\r\n")
                    answer = await read_all(reader)  # no keep-alive asked: the proxy closes after it
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\nweb-0 GET /old HTTP/1.0 ")
                assert app.heads[-1].startswith(b"GET /old HTTP/1.0\r\n")
            assert protocols(await scrape(b)) == {"http2": 1}  # upgraded: marked l5d-orig-proto: HTTP/1.0

    run(scenario())


def test_the_inbound_side_answers_an_upgraded_request_as_linkerd_does(tmp_path: Path) -> None:
    """A linkerd2-proxy peer's upgraded HTTP/1.0 requests (forged here with the h2 library): the app is sent
    HTTP/1.0; when it cannot be reached, the 502 is marked as its answer would have been, with the error and
    the connection-close hint for the peer (who holds the client's connection), not ``connection: close``."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server = mesh.pod("web-0", app="web", ports=[8080])
            await mesh.start_proxy(server)
            peer = "client.emojivoto.serviceaccount.identity.linkerd.cluster.local"
            ctx = mesh.ca.client_context(peer, alpn=[TRANSPORT_ALPN])
            reader, writer = await asyncio.open_connection(server.ip, 4143, ssl=ctx, server_hostname=server.identity)
            try:
                writer.write(encode(TransportHeader(port=8080, protocol=SessionProtocol.HTTP2)))
                conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
                conn.initiate_connection()
                writer.write(conn.data_to_send())
                old = [(":method", "GET"), (":scheme", "http"), (":authority", "web.emojivoto:8080"),
                       (":path", "/old"), ("l5d-orig-proto", "HTTP/1.0")]
                async with VersionWeb(server.ip, 8080, "web-0"):
                    head, body = await h2_exchange(reader, writer, conn, old)
                    assert head[":status"] == "200" and body == b"web-0 GET /old HTTP/1.0 "
                head, body = await h2_exchange(reader, writer, conn, old)  # no app now
                assert head[":status"] == "502" and body == b""
                assert head["l5d-orig-proto"] == "HTTP/1.0" and head["l5d-proxy-connection"] == "close"
                assert head["l5d-proxy-error"] and "connection" not in head
            finally:
                writer.close()

    run(scenario())
