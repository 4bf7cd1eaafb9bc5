"""Raw ``/metrics`` of proxies and control-plane components on Kubernetes, through the API server.

No addresses or certificates are needed: each pod is asked through the API
server's ``pods/proxy`` subresource (``/api/v1/namespaces/NS/pods/NAME:PORT/proxy/metrics``),
with the kubeconfig's credentials — the API server reaches the pod as
``linkerd diagnostics`` reaches it through a port-forward.  Proxies answer on
their admin port 4191; components on their container port named ``admin-http``.

Caller: ``tether.cli.diagnostics_scrape``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tether.diagnose.facts import selects
from tether.platform.kubernetes.client import ApiError, KubeClient, KubeError

PROXY_ADMIN_PORT = 4191
ADMIN_PORT_NAME = "admin-http"
COMPONENT_LABEL = "linkerd.io/control-plane-component"


class TargetNotFound(Exception):
    """A workload named on the command line is malformed or not in the cluster."""


@dataclass(frozen=True)
class Scraped:
    pod: str
    text: str | None
    error: str | None = None


def _selector(match_labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


async def _get(client: KubeClient, path: str, what: str) -> dict[str, Any]:
    try:
        return await client.get(path)
    except ApiError as exc:
        if exc.status == 404:
            raise TargetNotFound(f"{what} not found") from None
        raise


async def workload_pods(client: KubeClient, targets: Sequence[str], namespace: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []
    for target in targets:
        kind, slash, name = target.partition("/")
        if not slash or not name:
            raise TargetNotFound(f"{target!r} is not po/NAME or deploy/NAME")
        if kind in ("po", "pod", "pods"):
            pods.append(await _get(client, f"/api/v1/namespaces/{namespace}/pods/{name}",
                                   f'pods "{name}" in namespace {namespace}'))
        elif kind in ("deploy", "deployment", "deployments", "deployment.apps"):
            deployment = await _get(client, f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
                                    f'deployments "{name}" in namespace {namespace}')
            labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            listed = await client.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": _selector(labels)})
            # The selector is judged here too: an answer that ignores it must not make other pods the workload's.
            pods += sorted((p for p in listed.get("items") or ()
                            if selects(labels, (p.get("metadata") or {}).get("labels") or {})),
                           key=lambda p: p["metadata"]["name"])
        else:
            raise TargetNotFound(f"expected po/NAME or deploy/NAME, not {kind}/")
    return pods


async def scrape(client: KubeClient, pod: dict[str, Any], port: int) -> Scraped:
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}:{port}/proxy/metrics"
    try:
        return Scraped(meta["name"], await client.get_text(path))
    except KubeError as exc:
        return Scraped(meta["name"], None, f"{path}: {exc}")


def admin_port(pod: dict[str, Any]) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == ADMIN_PORT_NAME:
                return port.get("containerPort")
    return None


async def control_plane_pods(client: KubeClient, namespace: str) -> list[dict[str, Any]]:
    listed = await client.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": COMPONENT_LABEL})
    return sorted(listed.get("items") or (), key=lambda p: p["metadata"]["name"])
