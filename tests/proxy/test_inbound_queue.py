"""The inbound HTTP/2 queue through a real proxy (in-process, loopback): requests for an app port that refuses
connections wait for it (LINKERD2_PROXY_INBOUND_HTTP_QUEUE_CAPACITY, _FAILFAST_TIMEOUT) as linkerd2-proxy's
inbound HTTP/2 client makes them wait while it reconnects: served once the app listens, 504 ``service in
fail-fast`` when it does not within the failfast timeout (and 503 ``service unavailable`` at once after that,
while it stays unreachable), 503 past the capacity. An
HTTP/1 request's refused connect is its own error, 502 at once, as linkerd2-proxy's (its HTTP/1 client is always
ready: nothing queues). Each client is a meshed one (mTLS and a transport header to the inbound port), so the
answers carry ``l5d-proxy-error``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import h2.config
import h2.connection
import h2.events
from proxy_harness import App, Mesh, Pod, run, samples, scrape
from test_http2_mesh import h2_client, h2_exchange

from tether.proxy.app import Proxy
from tether.proxy.codec.addrs import SocketAddr, parse_socket_addr
from tether.proxy.codec.transport_header import SessionProtocol, TransportHeader, encode
from tether.proxy.core.inbound import TRANSPORT_ALPN
from tether.proxy.io.discovery import WaitingBalancer

PORT = 8080
PEER = "client.emojivoto.serviceaccount.identity.linkerd.cluster.local"


class H2App(App):
    """An HTTP/2 (prior knowledge) app answering every request ``200 ok``."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    conn.send_headers(event.stream_id, [(":status", "200"), ("content-length", "2")])
                    conn.send_data(event.stream_id, b"ok", end_stream=True)
            writer.write(conn.data_to_send())
            await writer.drain()


async def get(mesh: Mesh, pod: Pod, path: str, protocol: SessionProtocol = SessionProtocol.HTTP2) -> tuple[str, str]:
    """``GET path`` to the app's port through the pod's inbound proxy: (status, l5d-proxy-error)."""
    ctx = mesh.ca.client_context(PEER, alpn=[TRANSPORT_ALPN])
    reader, writer = await asyncio.open_connection(pod.ip, 4143, ssl=ctx, server_hostname=pod.identity)
    try:
        writer.write(encode(TransportHeader(port=PORT, protocol=protocol)))
        if protocol is SessionProtocol.HTTP1:
            writer.write(f"GET {path} HTTP/1.1\r\nhost: web:{PORT}\r\n\r\n".encode())
            head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
            error = next((line.split(":", 1)[1].strip() for line in head.split("\r\n")
                          if line.startswith("l5d-proxy-error:")), "")
            return head.split()[1], error
        conn = h2_client(writer)
        headers, _ = await h2_exchange(reader, writer, conn, [(":method", "GET"), (":scheme", "http"),
                                                             (":authority", f"web:{PORT}"), (":path", path)])
        return headers[":status"], headers.get("l5d-proxy-error", "")
    finally:
        writer.close()


async def waiting(proxy: Proxy, target: SocketAddr, count: int) -> WaitingBalancer:
    """The app port's balancer once ``count`` requests wait for it (no event says so: yield to the proxy)."""
    while True:
        balancer = proxy.app_ports.unreachable_ports.get(target)
        if isinstance(balancer, WaitingBalancer) and balancer.queue.waiting >= count:
            return balancer
        await asyncio.sleep(0)


def test_a_request_waits_for_the_app_to_listen_and_is_served(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pod = mesh.pod("web-0", app="web", ports=[PORT])
            # A failfast far longer than the test: the request is answered by the app, not by the timeout.
            proxy = await mesh.start_proxy(pod, LINKERD2_PROXY_INBOUND_HTTP_FAILFAST_TIMEOUT="1h")
            target = parse_socket_addr(f"{pod.ip}:{PORT}")
            request = asyncio.ensure_future(get(mesh, pod, "/early"))
            await waiting(proxy, target, 1)  # the connect was refused: the request waits
            assert not request.done()
            async with H2App(pod.ip, PORT):
                assert await request == ("200", "")
                assert target not in proxy.app_ports.unreachable_ports  # reconnected
                assert await get(mesh, pod, "/later") == ("200", "")
            out = await scrape(proxy)
            assert not samples(out, "inbound_http_errors_total")

    run(scenario())


def test_a_request_for_an_app_that_never_listens_fails_fast_with_504(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pod = mesh.pod("web-0", app="web", ports=[PORT])
            proxy = await mesh.start_proxy(pod, LINKERD2_PROXY_INBOUND_HTTP_FAILFAST_TIMEOUT="200ms")
            status, error = await get(mesh, pod, "/nobody")
            assert status == "504" and error.endswith("service in fail-fast"), error
            # Still unreachable, past the failfast: shed at once, as linkerd2-proxy's shut gate makes it.
            status, error = await get(mesh, pod, "/nobody-again")
            assert status == "503" and error.endswith("service unavailable"), error
            out = await scrape(proxy)
            assert [n for _, n in samples(out, "inbound_http_errors_total", error="failfast")] == [1]
            assert [n for _, n in samples(out, "inbound_http_errors_total", error="loadshed")] == [1]
            assert samples(out, "response_total", direction="inbound", status_code="504")
            # The route family's statuses count both, with no status: linkerd2-proxy's see the error above the
            # queue.
            assert [n for _, n in samples(out, "inbound_http_statuses_total", status="")] == [2]

    run(scenario())


def test_past_the_capacity_a_request_is_shed_with_503(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pod = mesh.pod("web-0", app="web", ports=[PORT])
            proxy = await mesh.start_proxy(pod, LINKERD2_PROXY_INBOUND_HTTP_QUEUE_CAPACITY="1",
                                           LINKERD2_PROXY_INBOUND_HTTP_FAILFAST_TIMEOUT="1h")
            target = parse_socket_addr(f"{pod.ip}:{PORT}")
            first = asyncio.ensure_future(get(mesh, pod, "/first"))
            await waiting(proxy, target, 1)
            status, error = await get(mesh, pod, "/second")
            assert status == "503" and error.endswith("service unavailable"), error
            assert not first.done()  # the queue keeps its one
            async with H2App(pod.ip, PORT):
                assert await first == ("200", "")
            out = await scrape(proxy)
            assert [n for _, n in samples(out, "inbound_http_errors_total", error="loadshed")] == [1]
            assert not samples(out, "inbound_http_errors_total", error="failfast")

    run(scenario())


def test_an_http1_request_is_answered_502_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pod = mesh.pod("web-0", app="web", ports=[PORT])
            proxy = await mesh.start_proxy(pod, LINKERD2_PROXY_INBOUND_HTTP_FAILFAST_TIMEOUT="1h")
            status, error = await get(mesh, pod, "/h1", SessionProtocol.HTTP1)
            assert status == "502" and "refused" in error.lower(), error
            assert not proxy.app_ports.unreachable_ports  # nothing waits for an HTTP/1 app

    run(scenario())
