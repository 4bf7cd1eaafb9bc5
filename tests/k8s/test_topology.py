"""Topology-aware endpoints on the Kubernetes platform: real ``Get`` streams over real gRPC, zones from Nodes.

The destination runs as ``--platform kubernetes`` runs it (``Platform("kubernetes",
kubeconfig)``), but the API server is mocked: kmock on localhost holds two Nodes
in two zones, a Service whose EndpointSlice carries zone hints, and a Service with
``internalTrafficPolicy: Local``.  Each subscriber names its node in its context
token, as a proxy does (``LINKERD2_PROXY_DESTINATION_CONTEXT``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tether.cli.platform_opts import Platform
from tether.destination import DestinationConfig, DestinationService
from tether.destination.client import open_channel, stream_endpoints, update_dict

from .kube_helpers import emulated_api, watching
from .test_controllers import namespace, pod

NS = "emojivoto"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def node(name: str, zone: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone, "kubernetes.io/os": "linux"}}}


def service(name: str, policy: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"app": name}, "internalTrafficPolicy": policy,
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


def on_node(obj: dict[str, Any], node_name: str) -> dict[str, Any]:
    obj["spec"]["nodeName"] = node_name
    return obj


def endpoint_slice(service_name: str, *endpoints: tuple[str, str, str, str], hints: bool) -> dict[str, Any]:
    """(pod, ip, node, zone) per endpoint; with ``hints``, each hinted for its own zone (as Kubernetes does)."""
    entries = []
    for name, ip, node_name, zone in endpoints:
        entry: dict[str, Any] = {"addresses": [ip], "conditions": {"ready": True}, "nodeName": node_name,
                                 "zone": zone, "targetRef": {"kind": "Pod", "namespace": NS, "name": name}}
        if hints:
            entry["hints"] = {"forZones": [{"name": zone}]}
        entries.append(entry)
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"{service_name}-abcde", "namespace": NS,
                         "labels": {"kubernetes.io/service-name": service_name}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": entries}


def token(node_name: str) -> str:
    return json.dumps({"ns": NS, "nodeName": node_name, "pod": "client"})


def localities(update: dict[str, Any]) -> dict[str, str]:
    return {a["addr"]: a["metric_labels"]["zone_locality"] for a in update["add"]["addrs"]}


def serve_destination_kinds(api: Any) -> None:
    """Let kmock serve every kind the destination watches: the mesh CRDs' (empty) collections, and ``NS``."""
    for group_version_plural in ("policy.linkerd.io/v1beta3/servers", "linkerd.io/v1alpha2/serviceprofiles",
                                 "discovery.k8s.io/v1/endpointslices", "workload.linkerd.io/v1beta1/externalworkloads",
                                 "apps/v1/replicasets", "batch/v1/jobs", "v1/nodes"):
        api.resources[group_version_plural] = {}
    api.namespaces.append(namespace(NS))  # kmock cannot serve Namespaces: a recorded answer


async def test_get_streams_filter_by_the_subscribers_node_and_zone(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        serve_destination_kinds(api)
        await api.post("/api/v1/nodes", json=node("node-a", "east"))
        await api.post("/api/v1/nodes", json=node("node-b", "west"))
        await api.post(f"/api/v1/namespaces/{NS}/services", json=service("web", "Cluster"))
        await api.post(f"/api/v1/namespaces/{NS}/services", json=service("cache", "Local"))
        for name, app, ip, node_name in (("web-a", "web", "10.1.0.1", "node-a"), ("web-b", "web", "10.1.0.2", "node-b"),
                                         ("cache-a", "cache", "10.1.1.1", "node-a"),
                                         ("cache-b", "cache", "10.1.1.2", "node-b")):
            await api.post(f"/api/v1/namespaces/{NS}/pods", json=on_node(pod(name, NS, app, ip), node_name))
        await api.post(SLICES, json=endpoint_slice(
            "web", ("web-a", "10.1.0.1", "node-a", "east"), ("web-b", "10.1.0.2", "node-b", "west"), hints=True))
        await api.post(SLICES, json=endpoint_slice(
            "cache", ("cache-a", "10.1.1.1", "node-a", "east"), ("cache-b", "10.1.1.2", "node-b", "west"), hints=False))

        watcher = Platform("kubernetes", settings.kubeconfig).resource_watcher()
        service_ = DestinationService(DestinationConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0"), watcher)
        await asyncio.wait_for(service_.start(), 20)
        try:
            async with open_channel(f"127.0.0.1:{service_.port}", None) as channel:
                web_from_a = stream_endpoints(channel, "web.emojivoto.svc.cluster.local:80", token("node-a"), 10)
                assert localities(update_dict(await anext(web_from_a))) == {"10.1.0.1:8080": "local"}
                web_from_b = stream_endpoints(channel, "web.emojivoto.svc.cluster.local:80", token("node-b"), 10)
                assert localities(update_dict(await anext(web_from_b))) == {"10.1.0.2:8080": "local"}
                # No node in the token: the zone is unknown, so the hints fall back to every endpoint.
                web_anywhere = stream_endpoints(channel, "web.emojivoto.svc.cluster.local:80", "", 10)
                assert localities(update_dict(await anext(web_anywhere))) == {
                    "10.1.0.1:8080": "unknown", "10.1.0.2:8080": "unknown"}
                await web_anywhere.aclose()

                cache_from_b = stream_endpoints(channel, "cache.emojivoto.svc.cluster.local:80", token("node-b"), 10)
                assert localities(update_dict(await anext(cache_from_b))) == {"10.1.1.2:8080": "local"}
                await cache_from_b.aclose()
                cache_from_a = stream_endpoints(channel, "cache.emojivoto.svc.cluster.local:80", token("node-a"), 10)
                assert localities(update_dict(await anext(cache_from_a))) == {"10.1.1.1:8080": "local"}
                await cache_from_a.aclose()

                await watching(api, 9)  # every watched kind (Nodes too) is being watched: the next change streams
                # node-a moves to the west: its subscriber now gets the west endpoint, and loses the east one.
                await api.patch("/api/v1/nodes/node-a", json=node("node-a", "west"))
                assert localities(update_dict(await anext(web_from_a))) == {"10.1.0.2:8080": "local"}
                assert update_dict(await anext(web_from_a)) == {"remove": ["10.1.0.1:8080"]}

                # The hints change: web-a serves both zones, so node-b's subscriber gets it too (a remote one).
                both = endpoint_slice("web", ("web-a", "10.1.0.1", "node-a", "east"),
                                      ("web-b", "10.1.0.2", "node-b", "west"), hints=True)
                both["endpoints"][0]["hints"]["forZones"].append({"name": "west"})
                await api.patch(f"{SLICES}/web-abcde", json=both)
                assert localities(update_dict(await anext(web_from_b))) == {"10.1.0.1:8080": "remote"}
                assert localities(update_dict(await anext(web_from_a))) == {"10.1.0.1:8080": "remote"}
                await web_from_a.aclose()
                await web_from_b.aclose()
        finally:
            await service_.stop()
        assert "/api/v1/nodes" in {r.url.path for r in api["list"]}
