"""``tether diagnostics proxy-metrics|controller-metrics --platform kubernetes`` against kmock.

No addresses: the pods are asked through the API server's pods/proxy subresource, which kmock
answers as a kubelet-backed API server would (the recorded text of each pod's /metrics).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from k8s.kube_helpers import emulated_api
from tether.cli.main import cli


async def tether(*args: str) -> tuple[int, str, str]:
    result = await asyncio.to_thread(CliRunner().invoke, cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def _pod(name: str, namespace: str, labels: dict, ports: list | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "x", "ports": ports or []}]}}


async def test_proxy_and_controller_metrics_through_the_api_server(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        for resource in ("v1/pods", "apps/v1/deployments"):
            api.resources[resource] = {}
        await api.post("/apis/apps/v1/namespaces/shop/deployments", json={
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {}}})
        for name in ("web-1", "web-2"):
            await api.post("/api/v1/namespaces/shop/pods", json=_pod(name, "shop", {"app": "web"}))
            api[f"get /api/v1/namespaces/shop/pods/{name}:4191/proxy/metrics"] << \
                f'proxy_build_info{{version="0.1.0",pod="{name}"}} 1\n'.encode()
        await api.post("/api/v1/namespaces/linkerd/pods", json=_pod(
            "linkerd-identity-1", "linkerd", {"linkerd.io/control-plane-component": "identity"},
            [{"name": "admin-http", "containerPort": 9990}]))
        api["get /api/v1/namespaces/linkerd/pods/linkerd-identity-1:9990/proxy/metrics"] << b"identity_up 1\n"
        kube = ["--platform", "kubernetes", "--kubeconfig", str(settings.kubeconfig)]

        code, out, err = await tether("diagnostics", "proxy-metrics", "deploy/web", "-n", "shop", *kube)
        assert code == 0, err
        assert out == ('#\n# POD web-1 (1 of 2)\n#\nproxy_build_info{version="0.1.0",pod="web-1"} 1\n'
                       '#\n# POD web-2 (2 of 2)\n#\nproxy_build_info{version="0.1.0",pod="web-2"} 1\n')
        asked = [r.url.path for r in api["get"] if r.url.path.endswith("/proxy/metrics")]
        assert asked == ["/api/v1/namespaces/shop/pods/web-1:4191/proxy/metrics",
                         "/api/v1/namespaces/shop/pods/web-2:4191/proxy/metrics"]
        assert all(r.headers.get("Authorization") == "Bearer test-token" for r in api["get"])

        code, out, _ = await tether("diagnostics", "controller-metrics", *kube)
        assert code == 0 and out == "#\n# POD linkerd-identity-1\n#\nidentity_up 1\n"

        code, _, err = await tether("diagnostics", "proxy-metrics", "po/ghost", "-n", "shop", *kube)
        assert code == 1 and 'pods "ghost" in namespace shop not found' in err
