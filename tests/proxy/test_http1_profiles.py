"""ServiceProfiles through two proxies and a real control plane (proxy.md §7.2, §7.5, §7.6, §9.2).

A ServiceProfile applied to the store reaches the client's outbound proxy by
``GetProfile``; its routes then decide, per request, the timeout, the retries
within the budget, the traffic split and the ``route_*`` metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from proxy_harness import NS, App, Mesh, connection, read_request, run, samples, scrape, until
from test_http1_mesh import header, request

from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.codec.http1 import EndOfMessage, Http1Connection, RequestHead, ResponseHead, Role
from tether.proxy.codec.transport_header import SessionProtocol, TransportHeader, encode
from tether.proxy.app import Proxy
from tether.proxy.io.discovery import ProfileWatch

CD = "svc.cluster.local"


class Api(App):
    """HTTP/1.1 keep-alive; ``/flaky`` fails every other time, ``/fail`` always, ``/slow`` never answers."""

    def __init__(self, ip: str, port: int, name: str) -> None:
        super().__init__(ip, port)
        self.name = name
        self.paths: list[str] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.release = asyncio.Event()  # /slow answers only once it is set (the test's end)
        self._flaky = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            method, path, headers, body = request.method, request.path, request.headers, request.body
            self.paths.append(path)
            self.bodies.append(body)
            self.headers.append(headers)
            status = 200
            if path.startswith("/slow"):
                await self.release.wait()
            elif path.startswith("/flaky"):
                self._flaky += 1
                status = 500 if self._flaky % 2 else 200
            elif path.startswith("/fail"):
                status = 503
            answer = f"{self.name} {method} {path} {len(body)}".encode()
            writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(answer), answer))
            await writer.drain()


def service_profile(svc: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
            "metadata": {"name": f"{svc}.{NS}.{CD}", "namespace": NS}, "spec": spec}


async def profile_in(proxy: Proxy, ip: str, port: int) -> ProfileWatch:
    """The client proxy's profile watch for ``ip:port``, once it has a profile with routes (or a split).

    The test holds a lease on the watch, so it stays open between connections.
    """
    watch = proxy.discovery.profile(parse_socket_addr(f"{ip}:{port}"))
    await until(lambda: watch.resolution.profile is not None, watch.updated)
    return watch


@contextlib.asynccontextmanager
async def apps(*servers: Api) -> AsyncIterator[None]:
    for server in servers:
        await server.__aenter__()
    try:
        yield
    finally:
        for server in servers:
            server.release.set()
            await server.__aexit__(None, None, None)


def route_samples(metrics: Any, name: str, route: str, **want: str) -> float:
    return sum(v for _, v in samples(metrics, name, direction="outbound", dst=f"web.{NS}.{CD}:80", rt_route=route,
                                     **want))


def test_route_timeout_answers_504_and_metrics_follow_routes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web, client, svc = mesh.one_served_pod("web", 8080, 80)
            mesh.store.apply_many([service_profile("web", routes=[
                {"name": "slow", "condition": {"method": "GET", "pathRegex": "/slow.*"}, "timeout": "300ms"},
                {"name": "books", "condition": {"pathRegex": "/books/[^/]*"}},
            ])])
            await mesh.start_proxy(web)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:80"])
            api = Api(web.ip, 8080, "web-0")
            async with apps(api):
                watch = await profile_in(a, svc, 80)
                try:
                    async with connection(svc, 80) as (reader, writer):
                        for i in range(3):
                            head, body = await request(reader, writer, "GET", f"/books/{i}")
                            assert head.status == 200 and body == f"web-0 GET /books/{i} 0".encode()
                        head, _ = await request(reader, writer, "GET", "/other")
                        assert head.status == 200
                        head, body = await request(reader, writer, "GET", "/slow/1")
                        assert head.status == 504
                        assert header(head, b"l5d-proxy-error") == b"HTTP response timeout after 300ms"
                        assert header(head, b"connection") == b"close"
                        assert await reader.read() == b""  # the client's connection is closed
                finally:
                    watch.release()
                await a.idle()
                out = await scrape(a)
                assert route_samples(out, "route_request_total", "books") == 3
                assert route_samples(out, "route_response_total", "books", status_code="200",
                                     classification="success") == 3
                assert route_samples(out, "route_response_latency_ms_count", "books", status_code="200") == 3
                assert route_samples(out, "route_request_total", "slow") == 1
                assert route_samples(out, "route_response_total", "slow", classification="failure",
                                     error="timeout") == 1
                # The default route (no rt_ labels) counted the request that matched no route.
                default = samples(out, "route_request_total", direction="outbound", dst=f"web.{NS}.{CD}:80")
                assert [v for labels, v in default if "rt_route" not in labels] == [1]
                errors = samples(out, "outbound_http_errors_total", error="response timeout")
                assert sum(v for _, v in errors) == 1
                # Not retryable: no retry family for these routes, and one attempt each.
                assert route_samples(out, "route_retryable_total", "books") == 0
                assert route_samples(out, "route_actual_request_total", "books") == 3

    run(scenario())


def test_retryable_route_hides_a_flaky_endpoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web, client, svc = mesh.one_served_pod("web", 8080, 80)
            mesh.store.apply_many([service_profile("web", routes=[
                {"name": "flaky", "condition": {"pathRegex": "/flaky.*"}, "isRetryable": True},
            ], retryBudget={"retryRatio": 1.0, "minRetriesPerSecond": 10, "ttl": "10s"})])
            await mesh.start_proxy(web)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:80"])
            api = Api(web.ip, 8080, "web-0")
            async with apps(api):
                watch = await profile_in(a, svc, 80)
                try:
                    async with connection(svc, 80) as (reader, writer):
                        for i in range(10):
                            head, body = await request(reader, writer, "GET", f"/flaky/{i}")
                            assert head.status == 200, body
                        # A body is kept for the retry and sent again whole.
                        for i in range(5):
                            payload = f"payload {i}".encode() * 100
                            head, body = await request(reader, writer, "POST", f"/flaky/post{i}", body=payload)
                            assert head.status == 200 and body.endswith(b" %d" % len(payload))
                finally:
                    watch.release()
                assert len(api.paths) == 30  # every request failed once, then its retry succeeded
                assert api.paths[:4] == ["/flaky/0", "/flaky/0", "/flaky/1", "/flaky/1"]
                assert all(len(b) == len(f"payload {i // 2}") * 100 for i, b in enumerate(api.bodies[20:]))
                # Requests routed by the profile name its service to the peer, as Linkerd's do.
                assert {h.get("l5d-dst-canonical") for h in api.headers} == {f"web.{NS}.{CD}:80"}
                await a.idle()
                out = await scrape(a)
                assert route_samples(out, "route_request_total", "flaky") == 15
                assert route_samples(out, "route_response_total", "flaky", status_code="200",
                                     classification="success") == 15
                assert route_samples(out, "route_actual_request_total", "flaky") == 30
                assert route_samples(out, "route_actual_response_total", "flaky", status_code="500",
                                     classification="failure") == 15
                retryable = samples(out, "route_retryable_total", rt_route="flaky")
                assert sorted((labels.get("skipped", ""), v) for labels, v in retryable) == [
                    ("", 15), ("no_budget", 0)]
                # The endpoint family counts every attempt.
                endpoint = samples(out, "response_total", direction="outbound", status_code="500")
                assert sum(v for _, v in endpoint) == 15

    run(scenario())


def test_the_budget_bounds_retries_to_an_always_failing_endpoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web, client, svc = mesh.one_served_pod("web", 8080, 80)
            # A tiny budget: no share per request, a reserve of 1/s over 10 s: 10 retries in any 10 s.
            mesh.store.apply_many([service_profile("web", routes=[
                {"name": "fail", "condition": {"pathRegex": "/fail.*"}, "isRetryable": True},
            ], retryBudget={"retryRatio": 0.0, "minRetriesPerSecond": 1, "ttl": "10s"})])
            await mesh.start_proxy(web)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:80"])
            api = Api(web.ip, 8080, "web-0")
            async with apps(api):
                watch = await profile_in(a, svc, 80)
                try:
                    async with connection(svc, 80) as (reader, writer):
                        for i in range(20):
                            head, _ = await request(reader, writer, "GET", f"/fail/{i}")
                            assert head.status == 503
                finally:
                    watch.release()
                # No attempt limit but the budget (as Linkerd): the first request retries until the reserve
                # is spent, and every later failure finds the budget empty.
                assert api.paths[:12] == ["/fail/0"] * 11 + ["/fail/1"]
                assert len(api.paths) == 30
                await a.idle()
                out = await scrape(a)
                assert route_samples(out, "route_actual_request_total", "fail") == 30
                retryable = samples(out, "route_retryable_total", rt_route="fail")
                assert sorted((labels.get("skipped", ""), v) for labels, v in retryable) == [
                    ("", 30), ("no_budget", 20)]
                assert route_samples(out, "route_response_total", "fail", status_code="503",
                                     classification="failure") == 20

    run(scenario())


def test_dst_overrides_split_traffic_by_weight(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pods = {name: mesh.pod(f"{name}-0", app=name, ports=[8080]) for name in ("web-v1", "web-v2", "web-v3")}
            client = mesh.pod("client-0", app="client")
            svc = mesh.service("web", [(80, 8080)])  # the apex service: no endpoints of its own
            for name in pods:
                mesh.service(name, [(80, 8080)])
            mesh.store.apply_many([service_profile("web", dstOverrides=[
                {"authority": f"web-v1.{NS}.{CD}:80", "weight": 3},
                {"authority": f"web-v2.{NS}.{CD}:80", "weight": 1},
                {"authority": f"web-v3.{NS}.{CD}:80", "weight": 0},
            ])])
            for pod in pods.values():
                await mesh.start_proxy(pod)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:80"])
            servers = {name: Api(pod.ip, 8080, name) for name, pod in pods.items()}
            async with apps(*servers.values()):
                watch = await profile_in(a, svc, 80)
                try:
                    profile = watch.resolution.profile
                    assert profile is not None
                    assert [b.authority for b in profile.split.backends] == [f"web-v1.{NS}.{CD}:80",
                                                                             f"web-v2.{NS}.{CD}:80"]
                    # Both backends known before the first request: a backend without endpoints yet would
                    # pass its share to the other (routes.py), and the draws below would not be 3:1.
                    for backend in profile.split.backends:
                        await until(lambda b=backend: b.balancer.has_endpoints, backend.balancer.updated)
                    async with connection(svc, 80) as (reader, writer):
                        for i in range(200):
                            head, _ = await request(reader, writer, "GET", f"/r{i}")
                            assert head.status == 200
                finally:
                    watch.release()
                counts = {name: len(server.paths) for name, server in servers.items()}
                assert counts["web-v3"] == 0
                assert counts["web-v1"] + counts["web-v2"] == 200
                # Each request draws web-v2 with p = 1/4, so its count is Binomial(200, 1/4) (mean 50, sd 6.1).
                # P(outside [15, 85]) = 2.1e-8: a false failure once in ~50 million runs. Reversed weights
                # (p = 3/4) land inside with P < 1e-21, equal ones (p = 1/2) with P = 0.02; the weight-to-draw
                # mapping itself is checked exactly in test_http_profiles.py (Split.choose).
                assert 15 <= counts["web-v2"] <= 85, counts
                await a.idle()
                out = await scrape(a)
                # Endpoint metrics name each backend service; the default route counts all 200.
                per_authority = {labels["authority"]: v for labels, v in
                                 samples(out, "request_total", direction="outbound")}
                assert per_authority == {f"web-v1.{NS}.{CD}:80": counts["web-v1"],
                                         f"web-v2.{NS}.{CD}:80": counts["web-v2"]}
                default = samples(out, "route_request_total", direction="outbound", dst=f"web.{NS}.{CD}:80")
                assert [v for _, v in default] == [200]

    run(scenario())


def test_l5d_dst_override_names_the_target_in_ingress_mode(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web = mesh.pod("web-0", app="web", ports=[8080])
            v2 = mesh.pod("web-v2-0", app="web-v2", ports=[8080])
            ingress = mesh.pod("ingress-0", app="ingress")
            svc = mesh.service("web", [(80, 8080)])
            mesh.service("web-v2", [(80, 8080)])
            for pod in (web, v2):
                await mesh.start_proxy(pod)
            # An ingress's proxy leaves the informational headers out by default; on here to read why.
            a = await mesh.start_proxy(ingress, outbound_to=[f"{svc}:80"], LINKERD2_PROXY_INGRESS_MODE="true",
                                       LINKERD2_PROXY_OUTBOUND_DISABLE_INFORMATIONAL_HEADERS="false")
            servers = {"web": Api(web.ip, 8080, "web-0"), "web-v2": Api(v2.ip, 8080, "web-v2-0")}
            async with apps(*servers.values()), connection(svc, 80) as (reader, writer):
                override = ((b"l5d-dst-override", f"web-v2.{NS}.{CD}:80".encode()),)
                head, body = await request(reader, writer, "GET", "/a", headers=override)
                assert head.status == 200 and body.startswith(b"web-v2-0 ")
                head, body = await request(reader, writer, "GET", "/b")
                assert head.status == 200 and body.startswith(b"web-0 ")
                head, body = await request(reader, writer, "GET", "/c", headers=((b"l5d-dst-override", b"web-v2"),))
                assert head.status == 502  # port 80 by default, and web-v2 is not a name the destination knows
                assert header(head, b"l5d-proxy-error") == b"l5d-dst-override web-v2:80: not a known service"
            assert servers["web-v2"].paths == ["/a"] and servers["web"].paths == ["/b"]
            assert "l5d-dst-override" not in servers["web-v2"].headers[0]  # removed before it went on

    run(scenario())


def test_ingress_mode_looks_up_only_names_under_the_profile_suffixes(tmp_path: Path) -> None:
    """LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES gates the names an override may name: outside them the
    destination is not asked, and the request is answered as for a service nobody knows."""
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web = mesh.pod("web-0", app="web", ports=[8080])
            ingress = mesh.pod("ingress-0", app="ingress")
            svc = mesh.service("web", [(80, 8080)])
            await mesh.start_proxy(web)
            a = await mesh.start_proxy(ingress, outbound_to=[f"{svc}:80"], LINKERD2_PROXY_INGRESS_MODE="true",
                                       LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES="other.example.",
                                       LINKERD2_PROXY_OUTBOUND_DISABLE_INFORMATIONAL_HEADERS="false")
            async with apps(Api(web.ip, 8080, "web-0")), connection(svc, 80) as (reader, writer):
                override = ((b"l5d-dst-override", f"web.{NS}.{CD}:80".encode()),)
                head, _ = await request(reader, writer, "GET", "/a", headers=override)
                assert head.status == 502
                assert header(head, b"l5d-proxy-error") == f"l5d-dst-override web.{NS}.{CD}:80: not a known service".encode()
                assert f"web.{NS}.{CD}:80" not in a.discovery.profiles  # never asked
            async with apps(Api(web.ip, 8080, "web-0")), connection(svc, 80) as (reader, writer):
                head, _ = await request(reader, writer, "GET", "/b")  # no override: routed by its address
                assert head.status == 200

    run(scenario())


def test_a_profile_applied_later_takes_effect_on_an_open_connection(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web, client, svc, _, a = await mesh.two_proxies("web", 8080, 80)
            api = Api(web.ip, 8080, "web-0")
            async with apps(api), connection(svc, 80) as (reader, writer):
                head, _ = await request(reader, writer, "GET", "/books/1")
                assert head.status == 200
                watch = a.discovery.profile(parse_socket_addr(f"{svc}:80"))
                try:
                    assert watch.resolution.profile is None
                    mesh.store.apply_many([service_profile("web", routes=[
                        {"name": "books", "condition": {"pathRegex": "/books/.*"}}])])
                    await until(lambda: watch.resolution.profile is not None, watch.updated)
                finally:
                    watch.release()
                head, _ = await request(reader, writer, "GET", "/books/2")  # the same client connection
                assert head.status == 200
                out = await scrape(a)
                assert route_samples(out, "route_request_total", "books") == 1
                assert api.headers[0].get("l5d-dst-canonical") is None
                assert api.headers[1]["l5d-dst-canonical"] == f"web.{NS}.{CD}:80"

    run(scenario())


def test_the_inbound_proxy_counts_the_profile_route_its_clients_named(tmp_path: Path) -> None:
    """The server's proxy looks up the profile named by the l5d-dst-canonical the client's proxy sends and counts
    ``route_*{direction="inbound"}``, as linkerd2-proxy does; the first request, sent before that profile is
    known, waits for it (``LINKERD2_PROXY_DESTINATION_PROFILE_INITIAL_TIMEOUT``, long here: the wait ends on the
    answer) and takes its route."""
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web, client, svc = mesh.one_served_pod("web", 8080, 80)
            mesh.store.apply_many([service_profile("web", routes=[
                {"name": "GET /x", "condition": {"method": "GET", "pathRegex": "/x"}},
            ])])
            b = await mesh.start_proxy(web, LINKERD2_PROXY_DESTINATION_PROFILE_INITIAL_TIMEOUT="60s")
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:80"])
            api = Api(web.ip, 8080, "web-0")
            dst = f"web.{NS}.{CD}:80"
            async with apps(api):
                watch = await profile_in(a, svc, 80)
                try:
                    async with connection(svc, 80) as (reader, writer):
                        for path in ("/x", "/x", "/x", "/other"):
                            head, _ = await request(reader, writer, "GET", path)
                            assert head.status == 200
                finally:
                    watch.release()
                assert {h.get("l5d-dst-canonical") for h in api.headers} == {dst}
                await b.idle()
                out = await scrape(b)
                named = {"direction": "inbound", "dst": dst, "rt_route": "GET /x"}
                assert samples(out, "route_request_total", **named) == [(named, 3)]
                assert [v for _, v in samples(out, "route_response_total", **named, status_code="200",
                                              classification="success")] == [3]
                assert [v for _, v in samples(out, "route_response_latency_ms_count", **named)] == [3]
                default = samples(out, "route_request_total", direction="inbound", dst=dst)
                assert [v for labels, v in default if "rt_route" not in labels] == [1]  # /other
                # No retries inbound: the route is not retryable there, whatever the profile says.
                assert samples(out, "route_retryable_total", direction="inbound") == []
                outbound = await scrape(a)
                assert route_samples(outbound, "route_request_total", "GET /x") == 3

    run(scenario())


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, host: bytes) -> int:
    """``GET path`` with ``Host: host`` (and nothing else) on an open connection; the response's status."""
    conn = Http1Connection(Role.CLIENT)
    writer.write(conn.send_head(RequestHead(b"GET", path.encode(), ((b"host", host),))) + conn.send_end())
    status = 0
    while True:
        chunk = await reader.read(65536)
        assert chunk, "closed before the response ended"
        for event in conn.receive_data(chunk):
            if isinstance(event, ResponseHead):
                status = event.status
            elif isinstance(event, EndOfMessage):
                return status


def test_without_l5d_dst_canonical_the_inbound_proxy_names_the_service_by_the_host(tmp_path: Path) -> None:
    """A request without ``l5d-dst-canonical`` (a peer that took no profile route) names its service by its
    ``Host`` (port 80 when it has none), as linkerd2-proxy falls back to; the first request waits for the
    profile's first answer. A Host that is an address, or a name outside the profile suffixes, names none."""
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web = mesh.pod("web-0", app="web", ports=[8080])
            mesh.service("web", [(80, 8080)])
            mesh.store.apply_many([service_profile("web", routes=[
                {"name": "GET /x", "condition": {"method": "GET", "pathRegex": "/x"}},
            ])])
            b = await mesh.start_proxy(web, LINKERD2_PROXY_DESTINATION_PROFILE_INITIAL_TIMEOUT="60s")
            peer = "client.emojivoto.serviceaccount.identity.linkerd.cluster.local"
            ctx = mesh.ca.client_context(peer, alpn=["transport.l5d.io/v1"])
            dst = f"web.{NS}.{CD}:80"
            async with apps(Api(web.ip, 8080, "web-0")):
                reader, writer = await asyncio.open_connection(web.ip, 4143, ssl=ctx, server_hostname=web.identity)
                try:
                    writer.write(encode(TransportHeader(port=8080, protocol=SessionProtocol.HTTP1)))
                    for host in (f"Web.{NS}.{CD}".encode(), f"web.{NS}.{CD}:80".encode(), web.ip.encode(),
                                 b"web.example.com"):
                        assert await _get(reader, writer, "/x", host) == 200
                finally:
                    writer.close()
                await b.idle()
                out = await scrape(b)
                named = {"direction": "inbound", "dst": dst, "rt_route": "GET /x"}
                assert samples(out, "route_request_total", **named) == [(named, 2)]
                assert [labels["dst"] for labels, _ in samples(out, "route_request_total", direction="inbound")] \
                    == [dst]
                assert list(b.discovery.profiles) == [dst]  # nothing was looked up for the address nor example.com

    run(scenario())
