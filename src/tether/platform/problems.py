"""Objects the EndpointSlice controllers cannot use, reported on the object: a Warning Event naming the field.

A user looks for what went wrong with an object where Kubernetes puts it: ``kubectl describe``
and ``kubectl get events`` (``tether get events`` on the local platform). Linkerd's
ExternalWorkload controller only logs and skips; Tether also records a Warning Event on the
object, once per version of what is wrong:

* an ExternalWorkload the resource model refuses (a ``workloadIPs`` entry that is not an IP,
  a port out of range...) is left out of every slice: reason `INVALID_EXTERNAL_WORKLOAD`;
* an EndpointSlice entry that cannot be used (an address not of the slice's ``addressType``,
  a bad port) is skipped by the destination (which also logs it and counts it in
  ``endpointslice_invalid_entries_total``): reason `INVALID_ENDPOINTS`.

The message is ``<field>: <reason>`` for each problem (``spec.workloadIPs[0].ip: '300.1.1.1'
must be an IP address``). Linkerd's ExternalWorkload status carries only the ``Ready``
condition the workload's own agent reports, so Tether writes no status condition of its own.

An ExternalWorkload left out (`WORKLOAD_REJECTIONS`) is also counted, once per object and set of
problems as its Event, by namespace and reason: ``externalworkload_rejected_total`` in the
destination on Kubernetes, ``tether_platform_externalworkload_rejected_total`` on the local
platform's admin port (the destination counts a slice's bad entries itself,
``endpointslice_invalid_entries_total``).

`problems_of` is the rule (the resource model's); `ProblemReporter` remembers what was
reported and hands new problems to an `EventSink`: the API server's Events on Kubernetes
(``tether.platform.kubernetes.objects.EventWriter``), Event objects in the store on the local
platform (``tether.platform.local.events``). Caller: ``tether.platform.endpointslices.SliceController``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tether.resources.discovery import EndpointSliceSpec
from tether.resources.errors import ValidationError
from tether.resources.kinds import ENDPOINT_SLICE, EXTERNAL_WORKLOAD
from tether.resources.model import parse

log = logging.getLogger(__name__)

INVALID_ENDPOINTS = "InvalidEndpoints"
INVALID_EXTERNAL_WORKLOAD = "InvalidExternalWorkload"
ADDRESS_IN_USE = "AddressInUse"  # the local platform: a workload's IP is a pod's (tether.platform.local.ipam)
WORKLOAD_REJECTIONS = frozenset({INVALID_EXTERNAL_WORKLOAD, ADDRESS_IN_USE})  # reasons a workload is left out
# Counts a rejected ExternalWorkload: (namespace, reason).
Rejected = Callable[[str, str], None]
_MODEL_REASONS = {ENDPOINT_SLICE.key: (INVALID_ENDPOINTS, "skipping entries"),
                  EXTERNAL_WORKLOAD.key: (INVALID_EXTERNAL_WORKLOAD, "left out of its Services' endpoints")}
MAX_MESSAGE = 1024  # Kubernetes truncates longer Event messages


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an Event is about (its ``involvedObject``)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Involved:
        meta = obj.get("metadata") or {}
        return cls(str(obj.get("apiVersion", "")), str(obj.get("kind", "")), str(meta.get("namespace", "")),
                   str(meta.get("name", "")), str(meta.get("uid", "")))


class EventSink(Protocol):
    async def warn(self, involved: Involved, reason: str, message: str) -> None:
        """Record a Warning Event on ``involved``; failures are logged, never raised."""
        ...


def problems_of(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """What is wrong with ``obj`` for the controllers, each ``<field>: <reason>``; () when nothing is."""
    try:
        resource = parse(obj)
    except ValidationError as exc:
        return (f"{exc.path}: {exc.message}" if exc.path else exc.message,)
    spec = resource.spec
    return spec.problems if isinstance(spec, EndpointSliceSpec) else ()


def message(lead: str, problems: tuple[str, ...]) -> str:
    """The Event message: ``<lead>: <problem>; <problem>...``, at most `MAX_MESSAGE` characters."""
    text = f"{lead}: " + "; ".join(problems)
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


Slot = tuple[str, tuple[str, str]]  # (reason, object key): one object may be wrong in several ways


class ProblemReporter:
    """`check` objects as the watches deliver them (and `note` other problems); `flush` records a Warning
    Event for each new set of problems of an object, once, until they change or go away."""

    def __init__(self, sink: EventSink, rejected: Rejected | None = None) -> None:
        self._sink = sink
        self._rejected = rejected
        self._reported: dict[Slot, tuple[str, ...]] = {}
        self._pending: dict[Slot, tuple[Mapping[str, Any], str, tuple[str, ...]]] = {}

    def check(self, kind_key: str, key: tuple[str, str], obj: Mapping[str, Any] | None) -> bool:
        """Whether ``obj`` (None: deleted) is usable as a whole; what is wrong with it is kept for `flush`."""
        reason, lead = _MODEL_REASONS[kind_key]
        problems = problems_of(obj) if obj is not None else ()
        self.note(reason, key, obj, lead, problems)
        # A slice with bad entries is still used (the destination skips the entries); a workload is not.
        return not problems or kind_key == ENDPOINT_SLICE.key

    def note(self, reason: str, key: tuple[str, str], obj: Mapping[str, Any] | None, lead: str,
             problems: tuple[str, ...]) -> None:
        """``obj`` has these ``problems`` of kind ``reason`` now (none: it has no longer)."""
        slot = (reason, key)
        if not problems or obj is None:
            self._reported.pop(slot, None)
            self._pending.pop(slot, None)
        elif self._reported.get(slot) != problems:
            self._pending[slot] = (obj, lead, problems)

    async def flush(self) -> None:
        pending, self._pending = self._pending, {}
        for (reason, key), (obj, lead, problems) in pending.items():
            self._reported[(reason, key)] = problems
            log.warning("%s %s/%s: %s: %s", obj.get("kind"), key[0], key[1], lead, "; ".join(problems))
            if self._rejected is not None and reason in WORKLOAD_REJECTIONS:
                self._rejected(key[0], reason)
            await self._sink.warn(Involved.of(obj), reason, message(lead, problems))
