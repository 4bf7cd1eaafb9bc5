"""The admin port under inbound policy and mesh TLS, as linkerd2-proxy's admin server (proxy.md §10.1).

A real proxy (``proxy_harness.Mesh``: real identity, real TLS) whose policy
controller is a stand-in gRPC server (``FakeController``, real grpcio) streaming
what Tether's policy controller computes for the admin port: its index
(``tether.policy.inbound.index``) and translator, so the ``deny`` default
server carries the ``probe`` route the pod's probes on 4191 give it. Clients
connect from 127.0.0.x addresses other than 127.0.0.1, so the implicit
``default:localhost`` authorization does not admit them unless a test means it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from proxy_harness import Mesh, Pod, closed_without_answer, connection, identity_of, parse_metrics, read_all, run
from test_policy_client import FakeController

from tether.api import inbound_pb2 as pb
from tether.proxy.codec import http2_events as h2e
from tether.proxy.codec.http2 import H2Endpoint
from tether.policy.config import PolicyConfig
from tether.policy.defaults import DefaultPolicy
from tether.policy.inbound.facts import PodFacts
from tether.policy.inbound.index import InboundIndex
from tether.policy.inbound.translator import server_message
from tether.policy.model import AuthnKind, ClientAuthz, HttpRule, IdentityMatch, InboundRoute, InboundServer, Protocol, Ref
from tether.proxy.app import Proxy
from tether.resources.routes import HTTPRouteMatch, PathMatch

ADMIN = 4191
PROMETHEUS = identity_of("prometheus", "linkerd-viz")
REMOTE = "127.0.0.77"  # a client that is not localhost


def deny_default(pod: Pod) -> pb.Server:
    """What the policy controller streams for the admin port of a ``deny`` pod whose proxy is probed there."""
    config = PolicyConfig(default_policy=DefaultPolicy.parse("deny"))
    facts = PodFacts(namespace=pod.ns, name=pod.name, labels={}, annotations={}, service_account=pod.sa,
                     port_names={"linkerd-admin": (ADMIN,)}, probe_paths={ADMIN: ("/live", "/ready")})
    return server_message(InboundIndex(config).compute(facts, ADMIN), config.cluster_networks)


def allow_scrapes(identity: str = PROMETHEUS) -> pb.Server:
    """A Server on the admin port whose ``/metrics`` route only ``identity`` may use (allow-scrapes)."""
    config = PolicyConfig()
    metrics = InboundRoute(
        Ref("policy.linkerd.io", "httproute", "proxy-metrics"),
        http_rules=(HttpRule((HTTPRouteMatch(path=PathMatch("PathPrefix", "/metrics")),)),),
        authorizations=(ClientAuthz(Ref("policy.linkerd.io", "authorizationpolicy", "prometheus-scrape"),
                                    AuthnKind.TLS_AUTHENTICATED, (IdentityMatch(name=identity),)),),
    )
    server = InboundServer(Ref("policy.linkerd.io", "server", "proxy-admin"), Protocol.HTTP1, (), (metrics,))
    return server_message(server, config.cluster_networks)


async def get(proxy: Proxy, path: str, *, source: str = REMOTE, tls: ssl.SSLContext | None = None,
              method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    admin = proxy.admin_addr
    kwargs: dict[str, object] = {"local_addr": (source, 0)}
    if tls is not None:
        kwargs.update(ssl=tls, server_hostname=proxy.config.identity.local_name)
    async with connection(str(admin.ip), admin.port, **kwargs) as (reader, writer):
        writer.write(f"{method} {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
                     .encode())
        raw = await read_all(reader)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), fields, body


async def admin_policy(proxy: Proxy, name: str) -> None:
    """Wait until the proxy holds the controller's policy named ``name`` for the admin port (the proxy's own
    ``deny`` has the same name, but is opaque)."""
    def held() -> bool:
        policy = proxy.policies.policy(proxy.admin_addr.port)
        return policy.meta.name == name and not policy.opaque

    while not held():
        await proxy.policies.updated()


async def deny_pod(mesh: Mesh, port: int) -> tuple[Pod, Proxy]:
    """A pod with the ``deny`` default policy whose proxy asks the controller on ``port``."""
    pod = mesh.pod("web-0", app="web")
    proxy = await mesh.start_proxy(pod, LINKERD2_PROXY_POLICY_SVC_ADDR=f"127.0.0.1:{port}",
                                   LINKERD2_PROXY_INBOUND_DEFAULT_POLICY="deny")
    return pod, proxy


def counts(metrics: dict[frozenset[tuple[str, str]], float], **match: str) -> list[tuple[dict[str, str], float]]:
    """The series whose labels include ``match``, as (labels, value)."""
    found = [(dict(labels), value) for labels, value in metrics.items()]
    return [(labels, value) for labels, value in found if all(labels.get(k) == v for k, v in match.items())]


def test_a_deny_pods_admin_port_refuses_scrapes_and_answers_probes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            controller = FakeController()
            grpc_server, port = await controller.serve()
            try:
                await deny_scenario(mesh, controller, port)
            finally:
                await grpc_server.stop(None)

    run(scenario())


async def deny_scenario(mesh: Mesh, controller: FakeController, port: int) -> None:
    pod, proxy = await deny_pod(mesh, port)
    # Before the controller answers, the proxy's own `deny` has no route at all: 404, as linkerd2-proxy.
    assert (await get(proxy, "/ready"))[0] == 404
    controller.queue(ADMIN).put_nowait(deny_default(pod))
    await admin_policy(proxy, "deny")

    status, fields, body = await get(proxy, "/metrics")
    assert (status, body) == (403, b"") and "l5d-proxy-error" not in fields  # plaintext: no reason
    assert (await get(proxy, "/env.json"))[0] == 403
    # The kubelet's probes: the probe route (GET, exact paths, any network).
    assert (await get(proxy, "/live"))[::2] == (200, b"live\n")
    assert (await get(proxy, "/ready"))[::2] == (200, b"ready\n")
    assert (await get(proxy, "/ready", method="POST"))[0] == 403  # GET only
    # Localhost passes through every discovered policy's default:localhost.
    assert (await get(proxy, "/metrics", source="127.0.0.1"))[0] == 200
    # Mesh TLS with an identity the policy does not name: still denied, and told why.
    status, fields, _ = await get(proxy, "/metrics", tls=mesh.ca.client_context(PROMETHEUS))
    assert status == 403 and fields["l5d-proxy-error"] == "unauthorized request on route"

    metrics = parse_metrics((await get(proxy, "/metrics", source="127.0.0.1"))[2].decode())
    denied = metrics["inbound_http_authz_deny_total"]
    common = {"target_port": str(ADMIN), "srv_kind": "default", "srv_name": "deny"}
    plain = counts(denied, **common, route_name="default", tls="no_identity",
                   no_tls_reason="no_tls_from_remote")
    assert [value for _, value in plain] == [3.0]  # /metrics, /env.json, and the POST: not the probe route's
    meshed = counts(denied, **common, route_name="default", tls="true", client_id=PROMETHEUS)
    assert [value for _, value in meshed] == [1.0]
    allowed = metrics["inbound_http_authz_allow_total"]
    assert sum(value for _, value in counts(allowed, **common, authz_name="probe")) == 2.0


def test_an_authorized_identity_scrapes_over_mesh_tls(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            controller = FakeController()
            grpc_server, port = await controller.serve()
            try:
                await allowed_scenario(mesh, controller, port)
            finally:
                await grpc_server.stop(None)

    run(scenario())


async def allowed_scenario(mesh: Mesh, controller: FakeController, port: int) -> None:
    _, proxy = await deny_pod(mesh, port)
    controller.queue(ADMIN).put_nowait(allow_scrapes())
    await admin_policy(proxy, "proxy-admin")

    prometheus = mesh.ca.client_context(PROMETHEUS)
    status, fields, body = await get(proxy, "/metrics", tls=prometheus)
    assert status == 200 and b"inbound_http_authz_allow_total" in body
    assert (await get(proxy, "/metrics"))[0] == 403  # the same route in plaintext
    assert (await get(proxy, "/metrics", tls=mesh.ca.client_context(identity_of("web"))))[0] == 403
    assert (await get(proxy, "/live", tls=prometheus))[0] == 404  # no route for it on this Server
    # A TLS client presenting no certificate: mesh TLS, no identity.
    assert (await get(proxy, "/metrics", tls=mesh.ca.client_context(None)))[0] == 403

    metrics = parse_metrics((await get(proxy, "/metrics", tls=prometheus))[2].decode())
    [(labels, count)] = counts(metrics["inbound_http_authz_allow_total"], srv_name="proxy-admin")
    assert count == 2.0 and labels["route_name"] == "proxy-metrics"  # the first scrape, and this one
    assert (labels["authz_name"], labels["tls"], labels["client_id"]) == ("prometheus-scrape", "true", PROMETHEUS)
    assert sum(metrics["inbound_http_route_not_found_total"].values()) == 1.0
    # Admitted requests are recorded with inbound labels and the permit's (this one's response comes after).
    scraped = {"direction": "inbound", "target_port": str(ADMIN), "tls": "true", "client_id": PROMETHEUS,
               "srv_name": "proxy-admin", "route_name": "proxy-metrics", "authz_name": "prometheus-scrape"}
    assert [value for _, value in counts(metrics["request_total"], **scraped)] == [2.0]
    assert [value for _, value in counts(metrics["response_total"], **scraped, status_code="200",
                                         classification="success")] == [1.0]
    assert not counts(metrics["request_total"], srv_name="proxy-admin", tls="no_identity")  # refused: not here


def test_tls_for_another_name_and_non_http_bytes_are_closed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            proxy = await mesh.start_proxy(mesh.pod("web-0", app="web"))
            admin = proxy.admin_addr
            with_other_sni = mesh.ca.client_context(PROMETHEUS)
            try:
                async with connection(str(admin.ip), admin.port, ssl=with_other_sni, server_hostname="other.example",
                                      local_addr=(REMOTE, 0)):
                    raise AssertionError("a TLS connection for another name was accepted")
            except (ConnectionError, ssl.SSLError):
                pass
            async with connection(str(admin.ip), admin.port, local_addr=(REMOTE, 0)) as (reader, writer):
                writer.write(b"\x00\x01 not http at all, long enough to sniff\r\n")
                assert await asyncio.wait_for(closed_without_answer(reader), 10)
            # The default policy (all-unauthenticated) serves everything else as before.
            assert (await get(proxy, "/metrics"))[0] == 200

    run(scenario())


async def exchange(proxy: Proxy, request: bytes, **kwargs: object) -> bytes:
    """Send ``request`` on a new admin connection from ``REMOTE``; every byte of the answer, to its close."""
    admin = proxy.admin_addr
    async with connection(str(admin.ip), admin.port, local_addr=(REMOTE, 0), **kwargs) as (reader, writer):
        writer.write(request)
        return await read_all(reader)


def test_admin_connections_count_in_the_transport_and_detection_metrics(tmp_path: Path) -> None:
    """As linkerd2-proxy's admin stack (its transport metrics layer sits after TLS detection, with the inbound
    server's labels, then HTTP detection): every connection whose TLS detection ended, under ``peer="src"``,
    its TLS and the admin port's ``srv_*``, with the bytes the admin server read and wrote inside TLS, and its
    HTTP detection's result; one that never told (the TLS detection timeout) is not counted."""
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            proxy = await mesh.start_proxy(mesh.pod("web-0", app="web"))
            admin = proxy.admin_addr
            request = b"GET /live HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n"
            plain = await exchange(proxy, request)
            assert plain.startswith(b"HTTP/1.1 200") and plain.endswith(b"live\n")
            meshed = await exchange(proxy, request, ssl=mesh.ca.client_context(PROMETHEUS),
                                    server_hostname=proxy.config.identity.local_name)
            assert meshed.startswith(b"HTTP/1.1 200")
            with pytest.raises((ConnectionError, ssl.SSLError)):
                await exchange(proxy, b"", ssl=mesh.ca.client_context(PROMETHEUS), server_hostname="other.example")
            async with connection(str(admin.ip), admin.port, local_addr=(REMOTE, 0)) as (reader, writer):
                writer.write(b"\x00\x01 not http at all, long enough to sniff\r\n")
                assert await closed_without_answer(reader)
            async with connection(str(admin.ip), admin.port, local_addr=(REMOTE, 0)) as (reader, _):
                assert await closed_without_answer(reader)  # nothing sent: closed at the detect timeout
            async with connection(str(admin.ip), admin.port, local_addr=(REMOTE, 0), ssl=mesh.ca.client_context(
                    PROMETHEUS), server_hostname=proxy.config.identity.local_name) as (reader, _):
                assert await reader.read(9)  # nothing sent inside mesh TLS: HTTP/2 assumed, its SETTINGS come
            await proxy.admin.idle()

            # Scraped by an identity of its own, so that the scraping connection has a series of its own.
            scraper = mesh.ca.client_context(identity_of("scraper"))
            text = (await exchange(proxy, b"GET /metrics HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n",
                                   ssl=scraper, server_hostname=proxy.config.identity.local_name)).decode()
            metrics = parse_metrics(text.partition("\r\n\r\n")[2])
            side = {"direction": "inbound", "peer": "src", "target_addr": str(admin), "srv_port": str(ADMIN)}

            def series(**match: str) -> dict[str, float]:
                values = {}
                for family in ("tcp_open_total", "tcp_open_connections", "tcp_read_bytes_total",
                               "tcp_write_bytes_total"):
                    [(labels, value)] = counts(metrics[family], **side, **match)
                    assert labels["srv_name"]  # the admin port's server
                    values[family] = value
                values["tcp_close_total"] = sum(value for _, value in counts(metrics["tcp_close_total"], **side,
                                                                            **match))
                return values

            # The plain /live and the bytes that are not HTTP (peeked, never read); not the silent one.
            assert series(tls="no_identity", no_tls_reason="no_tls_from_remote") == {
                "tcp_open_total": 2.0, "tcp_open_connections": 0.0, "tcp_close_total": 2.0,
                "tcp_read_bytes_total": float(len(request)), "tcp_write_bytes_total": float(len(plain))}
            meshed_side = series(tls="true", client_id=PROMETHEUS)  # /live, and the silent one answered in HTTP/2
            assert (meshed_side["tcp_open_total"], meshed_side["tcp_close_total"]) == (2.0, 2.0)
            assert meshed_side["tcp_read_bytes_total"] == float(len(request))
            assert meshed_side["tcp_write_bytes_total"] > float(len(meshed))  # and the HTTP/2 preface
            assert series(tls="opaque", sni="other.example") == {
                "tcp_open_total": 1.0, "tcp_open_connections": 0.0, "tcp_close_total": 1.0,
                "tcp_read_bytes_total": 0.0, "tcp_write_bytes_total": 0.0}
            scraping = series(tls="true", client_id=identity_of("scraper"))
            assert (scraping["tcp_open_total"], scraping["tcp_open_connections"]) == (1.0, 1.0)
            assert scraping["tcp_read_bytes_total"] > 0.0 and scraping["tcp_close_total"] == 0.0
            assert [labels["errno"] for labels, _ in counts(metrics["tcp_close_total"], **side)] == ["", "", ""]
            # HTTP detection on each of them, as Linkerd's admin stack detects it, under the admin port's srv_*.
            detected = {labels["result"]: value for labels, value in
                        counts(metrics["inbound_tcp_detect_http_results_total"], srv_port=str(ADMIN))}
            assert detected == {"http/1": 3.0, "not_http": 2.0, "read_timeout": 1.0, "http/2": 0.0, "error": 0.0}

    run(scenario())


async def h2_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 paths: list[bytes]) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """GET each of ``paths`` on one HTTP/2 connection (the proxy's own codec as the client): (status, headers,
    body) each, in order."""
    client = H2Endpoint(client=True)
    client.initiate()
    order, heads, bodies, ended = [], {}, {}, set()
    for path in paths:
        sid = client.next_stream_id()
        order.append(sid)
        bodies[sid] = bytearray()
        client.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"http"), (b":path", path),
                                  (b":authority", b"admin")], end_stream=True)
    writer.write(client.data_to_send())
    while len(ended) < len(order):
        data = await reader.read(65536)
        assert data, "the admin server closed the connection"
        for event in client.receive_data(data):
            if isinstance(event, h2e.ResponseReceived):
                heads[event.stream_id] = dict(event.headers)
            elif isinstance(event, h2e.DataReceived):
                bodies[event.stream_id] += event.data
                client.ack(event.stream_id, event.flow_controlled_length)
            if getattr(event, "stream_ended", None) is not None:
                ended.add(event.stream_id)
        writer.write(client.data_to_send())
    return [(heads[sid][b":status"], heads[sid], bytes(bodies[sid])) for sid in order]


def test_http2_is_served_in_plaintext_and_inside_mesh_tls(tmp_path: Path) -> None:
    """HTTP/2 with prior knowledge, and HTTP/2 inside mesh TLS (what a meshed client's proxy sends): both
    authorized as HTTP/1 is; a body larger than the client's first windows arrives whole."""
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            controller = FakeController()
            grpc_server, port = await controller.serve()
            try:
                _, proxy = await deny_pod(mesh, port)
                controller.queue(ADMIN).put_nowait(allow_scrapes())
                await admin_policy(proxy, "proxy-admin")
                admin = proxy.admin_addr
                async with connection(str(admin.ip), admin.port, local_addr=(REMOTE, 0)) as (reader, writer):
                    answers = await h2_get(reader, writer, [b"/metrics", b"/ready"])
                assert [status for status, _, _ in answers] == [b"403", b"404"]
                tls = mesh.ca.client_context(PROMETHEUS)
                async with connection(str(admin.ip), admin.port, local_addr=(REMOTE, 0), ssl=tls,
                                      server_hostname=proxy.config.identity.local_name) as (reader, writer):
                    # Big enough to need the client's windows reopened: the registry holds many series by now.
                    for _ in range(3):
                        await get(proxy, "/metrics", source="127.0.0.1")
                    [(status, head, body)] = await h2_get(reader, writer, [b"/metrics"])
                assert status == b"200" and head[b"content-type"] == b"text/plain; version=0.0.4"
                assert int(head[b"content-length"]) == len(body) and body.endswith(b"\n")
                metrics = parse_metrics(body.decode())
                [(labels, _)] = counts(metrics["inbound_http_authz_allow_total"], srv_name="proxy-admin", tls="true")
                assert (labels["client_id"], labels["tls"]) == (PROMETHEUS, "true")
            finally:
                await grpc_server.stop(None)

    run(scenario())


def test_http2_on_the_admin_port_advertises_the_inbound_servers_settings(tmp_path: Path) -> None:
    """linkerd2-proxy's admin server takes the inbound server's HTTP/2 settings
    (``LINKERD2_PROXY_INBOUND_SERVER_HTTP2_*``, linkerd/app/src/env.rs): its SETTINGS frame carries them."""
    import hyperframe.frame as hf

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            prefix = "LINKERD2_PROXY_INBOUND_SERVER_HTTP2_"
            proxy = await mesh.start_proxy(mesh.pod("web-0", app="web"), **{
                prefix + "INITIAL_STREAM_WINDOW_SIZE": "131072", prefix + "INITIAL_CONNECTION_WINDOW_SIZE": "2097152",
                prefix + "MAX_CONCURRENT_STREAMS": "7", prefix + "MAX_FRAME_SIZE": "32768",
                prefix + "MAX_HEADER_LIST_SIZE": "40000"})
            admin = proxy.admin_addr
            async with connection(str(admin.ip), admin.port, local_addr=(REMOTE, 0)) as (reader, writer):
                writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + hf.SettingsFrame(0).serialize())
                frame, length = hf.Frame.parse_frame_header(memoryview(await reader.readexactly(9)))
                frame.parse_body(memoryview(await reader.readexactly(length)))
            assert isinstance(frame, hf.SettingsFrame) and "ACK" not in frame.flags
            assert frame.settings[hf.SettingsFrame.INITIAL_WINDOW_SIZE] == 131_072
            assert frame.settings[hf.SettingsFrame.MAX_CONCURRENT_STREAMS] == 7
            assert frame.settings[hf.SettingsFrame.MAX_FRAME_SIZE] == 32_768
            assert frame.settings[hf.SettingsFrame.MAX_HEADER_LIST_SIZE] == 40_000

    run(scenario())


NETNS_SCENARIO = Path(__file__).with_name("netns_admin_scenario.py")


@pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "ip", "iptables")),
                    reason="needs root, unshare, ip and iptables")
def test_a_meshed_scraper_reaches_the_admin_port_through_its_proxy(tmp_path: Path) -> None:
    """Real redirection in a network namespace of its own (netns_admin_scenario.py): the scraper's proxy
    carries its request in mesh TLS (upgraded to HTTP/2) to the pod's admin port, which admits its identity."""
    done = subprocess.run(["unshare", "--net", "--", sys.executable, str(NETNS_SCENARIO), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode == 77:
        pytest.skip(f"network namespace unavailable: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok")
