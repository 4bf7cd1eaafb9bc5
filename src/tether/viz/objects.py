"""``metrics_api.Objects`` over the local store: the platform's objects viz joins with Prometheus' series.

Callers: the ``tether viz`` CLI and the dashboard.
"""

from __future__ import annotations

from typing import Any

from tether.store import Store

_STORE_KEYS = {"Pod": ("Pod",), "Deployment": ("Deployment.apps",), "Namespace": ("Namespace",),
               "Service": ("Service",), "ServiceProfile": ("ServiceProfile.linkerd.io",),
               "Server": ("Server.policy.linkerd.io",),
               # Both groups' HTTPRoutes: the policy controller serves either.
               "HTTPRoute": ("HTTPRoute.policy.linkerd.io", "HTTPRoute.gateway.networking.k8s.io"),
               "GRPCRoute": ("GRPCRoute.gateway.networking.k8s.io",)}


class StoreObjects:
    def __init__(self, store: Store) -> None:
        self.store = store

    def list(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        return [item for key in _STORE_KEYS[kind]
                for item in self.store.list(key, None if kind == "Namespace" else namespace).items]
