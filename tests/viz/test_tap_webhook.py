"""The tap injector's webhook on Kubernetes: AdmissionReviews over real TLS, namespaces read from kmock.

kmock stands in for the Kubernetes API server (it answers the webhook's
namespace GETs); the webhook itself is the real aiohttp server over real TLS
with the certificate ``tether viz install --platform kubernetes`` makes, and
its patches are applied with a real RFC 6902 implementation.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import kmock

from k8s.kube_helpers import emulated_api, status
from tether.cli.install_cmd import webhook_certificate
from tether.platform.kubernetes.client import KubeClient
from tether.viz import tap_webhook_server
from tether.viz.tap_injector import DISABLE_TAP, TAP_ENABLED, TAP_ENV, tap_identity
from viz.promlab import meshed_pod

IDENTITY = tap_identity()
SERVICE = "tap-injector.linkerd-viz.svc"


def _review(pod: dict[str, Any], namespace: str, uid: str = "u-1") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "namespace": namespace, "operation": "CREATE", "object": pod}}


async def _exercise(tmp_path: Path) -> dict[str, Any]:
    ca, crt, key = webhook_certificate(SERVICE, "cluster.local", datetime.now(UTC))
    (tmp_path / "tls.crt").write_text(crt)
    (tmp_path / "tls.key").write_text(key)
    client_tls = ssl.create_default_context(cadata=ca)
    out: dict[str, Any] = {}
    async with emulated_api(tmp_path, kmock.KubernetesScaffold) as (api, _srv, settings):
        api["get /api/v1/namespaces/emojivoto"] << {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": "emojivoto"}}
        api["get /api/v1/namespaces/quiet"] << {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": "quiet", "annotations": {DISABLE_TAP: "true"}}}
        api["get /api/v1/namespaces/forbidden"] << 403 << status(403, "Forbidden", "namespaces is forbidden")
        kube = KubeClient(settings)
        webhook = tap_webhook_server.TapInjectorWebhook(kube, IDENTITY)
        runner = await tap_webhook_server.serve(webhook, tap_webhook_server.tls_context(
            tmp_path / "tls.crt", tmp_path / "tls.key"), "127.0.0.1", 0)
        port = runner.addresses[0][1]
        url = f"https://127.0.0.1:{port}/"
        try:
            # The API server checks the certificate against caBundle for the Service's name.
            connector = aiohttp.TCPConnector(ssl=client_tls, resolver=_Resolve(SERVICE))
            async with aiohttp.ClientSession(connector=connector) as session:
                async def post(body: Any) -> tuple[int, Any]:
                    async with session.post(f"https://{SERVICE}:{port}/", json=body) as r:
                        return r.status, (await r.json() if r.content_type == "application/json" else await r.text())

                for ns in ("emojivoto", "quiet", "forbidden"):
                    out[ns] = await post(_review(meshed_pod("web-1", ns, "web", 4191), ns))
                out["unmeshed"] = await post(_review({"metadata": {"name": "plain"}, "spec": {"containers": [
                    {"name": "app", "image": "x"}]}}, "emojivoto"))
                out["not a review"] = await post({"kind": "Pod"})
                async with session.get(f"https://{SERVICE}:{port}/ready") as r:
                    out["ready"] = r.status
            # Without the CA, a client refuses the webhook's certificate: it is not a public one.
            async with aiohttp.ClientSession() as plain:
                try:
                    await plain.get(url + "ready")
                    out["untrusted"] = "connected"
                except aiohttp.ClientConnectorCertificateError:
                    out["untrusted"] = "refused"
        finally:
            await runner.cleanup()
            await kube.close()
    return out


class _Resolve(aiohttp.abc.AbstractResolver):
    """Resolves the Service's DNS name to loopback, as cluster DNS resolves it to the Service's IP."""

    def __init__(self, name: str) -> None:
        self._name = name

    async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[dict[str, Any]]:
        assert host == self._name
        return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": 2, "proto": 0, "flags": 0}]

    async def close(self) -> None:
        return None


def test_the_webhook_patches_meshed_pods_and_honours_disable_tap(tmp_path: Path) -> None:
    out = asyncio.run(_exercise(tmp_path))
    code, body = out["emojivoto"]
    assert code == 200 and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == "u-1" and response["allowed"] is True and response["patchType"] == "JSONPatch"
    pod = meshed_pod("web-1", "emojivoto", "web", 4191)
    patched = jsonpatch.apply_patch(copy.deepcopy(pod), json.loads(base64.b64decode(response["patch"])))
    proxy = next(c for c in patched["spec"]["initContainers"] if c["name"] == "linkerd-proxy")
    assert {"name": TAP_ENV, "value": IDENTITY} in proxy["env"]
    assert patched["metadata"]["annotations"][TAP_ENABLED] == "true"
    # The namespace's viz.linkerd.io/disable-tap (read from the API) leaves the pod alone, allowed.
    code, body = out["quiet"]
    assert code == 200 and body["response"]["allowed"] is True and "patch" not in body["response"]
    # An unreadable namespace: allowed unchanged, with a warning naming it (never a failed pod creation).
    code, body = out["forbidden"]
    assert code == 200 and "patch" not in body["response"]
    assert "cannot read namespace forbidden" in body["response"]["warnings"][0]
    code, body = out["unmeshed"]
    assert code == 200 and "patch" not in body["response"]
    code, text = out["not a review"]
    assert code == 400 and "expected kind AdmissionReview" in text
    assert out["ready"] == 200
    assert out["untrusted"] == "refused"
