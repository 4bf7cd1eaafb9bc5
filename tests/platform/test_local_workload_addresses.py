"""Local Events expire as the API server's do. The local ExternalWorkload controller reserves workloads' addresses in the pod IPAM (real SQLite store
and IPAM files; no network namespaces): a pod is never handed a VM's address, a workload whose address a
pod holds is left out of the endpoints with an ``AddressInUse`` Warning Event naming the pod, and picked
up once the pod lets it go; a deleted workload's reservation is released."""

from __future__ import annotations

import asyncio
import ipaddress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tether.platform import endpointslices
from tether.platform.local.endpointslices import external_workload_controller
from tether.platform.local.events import StoreEvents, expired
from tether.platform.local.ipam import Ipam, IpamConfig, PoolExhausted, workload_owner
from tether.platform.local.pods import Counters, PodController
from tether.platform.problems import Involved
from tether.store import Store

NS = "billing"


def _workload(name: str, ip: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "workload.linkerd.io/v1beta1", "kind": "ExternalWorkload",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "billing", **labels}},
            "spec": {"meshTLS": {"identity": f"spiffe://cluster.local/vm/{name}", "serverName": f"{name}.cluster.local"},
                     "ports": [{"name": "http", "port": 8080}], "workloadIPs": [{"ip": ip}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "billing", "namespace": NS},
           "spec": {"selector": {"app": "billing"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}


def _endpoints(store: Store) -> list[str]:
    return sorted(a for s in store.list("EndpointSlice.discovery.k8s.io", NS).items
                  for e in s["endpoints"] for a in e["addresses"])


async def _until(controller: Any, check: Any) -> None:
    async with asyncio.timeout(20):
        while not check():
            controller.reconciled.clear()
            await controller.reconciled.wait()


async def test_workload_addresses_are_reserved_and_a_pods_address_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(endpointslices, "ADMIT_RETRY_S", 0.1)  # a refused workload is looked at again soon
    store = Store(tmp_path / "store.db", poll_interval=0.2)
    ipam = Ipam(IpamConfig(state_dir=tmp_path / "state", pod_cidr=ipaddress.IPv4Network("10.9.0.0/29")))
    assert str(ipam.allocate(f"{NS}/web-0").ip) == "10.9.0.2"  # a pod's address
    store.apply_many([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, SERVICE,
                      _workload("vm-1", "10.9.0.2"), _workload("vm-2", "10.9.0.4"),
                      _workload("vm-3", "192.168.50.10")])
    counters = Counters()
    controller = external_workload_controller(store, ipam, counters.workload_rejected)
    task = asyncio.create_task(controller.run())
    try:
        await _until(controller, lambda: _endpoints(store) == ["10.9.0.4", "192.168.50.10"])
        held = {o: str(a.ip) for o, a in ipam.allocations().items()}
        assert held == {f"{NS}/web-0": "10.9.0.2", workload_owner(NS, "vm-2"): "10.9.0.4"}  # vm-3 is outside
        assert [str(ipam.allocate(p).ip) for p in ("a/p", "b/p", "c/p")] == ["10.9.0.3", "10.9.0.5", "10.9.0.6"]
        with pytest.raises(PoolExhausted):
            ipam.allocate("d/p")  # .4 stays the VM's

        [event] = store.list("Event", NS).items
        assert (event["type"], event["reason"], event["involvedObject"]["name"]) == ("Warning", "AddressInUse", "vm-1")
        assert event["message"] == ("left out of its Services' endpoints: "
                                    "spec.workloadIPs[0].ip: 10.9.0.2 is the address of pod billing/web-0")

        ipam.release(f"{NS}/web-0")  # the pod is gone: the next look reserves the address for vm-1
        await _until(controller, lambda: _endpoints(store) == ["10.9.0.2", "10.9.0.4", "192.168.50.10"])
        assert str(ipam.allocations()[workload_owner(NS, "vm-1")].ip) == "10.9.0.2"

        store.delete("ExternalWorkload.workload.linkerd.io", NS, "vm-2")
        await _until(controller, lambda: workload_owner(NS, "vm-2") not in ipam.allocations())
        assert str(ipam.allocate("d/p").ip) == "10.9.0.4"
        assert len(store.list("Event", NS).items) == 1, "the conflict was reported once"
        assert counters.workloads_rejected == {(NS, "AddressInUse"): 1}
        # The local platform's admin port shows the count (its /metrics is PodController.metrics_text).
        text = PodController.metrics_text(SimpleNamespace(counters=counters))  # type: ignore[arg-type]
        assert f'tether_platform_externalworkload_rejected_total{{namespace="{NS}",reason="AddressInUse"}} 1' in text
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()


def test_events_expire_an_hour_after_they_were_last_seen(tmp_path: Path) -> None:
    """As the API server's --event-ttl: the Event not seen for over an hour goes, a fresher one stays."""
    store = Store(tmp_path / "store.db")
    try:
        store.apply_many([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
        events = StoreEvents(store)
        involved = Involved("v1", "Service", NS, "billing")
        events.record(involved, "Old", "seen long ago")
        events.record(involved, "Fresh", "seen again lately")
        events.record(involved, "Fresh", "seen again lately")  # a repeat counts up the same Event
        fresh = {e["reason"]: e for e in store.list("Event", NS).items}["Fresh"]
        assert fresh["count"] == 2
        now = datetime.strptime(fresh["lastTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        old = {e["reason"]: e for e in store.list("Event", NS).items}["Old"]
        store.apply({**old, "lastTimestamp": (now - timedelta(hours=1, seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")})
        assert [name for _, _, name in expired(store, now)] == [old["metadata"]["name"]]
        assert expired(store, now - timedelta(seconds=1), ttl=timedelta(hours=2)) == []
    finally:
        store.close()
