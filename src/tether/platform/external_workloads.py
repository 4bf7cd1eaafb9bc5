"""The ExternalWorkload endpoints controller: Services selecting ExternalWorkloads -> EndpointSlices.

Linkerd runs it in its destination (``controller/api/destination/external-workload``); the
local platform runs it beside its EndpointSlice controller, over the store
(``tether.platform.local.endpointslices``), and ``tether destination serve --platform
kubernetes`` over the API server (``tether.platform.kubernetes.endpointslices``). For every Service
with a selector it keeps EndpointSlices named ``linkerd-external-<svc>-<hash>``, labelled
``endpointslice.kubernetes.io/managed-by: linkerd-external-workloads-controller`` and
``kubernetes.io/service-name``, listing each selected ExternalWorkload (same namespace):

* its first ``workloadIPs`` address; ``ready`` and ``serving`` follow its ``Ready`` status
  condition (an ExternalWorkload without one is not ready), never ``terminating``;
* ``targetRef`` the ExternalWorkload, so the destination answers with its
  ``meshTLS.identity`` (a SPIFFE URI) and ``serverName``;
* the Service's ports resolved on the workload: a number as is, a name through the
  workload's ``ports`` (a workload without that port is left out);
* at most 100 endpoints per slice is Linkerd's limit; one local slice per port set is kept
  (local meshes stay far below it).

A Service selecting no ExternalWorkload gets no such slice. Pure rule:
`external_workload_slices`; the controller loop is ``tether.platform.endpointslices.SliceController``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.platform.endpointslices import Member, Obj, selected, slices_for
from tether.resources.kinds import EXTERNAL_WORKLOAD

MANAGED_BY = "linkerd-external-workloads-controller"
PREFIX = "linkerd-external-"


def _ready(workload: Mapping[str, Any]) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _member(workload: Mapping[str, Any]) -> Member | None:
    spec = workload.get("spec") or {}
    ips = [entry.get("ip") for entry in spec.get("workloadIPs") or () if entry.get("ip")]
    if not ips:
        return None
    meta = workload["metadata"]
    ready = _ready(workload)
    endpoint = {
        "addresses": [ips[0]],
        "conditions": {"ready": ready, "serving": ready, "terminating": False},
        "targetRef": {"apiVersion": EXTERNAL_WORKLOAD.api_version, "kind": EXTERNAL_WORKLOAD.kind,
                      "namespace": meta["namespace"], "name": meta["name"], "uid": meta.get("uid", "")},
    }
    named = {(p["name"], p.get("protocol", "TCP")): int(p["port"]) for p in spec.get("ports") or () if p.get("name")}
    return Member(ips[0], named, endpoint)


def external_workload_slices(service: Mapping[str, Any], workloads: list[Obj]) -> list[Obj]:
    """The slices Linkerd's ExternalWorkload controller keeps for ``service`` (one with a selector)."""
    members = [m for w in selected(service, workloads) if (m := _member(w)) is not None]
    return slices_for(service, members, managed_by=MANAGED_BY, prefix=PREFIX, placeholders=())
