"""Topology-aware endpoints: the filter rules, and what one subscriber is told as Services, slices and Nodes change.

The cluster index is fed real objects (as the Kubernetes platform's watches deliver
them, Nodes included) through ``ClusterIndex.apply``; the subscriber is a recorder
standing in for a stream's translator.  The same rules over real gRPC on the
Kubernetes platform (kmock) are in tests/k8s/test_topology.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tether.api import destination_pb2 as pb
from tether.destination.config import DestinationConfig
from tether.destination.endpoint_translator import EndpointEncoder
from tether.destination.metrics import DestinationMetrics
from tether.destination.watcher.cluster import WATCHED, WATCHED_WITH_NODES, ClusterIndex
from tether.destination.watcher.endpoints import EndpointsWatcher
from tether.destination.watcher.facts import PodFacts
from tether.destination.watcher.listeners import Address, AddressSet
from tether.destination.watcher.topology import select, zone_locality
from tether.platform.watch import ResourceEvent
from tether.ports import PortSet

NS = "emojivoto"
TYPE_KEYS = {"Namespace": "Namespace", "Service": "Service", "Pod": "Pod", "Node": "Node",
             "EndpointSlice": "EndpointSlice.discovery.k8s.io"}


def pod_facts(name: str, node: str | None) -> PodFacts:
    return PodFacts(NS, name, "1", {}, ("10.0.0.1",), "Running", True, False, "web", "pod", name, None, None, None,
                    PortSet(), node_name=node)


def address(ip: str, *, node: str | None = "node-a", zones: tuple[str, ...] = (), pod: bool = True) -> Address:
    return Address(ip, 8080, pod_facts(f"web-{ip}", node) if pod else None, False, "", for_zones=zones)


# -- the rules ----------------------------------------------------------------------------------------


def test_hints_keep_the_subscribers_zone_when_every_endpoint_has_hints() -> None:
    a, b, c = address("10.0.0.1", zones=("east",)), address("10.0.0.2", zones=("west",)), \
        address("10.0.0.3", zones=("east", "west"))
    assert select([a, b, c], local_only=False, node_name="node-a", zone="east") == [a, c]
    assert select([a, b, c], local_only=False, node_name="node-a", zone="west") == [b, c]


def test_hints_are_ignored_unless_every_endpoint_has_them_and_an_empty_result_falls_back_to_all() -> None:
    hinted, bare = address("10.0.0.1", zones=("east",)), address("10.0.0.2")
    assert select([hinted, bare], local_only=False, node_name="n", zone="west") == [hinted, bare]
    west_only = [address("10.0.0.3", zones=("west",)), address("10.0.0.4", zones=("west",))]
    assert select(west_only, local_only=False, node_name="n", zone="south") == west_only
    assert select(west_only, local_only=False, node_name="n", zone="") == west_only  # zone unknown: all
    assert select([], local_only=False, node_name="n", zone="east") == []


def test_internal_traffic_policy_local_keeps_only_pods_on_the_subscribers_node_before_hints() -> None:
    here = address("10.0.0.1", node="node-a", zones=("west",))
    there = address("10.0.0.2", node="node-b", zones=("east",))
    podless = address("10.0.0.3", pod=False, zones=("east",))
    # Hints would pick the east endpoints; the local policy comes first and has no fallback.
    assert select([here, there, podless], local_only=True, node_name="node-a", zone="east") == [here]
    assert select([there, podless], local_only=True, node_name="node-a", zone="east") == []


def test_zone_locality_is_local_or_remote_only_when_both_zones_are_known() -> None:
    assert zone_locality("east", "east") == "local"
    assert zone_locality("east", "west") == "remote"
    assert zone_locality("", "west") == zone_locality("east", "") == "unknown"


def test_the_encoder_writes_zone_locality_against_the_subscribers_zone() -> None:
    encoder = EndpointEncoder(DestinationConfig())
    endpoints = (Address("10.0.0.1", 80, None, False, "east"), Address("10.0.0.2", 80, None, False, "west"),
                 Address("10.0.0.3", 80, None, False, ""))
    update = pb.Update.FromString(encoder.add(AddressSet(endpoints, {}, None, subscriber_zone="east")))
    assert [a.metric_labels["zone_locality"] for a in update.add.addrs] == ["local", "remote", "unknown"]
    shared = pb.Update.FromString(encoder.add(AddressSet(endpoints, {}, None)))
    assert {a.metric_labels["zone_locality"] for a in shared.add.addrs} == {"unknown"}
    assert [a.weight for a in update.add.addrs] == [10000, 10000, 10000]
    weighted = EndpointEncoder(DestinationConfig(ext_endpoint_zone_weights=True))
    update = pb.Update.FromString(weighted.add(AddressSet(endpoints, {}, None, subscriber_zone="east")))
    assert [a.weight for a in update.add.addrs] == [100000, 10000, 10000]  # only the zone-local one, 10x


# -- one subscriber, as things change ---------------------------------------------------------------------


def obj(kind: str, name: str, namespace: str | None = NS, **fields: Any) -> dict[str, Any]:
    api_version = "discovery.k8s.io/v1" if kind == "EndpointSlice" else "v1"
    metadata: dict[str, Any] = {"name": name, **fields.pop("metadata", {})}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **fields}


def node(name: str, zone: str | None) -> dict[str, Any]:
    return obj("Node", name, None, metadata={"labels": {"topology.kubernetes.io/zone": zone} if zone else {}})


def service(policy: str = "Cluster") -> dict[str, Any]:
    return obj("Service", "web", spec={"selector": {"app": "web"}, "internalTrafficPolicy": policy,
                                       "ports": [{"name": "http", "port": 80, "targetPort": 8080}]})


def pod(name: str, ip: str, node_name: str) -> dict[str, Any]:
    return obj("Pod", name, metadata={"labels": {"app": "web"}},
               spec={"nodeName": node_name, "containers": [{"name": "web", "image": "web"}]},
               status={"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]})


def endpoint_slice(*endpoints: tuple[str, str, str, tuple[str, ...]]) -> dict[str, Any]:
    """(pod, ip, zone, hinted zones) per endpoint."""
    entries = []
    for name, ip, zone, hints in endpoints:
        entry: dict[str, Any] = {"addresses": [ip], "zone": zone, "targetRef": {"kind": "Pod", "name": name}}
        if hints:
            entry["hints"] = {"forZones": [{"name": h} for h in hints]}
        entries.append(entry)
    return obj("EndpointSlice", "web-abc", metadata={"labels": {"kubernetes.io/service-name": "web"}},
               addressType="IPv4", ports=[{"name": "http", "port": 8080}], endpoints=entries)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], str]] = []

    def add(self, addresses: AddressSet) -> None:
        self.calls.append(("add", sorted(a.ip for a in addresses.addresses), addresses.subscriber_zone))

    def remove(self, addresses: AddressSet) -> None:
        kind = "remove" if addresses.service_exists else "gone"
        self.calls.append((kind, sorted(a.ip for a in addresses.addresses), addresses.subscriber_zone))

    def take(self) -> list[tuple[str, list[str], str]]:
        calls, self.calls = self.calls, []
        return calls


class Cluster:
    def __init__(self, *objects: dict[str, Any], nodes: bool = True, enable_ipv6: bool = True) -> None:
        self.index = ClusterIndex(PortSet(), WATCHED_WITH_NODES if nodes else WATCHED)
        self.watcher = EndpointsWatcher(self.index, DestinationMetrics(), enable_ipv6=enable_ipv6)
        for o in objects:
            self.apply(o)

    def apply(self, o: dict[str, Any], event: str = "ADDED") -> None:
        self.index.apply(TYPE_KEYS[o["kind"]], ResourceEvent(event, o, "1", 1.0))  # type: ignore[arg-type]
        self.watcher.flush()


SLICE = endpoint_slice(("web-a", "10.0.0.1", "east", ("east",)), ("web-b", "10.0.0.2", "west", ("west",)))
OBJECTS = (node("node-a", "east"), node("node-b", "west"), service(), pod("web-a", "10.0.0.1", "node-a"),
           pod("web-b", "10.0.0.2", "node-b"))


async def test_a_subscriber_follows_hint_and_node_zone_changes() -> None:
    cluster = Cluster(*OBJECTS, SLICE)
    recorder = Recorder()
    cluster.watcher.subscribe(NS, "web", 80, recorder, node_name="node-a")
    assert recorder.take() == [("add", ["10.0.0.1"], "east")]

    cluster.apply(node("node-a", "west"), "MODIFIED")  # the subscriber's node moved zone
    assert recorder.take() == [("add", ["10.0.0.2"], "west"), ("remove", ["10.0.0.1"], "west")]

    cluster.apply(node("node-b", "north"), "MODIFIED")  # another node: nothing for this subscriber
    assert recorder.take() == []

    # The hints change: web-a now serves the west too.
    cluster.apply(endpoint_slice(("web-a", "10.0.0.1", "east", ("east", "west")),
                                 ("web-b", "10.0.0.2", "west", ("west",))), "MODIFIED")
    assert recorder.take() == [("add", ["10.0.0.1"], "west")]

    # One endpoint loses its hints: they no longer apply, everything is sent (web-a again: its hints changed).
    cluster.apply(endpoint_slice(("web-a", "10.0.0.1", "east", ("east",)), ("web-b", "10.0.0.2", "west", ()),
                                 ("web-c", "10.0.0.3", "west", ())), "MODIFIED")
    cluster.apply(pod("web-c", "10.0.0.3", "node-b"))  # web-c's pod arrives after its slice entry
    assert recorder.take() == [("add", ["10.0.0.1", "10.0.0.2"], "west"), ("add", ["10.0.0.3"], "west")]

    cluster.apply(node("node-a", None), "MODIFIED")  # zone unknown: all endpoints, zone labels re-sent
    assert recorder.take() == [("add", ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "")]


async def test_internal_traffic_policy_local_follows_the_service_and_the_service_going_away() -> None:
    cluster = Cluster(*OBJECTS, SLICE)
    recorder, elsewhere = Recorder(), Recorder()
    cluster.watcher.subscribe(NS, "web", 80, recorder, node_name="node-b")
    cluster.watcher.subscribe(NS, "web", 80, elsewhere, node_name="node-z")  # a node with no pod of web
    assert recorder.take() == [("add", ["10.0.0.2"], "west")]
    assert elsewhere.take() == [("add", ["10.0.0.1", "10.0.0.2"], "")]  # an unknown node has no zone: all
    cluster.apply(service("Local"), "MODIFIED")
    assert recorder.take() == []  # the local pod was already all it had
    assert elsewhere.take() == [("remove", ["10.0.0.1", "10.0.0.2"], "")]  # no pod of web on its node
    cluster.apply(service("Cluster"), "MODIFIED")
    assert recorder.take() == []
    assert elsewhere.take() == [("add", ["10.0.0.1", "10.0.0.2"], "")]

    cluster.apply(service("Local"), "MODIFIED")
    cluster.apply(node("node-b", "east"), "MODIFIED")  # zone changes don't matter under the local policy...
    assert recorder.take() == [("add", ["10.0.0.2"], "east")]  # ...but its zone_locality label does

    cluster.apply(service("Cluster"), "MODIFIED")  # back to hints: the east endpoint for an east node
    assert recorder.take() == [("add", ["10.0.0.1"], "east"), ("remove", ["10.0.0.2"], "east")]

    cluster.apply(service(), "DELETED")
    assert recorder.take() == [("gone", ["10.0.0.1"], "")]
    cluster.watcher.unsubscribe(NS, "web", 80, recorder)
    cluster.watcher.unsubscribe(NS, "web", 80, elsewhere)
    cluster.apply(node("node-b", "west"), "MODIFIED")
    assert recorder.take() == [] and cluster.watcher.publishers == 0


async def test_without_nodes_every_subscriber_sees_everything(caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(service("Local"), pod("web-a", "10.0.0.1", "node-a"), pod("web-b", "10.0.0.2", "node-b"),
                      SLICE, nodes=False)
    recorder, other = Recorder(), Recorder()
    with caplog.at_level(logging.WARNING, logger="tether.destination.watcher.endpoints"):
        cluster.watcher.subscribe(NS, "web", 80, recorder, node_name="node-a")
        cluster.watcher.subscribe(NS, "web", 80, other, node_name="node-b")
    assert recorder.take() == other.take() == [("add", ["10.0.0.1", "10.0.0.2"], "")]
    # The policy can't take effect without Nodes: said once per Service, by name.
    assert [r.getMessage() for r in caplog.records] == [
        "Service emojivoto/web: internalTrafficPolicy Local has no effect on a platform without Nodes"]


class Keeper:
    """Keeps the sets themselves, to see which subscribers were handed the same one (one encoding)."""

    def __init__(self) -> None:
        self.sets: list[AddressSet] = []

    def add(self, addresses: AddressSet) -> None:
        self.sets.append(addresses)

    def remove(self, addresses: AddressSet) -> None:
        self.sets.append(addresses)


async def test_subscribers_in_one_zone_share_a_set_only_when_they_are_told_all_of_it() -> None:
    unhinted = endpoint_slice(("web-a", "10.0.0.1", "east", ()), ("web-b", "10.0.0.2", "west", ()))
    cluster = Cluster(*OBJECTS, node("node-c", "east"), unhinted)
    a, c, b = Keeper(), Keeper(), Keeper()
    for keeper, node_name in ((a, "node-a"), (c, "node-c"), (b, "node-b")):
        cluster.watcher.subscribe(NS, "web", 80, keeper, node_name=node_name)
    # No hints: everyone gets everything; node-a and node-c are both in the east, so one set (one encoding).
    assert a.sets[0] is c.sets[0] and a.sets[0] is not b.sets[0]
    assert a.sets[0].subscriber_zone == "east" and b.sets[0].subscriber_zone == "west"
    assert [x.ip for x in a.sets[0].addresses] == [x.ip for x in b.sets[0].addresses] == ["10.0.0.1", "10.0.0.2"]

    cluster.apply(SLICE, "MODIFIED")  # hints now: each east subscriber is told its part in a set of its own
    assert a.sets[1] is not c.sets[1]
    assert [[x.ip for x in s.addresses] for s in a.sets[1:]] == [["10.0.0.1"], ["10.0.0.2"]]  # re-sent, removed
    assert [[x.ip for x in s.addresses] for s in c.sets[1:]] == [["10.0.0.1"], ["10.0.0.2"]]
    assert [s.service_exists for s in a.sets[1:]] == [True, True]


async def test_subscribers_on_one_node_share_one_filter_and_are_counted_one_by_one() -> None:
    cluster = Cluster(*OBJECTS, SLICE)
    first, second = Keeper(), Keeper()
    cluster.watcher.subscribe(NS, "web", 80, first, node_name="node-a")
    cluster.apply(node("node-a", "west"), "MODIFIED")  # node-a's view changes before the second stream arrives
    cluster.watcher.subscribe(NS, "web", 80, second, node_name="node-a")
    assert [[x.ip for x in s.addresses] for s in second.sets] == [["10.0.0.2"]]  # the current view, at once
    assert second.sets[0].subscriber_zone == "west"
    assert series(cluster, "endpoints_subscribers", "node-a") == 2
    assert series(cluster, "endpoints_pods", "node-a") == 1  # what node-a's streams were sent: web-b

    cluster.apply(node("node-a", "east"), "MODIFIED")
    assert first.sets[-2:] == second.sets[-2:]  # one add and one remove, the same sets for both
    assert [[x.ip for x in s.addresses] for s in second.sets[1:]] == [["10.0.0.1"], ["10.0.0.2"]]

    assert series(cluster, "endpoints_updates_total", "node-a") == 2  # two changes sent to node-a's streams

    cluster.watcher.unsubscribe(NS, "web", 80, first)
    assert series(cluster, "endpoints_subscribers", "node-a") == 1
    heard = len(first.sets), len(second.sets)
    cluster.apply(node("node-a", "west"), "MODIFIED")
    assert (len(first.sets), len(second.sets)) == (heard[0], heard[1] + 2)  # only the one still subscribed hears it

    # Each node's streams have their own series (Linkerd's nodename label), gone with their last stream.
    elsewhere = Keeper()
    cluster.watcher.subscribe(NS, "web", 80, elsewhere, node_name="node-b")
    assert series(cluster, "endpoints_subscribers", "node-b") == 1
    assert series(cluster, "endpoints_pods", "node-b") == 1 and series(cluster, "endpoints_exists", "node-b") == 1
    cluster.watcher.unsubscribe(NS, "web", 80, second)
    assert series(cluster, "endpoints_subscribers", "node-a") is None
    assert series(cluster, "endpoints_updates_total", "node-a") is None
    assert series(cluster, "endpoints_subscribers", "node-b") == 1
    cluster.watcher.unsubscribe(NS, "web", 80, elsewhere)
    assert cluster.watcher.publishers == 0
    assert series(cluster, "endpoints_subscribers", "node-b") is None


def series(cluster: Cluster, name: str, node_name: str) -> float | None:
    labels = {"cluster": "local", "namespace": NS, "service": "web", "port": "80", "hostname": "",
              "nodename": node_name}
    return cluster.watcher._metrics.registry.get_sample_value(name, labels)
