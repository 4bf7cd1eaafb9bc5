"""EndpointSlices as controllers keep them, on either platform: the shared rules and the reconcile loop.

Two controllers write EndpointSlices for Services with selectors: the EndpointSlice controller
for pods (Kubernetes' own on a cluster; ``tether.platform.local.endpointslices`` on the local
platform) and the ExternalWorkload controller (``tether.platform.external_workloads``, Linkerd's,
on both). They share what is here:

* `slices_for`: a Service's slices over its members (pods or workloads), grouped by address
  family and resolved ports, named ``<prefix><svc>-<hash>``, labelled
  ``kubernetes.io/service-name`` and ``endpointslice.kubernetes.io/managed-by``, owned by the
  Service;
* `SliceController`: watches Services, the members and EndpointSlices through a platform
  watch (``tether.platform.watch``), and after every change writes the slices that differ and
  deletes the ones it manages that no Service wants, through a `SliceWriter` (the store, or the
  API server). A failed write is tried again a second later. With a `ProblemReporter`
  (``tether.platform.problems``) it also checks its members and every EndpointSlice as they
  arrive: a member the resource model refuses is left out (never taking the loop down), and
  each pass records a Warning Event on what is newly wrong. An `Admit` hook sees each pass's
  members first (the local platform reserves ExternalWorkloads' addresses there).
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
from typing import Any, Protocol

from tether.platform.problems import ProblemReporter
from tether.platform.watch import ResourceWatcher
from tether.resources.discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from tether.resources.kinds import ENDPOINT_SLICE, SERVICE
from tether.resources.selectors import LabelSelector

log = logging.getLogger(__name__)

Key = tuple[str, str]
Obj = dict[str, Any]
RETRY_S = 1.0


def resolve_port(port: Mapping[str, Any], named: Mapping[tuple[str, str], int]) -> int | None:
    """A Service port's target on one member: the number, or the member's port of that name and protocol."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    return named.get((str(target), port.get("protocol", "TCP")))


def selects(service: Mapping[str, Any]) -> bool:
    """Whether the controllers manage this Service's slices: a non-empty selector, not ExternalName."""
    spec = service.get("spec") or {}
    return bool(spec.get("selector")) and spec.get("type") != "ExternalName"


@dataclass(frozen=True, slots=True)
class Member:
    """One endpoint-to-be: its address, its named ports, and the endpoint entry."""

    ip: str
    named_ports: Mapping[tuple[str, str], int]
    endpoint: Obj


def slices_for(service: Mapping[str, Any], members: Iterable[Member], *, managed_by: str, prefix: str = "",
               placeholders: tuple[str, ...] = ("IPv4",)) -> list[Obj]:
    """``service``'s slices over ``members``: grouped by address family and resolved ports, one per group.

    A member on which a named target port does not resolve is left out, as Kubernetes does;
    each address family in ``placeholders`` that no member is left in keeps one empty slice
    (Kubernetes' controller does, per family of the Service).
    """
    meta = service["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    service_ports = (service.get("spec") or {}).get("ports") or ()
    groups: dict[tuple[str, tuple[tuple[str, int, str], ...]], list[Obj]] = {}
    for member in members:
        ports = []
        for port in service_ports:
            number = resolve_port(port, member.named_ports)
            if number is None:
                break
            ports.append((port.get("name") or "", number, port.get("protocol", "TCP")))
        else:
            family = "IPv6" if ipaddress.ip_address(member.ip).version == 6 else "IPv4"
            groups.setdefault((family, tuple(ports)), []).append(member.endpoint)
    for family in set(placeholders) - {family for family, _ in groups}:
        groups[(family, ())] = []
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


def _content(obj: Mapping[str, Any]) -> str:
    """What the controller owns of a slice, to compare with what is stored."""
    meta = obj["metadata"]
    return json.dumps([meta.get("labels"), meta.get("ownerReferences"), obj.get("addressType"), obj.get("endpoints"),
                       obj.get("ports")], sort_keys=True)


Desired = Callable[[Mapping[str, Any], list[Obj]], list[Obj]]
# Each pass's members go through it: those it admits, and whether to look again later (a refusal may pass then).
Admit = Callable[[list[Obj]], tuple[list[Obj], bool]]
ADMIT_RETRY_S = 5.0


class WriteFailed(Exception):
    """A slice could not be written or deleted (the controller tries again)."""


class SliceWriter(Protocol):
    async def write(self, slices: list[tuple[Obj, Obj | None]]) -> None:
        """Create or replace each slice (paired with the stored one it replaces, None when new)."""
        ...

    async def delete(self, slices: list[Obj]) -> None:
        """Delete these stored slices."""
        ...


class SliceController:
    """Keeps the EndpointSlices labelled ``managed_by`` in step with Services and their members; `run` until cancelled."""

    def __init__(self, watcher: ResourceWatcher, writer: SliceWriter, *, source: str, managed_by: str,
                 desired: Desired, leading: asyncio.Event | None = None,
                 reporter: ProblemReporter | None = None, admit: Admit | None = None) -> None:
        """``leading``, when given, gates the writes (and the Events): only while it is set (a Lease held)."""
        self._reporter = reporter
        self._admit = admit
        self._retry: asyncio.TimerHandle | None = None  # one pending look again at refused members
        self._leading = leading
        self._watcher = watcher
        self._writer = writer
        self._source = source
        self._managed_by = managed_by
        self._desired = desired
        self._watched = (SERVICE.key, source, ENDPOINT_SLICE.key)
        self._objects: dict[str, dict[Key, Obj]] = {kind: {} for kind in self._watched}
        self._synced: set[str] = set()
        self._dirty = asyncio.Event()
        self.passes = 0
        self.reconciled = asyncio.Event()  # set after each pass (tests await it)

    async def run(self) -> None:
        feeds = [asyncio.create_task(self._feed(kind)) for kind in self._watched]
        try:
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                if len(self._synced) < len(self._watched):
                    continue
                if self._leading is not None and not self._leading.is_set():
                    await self._leading.wait()  # then plan from what the watches hold by then
                writes, deletes = self.plan()
                try:
                    if writes:
                        await self._writer.write(writes)
                    if deletes:
                        await self._writer.delete(deletes)
                except WriteFailed as exc:
                    log.warning("EndpointSlices (%s): %s; trying again", self._managed_by, exc)
                    asyncio.get_running_loop().call_later(RETRY_S, self._dirty.set)
                if writes or deletes:
                    log.debug("EndpointSlices (%s): wrote %d, deleted %d", self._managed_by, len(writes), len(deletes))
                if self._reporter is not None:
                    await self._reporter.flush()
                self.passes += 1
                self.reconciled.set()
        finally:
            if self._retry is not None:
                self._retry.cancel()
            for task in feeds:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*feeds, return_exceptions=True)

    async def _feed(self, kind: str) -> None:
        reporter = self._reporter if kind != SERVICE.key else None  # members and slices are checked
        async for event in self._watcher.watch(kind):
            if event.type == "SYNCED":
                self._synced.add(kind)
            elif event.type == "DELETED":
                self._objects[kind].pop(event.key, None)
                if reporter is not None:
                    reporter.check(kind, event.key, None)
            else:
                assert event.object is not None
                if reporter is None or reporter.check(kind, event.key, event.object):
                    self._objects[kind][event.key] = dict(event.object)
                else:
                    self._objects[kind].pop(event.key, None)
            self._dirty.set()

    def _look_again(self) -> None:
        self._retry = None
        self._dirty.set()

    def plan(self) -> tuple[list[tuple[Obj, Obj | None]], list[Obj]]:
        """The slices to write (with what they replace) and the managed ones no Service wants."""
        members = list(self._objects[self._source].values())
        if self._admit is not None:
            members, again = self._admit(members)
            if again and self._retry is None:
                self._retry = asyncio.get_running_loop().call_later(ADMIT_RETRY_S, self._look_again)
        stored = {k: s for k, s in self._objects[ENDPOINT_SLICE.key].items()
                  if (s["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == self._managed_by}
        wanted: dict[Key, Obj] = {}
        for service in self._objects[SERVICE.key].values():
            if selects(service):
                for slice_ in self._desired(service, members):
                    wanted[(slice_["metadata"]["namespace"], slice_["metadata"]["name"])] = slice_
        writes = [(s, stored.get(key)) for key, s in wanted.items()
                  if key not in stored or _content(stored[key]) != _content(s)]
        deletes = [s for key, s in stored.items() if key not in wanted]
        return writes, deletes
