"""Endpoint profiles of pods reached through their node (hostNetwork, hostPort) on the Kubernetes platform.

As Linkerd's workload watcher does: ``GetProfile`` on an IP that no pod-network pod
has looks for a running pod reached at that node IP and port — a hostNetwork pod's
container port, or a container's ``hostPort`` — and answers its endpoint profile;
two such pods conflict (FAILED_PRECONDITION).  Real gRPC; the API server is mocked
(kmock), as in tests/k8s/test_topology.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tether.cli.platform_opts import Platform
from tether.destination import DestinationConfig, DestinationService
from tether.destination.client import DestinationError, open_channel, profile_dict, stream_profile

from .kube_helpers import emulated_api, watching
from .test_controllers import pod
from .test_topology import NS, serve_destination_kinds, token

PODS = f"/api/v1/namespaces/{NS}/pods"
NODE_IP = "192.168.1.20"
WEB_ID = f"web.{NS}.serviceaccount.identity.linkerd.cluster.local"


def on_host(manifest: dict[str, Any], host_ip: str = NODE_IP) -> dict[str, Any]:
    manifest["status"].update(hostIP=host_ip, hostIPs=[{"ip": host_ip}])
    return manifest


def host_network_agent() -> dict[str, Any]:
    """An unmeshed agent on the node's network (the injector skips hostNetwork pods), its port without a hostPort
    (the API server would set it to the container port; kmock does not)."""
    agent = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent", "namespace": NS, "labels": {"app": "agent"}},
             "spec": {"hostNetwork": True, "nodeName": "node-a",
                      "containers": [{"name": "agent", "image": "example/agent",
                                      "ports": [{"name": "metrics", "containerPort": 7777}]}]},
             "status": {"phase": "Running", "podIP": NODE_IP, "podIPs": [{"ip": NODE_IP}],
                        "conditions": [{"type": "Ready", "status": "True"}]}}
    return on_host(agent)


def with_host_port(manifest: dict[str, Any], host_port: int) -> dict[str, Any]:
    app = manifest["spec"]["containers"][1]  # (the proxy is the first)
    app["ports"][0]["hostPort"] = host_port
    return manifest


async def test_get_profile_on_a_node_ip_answers_the_pod_reached_there(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        serve_destination_kinds(api)
        api.resources["v1/services"] = {}  # (no Service here: only endpoint profiles)
        await api.post(PODS, json=host_network_agent())
        await api.post(PODS, json=on_host(with_host_port(pod("web-1", NS, "web", "10.1.0.1"), 18080)))
        for name, ip in (("edge-a", "10.1.0.2"), ("edge-b", "10.1.0.3")):  # both take 30443 on one node
            await api.post(PODS, json=on_host(with_host_port(pod(name, NS, "edge", ip), 30443), "192.168.1.21"))

        config = DestinationConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0")
        service = DestinationService(config, Platform("kubernetes", settings.kubeconfig).resource_watcher())
        await asyncio.wait_for(service.start(), 20)
        try:
            async with open_channel(f"127.0.0.1:{service.port}", None) as channel:
                async def first(path: str) -> dict[str, Any]:
                    stream = stream_profile(channel, path, token("node-a"), 10)
                    try:
                        return profile_dict(await anext(stream))
                    finally:
                        await stream.aclose()

                # A hostPort: the pod behind it, with its identity, at the node's address.
                by_host_port = stream_profile(channel, f"{NODE_IP}:18080", token("node-a"), 10)
                endpoint = profile_dict(await anext(by_host_port))["endpoint"]
                assert endpoint["addr"] == f"{NODE_IP}:18080"
                assert endpoint["metric_labels"]["pod"] == "web-1"
                assert endpoint["tls_identity"] == WEB_ID
                assert (await first("10.1.0.1:8080"))["endpoint"]["metric_labels"]["pod"] == "web-1"  # and its own IP

                # A hostNetwork pod's container port; not meshed, so no identity.
                agent = (await first(f"{NODE_IP}:7777"))["endpoint"]
                assert agent["metric_labels"]["pod"] == "agent" and "tls_identity" not in agent
                # A port nothing is reached at on the node: a bare endpoint.
                assert (await first(f"{NODE_IP}:9999"))["endpoint"]["metric_labels"] == {}

                with pytest.raises(DestinationError) as conflict:
                    await first("192.168.1.21:30443")
                assert conflict.value.code.name == "FAILED_PRECONDITION"
                assert "edge-a" in conflict.value.details and "edge-b" in conflict.value.details

                # The pod goes: the stream is told nothing runs there any more.
                await watching(api, 9)
                await api.delete(f"{PODS}/web-1")
                assert profile_dict(await anext(by_host_port))["endpoint"] == {
                    "addr": f"{NODE_IP}:18080", "weight": 10000, "metric_labels": {}}
                await by_host_port.aclose()
        finally:
            await service.stop()
