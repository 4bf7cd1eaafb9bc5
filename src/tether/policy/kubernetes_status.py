"""Status on Kubernetes: the status subresource patched by the one replica that holds the Lease.

Linkerd's policy controller writes route, rate-limit and EgressNetwork status only
while it holds the Lease ``policy-controller-write`` in the control-plane namespace
(control-plane.md §5.1); every replica serves gRPC.  ``tether policy serve
--platform kubernetes`` runs a ``LeaseElector`` for that Lease and hands its
``leading`` event to the ``StatusController``, which writes through
``KubeStatusWriter``: a JSON merge patch of ``<object>/status`` carrying the
``metadata.resourceVersion`` the watch last showed, so the API server refuses it
(409) when the object moved on meanwhile and nothing another writer did is lost;
``status.parents`` goes whole (a merge patch replaces lists), with the parents
other controllers own kept as they were.  Linkerd's status controller sends the
same kind of patch (``k8s/status/src/index.rs``: ``make_patch`` is a
``Patch::Merge`` of the status, sent with ``PatchParams::apply`` naming the field
manager ``linkerd.io/policy-controller``), not a server-side apply whatever
control-plane.md §5.1 says; Tether names the same field manager and adds the
resourceVersion precondition.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from tether.platform.kubernetes.client import ApiError, KubeClient, KubeError
from tether.platform.kubernetes.resources import api_resource
from tether.policy.status import CONTROLLER_NAME, Key, StatusWriteFailed

LEASE_NAME = "policy-controller-write"


def status_path(key: Key) -> str:
    type_key, namespace, name = key
    return f"{api_resource(type_key).collection_path(namespace)}/{quote(name, safe='')}/status"


class KubeStatusWriter:
    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def write(self, key: Key, resource_version: str, status: dict[str, Any]) -> str | None:
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            patched = await self._client.merge_patch(status_path(key), body, field_manager=CONTROLLER_NAME)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise StatusWriteFailed(f"PATCH {status_path(key)}: {exc}") from None
        except KubeError as exc:
            raise StatusWriteFailed(f"PATCH {status_path(key)}: {exc}") from None
        return str((patched.get("metadata") or {}).get("resourceVersion") or "")

    def close(self) -> None:
        """The client belongs to the watcher, which closes it."""
