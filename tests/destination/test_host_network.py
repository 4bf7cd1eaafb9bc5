"""Pods reached through their node (hostNetwork, hostPort): endpoint profiles on a node IP and port.

Where pods share their node's network (a platform with Nodes: Kubernetes), an
IP:port no pod-network pod has is looked up as Linkerd's host IP index does: a
running hostNetwork pod's container port, or a container's ``hostPort``, on one
of the node's IPs (``status.hostIPs``, else ``hostIP``).  The local platform
runs every pod in its own network namespace whatever its spec says, so there a
hostNetwork pod is found at its own IP and a ``hostPort`` leads nowhere.  The
index and workload watcher fed real objects first, then real gRPC over the
local store; real gRPC on Kubernetes (kmock) is in tests/k8s/test_host_network.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from destination_helpers import Harness, Pki, namespace, pod
from test_topology import TYPE_KEYS, obj

from tether.destination.metrics import DestinationMetrics
from tether.destination.watcher.cluster import WATCHED, WATCHED_WITH_NODES, ClusterIndex
from tether.destination.watcher.errors import ConflictingAddress
from tether.destination.watcher.listeners import Address
from tether.destination.watcher.workloads import WorkloadWatcher
from tether.platform.watch import ResourceEvent
from tether.ports import PortSet

NODE_IP, NODE_IP6 = "192.168.1.20", "fd00:1::20"


def host_pod(name: str, ip: str, *, host_network: bool = False, host_port: int | None = None,
             phase: str = "Running") -> dict[str, Any]:
    port: dict[str, Any] = {"name": "metrics", "containerPort": 7777}
    if host_port is not None:
        port["hostPort"] = host_port
    return obj("Pod", name, metadata={"labels": {"app": "agent"}},
               spec={"hostNetwork": host_network, "nodeName": "node-a",
                     "containers": [{"name": "agent", "image": "agent", "ports": [port]}]},
               status={"phase": phase, "podIP": ip, "hostIP": NODE_IP,
                       "hostIPs": [{"ip": NODE_IP}, {"ip": NODE_IP6}]})


def opaque_server(port: int | str) -> dict[str, Any]:
    manifest = obj("Server", "agent-opaque", spec={"podSelector": {"matchLabels": {"app": "agent"}}, "port": port,
                                                   "proxyProtocol": "opaque"})
    manifest["apiVersion"] = "policy.linkerd.io/v1beta3"
    return manifest


class Targets:
    def __init__(self, *objects: dict[str, Any], nodes: bool = True) -> None:
        self.index = ClusterIndex(PortSet(), WATCHED_WITH_NODES if nodes else WATCHED)
        self.watcher = WorkloadWatcher(self.index, DestinationMetrics())
        self.seen: list[Address] = []
        for o in objects:
            self.apply(o)

    def apply(self, o: dict[str, Any], event: str = "ADDED") -> None:
        type_key = "Server.policy.linkerd.io" if o["kind"] == "Server" else TYPE_KEYS[o["kind"]]
        self.index.apply(type_key, ResourceEvent(event, o, "1", 1.0))  # type: ignore[arg-type]

    def update(self, target: Address, at: float | None) -> None:
        self.seen.append(target)

    def pods(self) -> list[str | None]:
        seen, self.seen = self.seen, []
        return [t.pod.name if t.pod is not None else None for t in seen]


def test_a_node_ip_and_port_means_the_pod_reached_there_while_it_runs() -> None:
    targets = Targets(host_pod("agent", NODE_IP, host_network=True), host_pod("web", "10.1.0.1", host_port=18080))
    targets.watcher.subscribe(NODE_IP, 7777, targets)  # a hostNetwork pod's container port (its host port)
    targets.watcher.subscribe(NODE_IP6, 18080, targets)  # a hostPort, on the node's other family
    targets.watcher.subscribe(NODE_IP, 9999, targets)  # nothing there
    assert targets.pods() == ["agent", "web", None]

    targets.apply(host_pod("web", "10.1.0.1", host_port=18080, phase="Succeeded"), "MODIFIED")
    assert targets.pods() == [None]  # only running pods are reached
    targets.apply(host_pod("web", "10.1.0.1", host_port=18080), "MODIFIED")
    assert targets.pods() == ["web"]
    targets.apply(host_pod("web", "10.1.0.1", host_port=18081), "MODIFIED")  # the host port moved
    assert targets.pods() == [None]

    targets.watcher.subscribe("10.1.0.1", 7777, targets)  # a hostPort pod keeps its own IP
    assert targets.pods() == ["web"]
    targets.watcher.subscribe(NODE_IP, 18081, targets)
    targets.apply(host_pod("web-2", "10.1.0.2", host_port=18081))
    with pytest.raises(ConflictingAddress, match="web, .*web-2"):
        targets.watcher.subscribe(NODE_IP, 18081, targets)


def test_a_server_names_a_host_port_by_its_container_ports_name() -> None:
    targets = Targets(host_pod("web", "10.1.0.1", host_port=18080), opaque_server("metrics"))
    targets.watcher.subscribe(NODE_IP, 18080, targets)
    [target] = targets.seen
    assert target.opaque and target.pod is not None
    assert Targets(host_pod("web", "10.1.0.1", host_port=18080), opaque_server(18080)).index.is_opaque(
        target.pod, 18080)


def test_without_nodes_pods_have_their_own_network_whatever_their_spec_says() -> None:
    targets = Targets(host_pod("agent", "10.1.0.9", host_network=True), host_pod("web", "10.1.0.1", host_port=18080),
                      nodes=False)
    for ip, port in (("10.1.0.9", 7777), (NODE_IP, 7777), (NODE_IP, 18080)):
        targets.watcher.subscribe(ip, port, targets)
    assert targets.pods() == ["agent", None, None]


async def test_get_profile_over_the_local_store_finds_a_host_network_pod_at_its_own_ip(
        workdir: Path, pki: Pki) -> None:
    agent = pod("agent", "10.1.0.9", app="agent", meshed=False, ports=[("metrics", 7777)])
    agent["spec"]["hostNetwork"] = True
    agent["status"]["hostIP"] = "10.1.0.1"  # the local platform's gateway, as it writes every pod's
    web = pod("web-1", "10.1.0.2")
    web["spec"]["containers"][1]["ports"][0]["hostPort"] = 18080
    web["status"]["hostIP"] = "10.1.0.1"
    async with Harness(workdir, pki, namespace(), agent, web) as h:
        assert (await h.get_profile("10.1.0.9:7777").next())["endpoint"]["metric_labels"]["pod"] == "agent"
        assert (await h.get_profile("10.1.0.1:18080").next())["endpoint"]["metric_labels"] == {}
