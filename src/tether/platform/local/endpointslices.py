"""The local platform's EndpointSlice controller: Services with selectors -> EndpointSlices in the store.

It does for the local platform what Kubernetes' EndpointSlice controller does on a cluster, so
the destination reads endpoints the same way on both (``tether.destination.watcher.endpoints``):

* every Service with a non-empty selector (not ExternalName) gets EndpointSlices labelled
  ``kubernetes.io/service-name: <svc>`` and ``endpointslice.kubernetes.io/managed-by:``
  `MANAGED_BY`, owned by the Service; Services without a selector are left to whoever writes
  their slices (by hand, or the ExternalWorkload controller);
* slices are kept per address family of the Service (`service_families`: ``ipFamilies``, as
  the API server would default it), one per family even when empty; each selected pod that
  has not finished is one endpoint in each of those families it has an IP of
  (``status.podIPs``, else ``podIP``), as on a dual-stack cluster: ``ready`` when its
  ``Ready`` condition is True and it is not terminating (or the Service publishes not-ready
  addresses), ``serving`` when Ready, ``terminating`` when it has a ``deletionTimestamp``;
  ``hostname`` when the pod's ``spec.subdomain`` names the Service and it has
  ``spec.hostname`` (StatefulSet-style DNS); ``nodeName``; ``zone`` when the platform has one;
  ``targetRef`` the Pod;
* the ports are the Service's, each resolved on the pod (a named ``targetPort`` is looked up
  in its containers); pods whose ports resolve differently go in different slices, and a pod
  on which a named port does not resolve is left out, as Kubernetes does;
* slices it manages are rewritten when they differ and deleted when their Service or its
  selector goes.

`desired_slices` is the pure rule (over ``tether.platform.endpointslices``); `EndpointSliceController`
runs the shared loop over the store.  Caller: ``tether platform run`` (``tether.cli.up``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from tether.platform.endpointslices import (
    Admit,
    Desired,
    Member,
    Obj,
    SliceController,
    WriteFailed,
    selected,
    selects,
    slices_for,
)
from tether.platform.external_workloads import MANAGED_BY as EW_MANAGED_BY
from tether.platform.external_workloads import external_workload_slices
from tether.platform.local.events import StoreEvents
from tether.platform.local.watch import LocalResourceWatcher
from tether.platform.local.ipam import AddressTaken, Ipam, IpamError, is_workload_owner, workload_owner
from tether.platform.problems import ADDRESS_IN_USE, ProblemReporter, Rejected
from tether.resources.kinds import ENDPOINT_SLICE, EXTERNAL_WORKLOAD, POD
from tether.store import Store, StoreError

log = logging.getLogger(__name__)

__all__ = ["MANAGED_BY", "EndpointSliceController", "StoreWriter", "desired_slices", "external_workload_controller",
           "selects", "WorkloadAddresses"]

MANAGED_BY = "endpointslice-controller.local.tether.io"
_FINISHED = ("Succeeded", "Failed")


def _condition(pod: Mapping[str, Any], kind: str) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _pod_ports(pod: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    return {(p["name"], p.get("protocol", "TCP")): int(p["containerPort"])
            for c in (pod.get("spec") or {}).get("containers") or () for p in c.get("ports") or () if p.get("name")}


def _pod_endpoint(pod: Mapping[str, Any], service: Mapping[str, Any], zone: str | None, ip: str) -> Obj:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    ready_condition = _condition(pod, "Ready")
    terminating = meta.get("deletionTimestamp") is not None
    publish = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    endpoint: Obj = {
        "addresses": [ip],
        "conditions": {"ready": publish or (ready_condition and not terminating), "serving": ready_condition,
                       "terminating": terminating},
        "targetRef": {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"], "uid": meta.get("uid", "")},
    }
    if spec.get("hostname") and spec.get("subdomain") == service["metadata"]["name"]:
        endpoint["hostname"] = spec["hostname"]
    if spec.get("nodeName"):
        endpoint["nodeName"] = spec["nodeName"]
    if zone:
        endpoint["zone"] = zone
    return endpoint


def _family(ip: str) -> str | None:
    try:
        return "IPv6" if ipaddress.ip_address(ip).version == 6 else "IPv4"
    except ValueError:
        return None  # (the store's model refuses such a pod; never let one stop the controller)


def service_families(service: Mapping[str, Any]) -> tuple[str, ...]:
    """The address families a Service's slices are kept for (Kubernetes' controller: ``spec.ipFamilies``).

    On a cluster the API server always sets ``ipFamilies``; the local store does not, so the
    defaulting is done here: a ``PreferDualStack`` or ``RequireDualStack`` policy means both,
    otherwise the family of the cluster IP, and IPv4 (the local platform's only family) for a
    headless Service.
    """
    spec = service.get("spec") or {}
    families = tuple(f for f in ("IPv4", "IPv6") if f in (spec.get("ipFamilies") or ()))
    if families:
        return families
    if spec.get("ipFamilyPolicy") in ("PreferDualStack", "RequireDualStack"):
        return ("IPv4", "IPv6")
    return (_family(str(spec.get("clusterIP"))) or "IPv4",)


def _pod_ips(pod: Mapping[str, Any]) -> list[str]:
    """``status.podIPs`` (one per family on a dual-stack node), else ``status.podIP``."""
    status = pod.get("status") or {}
    ips = [entry.get("ip") for entry in status.get("podIPs") or () if isinstance(entry, Mapping)]
    return [ip for ip in ips if isinstance(ip, str) and ip] or ([status["podIP"]] if status.get("podIP") else [])


def desired_slices(service: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], zone: str | None = None) -> list[Obj]:
    """The EndpointSlices Kubernetes' controller would keep for ``service`` (one with a selector): per address
    family of the Service, one endpoint for each pod with an IP of that family."""
    families = service_families(service)
    members = [
        Member(ip, _pod_ports(pod), _pod_endpoint(pod, service, zone, ip))
        for pod in selected(service, pods)
        if (pod.get("status") or {}).get("phase") not in _FINISHED
        for ip in _pod_ips(pod) if _family(ip) in families
    ]
    return slices_for(service, members, managed_by=MANAGED_BY, placeholders=families)


class StoreWriter:
    """Writes slices to the local store (one transaction per pass, on a worker thread)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def write(self, slices: list[tuple[Obj, Obj | None]]) -> None:
        try:
            await asyncio.to_thread(self._store.apply_many, [s for s, _ in slices])
        except StoreError as exc:
            raise WriteFailed(f"the store failed: {exc}") from None

    async def delete(self, slices: list[Obj]) -> None:
        keys = [(ENDPOINT_SLICE.key, s["metadata"]["namespace"], s["metadata"]["name"]) for s in slices]
        try:
            await asyncio.to_thread(self._store.delete_many, keys)
        except StoreError as exc:
            raise WriteFailed(f"the store failed: {exc}") from None


class EndpointSliceController(SliceController):
    """The shared loop over the store: pods by default (`desired_slices`), or ``source``/``desired`` given."""

    def __init__(self, store: Store, *, source: str = POD.key, managed_by: str = MANAGED_BY,
                 desired: Desired | None = None, reporter: ProblemReporter | None = None,
                 admit: Admit | None = None) -> None:
        super().__init__(LocalResourceWatcher(store), StoreWriter(store), source=source, managed_by=managed_by,
                         desired=desired or desired_slices, reporter=reporter, admit=admit)


class WorkloadAddresses:
    """The ExternalWorkload controller's `Admit` on the local platform: each workload's IP, when it is in the
    pod range, is reserved in the pod IPAM (``tether.platform.local.ipam``), so no pod is handed it; a
    workload whose IP a pod (or another workload, or the gateway) holds is left out of the endpoints and
    gets a Warning Event ``AddressInUse`` naming the holder, and is tried again every few seconds.
    Reservations of workloads that are gone, or moved, are released."""

    def __init__(self, ipam: Ipam, reporter: ProblemReporter) -> None:
        self._ipam = ipam
        self._reporter = reporter
        self._held: dict[str, str] | None = None  # owner -> address; None until the first pass

    def __call__(self, workloads: list[Obj]) -> tuple[list[Obj], bool]:
        if self._held is None:  # reservations a previous run left are known from the IPAM itself
            self._held = {o: str(a.ip) for o, a in self._ipam.allocations().items() if is_workload_owner(o)}
        admitted, wanted, refused = [], set(), False
        for workload in workloads:
            meta = workload["metadata"]
            ips = [e.get("ip") for e in (workload.get("spec") or {}).get("workloadIPs") or ()]
            problems: tuple[str, ...] = ()
            if ips:
                owner = workload_owner(meta["namespace"], meta["name"])
                try:
                    if self._held.get(owner) == ips[0] or self._ipam.reserve(owner, ips[0]):
                        self._held[owner] = ips[0]
                        wanted.add(owner)  # (an address outside the range needs no reservation)
                except AddressTaken as exc:
                    problems = (f"spec.workloadIPs[0].ip: {exc}",)
                except IpamError as exc:
                    log.warning("ExternalWorkload %s/%s: cannot reserve %s: %s", meta["namespace"], meta["name"],
                                ips[0], exc)
            self._reporter.note(ADDRESS_IN_USE, (meta["namespace"], meta["name"]), workload,
                                "left out of its Services' endpoints", problems)
            refused = refused or bool(problems)
            if not problems:
                admitted.append(workload)
        for owner in [o for o in self._held if o not in wanted]:
            try:
                self._ipam.release(owner)
                del self._held[owner]
            except IpamError as exc:
                log.warning("cannot release %s: %s", owner, exc)
        return admitted, refused


def external_workload_controller(store: Store, ipam: Ipam | None = None,
                                 rejected: Rejected | None = None) -> EndpointSliceController:
    """The ExternalWorkload controller over the store (``tether.platform.external_workloads``); it also
    records Warning Events on ExternalWorkloads and EndpointSlices it cannot use (``tether.platform.problems``),
    counting each workload left out in ``rejected``, and, given the platform's pod ``ipam``, reserves the
    workloads' addresses there (`WorkloadAddresses`)."""
    reporter = ProblemReporter(StoreEvents(store), rejected)
    return EndpointSliceController(store, source=EXTERNAL_WORKLOAD.key, managed_by=EW_MANAGED_BY,
                                   desired=external_workload_slices, reporter=reporter,
                                   admit=WorkloadAddresses(ipam, reporter) if ipam is not None else None)
