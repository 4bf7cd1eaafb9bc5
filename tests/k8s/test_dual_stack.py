"""Dual stack on the Kubernetes platform: real ``Get`` streams over real gRPC; the API server is mocked (kmock).

A dual-stack cluster lists each pod in an IPv4 and an IPv6 EndpointSlice of its
Service.  The destination, run as ``--platform kubernetes`` runs it, sends each
pod's IPv6 endpoint (Linkerd's ``-enable-ipv6``, the binary's default) and falls
back to its IPv4 one when the IPv6 entry goes; with IPv6 disabled it sends only
IPv4.  ``tether install`` passes ``--disable-ipv6`` unless ``disableIPv6: false``,
as Linkerd's chart passes ``-enable-ipv6=false``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tether.cli.platform_opts import Platform
from tether.destination import DestinationConfig, DestinationService
from tether.destination.client import open_channel, profile_dict, stream_endpoints, stream_profile, update_dict

from .kube_helpers import emulated_api, watching
from .test_controllers import pod
from .test_install import container, find, objects
from .test_topology import NS, SLICES, node, serve_destination_kinds, service, token

AUTHORITY = f"web.{NS}.svc.cluster.local:80"
PODS = (("web-a", "10.1.0.1", "fd00:10:1::1"), ("web-b", "10.1.0.2", "fd00:10:1::2"))


def dual_stack(name: str, ip4: str, ip6: str) -> dict[str, Any]:
    manifest = pod(name, NS, "web", ip4)
    manifest["spec"]["nodeName"] = "node-a"
    manifest["status"]["podIPs"] = [{"ip": ip4}, {"ip": ip6}]
    return manifest


def family_slice(family: str, *entries: tuple[str, str]) -> dict[str, Any]:
    """The slice Kubernetes' EndpointSlice controller keeps for one address family ((pod, ip) entries)."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
            "metadata": {"name": f"web-{family.lower()}", "namespace": NS,
                         "labels": {"kubernetes.io/service-name": "web"}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "nodeName": "node-a", "zone": "east",
                           "targetRef": {"kind": "Pod", "namespace": NS, "name": name}} for name, ip in entries]}


def addrs(update: dict[str, Any]) -> list[str]:
    return sorted(a["addr"] for a in update["add"]["addrs"])


@pytest.mark.parametrize("enable_ipv6", [True, False], ids=["ipv6-enabled", "ipv6-disabled"])
async def test_get_sends_each_pods_ipv6_endpoint_on_a_dual_stack_cluster(tmp_path: Path, enable_ipv6: bool) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        serve_destination_kinds(api)
        await api.post("/api/v1/nodes", json=node("node-a", "east"))
        await api.post(f"/api/v1/namespaces/{NS}/services", json=service("web", "Cluster"))
        for name, ip4, ip6 in PODS:
            await api.post(f"/api/v1/namespaces/{NS}/pods", json=dual_stack(name, ip4, ip6))
        await api.post(SLICES, json=family_slice("IPv4", *((name, ip4) for name, ip4, _ in PODS)))
        await api.post(SLICES, json=family_slice("IPv6", *((name, ip6) for name, _, ip6 in PODS)))

        config = DestinationConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0", enable_ipv6=enable_ipv6)
        service_ = DestinationService(config, Platform("kubernetes", settings.kubeconfig).resource_watcher())
        await asyncio.wait_for(service_.start(), 20)
        try:
            async with open_channel(f"127.0.0.1:{service_.port}", None) as channel:
                stream = stream_endpoints(channel, AUTHORITY, token("node-a"), 10)
                first = update_dict(await anext(stream))
                if not enable_ipv6:
                    assert addrs(first) == ["10.1.0.1:8080", "10.1.0.2:8080"]
                    await stream.aclose()
                    return
                assert addrs(first) == ["[fd00:10:1::1]:8080", "[fd00:10:1::2]:8080"]
                assert {a["metric_labels"]["zone_locality"] for a in first["add"]["addrs"]} == {"local"}

                # The pod's IPv6 address is its own for the endpoint profile too (every podIP is indexed).
                profile = profile_dict(await anext(stream_profile(channel, "[fd00:10:1::2]:8080", token("node-a"), 10)))
                assert profile["endpoint"]["metric_labels"]["pod"] == "web-b"

                await watching(api, 9)
                # web-b leaves the IPv6 slice: its IPv4 endpoint takes over.
                await api.patch(f"{SLICES}/web-ipv6", json=family_slice("IPv6", ("web-a", "fd00:10:1::1")))
                assert addrs(update_dict(await anext(stream))) == ["10.1.0.2:8080"]
                assert update_dict(await anext(stream)) == {"remove": ["[fd00:10:1::2]:8080"]}
                await stream.aclose()
        finally:
            await service_.stop()


def test_install_passes_the_charts_ipv6_choice_to_the_destination() -> None:
    def args(*extra: str) -> list[str]:
        return container(find(objects("install", *extra), "Deployment", "linkerd-destination"))["args"]

    assert "--disable-ipv6" in args()  # disableIPv6: true by default, as in Linkerd's chart
    enabled = args("--set", "disableIPv6=false")
    assert "--enable-ipv6" in enabled and "--disable-ipv6" not in enabled
