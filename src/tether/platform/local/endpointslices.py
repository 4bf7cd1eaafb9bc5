"""The local platform's EndpointSlice controller: Services with selectors -> EndpointSlices in the store.

It does for the local platform what Kubernetes' EndpointSlice controller does on a cluster, so
the destination reads endpoints the same way on both (``tether.destination.watcher.endpoints``):

* every Service with a non-empty selector (not ExternalName) gets EndpointSlices labelled
  ``kubernetes.io/service-name: <svc>`` and ``endpointslice.kubernetes.io/managed-by:``
  `MANAGED_BY`, owned by the Service; Services without a selector are left to whoever writes
  their slices (by hand, or the ExternalWorkload controller);
* each selected pod with an IP that has not finished is one endpoint: ``ready`` when its
  ``Ready`` condition is True and it is not terminating (or the Service publishes not-ready
  addresses), ``serving`` when Ready, ``terminating`` when it has a ``deletionTimestamp``;
  ``hostname`` when the pod's ``spec.subdomain`` names the Service and it has
  ``spec.hostname`` (StatefulSet-style DNS); ``nodeName``; ``zone`` when the platform has one;
  ``targetRef`` the Pod;
* the ports are the Service's, each resolved on the pod (a named ``targetPort`` is looked up
  in its containers); pods whose ports resolve differently go in different slices, and a pod
  on which a named port does not resolve is left out, as Kubernetes does; a Service with no
  endpoints keeps one empty slice;
* slices it manages are rewritten when they differ and deleted when their Service or its
  selector goes.

`desired_slices` is the pure rule; `EndpointSliceController` watches Services, Pods and
EndpointSlices in the store and applies it whenever one changes.  Caller: ``tether platform
run`` (``tether.cli.up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tether.platform.local.watch import LocalResourceWatcher
from tether.resources.discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from tether.resources.kinds import ENDPOINT_SLICE, POD, SERVICE
from tether.resources.selectors import LabelSelector
from tether.store import Store, StoreError

log = logging.getLogger(__name__)

MANAGED_BY = "endpointslice-controller.local.tether.io"
_FINISHED = ("Succeeded", "Failed")

Key = tuple[str, str]
Obj = dict[str, Any]


def _condition(pod: Mapping[str, Any], kind: str) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _resolve(port: Mapping[str, Any], named: Mapping[tuple[str, str], int]) -> int | None:
    """A Service port's target on one member: the number, or the member's port of that name and protocol."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    return named.get((str(target), port.get("protocol", "TCP")))


def _pod_ports(pod: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    return {(p["name"], p.get("protocol", "TCP")): int(p["containerPort"])
            for c in (pod.get("spec") or {}).get("containers") or () for p in c.get("ports") or () if p.get("name")}


def selects(service: Mapping[str, Any]) -> bool:
    """Whether the controllers manage this Service's slices: a non-empty selector, not ExternalName."""
    spec = service.get("spec") or {}
    return bool(spec.get("selector")) and spec.get("type") != "ExternalName"


def _pod_endpoint(pod: Mapping[str, Any], service: Mapping[str, Any], zone: str | None) -> Obj:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    ready_condition = _condition(pod, "Ready")
    terminating = meta.get("deletionTimestamp") is not None
    publish = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    endpoint: Obj = {
        "addresses": [(pod.get("status") or {})["podIP"]],
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


@dataclass(frozen=True, slots=True)
class Member:
    """One endpoint-to-be: its address, its named ports, and the endpoint entry."""

    ip: str
    named_ports: Mapping[tuple[str, str], int]
    endpoint: Obj


def slices_for(service: Mapping[str, Any], members: Iterable[Member], *, managed_by: str, prefix: str = "",
               placeholder: bool = True) -> list[Obj]:
    """``service``'s slices over ``members``: grouped by address family and resolved ports, one per group.

    A member on which a named target port does not resolve is left out, as Kubernetes does;
    ``placeholder`` keeps one empty slice when nothing is left (Kubernetes' controller does).
    """
    meta = service["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    service_ports = (service.get("spec") or {}).get("ports") or ()
    groups: dict[tuple[str, tuple[tuple[str, int, str], ...]], list[Obj]] = {}
    for member in members:
        ports = []
        for port in service_ports:
            number = _resolve(port, member.named_ports)
            if number is None:
                break
            ports.append((port.get("name") or "", number, port.get("protocol", "TCP")))
        else:
            family = "IPv6" if ipaddress.ip_address(member.ip).version == 6 else "IPv4"
            groups.setdefault((family, tuple(ports)), []).append(member.endpoint)
    if not groups and placeholder:
        groups[("IPv4", ())] = []
    out = []
    for (family, ports), endpoints in sorted(groups.items()):
        digest = hashlib.sha256(json.dumps([family, ports]).encode()).hexdigest()[:5]
        labels = {**(meta.get("labels") or {}), SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: managed_by}
        out.append({
            "apiVersion": ENDPOINT_SLICE.api_version,
            "kind": ENDPOINT_SLICE.kind,
            "metadata": {
                "name": f"{prefix}{name}-{digest}", "namespace": namespace, "labels": labels,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": meta.get("uid", ""),
                                     "controller": True, "blockOwnerDeletion": True}],
            },
            "addressType": family,
            "endpoints": endpoints,
            "ports": [{"name": n, "port": p, "protocol": proto} for n, p, proto in ports],
        })
    return out


def selected(service: Mapping[str, Any], objects: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The objects of the Service's namespace its selector matches, by name."""
    namespace = service["metadata"]["namespace"]
    selector = LabelSelector.for_service((service.get("spec") or {}).get("selector"), "spec.selector")
    return sorted((o for o in objects if o["metadata"].get("namespace") == namespace
                   and selector.matches(o["metadata"].get("labels") or {})), key=lambda o: o["metadata"]["name"])


def desired_slices(service: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], zone: str | None = None) -> list[Obj]:
    """The EndpointSlices Kubernetes' controller would keep for ``service`` (one with a selector)."""
    members = [
        Member(pod["status"]["podIP"], _pod_ports(pod), _pod_endpoint(pod, service, zone))
        for pod in selected(service, pods)
        if (pod.get("status") or {}).get("podIP") and pod["status"].get("phase") not in _FINISHED
    ]
    return slices_for(service, members, managed_by=MANAGED_BY)


def _content(obj: Mapping[str, Any]) -> str:
    """What the controller owns of a slice, to compare with what is stored."""
    meta = obj["metadata"]
    return json.dumps([meta.get("labels"), meta.get("ownerReferences"), obj.get("addressType"), obj.get("endpoints"),
                       obj.get("ports")], sort_keys=True)


Desired = Callable[[Mapping[str, Any], list[Obj]], list[Obj]]


class EndpointSliceController:
    """Keeps the store's EndpointSlices in step with its Services and their members; `run` until cancelled.

    By default the members are Pods (Kubernetes' EndpointSlice controller, `desired_slices`);
    ``tether.platform.local.external_workloads`` runs one over ExternalWorkloads. Each only
    touches the slices labelled with its own ``managed_by``.
    """

    def __init__(self, store: Store, *, source: str = POD.key, managed_by: str = MANAGED_BY,
                 desired: Desired | None = None) -> None:
        self._store = store
        self._source = source
        self._managed_by = managed_by
        self._desired: Desired = desired or desired_slices
        self._watched = (SERVICE.key, source, ENDPOINT_SLICE.key)
        self._objects: dict[str, dict[Key, Obj]] = {kind: {} for kind in self._watched}
        self._synced: set[str] = set()
        self._dirty = asyncio.Event()
        self.passes = 0
        self.reconciled = asyncio.Event()  # set after each pass (tests await it)

    async def run(self) -> None:
        watcher = LocalResourceWatcher(self._store)
        feeds = [asyncio.create_task(self._feed(watcher, kind)) for kind in self._watched]
        try:
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                if len(self._synced) < len(self._watched):
                    continue
                try:
                    await asyncio.to_thread(self.reconcile)
                except StoreError as exc:
                    log.warning("EndpointSlices (%s): the store failed, trying again at the next change: %s",
                                self._managed_by, exc)
                self.passes += 1
                self.reconciled.set()
        finally:
            for task in feeds:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*feeds, return_exceptions=True)

    async def _feed(self, watcher: LocalResourceWatcher, kind: str) -> None:
        async for event in watcher.watch(kind):
            if event.type == "SYNCED":
                self._synced.add(kind)
            elif event.type == "DELETED":
                self._objects[kind].pop(event.key, None)
            else:
                assert event.object is not None
                self._objects[kind][event.key] = dict(event.object)
            self._dirty.set()

    def reconcile(self) -> None:
        """One pass: write the slices that differ, delete the managed ones no Service wants."""
        services = dict(self._objects[SERVICE.key])
        members = list(self._objects[self._source].values())
        stored = {k: s for k, s in self._objects[ENDPOINT_SLICE.key].items()
                  if (s["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == self._managed_by}
        wanted: dict[Key, Obj] = {}
        for service in services.values():
            if selects(service):
                for slice_ in self._desired(service, members):
                    wanted[(slice_["metadata"]["namespace"], slice_["metadata"]["name"])] = slice_
        writes = [s for key, s in wanted.items() if key not in stored or _content(stored[key]) != _content(s)]
        deletes = [(ENDPOINT_SLICE.key, ns, name) for ns, name in stored if (ns, name) not in wanted]
        if writes:
            self._store.apply_many(writes)
        if deletes:
            self._store.delete_many(deletes)
        if writes or deletes:
            log.debug("EndpointSlices (%s): wrote %d, deleted %d", self._managed_by, len(writes), len(deletes))
