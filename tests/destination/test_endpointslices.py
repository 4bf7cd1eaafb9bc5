"""Endpoints from EndpointSlices, as a linkerd2-proxy sees them over real gRPC (the generated protos).

Selectorless Services with hand-written slices, terminating endpoints, hostname lookups for
StatefulSet-style pods (``web-0.web.ns.svc.cluster.local``), ExternalWorkload endpoints with
their SPIFFE identity, and slices with bad entries, which are reported and skipped while the
rest keeps being served.  The local platform's EndpointSlice controller runs beside the
destination (``Harness``), as ``tether up`` runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from destination_helpers import NS, Harness, Pki, addrs, authority, by_addr, namespace, pod, service

from tether.cli.printing import render
from tether.platform.local.endpointslices import MANAGED_BY
from tether.resources.discovery import MANAGED_BY_LABEL

SPIFFE_ID = "spiffe://cluster.local/vm/legacy-billing"


def endpoint_slice(name: str, svc: str, endpoints: list[dict[str, Any]], ports: list[dict[str, Any]] | None = None,
                   address_type: str = "IPv4") -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": address_type,
        "ports": ports if ports is not None else [{"name": "http", "port": 5432}],
        "endpoints": endpoints,
    }


def external_workload(name: str, ip: str, *, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "workload.linkerd.io/v1beta1", "kind": "ExternalWorkload",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "billing"}},
        "spec": {"meshTLS": {"identity": SPIFFE_ID, "serverName": "legacy-billing.cluster.local"},
                 "ports": [{"name": "http", "port": 8080}], "workloadIPs": [{"ip": ip}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


async def test_selectorless_service_with_a_hand_written_slice(workdir: Path, pki: Pki) -> None:
    db = service("db", selector={}, ports=[{"name": "http", "port": 80, "targetPort": 5432}])
    slice_ = endpoint_slice("db-1", "db", [{"addresses": ["10.9.0.1"]}, {"addresses": ["10.9.0.2"]}])
    async with Harness(workdir, pki, namespace(), db, slice_) as h:
        stream = h.get(authority("db"))
        first = await stream.next()
        assert addrs(first) == ["10.9.0.1:5432", "10.9.0.2:5432"]
        bare = by_addr(first)["10.9.0.1:5432"]
        assert "tls_identity" not in bare and "protocol_hint" not in bare  # no pod behind it: plain TCP
        # The controller leaves a selectorless Service's slices alone: only the hand-written one exists.
        assert [s["metadata"]["name"] for s in h.store.list("EndpointSlice.discovery.k8s.io", NS).items] == ["db-1"]

        h.apply(endpoint_slice("db-1", "db", [{"addresses": ["10.9.0.2"]}]))
        assert await stream.next() == {"remove": ["10.9.0.1:5432"]}
        h.apply(endpoint_slice("db-2", "db", [{"addresses": ["10.9.0.3"]}]))  # a second slice adds to the first
        assert addrs(await stream.next()) == ["10.9.0.3:5432"]


async def test_not_ready_and_terminating_endpoints_are_dropped(workdir: Path, pki: Pki) -> None:
    db = service("db", selector={}, ports=[{"name": "http", "port": 80, "targetPort": 5432}])
    slice_ = endpoint_slice("db-1", "db", [
        {"addresses": ["10.9.0.1"], "conditions": {"ready": True}},
        {"addresses": ["10.9.0.2"], "conditions": {"ready": False, "serving": True, "terminating": True}},
    ])
    async with Harness(workdir, pki, namespace(), db, slice_) as h:
        stream = h.get(authority("db"))
        assert addrs(await stream.next()) == ["10.9.0.1:5432"]
        h.apply(endpoint_slice("db-1", "db", [
            {"addresses": ["10.9.0.1"], "conditions": {"ready": False, "serving": False, "terminating": True}},
            {"addresses": ["10.9.0.2"], "conditions": {"ready": False, "serving": True, "terminating": True}},
        ]))
        assert await stream.next() == {"remove": ["10.9.0.1:5432"]}


async def test_local_controller_writes_slices_with_conditions_hostname_and_target(workdir: Path, pki: Pki) -> None:
    stateful = pod("web-0", "10.1.0.1", template_hash=None)
    stateful["spec"].update(hostname="web-0", subdomain="web")
    async with Harness(workdir, pki, namespace(), service(), stateful, pod("web-x", "10.1.0.2", ready=False)) as h:
        [slice_] = h.store.list("EndpointSlice.discovery.k8s.io", NS).items
        assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "web"
        assert slice_["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
        assert slice_["metadata"]["ownerReferences"][0]["kind"] == "Service"
        assert slice_["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
        endpoints = {e["targetRef"]["name"]: e for e in slice_["endpoints"]}
        assert endpoints["web-0"]["hostname"] == "web-0"
        assert endpoints["web-0"]["conditions"] == {"ready": True, "serving": True, "terminating": False}
        assert "hostname" not in endpoints["web-x"]  # no subdomain naming the Service
        assert endpoints["web-x"]["conditions"]["ready"] is False
        h.delete("Service", "web")
        await h.slices.reconciled.wait()
        h.slices.reconciled.clear()
        while h.store.list("EndpointSlice.discovery.k8s.io", NS).items:
            await h.slices.reconciled.wait()
            h.slices.reconciled.clear()


async def test_hostname_lookup_returns_that_one_pod(workdir: Path, pki: Pki) -> None:
    pods = []
    for i in range(3):
        p = pod(f"web-{i}", f"10.1.0.{i + 1}", template_hash=None)
        p["spec"].update(hostname=f"web-{i}", subdomain="web")
        pods.append(p)
    headless = service(cluster_ip="None")
    async with Harness(workdir, pki, namespace(), headless, *pods) as h:
        one = h.get("web-1.web.emojivoto.svc.cluster.local:80")
        first = await one.next()
        assert addrs(first) == ["10.1.0.2:8080"]
        assert by_addr(first)["10.1.0.2:8080"]["tls_identity"] == "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
        everyone = h.get(authority())
        assert addrs(await everyone.next()) == ["10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"]

        nobody = h.get("web-7.web.emojivoto.svc.cluster.local:80")
        assert await nobody.next() == {"no_endpoints": {"exists": True}}
        h.delete("Pod", "web-1")
        assert await one.next() == {"remove": ["10.1.0.2:8080"]}
        assert await everyone.next() == {"remove": ["10.1.0.2:8080"]}
        assert h.metric("endpoints_subscribers", {"cluster": "local", "namespace": NS, "service": "web", "port": "80",
                                                  "hostname": "web-1", "nodename": ""}) == 1


async def test_get_profile_of_a_hostname_is_that_pods_endpoint_profile(workdir: Path, pki: Pki) -> None:
    stateful = pod("web-0", "10.1.0.1", template_hash=None)
    stateful["spec"].update(hostname="web-0", subdomain="web")
    async with Harness(workdir, pki, namespace(), service(cluster_ip="None"), stateful) as h:
        profile = await h.get_profile("web-0.web.emojivoto.svc.cluster.local:8080").next()
        assert profile["endpoint"]["addr"] == "10.1.0.1:8080"
        assert profile["endpoint"]["tls_identity"] == "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
        assert not profile.get("fully_qualified_name")  # an endpoint profile, not the Service's
        missing = h.get_profile("web-9.web.emojivoto.svc.cluster.local:8080")
        assert await missing.code() == grpc.StatusCode.NOT_FOUND


async def test_external_workload_endpoints_carry_the_spiffe_identity(workdir: Path, pki: Pki) -> None:
    billing = service("billing", selector={}, ports=[{"name": "http", "port": 80, "targetPort": 8080}])
    slice_ = endpoint_slice("billing-ew", "billing", [{
        "addresses": ["192.168.50.10"], "conditions": {"ready": True},
        "targetRef": {"kind": "ExternalWorkload", "name": "legacy-billing", "namespace": NS},
    }], ports=[{"name": "http", "port": 8080}])
    async with Harness(workdir, pki, namespace(), billing, slice_, external_workload("legacy-billing", "192.168.50.10")) as h:
        [endpoint] = (await h.get(authority("billing")).next())["add"]["addrs"]
        assert endpoint["addr"] == "192.168.50.10:8080"
        assert endpoint["tls_identity"] == SPIFFE_ID  # a URI-like identity, as the proxy verifies it
        assert endpoint["server_name"] == "legacy-billing.cluster.local"
        assert endpoint["protocol_hint"] == "h2"
        assert endpoint["metric_labels"]["external_workload"] == "legacy-billing"
        assert endpoint["resource"] == {"kind": "ExternalWorkload", "namespace": NS, "name": "legacy-billing"}


async def test_get_profile_on_a_workload_ip_is_its_endpoint_profile(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), external_workload("legacy-billing", "192.168.50.10")) as h:
        stream = h.get_profile("192.168.50.10:8080")
        endpoint = (await stream.next())["endpoint"]
        assert (endpoint["tls_identity"], endpoint["server_name"]) == (SPIFFE_ID, "legacy-billing.cluster.local")
        assert endpoint["metric_labels"]["external_workload"] == "legacy-billing"
        unknown = (await h.get_profile("192.168.50.10:9999").next())["endpoint"]  # a port it does not declare
        assert "tls_identity" not in unknown
        h.delete("ExternalWorkload.workload.linkerd.io", "legacy-billing")
        assert "tls_identity" not in (await stream.next())["endpoint"]


async def test_bad_entries_are_reported_and_skipped_and_the_watch_goes_on(workdir: Path, pki: Pki) -> None:
    db = service("db", selector={}, ports=[{"name": "http", "port": 80, "targetPort": 5432}])
    bad = endpoint_slice("db-1", "db", [{"addresses": ["10.9.0.1"]}, {"addresses": ["fd00::9"]},
                                        {"addresses": ["not-an-ip"]}])
    async with Harness(workdir, pki, namespace(), db, bad) as h:
        stream = h.get(authority("db"))
        assert addrs(await stream.next()) == ["10.9.0.1:5432"]
        assert h.metric("endpointslice_invalid_entries_total", {"namespace": NS}) == 2
        # The local platform's ExternalWorkload controller recorded a Warning Event on the slice (its first
        # pass was awaited by the harness), naming the fields; `tether get events` shows it.
        [event] = h.store.list("Event", NS).items
        assert (event["type"], event["reason"], event["involvedObject"]["name"]) == ("Warning", "InvalidEndpoints", "db-1")
        assert "endpoints[1].addresses[0]: 'fd00::9'" in event["message"]
        assert "endpoints[2].addresses[0]: 'not-an-ip'" in event["message"]
        table = render([event], None, single=False, all_namespaces=False)
        assert table.split("\n")[0].split() == ["NAME", "TYPE", "REASON", "OBJECT", "MESSAGE", "AGE"]
        assert "Warning   InvalidEndpoints   endpointslice/db-1   skipping entries: endpoints[1]" in table
        h.apply(endpoint_slice("db-2", "db", [{"addresses": ["10.9.0.2"]}]))  # later changes still arrive
        assert addrs(await stream.next()) == ["10.9.0.2:5432"]


async def test_the_external_workload_controller_follows_the_ready_condition(workdir: Path, pki: Pki) -> None:
    billing = service("billing", selector={"app": "billing"}, ports=[{"name": "http", "port": 80, "targetPort": "http"}])
    objects = [namespace(), billing, external_workload("vm-1", "192.168.50.10"),
               external_workload("vm-2", "192.168.50.11", ready=False)]
    async with Harness(workdir, pki, *objects) as h:
        slices = {s["metadata"]["name"]: s for s in h.store.list("EndpointSlice.discovery.k8s.io", NS).items}
        [name] = [n for n in slices if n.startswith("linkerd-external-billing-")]
        written = slices[name]
        assert written["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == (
            "linkerd-external-workloads-controller")
        assert written["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]  # the workload's named port
        assert [e["conditions"]["ready"] for e in written["endpoints"]] == [True, False]

        stream = h.get(authority("billing"))
        [endpoint] = (await stream.next())["add"]["addrs"]
        assert (endpoint["addr"], endpoint["tls_identity"]) == ("192.168.50.10:8080", SPIFFE_ID)
        h.apply(external_workload("vm-2", "192.168.50.11"))  # its agent reports Ready
        assert addrs(await stream.next()) == ["192.168.50.11:8080"]
        h.apply(external_workload("vm-1", "192.168.50.10", ready=False))
        assert await stream.next() == {"remove": ["192.168.50.10:8080"]}
