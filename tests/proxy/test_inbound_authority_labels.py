"""LINKERD2_PROXY_INBOUND_METRICS_AUTHORITY_LABELS through real proxies (in-process, loopback; the Kubernetes
API is kmock, as in every proxy_harness test): ``unsafe`` (any case) puts each inbound request's logical name
(its client proxy's ``l5d-dst-canonical`` when a ServiceProfile named it, else its ``Host``, as here; the port
left out when it is 80) as ``authority`` on the inbound ``request_total``, ``response_total`` and
``response_latency_ms``, as linkerd2-proxy does; unset, none. The naming rules themselves are
``test_inbound_profile_routes.py``'s."""

from __future__ import annotations

from pathlib import Path

import pytest
from proxy_harness import Mesh, connection, run, samples, scrape
from test_http1_mesh import Web, request

from tether.proxy.core.labels import with_authority

FAMILIES = ("request_total", "response_total", "response_latency_ms_count")


@pytest.mark.parametrize("setting", ["UnSafe", None])
def test_the_inbound_request_metrics_carry_the_logical_authority_when_unsafe(tmp_path: Path,
                                                                            setting: str | None) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            env = {"LINKERD2_PROXY_INBOUND_METRICS_AUTHORITY_LABELS": setting} if setting is not None else {}
            server, _, svc, b, a = await mesh.two_proxies("web", 8080, 80, server_env=env)
            async with Web(server.ip, 8080, "web-0"), connection(svc, 80) as (reader, writer):
                for path in ("/", "/fail"):
                    head, _ = await request(reader, writer, "GET", path)
                    assert head.status == (500 if path == "/fail" else 200)
            inbound = await scrape(b)
            expected = "web" if setting is not None else None  # Host: web (request() sends it), port 80
            for family in FAMILIES:
                got = samples(inbound, family, direction="inbound", target_port="8080")  # the app's, not admin's
                assert got, family
                assert {labels.get("authority") for labels, _ in got} == {expected}, family
            outbound = await scrape(a)  # the outbound side labels its authority in any case (with the port)
            assert {labels.get("authority") for labels, _ in samples(outbound, "request_total", direction="outbound")} \
                == {f"web.{server.ns}.svc.cluster.local:80"}

    run(scenario())


def test_the_label_follows_the_direction_where_linkerd2_proxy_prints_it() -> None:
    labels = 'direction="inbound",target_addr="10.0.0.1:8080",tls="true",client_id="a"'
    assert with_authority(labels, "web.ns.svc.cluster.local:8080") == (
        'direction="inbound",authority="web.ns.svc.cluster.local:8080",target_addr="10.0.0.1:8080",tls="true",'
        'client_id="a"')
