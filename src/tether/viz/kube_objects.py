"""``metrics_api.Objects`` over the Kubernetes API: what viz joins with Prometheus' series, on a cluster.

Each ``list(kind, namespace)`` is one LIST request to the API server (through
``tether.platform.kubernetes.client``, configured in-cluster or from a
kubeconfig), made on a loop of its own so the synchronous metrics API can call
it from any thread.  A kind whose API is not served (no ServiceProfile CRD) is
an empty list; any other failure is ``ObjectsUnavailable`` naming the path.

Callers: the ``tether viz`` commands with ``--platform kubernetes``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tether.platform.kubernetes.client import ApiError, ClientSettings, KubeClient, KubeError

_PATHS = {"Pod": [("/api/v1", "pods")], "Deployment": [("/apis/apps/v1", "deployments")],
          "Service": [("/api/v1", "services")], "ServiceProfile": [("/apis/linkerd.io/v1alpha2", "serviceprofiles")],
          "Server": [("/apis/policy.linkerd.io/v1beta3", "servers")],
          "HTTPRoute": [("/apis/policy.linkerd.io/v1beta3", "httproutes"),
                        ("/apis/gateway.networking.k8s.io/v1", "httproutes")],
          "GRPCRoute": [("/apis/gateway.networking.k8s.io/v1", "grpcroutes")]}
# Kinds whose CRD may be missing: a 404 is an empty list (no ServiceProfile CRD means no profiles).
_OPTIONAL = frozenset({"ServiceProfile", "Server", "HTTPRoute", "GRPCRoute"})


class ObjectsUnavailable(Exception):
    """The API server did not answer a LIST; the message names it."""


def list_paths(kind: str, namespace: str | None) -> list[str]:
    if kind == "Namespace":
        return ["/api/v1/namespaces"]
    return [f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
            for prefix, plural in _PATHS[kind]]


class KubeObjects:
    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings

    def list(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        return asyncio.run(self._list(kind, None if kind == "Namespace" else namespace))

    async def _list(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        client = KubeClient(self.settings)
        items: list[dict[str, Any]] = []
        try:
            for path in list_paths(kind, namespace):
                try:
                    doc = await client.get(path)
                except ApiError as err:
                    if err.status == 404 and kind in _OPTIONAL:
                        continue
                    raise ObjectsUnavailable(f"the Kubernetes API refused GET {path}: {err}") from None
                except KubeError as err:
                    raise ObjectsUnavailable(f"cannot list {path} from the Kubernetes API: {err}") from None
                items.extend(doc.get("items") or ())
        finally:
            await client.close()
        for item in items:  # LIST answers leave kind and apiVersion off the items
            item.setdefault("kind", kind)
        return items
