"""HTTP/1 per request through two proxies and a real control plane (proxy.md §7.3, §7.9, §9.2).

The client app talks to a service address; its outbound proxy routes every
request on its own (P2C over the service's endpoints), over pooled mTLS
connections with the transport header, to the servers' inbound proxies, which
keep their own pooled connections to the apps.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from proxy_harness import App, EchoServer, Mesh, connection, read_request, run, samples, scrape, until

from tether.proxy.codec.http1 import Body, EndOfMessage, Http1Connection, RequestHead, ResponseHead, Role


class Web(App):
    """An HTTP/1.1 app (its own small parser): ``name method path body-length``; a few special paths."""

    def __init__(self, ip: str, port: int, name: str) -> None:
        super().__init__(ip, port)
        self.name = name
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            method, path, headers, body = request.method, request.path, request.headers, request.body
            self.requests.append((method, path, headers))
            if path == "/ws":
                writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: echo\r\nconnection: upgrade\r\n\r\n")
                while data := await reader.read(65536):
                    writer.write(data.upper())
                return
            if path == "/stream":
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                for part in (b"one ", b"two ", b"three"):
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                continue
            if path == "/until-close":
                writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
                await writer.drain()
                return
            status = 500 if path == "/fail" else 200
            answer = f"{self.name} {method} {path} {len(body)}".encode()
            if path == "/echo":
                answer = body
            writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(answer), answer))
            await writer.drain()


async def request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, path: str,
                  body: bytes | None = None, chunks: list[bytes] | None = None,
                  headers: tuple[tuple[bytes, bytes], ...] = ()) -> tuple[ResponseHead, bytes]:
    """One request on an open connection, parsed with the codec in the client role."""
    conn = Http1Connection(Role.CLIENT)
    hs = ((b"host", b"web"),) + headers
    if body is not None:
        hs += ((b"content-length", str(len(body)).encode()),)
    elif chunks is not None:
        hs += ((b"transfer-encoding", b"chunked"),)
    writer.write(conn.send_head(RequestHead(method.encode(), path.encode(), hs)))
    for part in ([body] if body else chunks or []):
        writer.write(conn.send_body(part))
        await writer.drain()
    writer.write(conn.send_end())
    head: ResponseHead | None = None
    data = b""
    while True:
        chunk = await reader.read(65536)
        for event in conn.receive_data(chunk):
            if isinstance(event, ResponseHead) and event.status >= 200:
                head = event
            elif isinstance(event, Body):
                data += event.data
            elif isinstance(event, EndOfMessage):
                assert head is not None
                return head, data
        if not chunk:
            raise AssertionError(f"closed before the response ended: {head} {data!r}")


def header(head: ResponseHead, name: bytes) -> bytes | None:
    return next((v for k, v in head.headers if k.lower() == name), None)


def test_requests_balanced_per_request_over_one_client_connection(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pods = [mesh.pod(f"web-{i}", app="web", ports=[8080]) for i in range(3)]
            client = mesh.pod("client-0", app="client")
            svc = mesh.service("web", [(80, 8080)])
            servers = [await mesh.start_proxy(p) for p in pods]
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:80"])
            apps = [Web(p.ip, 8080, p.name) for p in pods]
            for app in apps:
                await app.__aenter__()
            try:
                async with connection(svc, 80) as (reader, writer):
                    seen = set()
                    for i in range(60):
                        head, body = await request(reader, writer, "GET", f"/r{i}")
                        assert head.status == 200
                        seen.add(body.split(b" ")[0])
                    assert seen == {b"web-0", b"web-1", b"web-2"}
                # Keep-alive at every hop: each app saw one connection from its inbound proxy.
                assert [len(app.peers) for app in apps] == [1, 1, 1]
                # The inbound proxy sets l5d-client-id from the client's certificate.
                assert {app.requests[0][2].get("l5d-client-id") for app in apps} == {client.identity}
                await a.idle()
                for b in servers:
                    await b.idle()
                out = await scrape(a)
                sent = sum(v for _, v in samples(out, "request_total", direction="outbound"))
                assert sent == 60
                ok = samples(out, "response_total", direction="outbound", status_code="200",
                             classification="success", authority=f"web.emojivoto.svc.cluster.local:80")
                assert sum(v for _, v in ok) == 60 and len(ok) == 3
                assert all(labels["tls"] == "true" and labels["dst_pod"].startswith("web-") for labels, _ in ok)
                inf = samples(out, "response_latency_ms_bucket", direction="outbound", le="+Inf")
                assert sum(v for _, v in inf) == 60
                received = 0.0
                for b in servers:
                    inbound = await scrape(b)
                    got = samples(inbound, "response_total", direction="inbound", status_code="200",
                                  client_id=client.identity, srv_name="all-unauthenticated",
                                  route_name="default", authz_kind="default", authz_name="all-unauthenticated")
                    received += sum(v for _, v in got)
                assert received == 60
            finally:
                for app in apps:
                    await app.__aexit__(None, None, None)

    run(scenario())


def test_bodies_framing_and_upgrade(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, b, _ = await mesh.two_proxies("web", 8080, 80)
            async with Web(server.ip, 8080, "web-0") as app:
                async with connection(svc, 80) as (reader, writer):
                    big = bytes(range(256)) * 8192  # 2 MiB, streamed through both proxies
                    head, body = await request(reader, writer, "POST", "/echo", body=big)
                    assert (head.status, body) == (200, big)
                    head, body = await request(reader, writer, "POST", "/echo", chunks=[b"a" * 10, b"b" * 70000])
                    assert body == b"a" * 10 + b"b" * 70000
                    head, body = await request(reader, writer, "GET", "/stream")
                    assert body == b"one two three" and header(head, b"transfer-encoding") == b"chunked"
                    head, body = await request(reader, writer, "GET", "/fail")
                    assert head.status == 500
                    failed = samples(await scrape(b), "response_total", direction="inbound", status_code="500")
                    assert [labels["classification"] for labels, _ in failed] == ["failure"]
                    head, body = await request(reader, writer, "GET", "/until-close")
                    assert body == b"all of it"  # re-framed as chunked for the client, which stays connected
                    head, body = await request(reader, writer, "HEAD", "/x")
                    assert head.status == 200 and body == b""
                    head, body = await request(reader, writer, "GET", "/after")
                    assert body == b"web-0 GET /after 0"
                    hop = [r[2] for r in app.requests if r[1] == "/after"][0]
                    assert "l5d-proxy-error" not in hop
                # A protocol switch: after the 101, bytes both ways.
                async with connection(svc, 80) as (reader, writer):
                    writer.write(b"GET /ws HTTP/1.1\r\nhost: web\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\nhi")
                    answer = await reader.readuntil(b"\r\n\r\n")
                    assert answer.startswith(b"HTTP/1.1 101")
                    assert await reader.readexactly(2) == b"HI"
                    writer.write(b"more")
                    assert await reader.readexactly(4) == b"MORE"

    run(scenario())


def test_endpoints_added_and_removed_take_effect_per_request(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            first, client, svc, _, a = await mesh.two_proxies("web", 8080, 80)
            second = mesh.pod("web-1", app="web", ports=[8080], apply=False)
            await mesh.start_proxy(second)
            async with Web(first.ip, 8080, "web-0"), Web(second.ip, 8080, "web-1"), \
                    connection(svc, 80) as (reader, writer):

                async def names(n: int) -> set[bytes]:
                    out = set()
                    for _ in range(n):
                        head, body = await request(reader, writer, "GET", "/")
                        assert head.status == 200
                        out.add(body.split(b" ")[0])
                    return out

                assert await names(10) == {b"web-0"}
                balancer = a.discovery.services["web.emojivoto.svc.cluster.local:80"].balancer
                mesh.store.apply_many([second.manifest()])
                await until(lambda: len(balancer.endpoints) == 2, balancer.updated)
                # The same client connection reaches the new endpoint (P2C: soon, not necessarily at once).
                while b"web-1" not in await names(5):
                    pass
                assert mesh.store.delete("Pod", first.ns, first.name) is not None
                await until(lambda: [str(e.addr.ip) for e in balancer.endpoints] == [second.ip], balancer.updated)
                assert await names(30) == {b"web-1"}

    run(scenario())


def test_synthesized_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tether.proxy.core.http")

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc = mesh.one_served_pod("web", 8080, 80)
            empty = mesh.service("nobody", [(80, 8080)])
            b = await mesh.start_proxy(server)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:80", f"{empty}:80"],
                                       LINKERD2_PROXY_OUTBOUND_HTTP_FAILFAST_TIMEOUT="200ms")
            # No app listening: the inbound proxy answers 502 with l5d-proxy-error, which the outbound strips.
            async with connection(svc, 80) as (reader, writer):
                head, _ = await request(reader, writer, "GET", "/")
                assert head.status == 502
                assert header(head, b"l5d-proxy-error") is None and header(head, b"l5d-proxy-connection") is None
                # ... and logs, as linkerd2-proxy's "Remote proxy error": the app sees only the status.
                assert f"remote proxy error: endpoint {server.ip}:8080: i/o (ECONNREFUSED)" in caplog.text, caplog.text
                # The inbound proxy closed its client (the outbound proxy); a balanced service's client stays.
                head, _ = await request(reader, writer, "GET", "/")
                assert head.status == 502
            # A service without endpoints: failfast, 504.
            async with connection(empty, 80) as (reader, writer):
                head, _ = await request(reader, writer, "GET", "/")
                assert head.status == 504
                assert b"fail-fast" in (header(head, b"l5d-proxy-error") or b"")
                assert header(head, b"connection") == b"close"
            # Malformed requests: 400 and close; a head over the limit: 431.
            async with Web(server.ip, 8080, "web-0"):
                async with connection(svc, 80) as (reader, writer):
                    writer.write(b"GET / HTTP/1.1\r\nhost: web\r\nbad header: x\r\n\r\n")
                    answer = await reader.read()
                    assert answer.startswith(b"HTTP/1.1 400")
                async with connection(svc, 80) as (reader, writer):
                    writer.write(b"GET / HTTP/1.1\r\nhost: web\r\nx-big: " + b"a" * 70000 + b"\r\n\r\n")
                    answer = await reader.read()
                    assert answer.startswith(b"HTTP/1.1 431")
                async with connection(svc, 80) as (reader, writer):  # and the proxy is fine afterwards
                    head, body = await request(reader, writer, "GET", "/ok")
                    assert body == b"web-0 GET /ok 0"
            await a.idle()
            await b.idle()
            out = await scrape(a)
            assert samples(out, "outbound_http_errors_total", error="failfast")
            assert samples(out, "response_total", status_code="504", classification="failure")
            inbound = await scrape(b)
            assert samples(inbound, "response_total", direction="inbound", status_code="502",
                           classification="failure")

    run(scenario())


def test_not_http_after_all_is_carried_opaque(tmp_path: Path) -> None:
    """Detection only sees a prefix: a first line that turns out not to be HTTP/1 is forwarded as bytes."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, _, _ = await mesh.two_proxies("echo", 7000)
            async with EchoServer(server.ip, 7000), connection(svc, 7000) as (reader, writer):
                # Starts like a request line (detection: HTTP/1), but no line end within 8 KiB.
                payload = b"NOT-AN-HTTP-METHOD-" * 1000
                writer.write(payload)
                assert await reader.readexactly(len(payload)) == payload
                writer.write(b"and then some")
                assert await reader.readexactly(13) == b"and then some"

    run(scenario())
