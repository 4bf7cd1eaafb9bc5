"""Reach a control-plane component's gRPC port on Kubernetes with nothing but the kubeconfig.

As ``linkerd diagnostics`` does: find a ready pod of the component (label
``linkerd.io/control-plane-component``) in the control plane's namespace,
forward a loopback port to it through the API server (``tether.platform.
kubernetes.portforward``), and verify the component's certificate against the
trust anchors the cluster publishes (ConfigMap ``linkerd-identity-trust-roots``,
key ``ca-bundle.crt``) — Tether's components serve TLS themselves.

``pod_admin`` and ``served_certificate`` reach a meshed pod's proxy the same
way: its admin port (``/metrics``, ``/ready``) and the certificate its inbound
port serves, through a port-forward of that pod's port.

Callers: ``tether.cli.kube_forward`` (``diagnostics endpoints|profile|policy``),
``tether.diagnose.kube_layers`` and ``tether identity po/NAME --platform kubernetes``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from tether.diagnose import proxies
from tether.diagnose.kube_metrics import COMPONENT_LABEL
from tether.naming import TRUST_ROOTS_CONFIGMAP
from tether.platform.kubernetes.client import ApiError, KubeClient
from tether.platform.kubernetes.portforward import Dial, Forward, forwarded


class NotReachable(Exception):
    """No ready pod of the component, or no published trust anchors."""


@dataclass(frozen=True)
class Reached:
    forward: Forward
    pod: str
    anchors_pem: str  # the cluster's trust anchors, to verify the component's certificate


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


async def ready_pod(client: KubeClient, namespace: str, component: str) -> str:
    """The name of a running, ready pod of ``component`` (the first by name, so repeated runs agree)."""
    listed = await client.get(f"/api/v1/namespaces/{namespace}/pods",
                              {"labelSelector": f"{COMPONENT_LABEL}={component}"})
    pods = sorted((p for p in listed.get("items") or ()
                   if (p["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == component),
                  key=lambda p: p["metadata"]["name"])
    ready = [p["metadata"]["name"] for p in pods if _ready(p)]
    if not ready:
        found = f"{len(pods)} pod(s), none ready" if pods else "no pod"
        raise NotReachable(f"no ready {component} pod in namespace {namespace} "
                           f"(label {COMPONENT_LABEL}={component}: {found})")
    return ready[0]


async def trust_anchors(client: KubeClient, namespace: str) -> str:
    """The PEM trust anchors the control plane publishes."""
    try:
        config_map = await client.get(f"/api/v1/namespaces/{namespace}/configmaps/{TRUST_ROOTS_CONFIGMAP}")
    except ApiError as exc:
        if exc.status == 404:
            raise NotReachable(f"ConfigMap {namespace}/{TRUST_ROOTS_CONFIGMAP} not found: is the control plane "
                               f"installed in {namespace}? (or give --trust-anchors)") from None
        raise
    bundle = (config_map.get("data") or {}).get("ca-bundle.crt")
    if not bundle:
        raise NotReachable(f"ConfigMap {namespace}/{TRUST_ROOTS_CONFIGMAP} has no ca-bundle.crt")
    return str(bundle)


@contextlib.asynccontextmanager
async def component(client: KubeClient, namespace: str, name: str, port: int,
                    tunnel: Callable[[str, str, int], Dial], *, anchors: bool = True) -> AsyncIterator[Reached]:
    """A loopback forward to ``port`` of a ready ``name`` pod while the block runs.

    ``tunnel(namespace, pod, port)`` makes the dialer of one pod's port (the API
    server's port-forward in production; a loopback stand-in in the tests).
    """
    pod = await ready_pod(client, namespace, name)
    pem = await trust_anchors(client, namespace) if anchors else ""
    async with forwarded(tunnel(namespace, pod, port)) as forward:
        yield Reached(forward, pod, pem)


def proxy_port(pod: Mapping[str, Any], name: str, default: int) -> int:
    """The proxy container's port of that name (``linkerd-admin``, ``linkerd-proxy``), else Linkerd's default."""
    container = proxies.proxy_container(pod) or {}
    return next((p["containerPort"] for p in container.get("ports") or () if p.get("name") == name), default)


@contextlib.asynccontextmanager
async def _pod_port(tunnel: Callable[[str, str, int], Dial], pod: Mapping[str, Any], port: int
                    ) -> AsyncIterator[tuple[str, int]]:
    """``(host, port)`` on loopback forwarded to ``port`` of ``pod``; a failed forward is named, not hidden."""
    meta = pod["metadata"]
    async with forwarded(tunnel(meta["namespace"], meta["name"], port)) as forward:
        host, _, local = forward.addr.rpartition(":")
        try:
            yield host, int(local)
        except proxies.ProxyUnreachable:
            if forward.failures:  # the forward broke: that is why, not "cannot reach 127.0.0.1:…"
                raise proxies.ProxyUnreachable(f"pod {meta['namespace']}/{meta['name']} port {port}: "
                                               f"{forward.failures[0]}") from None
            raise


async def pod_admin(tunnel: Callable[[str, str, int], Dial], pod: Mapping[str, Any], path: str
                    ) -> proxies.AdminAnswer:
    """GET ``path`` of the pod proxy's admin port."""
    async with _pod_port(tunnel, pod, proxy_port(pod, "linkerd-admin", proxies.ADMIN_PORT)) as (host, port):
        return await asyncio.to_thread(proxies.admin_get, host, path, port=port)


async def served_certificate(tunnel: Callable[[str, str, int], Dial], pod: Mapping[str, Any],
                             identity: str) -> x509.Certificate:
    """The certificate the pod's proxy serves for ``identity`` on its inbound port (not verified here)."""
    async with _pod_port(tunnel, pod, proxy_port(pod, "linkerd-proxy", proxies.INBOUND_PORT)) as (host, port):
        return await asyncio.to_thread(proxies.served_certificate, host, identity, port=port)
