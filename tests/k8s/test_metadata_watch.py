"""Nodes are watched as metadata only, as Linkerd's metadata informers watch them (the destination needs their labels).

kmock stands in for the API server.  Its emulator keeps whole Nodes and ignores the
``Accept`` header, as a server that cannot convert to ``PartialObjectMetadata`` would
(the header's last choice, plain JSON, allows it); scripted reactions answer as an
API server that converts does (``meta.k8s.io/v1`` ``PartialObjectMetadataList`` and
``PartialObjectMetadata`` watch events).  Either way the watcher hands on ``v1``
``Node`` objects with their metadata alone, and the destination's index reads the zone.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import kmock

from tether.destination.watcher.facts import NodeFacts, facts_of
from tether.platform.kubernetes.client import METADATA_LIST, METADATA_WATCH, ClientSettings
from tether.platform.kubernetes.watch import KubernetesResourceWatcher
from tether.resources import kinds

from .kube_helpers import PODS, emulated_api, hold, pod, take, watching

NODES = kmock.resource("", "v1", "nodes")
ZONE = "topology.kubernetes.io/zone"


def node(name: str, zone: str, version: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {ZONE: zone}}
    if version is not None:
        metadata["resourceVersion"] = version
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata,
            "spec": {"podCIDR": "10.1.0.0/24"}, "status": {"capacity": {"cpu": "2"}}}


def partial(name: str, zone: str, version: str) -> dict[str, Any]:
    """A Node as an API server answers ``as=PartialObjectMetadata``."""
    return {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "resourceVersion": version, "labels": {ZONE: zone}}}


def watcher(settings: ClientSettings) -> KubernetesResourceWatcher:
    return KubernetesResourceWatcher(settings, watch_timeout=5.0, rng=random.Random(7))


async def test_nodes_are_asked_for_and_handed_on_as_metadata_when_the_server_sends_whole_objects(
        tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await api.post("/api/v1/nodes", json=node("node-a", "east"))
        events = watcher(settings).watch("Node")
        first = await take(events, 2)
        assert [e.type for e in first] == ["ADDED", "SYNCED"]
        assert set(first[0].object) == {"apiVersion", "kind", "metadata"}  # no spec, no status
        assert (first[0].object["apiVersion"], first[0].object["kind"]) == ("v1", "Node")
        assert facts_of(first[0].object) == NodeFacts("node-a", "east")
        pending = asyncio.ensure_future(take(events, 1))
        await watching(api)
        await api.patch("/api/v1/nodes/node-a", json={"metadata": {"labels": {ZONE: "west"}}})
        [changed] = await pending
        assert changed.type == "MODIFIED" and set(changed.object) == {"apiVersion", "kind", "metadata"}
        assert facts_of(changed.object) == NodeFacts("node-a", "west")
        await events.aclose()
        assert api["list"][0].headers["Accept"] == METADATA_LIST
        assert api["watch"][0].headers["Accept"] == METADATA_WATCH


async def test_partial_object_metadata_from_the_server_becomes_nodes(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["list", NODES] << {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                               "metadata": {"resourceVersion": "10"}, "items": [partial("node-a", "east", "5")]}
        api["watch", NODES] << ({"type": "MODIFIED", "object": partial("node-a", "west", "11")},
                                {"type": "BOOKMARK", "object": {"apiVersion": "meta.k8s.io/v1",
                                                                "kind": "PartialObjectMetadata",
                                                                "metadata": {"resourceVersion": "12"}}},
                                {"type": "ADDED", "object": partial("node-b", "north", "13")}, hold)
        events = watcher(settings).watch("Node")
        got = await take(events, 4)
        assert [(e.type, e.resource_version) for e in got] == [
            ("ADDED", "5"), ("SYNCED", "10"), ("MODIFIED", "11"), ("ADDED", "13")]
        assert [facts_of(e.object) for e in got if e.object is not None] == [
            NodeFacts("node-a", "east"), NodeFacts("node-a", "west"), NodeFacts("node-b", "north")]
        await events.aclose()


async def test_other_kinds_are_still_watched_whole(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["list", PODS] << {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
                              "items": [pod("a", version="1", spec={"nodeName": "node-a"})]}
        events = watcher(settings).watch(kinds.POD.key)
        [added, _] = await take(events, 2)
        assert added.object["spec"] == {"nodeName": "node-a"}
        await events.aclose()
        assert api["list"][0].headers["Accept"] == "application/json"
