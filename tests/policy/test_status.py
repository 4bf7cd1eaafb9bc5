"""Status written by the policy controller into the local store: routes, rate limits, EgressNetworks.

The controller runs with its status loop (as ``tether policy serve`` does on the local
platform); each test makes a change and awaits, through the store's watch, the status the
loop writes for it.
"""

from __future__ import annotations

import time
from typing import Any
from pathlib import Path

import pytest
from policy_helpers import NS, Harness, Pki, grpc_route, http_route, namespace, pod, ratelimit, server, stored

from tether.platform.watch import ResourceEvent
from tether.policy import PolicyConfig
from tether.policy.inbound.index import InboundIndex
from tether.policy.outbound import OutboundIndex
from tether.policy.status import CONTROLLER_NAME, LocalStatusWriter, desired_statuses, merged_status
from tether.resources import kinds


def service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}}


def service_route(name: str, parent: str, backend: str) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": parent, "port": 80}],
                     "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}}


def conditions(obj: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    """Our conditions on the object (its own, or its parent entry's): type -> (status, reason)."""
    status = (obj or {}).get("status") or {}
    found = status.get("conditions") or next(
        (p["conditions"] for p in status.get("parents", []) if p.get("controllerName") == CONTROLLER_NAME), [])
    return {c["type"]: (c["status"], c["reason"]) for c in found}


async def until(h: Harness, type_key: str, name: str, **want: tuple[str, str]) -> dict[str, Any]:
    """The object once its conditions include ``want`` (type -> (status, reason))."""
    obj = await stored(h.store, type_key, name,
                       lambda o: all(conditions(o).get(t) == v for t, v in want.items()))
    assert obj is not None
    return obj


async def test_inbound_routes_are_accepted_by_an_existing_server_only(workdir: Path, pki: Pki) -> None:
    key = kinds.POLICY_HTTP_ROUTE.key
    async with Harness(workdir, pki, namespace(), pod(), http_route("r", "web"), status_writer=LocalStatusWriter) as h:
        await until(h, key, "r", Accepted=("False", "NoMatchingParent"))
        h.apply(server("web"))
        route = await until(h, key, "r", Accepted=("True", "Accepted"))
        parents = route["status"]["parents"]
        assert conditions(route) == {"Accepted": ("True", "Accepted")}  # Accepted alone on a Server, as Linkerd
        assert parents[0]["parentRef"] == {"group": "policy.linkerd.io", "kind": "Server", "namespace": NS,
                                           "name": "web"}
        assert parents[0]["controllerName"] == CONTROLLER_NAME


async def test_outbound_routes_report_missing_parents_and_backends(workdir: Path, pki: Pki) -> None:
    key = kinds.GATEWAY_HTTP_ROUTE.key
    async with Harness(workdir, pki, namespace(), service("web"), service_route("split", "web", "gone"),
                       status_writer=LocalStatusWriter) as h:
        await until(h, key, "split", Accepted=("True", "Accepted"), ResolvedRefs=("False", "BackendNotFound"))
        h.apply(service("gone"))
        await until(h, key, "split", ResolvedRefs=("True", "ResolvedRefs"))
        h.delete("svc", "web")
        await until(h, key, "split", Accepted=("False", "NoMatchingParent"))


async def test_an_http_route_on_a_service_port_with_a_grpc_route_is_conflicted(workdir: Path, pki: Pki) -> None:
    grpc = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute", "metadata": {"name": "rpc", "namespace": NS},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}
    async with Harness(workdir, pki, namespace(), service("web"), service_route("split", "web", "web"),
                       status_writer=LocalStatusWriter) as h:
        await until(h, kinds.GATEWAY_HTTP_ROUTE.key, "split", Accepted=("True", "Accepted"))
        h.apply(grpc)
        await until(h, kinds.GATEWAY_HTTP_ROUTE.key, "split", Accepted=("False", "RouteReasonConflicted"))
        await until(h, kinds.GRPC_ROUTE.key, "rpc", Accepted=("True", "Accepted"))
        h.delete("grpcroutes", "rpc")
        await until(h, kinds.GATEWAY_HTTP_ROUTE.key, "split", Accepted=("True", "Accepted"))


async def test_an_http_route_on_a_server_with_a_grpc_route_is_conflicted_and_not_served(workdir: Path,
                                                                                     pki: Pki) -> None:
    # As Linkerd's status controller (parent_has_conflicting_routes, for every parent kind), read back by the
    # inbound index: the HTTPRoute is left out of the Server's policy while the GRPCRoute is there.
    async with Harness(workdir, pki, namespace(), pod(), server("web", protocol="HTTP/2"), http_route("r", "web"),
                       status_writer=LocalStatusWriter) as h:
        await until(h, kinds.POLICY_HTTP_ROUTE.key, "r", Accepted=("True", "Accepted"))
        watch = h.watch(8080)
        while [r["ref"] for r in (await watch.next())["http_routes"]] != ["HTTPRoute/r"]:
            pass
        h.apply(grpc_route("rpc", "web", "emojivoto.v1.EmojiService"))
        obj = await until(h, kinds.POLICY_HTTP_ROUTE.key, "r", Accepted=("False", "RouteReasonConflicted"))
        assert obj["status"]["parents"][0]["conditions"][0]["message"] == (
            f"GRPCRoute {NS}/rpc is on the same Server (GRPCRoutes take precedence over HTTPRoutes)")
        await until(h, kinds.GRPC_ROUTE.key, "rpc", Accepted=("True", "Accepted"))
        while [r["ref"] for r in (await watch.next())["http_routes"]] != ["default:default"]:
            pass
        h.delete("grpcroutes", "rpc")
        await until(h, kinds.POLICY_HTTP_ROUTE.key, "r", Accepted=("True", "Accepted"))
        while [r["ref"] for r in (await watch.next())["http_routes"]] != ["HTTPRoute/r"]:
            pass


def stream_route(kind: str, name: str, backend: str) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": kind,
            "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                     "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}}


async def test_tls_and_tcp_routes_yield_to_routes_of_higher_precedence_on_their_port(workdir: Path, pki: Pki) -> None:
    tls, tcp = kinds.TLS_ROUTE.key, kinds.TCP_ROUTE.key
    async with Harness(workdir, pki, namespace(), service("web"), stream_route("TCPRoute", "tcp", "gone"),
                       status_writer=LocalStatusWriter) as h:
        route = await until(h, tcp, "tcp", Accepted=("True", "Accepted"), ResolvedRefs=("False", "BackendNotFound"))
        assert route["status"]["parents"][0]["parentRef"] == {"group": "core", "kind": "Service", "namespace": NS,
                                                              "name": "web", "port": 80}
        h.apply(stream_route("TLSRoute", "tls", "web"))  # TLSRoute over TCPRoute (GEP-1426, as Linkerd)
        await until(h, tcp, "tcp", Accepted=("False", "RouteReasonConflicted"))
        await until(h, tls, "tls", Accepted=("True", "Accepted"), ResolvedRefs=("True", "ResolvedRefs"))
        h.apply(service_route("split", "web", "web"))  # HTTPRoute over both
        obj = await until(h, tls, "tls", Accepted=("False", "RouteReasonConflicted"))
        message = obj["status"]["parents"][0]["conditions"][0]["message"]
        assert message == f"HTTPRoute {NS}/split is on the same Service port (HTTPRoutes take precedence over TLSRoutes)"
        h.delete("httproutes.gateway.networking.k8s.io", "split")
        h.delete("tlsroutes", "tls")
        await until(h, tcp, "tcp", Accepted=("True", "Accepted"))


async def test_rate_limits_one_per_server_and_a_target_that_exists(workdir: Path, pki: Pki) -> None:
    key = kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.key
    async with Harness(workdir, pki, namespace(), server("web"),
                       ratelimit("first", "web", 10, created="2024-01-01T00:00:00Z"),
                       ratelimit("second", "web", 10, created="2024-01-02T00:00:00Z"),
                       ratelimit("orphan", "nope", 10), status_writer=LocalStatusWriter) as h:
        await until(h, key, "orphan", Accepted=("False", "NoMatchingTarget"))
        await until(h, key, "first", Accepted=("True", "Accepted"))
        await until(h, key, "second", Accepted=("False", "RateLimitReasonAlreadyExists"))


def egress_network(name: str, networks: list[dict[str, Any]] | None, conditions: list[Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"trafficPolicy": "Allow"}
    if networks is not None:
        spec["networks"] = networks
    obj = {"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "EgressNetwork",
           "metadata": {"name": name, "namespace": NS}, "spec": spec}
    if conditions:
        obj["status"] = {"conditions": conditions}
    return obj


async def test_egress_networks_reaching_into_the_cluster_networks_are_not_accepted(workdir: Path, pki: Pki) -> None:
    key = kinds.EGRESS_NETWORK.key
    theirs = {"type": "Reviewed", "status": "True", "reason": "ByHand"}
    everything_but_the_cluster = [{"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12",
                                                                   "192.168.0.0/16"]}]
    async with Harness(workdir, pki, namespace(),
                       egress_network("default-outside", None),  # no networks: everything outside the cluster's
                       egress_network("internet", everything_but_the_cluster, [theirs]),
                       egress_network("too-wide", [{"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}]),
                       egress_network("inside", [{"cidr": "10.20.0.0/16"}]),
                       egress_network("split-out", [{"cidr": "10.20.0.0/16",
                                                     "except": ["10.20.0.0/17", "10.20.128.0/17"]}]),
                       status_writer=LocalStatusWriter) as h:
        await until(h, key, "default-outside", Accepted=("True", "Accepted"))
        internet = await until(h, key, "internet", Accepted=("True", "Accepted"))
        assert internet["status"]["conditions"][0] == theirs  # a condition of a type we do not own is kept
        await until(h, key, "too-wide", Accepted=("False", "EgressReasonNetworkOverlap"))  # 172.16/12 and more
        await until(h, key, "inside", Accepted=("False", "EgressReasonNetworkOverlap"))
        await until(h, key, "split-out", Accepted=("True", "Accepted"))  # its exceptions leave nothing of it
        h.apply(egress_network("inside", [{"cidr": "203.0.113.0/24"}]))
        await until(h, key, "inside", Accepted=("True", "Accepted"))


def test_other_controllers_parents_are_kept_and_transition_times_only_move_on_change() -> None:
    theirs = {"parentRef": {"kind": "Gateway", "name": "gw"}, "controllerName": "example.com/gateway",
              "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}
    ours = {"parentRef": {"group": "policy.linkerd.io", "kind": "Server", "name": "web"},
            "controllerName": CONTROLLER_NAME,
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""}]}
    first = merged_status({"parents": [theirs]}, {"parents": [ours]}, "2026-01-01T00:00:00Z")
    assert first is not None and first["parents"][0] == theirs
    assert first["parents"][1]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert merged_status(first, {"parents": [ours]}, "2026-01-02T00:00:00Z") is None
    denied = {**ours, "conditions": [{"type": "Accepted", "status": "False", "reason": "NoMatchingParent",
                                      "message": "gone"}]}
    second = merged_status(first, {"parents": [denied]}, "2026-01-03T00:00:00Z")
    assert second is not None
    assert second["parents"][1]["conditions"][0]["lastTransitionTime"] == "2026-01-03T00:00:00Z"


@pytest.mark.parametrize(("written", "expected"), [
    # A Service parent is written with the core group as Linkerd's status controller spells it: "core".
    ({"group": "core", "kind": "Service", "name": "web", "port": 80},
     {"group": "core", "kind": "Service", "namespace": NS, "name": "web", "port": 80}),
    ({"group": "", "kind": "Service", "name": "web", "port": 80, "sectionName": "http"},
     {"group": "core", "kind": "Service", "namespace": NS, "name": "web", "port": 80}),
    ({"group": "core", "kind": "Service", "name": "web", "namespace": "other"},
     {"group": "core", "kind": "Service", "namespace": "other", "name": "web"}),
    ({"group": "policy.linkerd.io", "kind": "EgressNetwork", "name": "out", "namespace": "linkerd-egress",
      "port": 443},
     {"group": "policy.linkerd.io", "kind": "EgressNetwork", "namespace": "linkerd-egress", "name": "out",
      "port": 443}),
    ({"group": "policy.linkerd.io", "kind": "Server", "name": "web", "sectionName": "x"},
     {"group": "policy.linkerd.io", "kind": "Server", "namespace": NS, "name": "web"}),
    # A kind the controller does not know: as the route wrote it (and refused, InvalidKind).
    ({"group": "example.com", "kind": "Thing", "name": "t"}, {"group": "example.com", "kind": "Thing", "name": "t"}),
])
def test_status_parent_refs_are_spelled_as_linkerds(written: dict[str, Any], expected: dict[str, Any]) -> None:
    index = InboundIndex(PolicyConfig())
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": "r", "namespace": NS}, "spec": {"parentRefs": [written], "rules": [{}]}}
    index.apply(kinds.GATEWAY_HTTP_ROUTE.key, ResourceEvent("ADDED", route, "1", time.monotonic()))
    index.flush()
    desired = desired_statuses(index, {}, {})
    [parent] = desired[(kinds.GATEWAY_HTTP_ROUTE.key, NS, "r")]["parents"]
    assert parent["parentRef"] == expected


@pytest.mark.parametrize(("spec", "accepted"), [
    ({"clusterIP": "10.96.0.10"}, ("True", "Accepted", "")),
    ({}, ("True", "Accepted", "")),  # not allocated yet (the local platform allocates after the write)
    ({"clusterIP": "None"}, ("False", "NoMatchingParent", f"Service {NS}/web has no cluster IP (headless or "
                                                          "ExternalName)")),
    ({"type": "ExternalName", "externalName": "example.com"},
     ("False", "NoMatchingParent", f"Service {NS}/web has no cluster IP (headless or ExternalName)")),
])
def test_a_service_without_a_cluster_ip_by_design_is_no_parent(spec: dict[str, Any],
                                                               accepted: tuple[str, str, str]) -> None:
    # As Linkerd's status controller (valid_parent_service): a proxy reaches a Service's routes by its cluster IP.
    outbound = OutboundIndex(PolicyConfig())
    svc = service("web")
    svc["spec"] = {**svc["spec"], **spec}
    outbound.apply(kinds.SERVICE.key, ResourceEvent("ADDED", svc, "1", time.monotonic()))
    index = InboundIndex(PolicyConfig())
    index.apply(kinds.GATEWAY_HTTP_ROUTE.key, ResourceEvent("ADDED", service_route("r", "web", "web"), "1",
                                                            time.monotonic()))
    index.flush()
    [parent] = desired_statuses(index, outbound.services, {})[(kinds.GATEWAY_HTTP_ROUTE.key, NS, "r")]["parents"]
    condition = parent["conditions"][0]
    assert (condition["status"], condition["reason"], condition["message"]) == accepted


@pytest.mark.parametrize(("network_status", "accepted"), [
    (None, ("False", "NoMatchingParent")),  # not written yet: the route waits a round
    ("True", ("True", "Accepted")),
    ("False", ("False", "NoMatchingParent")),  # say, EgressReasonNetworkOverlap
])
def test_a_route_on_an_egress_network_waits_for_the_networks_own_acceptance(network_status: str | None,
                                                                            accepted: tuple[str, str]) -> None:
    # As Linkerd's status controller (parent_condition_egress_network), from the network's status read back.
    network: dict[str, Any] = {"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "EgressNetwork",
                               "metadata": {"name": "out", "namespace": NS}, "spec": {"trafficPolicy": "Allow"}}
    if network_status is not None:
        network["status"] = {"conditions": [{"type": "Accepted", "status": network_status, "reason": "R"}]}
    outbound = OutboundIndex(PolicyConfig())
    outbound.apply(kinds.EGRESS_NETWORK.key, ResourceEvent("ADDED", network, "1", time.monotonic()))
    route = service_route("r", "web", "web")
    route["spec"]["parentRefs"] = [{"group": "policy.linkerd.io", "kind": "EgressNetwork", "name": "out",
                                    "port": 80}]
    index = InboundIndex(PolicyConfig())
    index.apply(kinds.GATEWAY_HTTP_ROUTE.key, ResourceEvent("ADDED", route, "1", time.monotonic()))
    index.flush()
    desired = desired_statuses(index, outbound.services, outbound.egress_networks)
    [parent] = desired[(kinds.GATEWAY_HTTP_ROUTE.key, NS, "r")]["parents"]
    condition = parent["conditions"][0]
    assert (condition["status"], condition["reason"]) == accepted
    if network_status != "True":
        assert condition["message"] == f"EgressNetwork {NS}/out is not accepted (its status)"
