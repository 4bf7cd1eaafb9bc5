"""The ExternalWorkload controller on Kubernetes, against kmock (a mock of the API server, not a cluster).

The controller ``tether destination serve --platform kubernetes`` runs watches Services,
ExternalWorkloads and EndpointSlices over the API and writes Linkerd's
``linkerd-external-<svc>-*`` slices back, while it holds the writers' Lease: created when a
Service selects a workload, replaced
(a merge patch) when the workload's Ready condition changes, deleted when the Service goes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tether.platform.kubernetes.endpointslices import LEASE_NAME, external_workload_controller
from tether.platform.kubernetes.lease import LeaseElector
from tether.platform.kubernetes.watch import KubernetesResourceWatcher

from .kube_helpers import emulated_api, watching

NS = "billing"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
WORKLOADS = f"/apis/workload.linkerd.io/v1beta1/namespaces/{NS}/externalworkloads"


def workload(ready: bool) -> dict[str, Any]:
    return {"apiVersion": "workload.linkerd.io/v1beta1", "kind": "ExternalWorkload",
            "metadata": {"name": "vm-1", "namespace": NS, "labels": {"app": "billing"}, "uid": "ew-uid"},
            "spec": {"meshTLS": {"identity": "spiffe://cluster.local/vm/vm-1", "serverName": "vm-1.cluster.local"},
                     "ports": [{"name": "http", "port": 8080}], "workloadIPs": [{"ip": "192.168.50.10"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "billing", "namespace": NS, "uid": "svc-uid"},
           "spec": {"selector": {"app": "billing"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}


async def _seed(api: Any) -> None:
    """The kinds the controller watches, a Service selecting app=billing and a ready workload."""
    for group_version_plural in ("discovery.k8s.io/v1/endpointslices", "workload.linkerd.io/v1beta1/externalworkloads"):
        api.resources[group_version_plural] = {}
    await api.post(f"/api/v1/namespaces/{NS}/services", json=SERVICE)
    await api.post(WORKLOADS, json=workload(ready=True))


async def _slices(api: Any) -> list[dict[str, Any]]:
    response = await api.get(SLICES)
    return (await response.json()).get("items") or []


async def _until(api: Any, check: Any, what: str) -> list[dict[str, Any]]:
    async with asyncio.timeout(20):
        while not check(slices := await _slices(api)):
            await asyncio.sleep(0.05)  # kmock offers no notification of writes: poll its state
    return slices


async def test_slices_follow_services_and_workload_readiness(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _seed(api)
        controller = asyncio.create_task(external_workload_controller(KubernetesResourceWatcher(settings)).run())
        try:
            [written] = await _until(api, lambda s: len(s) == 1, "the slice")
            assert written["metadata"]["name"].startswith("linkerd-external-billing-")
            labels = written["metadata"]["labels"]
            assert labels["endpointslice.kubernetes.io/managed-by"] == "linkerd-external-workloads-controller"
            assert labels["kubernetes.io/service-name"] == "billing"
            assert written["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
            [endpoint] = written["endpoints"]
            assert endpoint["addresses"] == ["192.168.50.10"] and endpoint["conditions"]["ready"] is True
            assert endpoint["targetRef"]["kind"] == "ExternalWorkload" and endpoint["targetRef"]["name"] == "vm-1"

            await watching(api, 3)
            await api.patch(f"{WORKLOADS}/vm-1", json={"status": workload(ready=False)["status"]})
            await _until(api, lambda s: s and s[0]["endpoints"][0]["conditions"]["ready"] is False, "not ready")
            assert [r.url.path for r in api["patch"] if "endpointslices" in r.url.path], "patched, not recreated"

            await api.delete(f"/api/v1/namespaces/{NS}/services/billing")
            await _until(api, lambda s: s == [], "the slice deleted")
        finally:
            controller.cancel()
            await asyncio.gather(controller, return_exceptions=True)


async def test_one_replica_leads_and_another_takes_over_when_the_lease_expires(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api.resources["coordination.k8s.io/v1/leases"] = {}
        now = [1_000_000.0]
        client = KubernetesResourceWatcher(settings).client
        a, b = (LeaseElector(client, "linkerd", LEASE_NAME, who, clock=lambda: now[0]) for who in ("a", "b"))
        assert await a.try_once() is True  # no Lease yet: created, held by a
        assert await b.try_once() is False  # held and fresh
        now[0] += 10
        assert await a.try_once() is True  # renewed
        now[0] += 31
        assert await b.try_once() is True  # a stopped renewing: b takes it
        assert await a.try_once() is False
        response = await api.get(f"/apis/coordination.k8s.io/v1/namespaces/linkerd/leases/{LEASE_NAME}")
        spec = (await response.json())["spec"]
        assert (spec["holderIdentity"], spec["leaseTransitions"], spec["leaseDurationSeconds"]) == ("b", 1, 30)
        await client.close()


async def test_the_controller_writes_only_while_leading(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _seed(api)
        leading = asyncio.Event()
        controller = external_workload_controller(KubernetesResourceWatcher(settings), leading)
        task = asyncio.create_task(controller.run())
        try:
            await watching(api, 3)  # every watch is open and has listed: the controller is waiting to lead
            assert controller.passes == 0 and await _slices(api) == []
            leading.set()
            await _until(api, lambda s: len(s) == 1, "the slice")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _events(api: Any) -> list[dict[str, Any]]:
    return [r.data for r in api["post"] if r.url.path == f"/api/v1/namespaces/{NS}/events"]


async def test_a_bad_workload_or_slice_gets_a_warning_event_naming_the_field(tmp_path: Path) -> None:
    """A workload with a bad IP is left out (the controller keeps running and serves the good one), and
    the leader records a Warning Event on it and on a hand-written slice with a bad address, once each."""
    async with emulated_api(tmp_path) as (api, _, settings):
        await _seed(api)
        bad = workload(ready=True)
        bad["metadata"] = {**bad["metadata"], "name": "vm-bad", "uid": "bad-uid"}
        bad["spec"] = {**bad["spec"], "workloadIPs": [{"ip": "192.168.50.300"}]}
        await api.post(WORKLOADS, json=bad)
        await api.post(SLICES, json={
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "manual", "namespace": NS, "labels": {"kubernetes.io/service-name": "manual"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["fe80::1"]}],
            "ports": [{"port": 80}]})
        rejected: list[tuple[str, str]] = []
        controller = external_workload_controller(KubernetesResourceWatcher(settings),
                                                  rejected=lambda *counted: rejected.append(counted))
        task = asyncio.create_task(controller.run())
        try:
            await _until(api, lambda s: len(s) == 2, "the good workload's slice beside the manual one")
            [ours] = [s for s in await _slices(api) if s["metadata"]["name"].startswith("linkerd-")]
            assert [e["targetRef"]["name"] for e in ours["endpoints"]] == ["vm-1"]
            async with asyncio.timeout(20):
                while len(await _events(api)) < 2:
                    await asyncio.sleep(0.05)  # kmock offers no notification of writes: poll its state
            events = {e["involvedObject"]["kind"]: e for e in await _events(api)}
            workload_event, slice_event = events["ExternalWorkload"], events["EndpointSlice"]
            assert workload_event["type"] == "Warning" and workload_event["reason"] == "InvalidExternalWorkload"
            assert workload_event["involvedObject"]["name"] == "vm-bad"
            assert workload_event["involvedObject"]["uid"] == "bad-uid"
            assert "spec.workloadIPs[0].ip: '192.168.50.300' must be an IP address" in workload_event["message"]
            assert slice_event["reason"] == "InvalidEndpoints" and slice_event["involvedObject"]["name"] == "manual"
            assert "endpoints[1].addresses[0]" in slice_event["message"]
            assert workload_event["source"]["component"] == "linkerd-destination"
            assert rejected == [(NS, "InvalidExternalWorkload")]  # counted as its Event; the slice's is not

            # Another pass (the good workload changes) reports nothing again.
            await api.patch(f"{WORKLOADS}/vm-1", json={"status": workload(ready=False)["status"]})
            await _until(api, lambda s: any(x["endpoints"] and x["endpoints"][0]["conditions"]["ready"] is False
                                            for x in s if x["metadata"]["name"].startswith("linkerd-")), "not ready")
            passes = controller.passes
            await api.patch(f"{WORKLOADS}/vm-bad", json={"metadata": {"labels": {"app": "billing", "v": "2"}}})
            async with asyncio.timeout(20):
                while controller.passes == passes:
                    await controller.reconciled.wait()
                    controller.reconciled.clear()
            assert len(await _events(api)) == 2, "the same problems are reported once"
            assert rejected == [(NS, "InvalidExternalWorkload")], "and counted once"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
