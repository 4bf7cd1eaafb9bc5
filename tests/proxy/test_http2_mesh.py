"""HTTP/2 and gRPC per stream through two proxies and a real control plane (proxy.md §7.3, §7.7, §7.9, §9.2).

A grpcio client on one channel (one HTTP/2 connection) talks to a service
address; its outbound proxy routes every call on its own (P2C over the
service's endpoints) over HTTP/2 connections with mTLS and the transport
header (session protocol ``http2``) to the servers' inbound proxies, which
open their own HTTP/2 connections to the grpcio servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
from proxy_harness import NS, App, Mesh, read_request, run, samples, scrape, until
from test_http1_profiles import CD, profile_in, service_profile

from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.codec.transport_header import SessionProtocol, TransportHeader, encode

TRANSPORT_ALPN = "transport.l5d.io/v1"


class Names:
    """A gRPC service ``test.Names``: who answered, a stream of words, and a call that fails with trailers.

    ``unavailable``: ``Who`` always fails with UNAVAILABLE (trailers-only); ``Slow`` answers once ``release``
    is set (the test's end).
    """

    def __init__(self, name: str, *, unavailable: bool = False) -> None:
        self.name = name
        self.calls = 0
        self.metadata: list[dict[str, str]] = []
        self.unavailable = unavailable
        self.release = asyncio.Event()

    def handler(self) -> grpc.GenericRpcHandler:
        async def who(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.calls += 1
            self.metadata.append({m.key: m.value for m in context.invocation_metadata()})
            if self.unavailable:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "not today")
            return self.name.encode() + b" " + request

        async def slow(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.calls += 1
            await self.release.wait()
            return request

        async def words(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            self.calls += 1
            for word in request.split():
                yield word.upper()

        async def echo(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            self.calls += 1
            async for request in requests:
                yield request[::-1]

        async def fail(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.calls += 1
            context.set_trailing_metadata((("x-why", "asked-for-it"),))
            await context.abort(grpc.StatusCode.NOT_FOUND, "nothing here: " + request.decode())
            return b""

        return grpc.method_handlers_generic_handler("test.Names", {
            "Who": grpc.unary_unary_rpc_method_handler(who),
            "Words": grpc.unary_stream_rpc_method_handler(words),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
            "Echo": grpc.stream_stream_rpc_method_handler(echo),
            "Slow": grpc.unary_unary_rpc_method_handler(slow),
        })


async def grpc_server(ip: str, port: int, service: Names) -> grpc.aio.Server:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((service.handler(),))
    server.add_insecure_port(f"{ip}:{port}")
    await server.start()
    return server


def test_grpc_calls_balanced_per_stream_on_one_channel(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pods = [mesh.pod(f"names-{i}", app="names", ports=[9090]) for i in range(3)]
            client = mesh.pod("client-0", app="client")
            svc = mesh.service("names", [(9090, 9090)])
            servers = [await mesh.start_proxy(p) for p in pods]
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:9090"])
            services = [Names(p.name) for p in pods]
            apps = [await grpc_server(p.ip, 9090, s) for p, s in zip(pods, services, strict=True)]
            try:
                async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                    who = channel.unary_unary("/test.Names/Who")
                    seen = set()
                    for i in range(60):
                        answer = await who(b"%d" % i, timeout=10)
                        assert answer.endswith(b" %d" % i)
                        seen.add(answer.split(b" ")[0])
                    assert seen == {b"names-0", b"names-1", b"names-2"}
                    # Concurrent calls on the one connection, each balanced on its own.
                    answers = await asyncio.gather(*(who(b"c%d" % i, timeout=10) for i in range(30)))
                    assert all(x.endswith(b" c%d" % i) for i, x in enumerate(answers))
                    words = channel.unary_stream("/test.Names/Words")
                    assert [w async for w in words(b"one two three", timeout=10)] == [b"ONE", b"TWO", b"THREE"]
                    fail = channel.unary_unary("/test.Names/Fail")
                    call = fail(b"x", timeout=10)
                    try:
                        await call
                        raise AssertionError("the call should fail")
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() is grpc.StatusCode.NOT_FOUND
                        assert exc.details() == "nothing here: x"
                        assert ("x-why", "asked-for-it") in tuple(exc.trailing_metadata())
                # The client's channel was one connection: every server saw one from its inbound proxy.
                assert sum(s.calls for s in services) == 92
                # The inbound proxy sets l5d-client-id from the client's certificate.
                assert {m.get("l5d-client-id") for s in services for m in s.metadata} == {client.identity}
            finally:
                for app in apps:
                    await app.stop(None)
            out = await scrape(a)
            authority = "names.emojivoto.svc.cluster.local:9090"
            assert sum(v for _, v in samples(out, "request_total", direction="outbound", authority=authority)) == 92
            ok = samples(out, "response_total", direction="outbound", status_code="200", grpc_status="0",
                         classification="success", authority=authority)
            assert sum(v for _, v in ok) == 91 and len(ok) == 3
            assert all(labels["tls"] == "true" and labels["dst_pod"].startswith("names-") for labels, _ in ok)
            failed = samples(out, "response_total", direction="outbound", grpc_status="5",
                             classification="failure")
            assert sum(v for _, v in failed) == 1
            received = 0.0
            for b in servers:
                inbound = await scrape(b)
                got = samples(inbound, "response_total", direction="inbound", grpc_status="0",
                              client_id=client.identity)
                received += sum(v for _, v in got)
                assert samples(inbound, "inbound_tcp_transport_header_connections_total", session_protocol="http2")
            assert received == 91

    run(scenario())


def test_large_streaming_messages_both_ways(tmp_path: Path) -> None:
    """MiBs each way on concurrent bidirectional calls: many windows' worth, through mTLS, without loss."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, _, _ = await mesh.two_proxies("names", 9090)
            app = await grpc_server(server.ip, 9090, Names("names-0"))
            try:
                async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                    echo = channel.stream_stream("/test.Names/Echo")

                    async def call(seed: int) -> None:
                        messages = [bytes([seed, i]) * 400_000 for i in range(5)]  # 800 KB each

                        async def requests() -> AsyncIterator[bytes]:
                            for message in messages:
                                yield message

                        answers = [a async for a in echo(requests(), timeout=30)]
                        assert answers == [m[::-1] for m in messages]

                    await asyncio.gather(*(call(seed) for seed in range(4)))
            finally:
                await app.stop(None)

    run(scenario())


def test_a_profile_split_applies_per_stream(tmp_path: Path) -> None:
    """A ServiceProfile's dstOverrides: each call of one channel draws its backend (the router's job)."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            one = mesh.pod("names-0", app="names", ports=[9090])
            two = mesh.pod("other-0", app="other", ports=[9090])
            client = mesh.pod("client-0", app="client")
            svc = mesh.service("names", [(9090, 9090)])
            mesh.service("other", [(9090, 9090)])
            domain = "emojivoto.svc.cluster.local"
            mesh.store.apply_many([{
                "apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
                "metadata": {"name": f"names.{domain}", "namespace": "emojivoto"},
                "spec": {"routes": [{"name": "who", "condition": {"method": "POST", "pathRegex": "/test.Names/.*"}}],
                         "dstOverrides": [{"authority": f"names.{domain}:9090", "weight": "500m"},
                                          {"authority": f"other.{domain}:9090", "weight": "500m"}]}}])
            await mesh.start_proxy(one)
            await mesh.start_proxy(two)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:9090"])
            apps = [await grpc_server(p.ip, 9090, Names(p.name)) for p in (one, two)]
            watch = a.discovery.profile(parse_socket_addr(f"{svc}:9090"))
            try:
                await until(lambda: watch.resolution.profile is not None, watch.updated)
                async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                    who = channel.unary_unary("/test.Names/Who")
                    seen = {(await who(b"x", timeout=10)).split(b" ")[0] for _ in range(40)}
                assert seen == {b"names-0", b"other-0"}
            finally:
                watch.release()
                for app in apps:
                    await app.stop(None)

    run(scenario())


def test_profile_routes_time_out_and_retry_grpc_calls(tmp_path: Path) -> None:
    """ServiceProfile routes on gRPC calls: a timeout shorter than the server is DEADLINE_EXCEEDED from the
    proxy; a retryable route hides an endpoint that always answers UNAVAILABLE (trailers-only).

    The two endpoints are two backends of a split (drawn again for each attempt), not one service's: P2C
    would keep choosing the failing endpoint (its errors are fast, the other's first call paid for the
    connections) until the budget ran out, as it would in Linkerd without failure accrual.
    """

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pods = [mesh.pod("names-0", app="names", ports=[9090]), mesh.pod("other-0", app="other", ports=[9090])]
            client = mesh.pod("client-0", app="client")
            svc = mesh.service("names", [(9090, 9090)])
            mesh.service("other", [(9090, 9090)])
            mesh.store.apply_many([service_profile("names", routes=[
                {"name": "slow", "condition": {"method": "POST", "pathRegex": "/test.Names/Slow"},
                 "timeout": "300ms"},
                {"name": "who", "condition": {"method": "POST", "pathRegex": "/test.Names/Who"},
                 "isRetryable": True},
            ], retryBudget={"retryRatio": 1.0, "minRetriesPerSecond": 10, "ttl": "10s"},
                dstOverrides=[{"authority": f"names.{NS}.{CD}:9090", "weight": "500m"},
                              {"authority": f"other.{NS}.{CD}:9090", "weight": "500m"}])])
            for pod in pods:
                await mesh.start_proxy(pod)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:9090"])
            services = [Names(pods[0].name, unavailable=True), Names(pods[1].name)]
            apps = [await grpc_server(p.ip, 9090, s) for p, s in zip(pods, services, strict=True)]
            watch = await profile_in(a, svc, 9090)
            try:
                async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                    slow = channel.unary_unary("/test.Names/Slow")
                    try:
                        await slow(b"x", timeout=10)
                        raise AssertionError("the call should time out")
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED
                        metadata = dict(tuple(exc.trailing_metadata()) + tuple(exc.initial_metadata() or ()))
                        assert metadata["l5d-proxy-error"] == "HTTP response timeout after 300ms"
                    who = channel.unary_unary("/test.Names/Who")
                    for i in range(20):
                        assert await who(b"%d" % i, timeout=10) == b"other-0 %d" % i
            finally:
                watch.release()
                for service in services:
                    service.release.set()
                for app in apps:
                    await app.stop(None)
            # The attempts drawn to the failing endpoint were each retried (on either: the split draws again).
            failed = len(services[0].metadata)
            assert failed > 0 and len(services[1].metadata) == 20
            out = await scrape(a)
            dst = f"names.{NS}.{CD}:9090"

            def route(name: str, family: str, **want: str) -> float:
                return sum(v for _, v in samples(out, family, direction="outbound", dst=dst, rt_route=name, **want))

            assert route("slow", "route_response_total", classification="failure", error="timeout") == 1
            assert samples(out, "outbound_http_errors_total", error="response timeout")
            assert route("who", "route_request_total") == 20
            assert route("who", "route_response_total", status_code="200", classification="success",
                         grpc_status="0") == 20
            assert route("who", "route_actual_response_total", classification="failure", grpc_status="14") == failed
            assert route("who", "route_actual_request_total") == 20 + failed
            retryable = samples(out, "route_retryable_total", rt_route="who")
            assert sorted((labels.get("skipped", ""), v) for labels, v in retryable) == [("", failed),
                                                                                        ("no_budget", 0)]

    run(scenario())


def test_unreachable_endpoints_answer_unavailable_and_an_unreachable_app_fails_fast(tmp_path: Path) -> None:
    """An endpoint whose proxy refuses the connection: the outbound proxy answers UNAVAILABLE (its connect
    failed). A proxy whose app refuses it: the inbound proxy's HTTP/2 client to the app waits for it, as
    linkerd2-proxy's reconnects (core.inbound_queue), and the call fails fast: DEADLINE_EXCEEDED (a 504's gRPC
    code) at LINKERD2_PROXY_INBOUND_HTTP_FAILFAST_TIMEOUT (1 s); the next one, the app still unreachable, is
    shed at once: UNAVAILABLE (a 503's)."""
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            # No proxy on this pod: connects to its inbound port are refused.
            mesh.pod("gone-0", app="gone", ports=[9090])
            # A proxy, but no app behind it: its inbound proxy cannot connect.
            empty = mesh.pod("empty-0", app="empty", ports=[9090])
            client = mesh.pod("client-0", app="client")
            gone = mesh.service("gone", [(9090, 9090)])
            lonely = mesh.service("empty", [(9090, 9090)])
            b = await mesh.start_proxy(empty)
            a = await mesh.start_proxy(client, outbound_to=[f"{gone}:9090", f"{lonely}:9090"])
            for ip, by_us in ((gone, True), (lonely, False)):
                code = grpc.StatusCode.UNAVAILABLE if by_us else grpc.StatusCode.DEADLINE_EXCEEDED
                again = grpc.StatusCode.UNAVAILABLE
                async with grpc.aio.insecure_channel(f"{ip}:9090") as channel:
                    who = channel.unary_unary("/test.Names/Who")
                    try:
                        await who(b"x", timeout=10)
                        raise AssertionError("the call should fail")
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() is code
                        metadata = dict(tuple(exc.trailing_metadata()) + tuple(exc.initial_metadata() or ()))
                        if by_us:  # the outbound proxy's own answer carries l5d-proxy-error
                            assert "connection refused" in metadata.get("l5d-proxy-error", "").lower() or \
                                "ECONNREFUSED" in metadata.get("l5d-proxy-error", "")
                            assert exc.details() == metadata["l5d-proxy-error"]
                        else:  # the inbound proxy's is for the proxy, not the app: removed outbound
                            assert "l5d-proxy-error" not in metadata
                            assert exc.details().endswith("service in fail-fast")
                    # The channel is still usable (errors do not end the HTTP/2 connection).
                    try:
                        await who(b"y", timeout=10)
                        raise AssertionError("the call should fail")
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() is again
            out = await scrape(a)
            assert samples(out, "outbound_http_errors_total", error="i/o")
            unavailable = samples(out, "response_total", direction="outbound", status_code="200",
                                  grpc_status="14", classification="failure")
            assert sum(v for _, v in unavailable) == 3
            inbound = await scrape(b)
            assert samples(inbound, "response_total", direction="inbound", grpc_status="4")
            assert [n for _, n in samples(inbound, "inbound_http_errors_total", error="failfast")] == [1]
            assert [n for _, n in samples(inbound, "inbound_http_errors_total", error="loadshed")] == [1]

    run(scenario())


class Web(App):
    """A plain HTTP/1.1 app: answers ``name method path version body`` and what it was told."""

    def __init__(self, ip: str, port: int, name: str) -> None:
        super().__init__(ip, port)
        self.name = name
        self.heads: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            self.heads.append(request.head)
            method, path, version, body = request.method, request.path, request.version, request.body
            answer = f"{self.name} {method} {path} {version} ".encode() + body
            writer.write(b"HTTP/1.1 200 OK\r\nx-app: yes\r\nconnection: keep-alive\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(answer), answer))
            await writer.drain()


async def h2_exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: h2.connection.H2Connection,
                      headers: list[tuple[str, str]], body: bytes = b"") -> tuple[dict[str, str], bytes]:
    """One request on an open HTTP/2 connection, its body sent as the windows allow; (response headers, body)."""
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, headers, end_stream=not body)
    response: dict[str, str] = {}
    data = b""
    while True:
        while body and (room := min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)) > 0:
            conn.send_data(sid, body[:room], end_stream=room >= len(body))
            body = body[room:]
        writer.write(conn.data_to_send())
        chunk = await reader.read(65536)
        assert chunk, "the proxy closed the connection"
        for event in conn.receive_data(chunk):
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                response = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
                data += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, sid)
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                writer.write(conn.data_to_send())
                return response, data
            elif isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                raise AssertionError(f"stream reset: {event.error_code}")


def h2_client(writer: asyncio.StreamWriter) -> h2.connection.H2Connection:
    """A client's HTTP/2 connection on ``writer``, its preface and settings sent."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    writer.write(conn.data_to_send())
    return conn


def frame_types(data: bytes) -> list[int]:
    types = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        types.append(data[3])
        data = data[9 + length:]
    return types


def test_orig_proto_is_downgraded_to_http1_for_the_app(tmp_path: Path) -> None:
    """What a linkerd2-proxy sends when the destination hints h2: HTTP/2 with ``l5d-orig-proto: HTTP/1.1``."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server = mesh.pod("web-0", app="web", ports=[8080])
            b = await mesh.start_proxy(server)
            peer = "client.emojivoto.serviceaccount.identity.linkerd.cluster.local"
            ctx = mesh.ca.client_context(peer, alpn=[TRANSPORT_ALPN])
            async with Web(server.ip, 8080, "web-0") as app:
                reader, writer = await asyncio.open_connection(server.ip, 4143, ssl=ctx,
                                                               server_hostname=server.identity)
                try:
                    writer.write(encode(TransportHeader(port=8080, protocol=SessionProtocol.HTTP2)))
                    conn = h2_client(writer)
                    base = [(":method", "GET"), (":scheme", "http"), (":authority", "web.emojivoto:8080")]
                    head, body = await h2_exchange(reader, writer, conn, [
                        *base, (":path", "/a"), ("l5d-orig-proto", "HTTP/1.1"), ("l5d-client-id", "forged")])
                    assert head[":status"] == "200" and head["l5d-orig-proto"] == "HTTP/1.1"
                    assert head["x-app"] == "yes" and "connection" not in head
                    assert body == b"web-0 GET /a HTTP/1.1 "
                    sent = app.heads[-1].decode().lower()
                    assert "l5d-orig-proto" not in sent and f"l5d-client-id: {peer}" in sent
                    assert "host: web.emojivoto:8080" in sent
                    post = [(":method", "POST"), *base[1:], (":path", "/b"), ("l5d-orig-proto", "HTTP/1.1")]
                    head, body = await h2_exchange(reader, writer, conn, post, body=b"x" * 100_000)
                    assert body == b"web-0 POST /b HTTP/1.1 " + b"x" * 100_000
                    # Without the header: HTTP/2 to the app, which speaks HTTP/1 only -> an error, not a hang.
                    head, body = await h2_exchange(reader, writer, conn, [*base, (":path", "/c")])
                    assert head[":status"] == "502"
                    # Keep-alive to the app: the downgraded requests shared its connection.
                    assert len(app.peers) == 2  # the pooled HTTP/1 one, and the failed HTTP/2 attempt
                finally:
                    writer.close()
            inbound = await scrape(b)
            assert samples(inbound, "response_total", direction="inbound", status_code="200", client_id=peer)

    run(scenario())


def test_plain_http2_client_and_goaway(tmp_path: Path) -> None:
    """A non-gRPC HTTP/2 client through both proxies: 502/504 as over HTTP/1, and a GOAWAY that lets streams end."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            empty, a = await mesh.proxy_to_nowhere(LINKERD2_PROXY_OUTBOUND_HTTP_FAILFAST_TIMEOUT="200ms")
            reader, writer = await asyncio.open_connection(empty, 80)
            try:
                conn = h2_client(writer)
                request = [(":method", "GET"), (":scheme", "http"), (":authority", "nobody"), (":path", "/")]
                head, _ = await h2_exchange(reader, writer, conn, request)
                assert head[":status"] == "504" and "fail-fast" in head["l5d-proxy-error"]
                head, _ = await h2_exchange(reader, writer, conn, [*request[:3], (":path", "/x.Y/Z"),
                                                                   ("content-type", "application/grpc")])
                assert head[":status"] == "200" and head["grpc-status"] == "4"  # DEADLINE_EXCEEDED, as Linkerd
                # Another client breaks HTTP/2: its connection ends with GOAWAY(PROTOCOL_ERROR); this one is fine.
                bad_reader, bad_writer = await asyncio.open_connection(empty, 80)
                bad_writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                                 + b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")  # SETTINGS, then DATA on stream 0
                answer = b""
                while chunk := await bad_reader.read(65536):
                    answer += chunk
                bad_writer.close()
                goaway = answer.rfind(b"\x07\x00\x00\x00\x00\x00")  # type GOAWAY, no flags, stream 0
                assert goaway > 0 and answer[goaway + 10:goaway + 14] == b"\x00\x00\x00\x01"  # PROTOCOL_ERROR
                head, _ = await h2_exchange(reader, writer, conn, request)
                assert head[":status"] == "504"
                conn.close_connection()
                writer.write(conn.data_to_send())
                # The proxy answers with its own GOAWAY and closes.
                rest = b""
                while chunk := await reader.read(65536):
                    rest += chunk
                assert 7 in frame_types(rest)
            finally:
                writer.close()
            out = await scrape(a)
            assert samples(out, "outbound_http_errors_total", error="failfast")

    run(scenario())


def test_rapid_reset_ends_with_enhance_your_calm_and_others_are_served(tmp_path: Path) -> None:
    """CVE-2023-44487 on loopback: one h2c connection sends HEADERS + RST_STREAM pairs back to back. The proxy
    answers GOAWAY(ENHANCE_YOUR_CALM) and closes it, counts it, and another client is served meanwhile."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            empty, a = await mesh.proxy_to_nowhere(LINKERD2_PROXY_OUTBOUND_HTTP_FAILFAST_TIMEOUT="200ms")
            request = [(":method", "GET"), (":scheme", "http"), (":authority", "nobody"), (":path", "/")]
            reader, writer = await asyncio.open_connection(empty, 80)
            attacker = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            attacker.initiate_connection()
            for _ in range(500):
                sid = attacker.get_next_available_stream_id()
                attacker.send_headers(sid, request, end_stream=True)
                attacker.reset_stream(sid)
            writer.write(attacker.data_to_send())
            answer = b""
            while chunk := await reader.read(65536):
                answer += chunk
            writer.close()
            goaway = answer.rfind(b"\x07\x00\x00\x00\x00\x00")  # type GOAWAY, no flags, stream 0
            assert goaway > 0 and answer[goaway + 10:goaway + 14] == b"\x00\x00\x00\x0b"  # ENHANCE_YOUR_CALM
            # Another client of the same proxy is served as usual.
            reader, writer = await asyncio.open_connection(empty, 80)
            try:
                conn = h2_client(writer)
                head, _ = await h2_exchange(reader, writer, conn, request)
                assert head[":status"] == "504" and "fail-fast" in head["l5d-proxy-error"]
            finally:
                writer.close()
            out = await scrape(a)
            assert samples(out, "outbound_http_errors_total", error="rapid reset")

    run(scenario())


def test_the_proxys_own_answers_to_the_app_can_leave_out_the_informational_headers(tmp_path: Path) -> None:
    """LINKERD2_PROXY_OUTBOUND_DISABLE_INFORMATIONAL_HEADERS (default: ingress mode): no l5d-proxy-error nor
    grpc-message on the outbound proxy's own answers; the status and grpc-status stay."""

    async def answers(mesh: Mesh, **env: str) -> tuple[dict[str, str], dict[str, str]]:
        empty, _ = await mesh.proxy_to_nowhere(LINKERD2_PROXY_OUTBOUND_HTTP_FAILFAST_TIMEOUT="200ms", **env)
        reader, writer = await asyncio.open_connection(empty, 80)
        try:
            conn = h2_client(writer)
            request = [(":method", "GET"), (":scheme", "http"), (":authority", "nobody"), (":path", "/")]
            plain, _ = await h2_exchange(reader, writer, conn, request)
            grpc, _ = await h2_exchange(reader, writer, conn, [*request[:3], (":path", "/x.Y/Z"),
                                                               ("content-type", "application/grpc")])
            return plain, grpc
        finally:
            writer.close()

    async def scenario() -> None:
        for env, informational in (({}, True),
                                   ({"LINKERD2_PROXY_OUTBOUND_DISABLE_INFORMATIONAL_HEADERS": "true"}, False),
                                   ({"LINKERD2_PROXY_INGRESS_MODE": "true"}, False)):
            async with Mesh(tmp_path / str(len(env) and sorted(env)[0])) as mesh:
                plain, grpc = await answers(mesh, **env)
            assert plain[":status"] == "504" and grpc["grpc-status"] == "4"
            assert ("l5d-proxy-error" in plain) is informational, env
            assert ("grpc-message" in grpc and "l5d-proxy-error" in grpc) is informational, env

    run(scenario())
