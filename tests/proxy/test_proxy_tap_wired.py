"""Tap wired into the running proxy (proxy.md §10.2): real proxies, a real control plane, real mTLS.

With ``LINKERD2_PROXY_TAP_SVC_NAME`` set, each proxy serves Observe on
``LINKERD2_PROXY_CONTROL_LISTEN_ADDR`` with its own certificate, to the tap
identity only, and both HTTP versions in both directions report to it: the
client's proxy sees the requests outbound, the server's inbound.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from proxy_harness import Mesh, connection, run
from test_http1_mesh import Web, request
from test_http2_mesh import Names, grpc_server

from tether.api import http_types_pb2, tap_pb2, tap_pb2_grpc
from tether.api.addresses import from_tcp_address
from tether.proxy.app import Proxy
from tether.proxy.io.tap_server import UNAUTHORIZED

TAP_ID = "tap.linkerd-viz.serviceaccount.identity.linkerd.cluster.local"
M = tap_pb2.ObserveRequest.Match


def _tap_env(ip: str) -> dict[str, str]:
    return {"LINKERD2_PROXY_TAP_SVC_NAME": TAP_ID, "LINKERD2_PROXY_CONTROL_LISTEN_ADDR": f"{ip}:0"}


def _channel(mesh: Mesh, proxy: Proxy, ip: str, as_identity: str) -> grpc.aio.Channel:
    cert, key = mesh.ca.leaf(as_identity)
    chain = cert.public_bytes(serialization.Encoding.PEM) + mesh.ca.issuer.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    credentials = grpc.ssl_channel_credentials(root_certificates=mesh.ca.anchors_pem, private_key=key_pem,
                                               certificate_chain=chain)
    assert proxy.tap is not None and proxy.tap.port
    return grpc.aio.secure_channel(f"{ip}:{proxy.tap.port}", credentials,
                                   options=[("grpc.ssl_target_name_override", proxy.config.identity.local_name)])


class Observed:
    """One Observe call's events, read in the background."""

    def __init__(self, channel: grpc.aio.Channel, request: tap_pb2.ObserveRequest) -> None:
        self.call = tap_pb2_grpc.TapStub(channel).Observe(request)
        self.events: list[tap_pb2.TapEvent] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.call:
            self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.http.WhichOneof("event") for e in self.events]

    def paths(self) -> list[str]:
        return [e.http.request_init.path for e in self.events if e.http.WhichOneof("event") == "request_init"]


async def _serving(proxy: Proxy) -> Proxy:
    """``proxy`` once its tap server listens (it starts with the first certificate)."""
    assert proxy.tap is not None
    await proxy.tap.serving.wait()
    return proxy


async def _opened(proxy: Proxy, count: int) -> None:
    assert proxy.tap is not None and proxy.tap.server is not None
    await proxy.tap.server.wait_for_taps(count)


def test_both_directions_and_both_http_versions_report_to_the_tap_identity(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web = mesh.pod("web-0", app="web", ports=[8080, 9090])
            client = mesh.pod("client-0", app="client")
            svc = mesh.service("web", [(80, 8080), (9090, 9090)])
            server_proxy = await _serving(await mesh.start_proxy(web, **_tap_env(web.ip)))
            client_proxy = await _serving(await mesh.start_proxy(client, outbound_to=[f"{svc}:80", f"{svc}:9090"],
                                                                 **_tap_env(client.ip)))
            names = Names("web-0")
            grpc_app = await grpc_server(web.ip, 9090, names)
            try:
                async with Web(web.ip, 8080, "web-0"), \
                        _channel(mesh, server_proxy, web.ip, TAP_ID) as to_server, \
                        _channel(mesh, client_proxy, client.ip, TAP_ID) as to_client:
                    # limit 2 each: the HTTP/1 request under /api and the gRPC call; /other is not asked for.
                    match = M(any=M.Seq(matches=[M(http=M.Http(path=M.Http.StringMatch(prefix="/api"))),
                                                 M(http=M.Http(path=M.Http.StringMatch(prefix="/test.Names/")))]))
                    inbound = Observed(to_server, tap_pb2.ObserveRequest(limit=2, match=match))
                    outbound = Observed(to_client, tap_pb2.ObserveRequest(
                        limit=2, match=match, extract=tap_pb2.ObserveRequest.Extract(
                            http=tap_pb2.ObserveRequest.Extract.Http(
                                headers=tap_pb2.ObserveRequest.Extract.Http.Headers()))))
                    await _opened(server_proxy, 1)
                    await _opened(client_proxy, 1)
                    async with connection(svc, 80, local_addr=(client.ip, 0)) as (reader, writer):
                        app_socket = writer.get_extra_info("sockname")[:2]
                        for path in ("/other", "/api/list"):
                            head, body = await request(reader, writer, "GET", path)
                            assert head.status == 200
                    async with grpc.aio.insecure_channel(f"{svc}:9090") as channel:
                        assert await channel.unary_unary("/test.Names/Who")(b"hi", timeout=10) == b"web-0 hi"
                    await asyncio.wait_for(asyncio.gather(inbound.task, outbound.task), 30)
            finally:
                await grpc_app.stop(0)
            for observed, direction in ((inbound, tap_pb2.TapEvent.INBOUND), (outbound, tap_pb2.TapEvent.OUTBOUND)):
                assert observed.paths() == ["/api/list", "/test.Names/Who"]
                assert observed.kinds().count("response_init") == 2 and observed.kinds().count("response_end") == 2
                assert {e.proxy_direction for e in observed.events} == {direction}
                statuses = [e.http.response_init.http_status for e in observed.events
                            if e.http.WhichOneof("event") == "response_init"]
                assert statuses == [200, 200]
                methods = [e.http.request_init.method.registered for e in observed.events
                           if e.http.WhichOneof("event") == "request_init"]
                assert methods == [http_types_pb2.HttpMethod.GET, http_types_pb2.HttpMethod.POST]
            # The client's proxy knows the server's identity from discovery; the server's knows the client's
            # from its certificate.
            out_init = next(e for e in outbound.events if e.http.WhichOneof("event") == "request_init")
            assert out_init.destination_meta.labels["server_id"] == web.identity
            assert out_init.destination_meta.labels["tls"] == "true"
            in_init = next(e for e in inbound.events if e.http.WhichOneof("event") == "request_init")
            assert in_init.source_meta.labels["client_id"] == client.identity
            # The source is the connection's client: outbound the app's socket (the HTTP/1 request's, bound to
            # the client pod's address), inbound the client proxy's connection (from a loopback address).
            assert from_tcp_address(out_init.source) == app_socket
            for e in inbound.events:
                ip, port = from_tcp_address(e.source)
                assert ip.startswith("127.") and port > 0
            # Headers only where they were asked for, the response's too (the gRPC call's content-type).
            assert any(h.name == "host" for h in out_init.http.request_init.headers.headers)
            assert not in_init.http.request_init.headers.headers
            out_responses = [e.http.response_init for e in outbound.events if e.http.HasField("response_init")]
            assert [h.value for h in out_responses[1].headers.headers if h.name == "content-type"] == [
                b"application/grpc"]
            assert not any(h.name.startswith(":") for r in out_responses for h in r.headers.headers)
            assert not any(e.http.response_init.headers.headers for e in inbound.events)
            # The gRPC call's end carries its grpc-status (OK) in both directions; the HTTP/1 request's none.
            for observed in (inbound, outbound):
                ends = [e.http.response_end for e in observed.events if e.http.HasField("response_end")]
                assert [end.eos.WhichOneof("end") for end in ends] == [None, "grpc_status_code"]
                assert ends[1].eos.grpc_status_code == 0
                # The bytes of each response body relayed: the HTTP/1 answer's, the gRPC reply's framed message.
                assert [end.response_bytes for end in ends] == [len(body), 5 + len(b"web-0 hi")]
                assert all(end.since_request_init.ToNanoseconds() >= end.since_response_init.ToNanoseconds()
                           for end in ends)
            # The trailers where headers were asked for (the gRPC call's grpc-status), none otherwise.
            out_ends = [e.http.response_end for e in outbound.events if e.http.HasField("response_end")]
            assert [h.value for h in out_ends[1].trailers.headers if h.name == "grpc-status"] == [b"0"]
            assert not out_ends[0].trailers.headers
            assert not any(e.http.response_end.trailers.headers for e in inbound.events)
            # The finished taps are gone: the request path is back to an empty list.
            for proxy in (server_proxy, client_proxy):
                assert proxy.tap is not None and proxy.tap.taps.taps == []

    run(scenario())


def test_other_identities_are_unauthenticated_and_tap_is_off_without_the_variable(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web = mesh.pod("web-0", app="web")
            tapped = await _serving(await mesh.start_proxy(web, **_tap_env(web.ip)))
            async with _channel(mesh, tapped, web.ip, mesh.pod("client-0", app="client", apply=False).identity) \
                    as channel:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in tap_pb2_grpc.TapStub(channel).Observe(tap_pb2.ObserveRequest(limit=1)):
                        pass
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and err.value.details() == UNAUTHORIZED
            assert tapped.tap is not None and tapped.tap.taps.taps == []
            plain = mesh.pod("plain-0", app="plain")
            untapped = await mesh.start_proxy(plain)
            assert untapped.tap is None
            assert untapped._inbound_settings is not None and untapped._inbound_settings.http.observer is None
            assert tapped._inbound_settings is not None and tapped._inbound_settings.http.observer is not None

    run(scenario())


def test_a_proxy_that_cannot_listen_for_tap_stops_naming_the_address(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web = mesh.pod("web-0", app="web")
            with socket.socket() as taken:
                taken.bind((web.ip, 0))
                taken.listen()
                port = taken.getsockname()[1]
                proxy = await mesh.start_proxy(web, **{**_tap_env(web.ip),
                                                       "LINKERD2_PROXY_CONTROL_LISTEN_ADDR": f"{web.ip}:{port}"})
                await proxy.stopping.wait()
            assert proxy.tap is not None and proxy.tap.server is None
            assert f"tap server: cannot listen on {web.ip}:{port} (LINKERD2_PROXY_CONTROL_LISTEN_ADDR)" in caplog.text

    run(scenario())
