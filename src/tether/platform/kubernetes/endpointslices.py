"""EndpointSlices written over the API server: the ExternalWorkload controller on Kubernetes.

``tether destination serve --platform kubernetes`` runs `external_workload_controller`, as
Linkerd's destination runs its ExternalWorkload endpoints controller: the shared loop
(``tether.platform.endpointslices.SliceController``) over the API watches, writing through
`ApiSliceWriter`: a new slice is created (POST), a changed one rewritten by a JSON merge patch
of everything the controller owns (labels, owner, address type, endpoints and ports, lists
replaced whole) carrying the ``resourceVersion`` it was read at, so a concurrent writer's
change is never lost (the conflict is retried from the watch's newer copy), and one no
Service wants deleted (a slice already gone counts as deleted). Linkerd also elects one writer among the destination replicas
with the Lease ``linkerd-destination-endpoint-write``; `external_workload_controller` takes the
``leading`` event of a ``lease.LeaseElector`` for the same. The leader also records a Warning
Event (component ``linkerd-destination``) on an ExternalWorkload or EndpointSlice it cannot use,
naming the field (``tether.platform.problems``; RBAC: create ``events``).
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

from tether.platform.endpointslices import Obj, SliceController, WriteFailed
from tether.platform.external_workloads import MANAGED_BY, external_workload_slices
from tether.platform.kubernetes.client import ApiError, KubeClient, KubeError
from tether.platform.kubernetes.objects import WarningEvents
from tether.platform.kubernetes.resources import api_resource
from tether.platform.kubernetes.watch import KubernetesResourceWatcher
from tether.platform.problems import ProblemReporter, Rejected
from tether.resources.kinds import ENDPOINT_SLICE, EXTERNAL_WORKLOAD

_SLICES = api_resource(ENDPOINT_SLICE.key)


def _path(slice_: Obj) -> tuple[str, str]:
    meta = slice_["metadata"]
    collection = _SLICES.collection_path(meta["namespace"])
    return collection, f"{collection}/{quote(meta['name'], safe='')}"


class ApiSliceWriter:
    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def write(self, slices: list[tuple[Obj, Obj | None]]) -> None:
        for desired, stored in slices:
            collection, item = _path(desired)
            try:
                if stored is None:
                    await self._client.post(collection, desired)
                else:
                    version = stored["metadata"].get("resourceVersion")
                    await self._client.merge_patch(item, {**desired, "metadata": {**desired["metadata"],
                                                                                  "resourceVersion": version}})
            except KubeError as exc:
                raise WriteFailed(f"cannot write EndpointSlice {item}: {exc}") from None

    async def delete(self, slices: list[Obj]) -> None:
        for stored in slices:
            _, item = _path(stored)
            try:
                await self._client.delete(item)
            except ApiError as exc:
                if exc.status != 404:
                    raise WriteFailed(f"cannot delete EndpointSlice {item}: {exc}") from None
            except KubeError as exc:
                raise WriteFailed(f"cannot delete EndpointSlice {item}: {exc}") from None


LEASE_NAME = "linkerd-destination-endpoint-write"
EVENT_COMPONENT = "linkerd-destination"


def external_workload_controller(
    watcher: KubernetesResourceWatcher, leading: asyncio.Event | None = None, rejected: Rejected | None = None
) -> SliceController:
    """Linkerd's ExternalWorkload endpoints controller over the API server (``.run()`` until cancelled);
    it writes only while ``leading`` is set, when given, and records Warning Events on ExternalWorkloads
    and EndpointSlices it cannot use (``tether.platform.problems``), counting each workload left out in
    ``rejected``."""
    events = WarningEvents(watcher.client, component=EVENT_COMPONENT)
    return SliceController(watcher, ApiSliceWriter(watcher.client), source=EXTERNAL_WORKLOAD.key,
                           managed_by=MANAGED_BY, desired=external_workload_slices, leading=leading,
                           reporter=ProblemReporter(events, rejected))
