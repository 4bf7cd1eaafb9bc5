"""IPv6 and dual stack: which address family of a pod's endpoints a ``Get`` subscriber is sent (Linkerd's rule).

A dual-stack cluster lists each pod twice, in an IPv4 and an IPv6 EndpointSlice of
its Service.  With ``--enable-ipv6`` (the default) the pod's IPv6 endpoint is sent
and its IPv4 one left out; a pod listed only in IPv4 keeps it.  With
``--disable-ipv6`` no pod's IPv6 endpoint is sent.  Endpoints without a pod (bare
addresses) pass either way, as in Linkerd, whose IDs for them carry no family.

The rule alone, then the index fed real objects as both platforms' watches deliver
them (with Nodes: the topology filter applies it; without: the port publisher),
then real gRPC over the local store.  The same on Kubernetes (kmock) is in
tests/k8s/test_topology.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from destination_helpers import NS, Harness, Pki, addrs, authority, namespace, pod, service
from test_topology import Cluster, Recorder, node, obj, pod_facts

from tether.destination.watcher.listeners import Address
from tether.destination.watcher.topology import select_family
from tether.platform.local.endpointslices import desired_slices, service_families


def endpoint(ip: str, pod_name: str | None) -> Address:
    return Address(ip, 8080, pod_facts(pod_name, None) if pod_name else None, False)


# -- the rule ----------------------------------------------------------------------------------------------


def test_ipv6_is_preferred_per_pod_and_bare_addresses_always_pass() -> None:
    a4, a6 = endpoint("10.0.0.1", "web-a"), endpoint("fd00::1", "web-a")
    b4 = endpoint("10.0.0.2", "web-b")  # listed in IPv4 only
    c6 = endpoint("fd00::3", "web-c")  # listed in IPv6 only
    bare4, bare6 = endpoint("10.0.0.9", None), endpoint("fd00::9", None)
    everything = [a4, a6, b4, c6, bare4, bare6]
    assert select_family(everything, enable_ipv6=True) == [a6, b4, c6, bare4, bare6]
    assert select_family(everything, enable_ipv6=False) == [a4, b4, bare4, bare6]
    assert select_family([a4, b4], enable_ipv6=True) == [a4, b4]  # no IPv6 at all: unchanged


# -- one subscriber, as slices change ------------------------------------------------------------------------


def dual_pod(name: str, ip4: str, ip6: str, node_name: str = "node-a") -> dict[str, Any]:
    return obj("Pod", name, metadata={"labels": {"app": "web"}},
               spec={"nodeName": node_name, "containers": [{"name": "web", "image": "web"}]},
               status={"phase": "Running", "podIP": ip4, "podIPs": [{"ip": ip4}, {"ip": ip6}],
                       "conditions": [{"type": "Ready", "status": "True"}]})


def family_slice(family: str, *entries: tuple[str | None, str]) -> dict[str, Any]:
    """A slice of ``family`` with (pod or None for a bare address, ip) entries."""
    endpoints: list[dict[str, Any]] = []
    for name, ip in entries:
        entry: dict[str, Any] = {"addresses": [ip]}
        if name is not None:
            entry["targetRef"] = {"kind": "Pod", "name": name}
        endpoints.append(entry)
    return obj("EndpointSlice", f"web-{family.lower()}", metadata={"labels": {"kubernetes.io/service-name": "web"}},
               addressType=family, ports=[{"name": "http", "port": 8080}], endpoints=endpoints)


WEB = obj("Service", "web", spec={"selector": {"app": "web"}, "ipFamilies": ["IPv4", "IPv6"],
                                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]})
PODS = (dual_pod("web-a", "10.0.0.1", "fd00::1"), dual_pod("web-b", "10.0.0.2", "fd00::2"))
V4 = family_slice("IPv4", ("web-a", "10.0.0.1"), ("web-b", "10.0.0.2"), (None, "10.0.0.9"))
V6 = family_slice("IPv6", ("web-a", "fd00::1"), ("web-b", "fd00::2"), (None, "fd00::9"))
NODES = (node("node-a", "east"),)  # only on a platform with Nodes


@pytest.mark.parametrize("nodes", [True, False], ids=["with-nodes", "without-nodes"])
async def test_a_subscriber_is_sent_each_pods_ipv6_endpoint_and_its_ipv4_one_when_that_goes(nodes: bool) -> None:
    cluster = Cluster(*(NODES if nodes else ()), WEB, *PODS, V4, V6, nodes=nodes)
    recorder = Recorder()
    cluster.watcher.subscribe(NS, "web", 80, recorder, node_name="node-a")
    zone = "east" if nodes else ""
    assert recorder.take() == [("add", ["10.0.0.9", "fd00::1", "fd00::2", "fd00::9"], zone)]

    # web-b leaves the IPv6 slice: its IPv4 endpoint takes over.
    cluster.apply(family_slice("IPv6", ("web-a", "fd00::1"), (None, "fd00::9")), "MODIFIED")
    assert recorder.take() == [("add", ["10.0.0.2"], zone), ("remove", ["fd00::2"], zone)]
    # And back: the IPv6 one again.
    cluster.apply(V6, "MODIFIED")
    assert recorder.take() == [("add", ["fd00::2"], zone), ("remove", ["10.0.0.2"], zone)]


@pytest.mark.parametrize("nodes", [True, False], ids=["with-nodes", "without-nodes"])
async def test_with_ipv6_disabled_no_pods_ipv6_endpoint_is_sent(nodes: bool) -> None:
    cluster = Cluster(*(NODES if nodes else ()), WEB, *PODS, V4, V6, nodes=nodes, enable_ipv6=False)
    recorder = Recorder()
    cluster.watcher.subscribe(NS, "web", 80, recorder, node_name="node-a")
    zone = "east" if nodes else ""
    assert recorder.take() == [("add", ["10.0.0.1", "10.0.0.2", "10.0.0.9", "fd00::9"], zone)]
    cluster.apply(family_slice("IPv6", ("web-a", "fd00::1")), "MODIFIED")
    assert recorder.take() == [("remove", ["fd00::9"], zone)]  # only the bare address was ever sent of it


async def test_the_local_platform_says_once_that_a_service_asking_for_ipv6_gets_none(
        caplog: pytest.LogCaptureFixture) -> None:
    asks = [obj("Service", name, spec={"selector": {"app": name}, **spec, "ports": [{"port": 80}]})
            for name, spec in (("dual", {"ipFamilyPolicy": "RequireDualStack"}), ("six", {"ipFamilies": ["IPv6"]}),
                               ("four", {"ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}))]
    handwritten = obj("Service", "manual", spec={"ipFamilies": ["IPv6"], "ports": [{"port": 80}]})  # no selector
    cluster = Cluster(*asks, handwritten, nodes=False)
    with caplog.at_level(logging.WARNING, logger="tether.destination.watcher.endpoints"):
        for name in ("dual", "dual", "six", "four", "manual"):
            cluster.watcher.subscribe(NS, name, 80, Recorder())
    assert [r.getMessage() for r in caplog.records] == [
        f"Service {NS}/{name}: ipFamilies/ipFamilyPolicy ask for IPv6, which the local platform does not give pods: "
        "only their IPv4 endpoints exist" for name in ("dual", "six")]


async def test_a_dual_stack_pods_hostname_means_its_primary_ip() -> None:
    named = family_slice("IPv6", ("web-a", "fd00::1"))
    named["metadata"]["name"] = "web-0-first"  # listed before the IPv4 slice
    named["endpoints"][0]["hostname"] = "web-a"
    cluster = Cluster(WEB, *PODS, V4, named, nodes=False)
    assert cluster.index.address_of_hostname(NS, "web", "web-a") == "10.0.0.1"  # status.podIP, as Linkerd
    bare = family_slice("IPv6", (None, "fd00::9"))
    bare["endpoints"][0]["hostname"] = "web-z"
    cluster.apply(bare)
    assert cluster.index.address_of_hostname(NS, "web", "web-z") == "fd00::9"  # no pod: the entry's own address


# -- real gRPC over the local store ------------------------------------------------------------------------


def stored_slice(family: str, *entries: tuple[str, str]) -> dict[str, Any]:
    """A hand-written slice of the selectorless Service ``web`` ((pod, ip) entries)."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"web-{family.lower()}", "namespace": NS,
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": family, "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "namespace": NS, "name": name}} for name, ip in entries]}


def dual_stack(name: str, ip4: str, ip6: str) -> dict[str, Any]:
    # ``app: other``: the selectorless Service's slices are the hand-written ones, not the local controller's.
    manifest = pod(name, ip4, app="other")
    manifest["status"]["podIPs"] = [{"ip": ip4}, {"ip": ip6}]
    return manifest


LOCAL = (namespace(), service(selector={}), dual_stack("web-1", "10.1.0.1", "fd00::1"),
         dual_stack("web-2", "10.1.0.2", "fd00::2"),
         stored_slice("IPv4", ("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")), stored_slice("IPv6", ("web-1", "fd00::1")))


async def test_get_over_the_local_store_prefers_ipv6_and_profiles_answer_for_either_pod_ip(
        workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, *LOCAL) as h:
        stream = h.get(authority())
        first = await stream.next()
        assert addrs(first) == ["10.1.0.2:8080", "[fd00::1]:8080"]
        assert {a["metric_labels"]["pod"] for a in first["add"]["addrs"]} == {"web-1", "web-2"}
        h.apply(stored_slice("IPv6", ("web-1", "fd00::1"), ("web-2", "fd00::2")))
        assert addrs(await stream.next()) == ["[fd00::2]:8080"]
        assert await stream.next() == {"remove": ["10.1.0.2:8080"]}
        # Every IP of a dual-stack pod is that pod's, for the endpoint profile too.
        for ip in ("10.1.0.2", "[fd00::2]"):
            profile = await h.get_profile(f"{ip}:8080").next()
            assert profile["endpoint"]["metric_labels"]["pod"] == "web-2"


async def test_get_over_the_local_store_with_ipv6_disabled(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, *LOCAL, enable_ipv6=False) as h:
        assert addrs(await h.get(authority()).next()) == ["10.1.0.1:8080", "10.1.0.2:8080"]


# -- the local platform's EndpointSlice controller, for pods that have addresses of both families ------------
# (The local platform's own pods have IPv4 only; these are written with their status, as another runtime would.)


def test_the_local_controller_reads_a_services_families_as_the_api_server_defaults_them() -> None:
    def families(**spec: Any) -> tuple[str, ...]:
        return service_families({"spec": spec})

    assert families(ipFamilies=["IPv6", "IPv4"]) == ("IPv4", "IPv6")
    assert families(ipFamilies=["IPv6"], clusterIP="10.96.0.1") == ("IPv6",)
    assert families(ipFamilyPolicy="PreferDualStack") == ("IPv4", "IPv6")
    assert families(ipFamilyPolicy="RequireDualStack", clusterIP="10.96.0.1") == ("IPv4", "IPv6")
    assert families(clusterIP="10.96.0.1") == ("IPv4",)
    assert families(clusterIP="fd00:96::1") == ("IPv6",)
    assert families(clusterIP="None") == families() == ("IPv4",)  # headless: the local platform's family


def test_the_local_controller_keeps_one_slice_per_family_with_each_pods_address_of_it() -> None:
    dual = service(ports=[{"name": "http", "port": 80, "targetPort": 8080}])
    dual["spec"]["ipFamilies"] = ["IPv4", "IPv6"]
    pods = [dual_stack("web-1", "10.1.0.1", "fd00::1"), pod("web-2", "10.1.0.2")]  # web-2: IPv4 only
    pods[0]["metadata"]["labels"]["app"] = "web"
    slices = {s["addressType"]: s for s in desired_slices(dual, pods)}
    assert sorted(slices) == ["IPv4", "IPv6"]
    assert [(e["targetRef"]["name"], e["addresses"]) for e in slices["IPv4"]["endpoints"]] == [
        ("web-1", ["10.1.0.1"]), ("web-2", ["10.1.0.2"])]
    assert [(e["targetRef"]["name"], e["addresses"]) for e in slices["IPv6"]["endpoints"]] == [("web-1", ["fd00::1"])]
    assert slices["IPv6"]["ports"] == slices["IPv4"]["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]

    # A single-stack Service gets its family only; a family nobody has an address of keeps an empty slice.
    assert [s["addressType"] for s in desired_slices(service(), pods)] == ["IPv4"]
    only6 = service()
    only6["spec"]["ipFamilies"] = ["IPv6"]
    assert [(s["addressType"], len(s["endpoints"])) for s in desired_slices(only6, pods[1:])] == [("IPv6", 0)]
    assert [(s["addressType"], len(s["endpoints"])) for s in desired_slices(dual, [])] == [("IPv4", 0), ("IPv6", 0)]


async def test_get_over_the_local_controllers_slices_sends_a_dual_stack_pods_ipv6_endpoint(
        workdir: Path, pki: Pki) -> None:
    dual = service()
    dual["spec"]["ipFamilyPolicy"] = "RequireDualStack"
    web1, web2 = dual_stack("web-1", "10.1.0.1", "fd00::1"), pod("web-2", "10.1.0.2")
    web1["metadata"]["labels"]["app"] = "web"
    async with Harness(workdir, pki, namespace(), dual, web1, web2) as h:
        stored = h.store.list("EndpointSlice.discovery.k8s.io", NS).items
        assert sorted(s["addressType"] for s in stored) == ["IPv4", "IPv6"]
        stream = h.get(authority())
        assert addrs(await stream.next()) == ["10.1.0.2:8080", "[fd00::1]:8080"]
        h.apply(dual_stack("web-2", "10.1.0.2", "fd00::2") | {"metadata": web2["metadata"]})
        assert addrs(await stream.next()) == ["[fd00::2]:8080"]
        assert await stream.next() == {"remove": ["10.1.0.2:8080"]}
