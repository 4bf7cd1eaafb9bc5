"""``tether check --platform kubernetes`` against kmock (a mock of the Kubernetes API server, as tests/k8s use).

The cluster holds what `tether install --crds` and `tether install` print, plus control-plane and meshed
pods as a kubelet would report them (kmock runs no controllers).  `tether check` runs in-process on a thread.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from executables import TETHER

from k8s.kube_helpers import emulated_api
from tether.cli.main import cli
from tether.injector.annotations import trust_root_sha256

# Each in-process check costs ~2 s of kmock's reaction filtering on an idle machine (most of it in kmock's DSL,
# not in Tether), and a test runs up to six; at load 15 that passed the default 60 s hang guard (tests/conftest.py).
ASYNC_TEST_DEADLINE = 240.0

_COLLECTIONS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "Pod": "/api/v1/namespaces/{ns}/pods",
}


async def tether(*args: str) -> tuple[int, str, str]:
    """`tether ARGS` in-process, on a thread: the check blocks its thread while kmock answers on this loop."""
    result = await asyncio.to_thread(CliRunner().invoke, cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def check_argv(kubeconfig: Path, *args: str) -> list[str]:
    """``tether check --platform kubernetes`` against the emulated API server, without waiting, then ``args``."""
    return ["check", "--platform", "kubernetes", "--kubeconfig", str(kubeconfig), "--wait", "0", *args]


def results(out: str) -> dict[str, dict[str, Any]]:
    """``check -o json``'s checks by description."""
    return {c["description"]: c for cat in json.loads(out)["categories"] for c in cat["checks"]}


def _pod(name: str, namespace: str, labels: dict, *, ready: bool = True, proxy: bool = False,
         annotations: dict | None = None) -> dict[str, Any]:
    containers = [{"name": "app", "image": "example/app"}]
    init = [{"name": "linkerd-proxy", "image": "tether/proxy:0.1.0", "restartPolicy": "Always"}] if proxy else []
    statuses = [{"name": c["name"], "ready": ready} for c in init]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations or {}},
            "spec": {"containers": containers, "initContainers": init},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "initContainerStatuses": statuses}}


@functools.cache
def _manifests() -> tuple[dict[str, Any], ...]:
    """What `tether install --crds` and `tether install` print (rendered once for the module)."""
    text = "\n".join(subprocess.run([TETHER, "install", *extra], check=True, capture_output=True, text=True).stdout
                     for extra in (("--crds",), ()))
    return tuple(d for d in yaml.safe_load_all(text) if d)


async def _install(api: Any, *, skip: tuple[str, str] | None = None, unready: str | None = None) -> dict[str, str]:
    """Post the install's objects and control-plane pods; returns the anchors PEM by name."""
    docs = copy.deepcopy(list(_manifests()))
    for doc in docs:
        for resource in ("v1/nodes", "v1/namespaces", "v1/serviceaccounts", "v1/services", "v1/secrets", "v1/configmaps",
                         "v1/pods", "apps/v1/deployments", "rbac.authorization.k8s.io/v1/clusterroles",
                         "rbac.authorization.k8s.io/v1/clusterrolebindings",
                         "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                         "admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                         "apiextensions.k8s.io/v1/customresourcedefinitions"):
            api.resources.setdefault(resource, {})
    anchors = ""
    for doc in docs:
        kind, name, ns = doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace", "")
        if kind == "Namespace":
            api.namespaces.append(doc)
            continue
        if (kind, name) == skip:
            continue
        if (kind, name) == ("ConfigMap", "linkerd-identity-trust-roots"):
            anchors = doc["data"]["ca-bundle.crt"]
        await api.post(_COLLECTIONS[kind].format(ns=ns), json=doc)
        if kind == "Deployment":
            labels = doc["spec"]["template"]["metadata"]["labels"]
            await api.post(_COLLECTIONS["Pod"].format(ns=ns),
                           json=_pod(f"{name}-1", ns, labels, ready=name != unready))
    return {"anchors": anchors}


async def test_a_healthy_cluster_passes_in_text_and_json(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["get /version"] << {"major": "1", "minor": "35", "gitVersion": "v1.35.0"}
        installed = await _install(api)
        api.namespaces.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        await api.post("/api/v1/namespaces/shop/pods", json=_pod("web-1", "shop", {"app": "web"}, proxy=True,
                       annotations={"linkerd.io/trust-root-sha256": trust_root_sha256(installed["anchors"]),
                                    "linkerd.io/proxy-version": "0.1.0"}))
        base = check_argv(settings.kubeconfig)
        code, out, err = await tether(*base, "--proxy", "-n", "shop")
        assert code == 0, out + err
        for category in ("kubernetes-api", "kubernetes-version", "linkerd-existence", "linkerd-config",
                         "linkerd-identity", "linkerd-webhooks-and-apisvc-tls", "control-plane-version",
                         "linkerd-identity-data-plane", "linkerd-data-plane", "linkerd-opaque-ports-definition"):
            assert f"\n{category}\n" in "\n" + out, out
        assert "\u00d7" not in out and out.rstrip().endswith("Status check results are \u221a")
        for webhook in ("proxy-injector", "policy-validator"):
            assert f"\u221a {webhook} webhook has valid cert" in out and f"\u221a {webhook} cert is valid for at least 60" in out


async def test_a_healthy_cluster_in_json_with_crds_and_pre(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["get /version"] << {"major": "1", "minor": "35", "gitVersion": "v1.35.0"}
        await _install(api)
        base = check_argv(settings.kubeconfig)
        code, out, _ = await tether(*base, "-o", "json")
        doc = json.loads(out)
        assert doc["success"] is True and code == 0
        names = [c["description"] for cat in doc["categories"] for c in cat["checks"]]
        assert "control plane CustomResourceDefinitions exist" in names
        assert "issuer cert is issued by the trust anchor" in names
        code, out, _ = await tether(*base, "--crds")
        assert code == 0 and "linkerd-crd" in out and "linkerd-existence" not in out
        code, out, _ = await tether(*base, "--pre")
        assert code == 1 and '\u00d7 control plane namespace does not already exist' in out


async def test_an_old_cluster_unready_pods_and_stale_proxies_fail(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["get /version"] << {"major": "1", "minor": "29", "gitVersion": "v1.29.4"}
        await _install(api, unready="linkerd-destination")
        api.namespaces.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        await api.post("/api/v1/namespaces/shop/pods", json=_pod("old-1", "shop", {"app": "old"}, proxy=True,
                       annotations={"linkerd.io/trust-root-sha256": "0" * 64, "linkerd.io/proxy-version": "0.0.9"}))
        base = check_argv(settings.kubeconfig)
        code, out, _ = await tether(*base, "--proxy", "-n", "shop", "-o", "json")
        assert code == 1
        found = results(out)
        version = found["is running the minimum Kubernetes API version"]
        assert version["result"] == "error" and "[v1.29.4]" in version["error"]
        ready = found["control plane pods are ready"]
        assert ready["result"] == "error" and "linkerd-destination-1" in ready["error"]
        match = found["data plane proxies certificate match CA"]
        assert match["result"] == "error" and "shop/old-1" in match["error"]
        assert found["data plane and cli versions match"]["result"] == "warning"


async def test_a_missing_cluster_role_fails_existence_and_stops(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["get /version"] << {"major": "1", "minor": "35"}
        await _install(api, skip=("ClusterRole", "linkerd-linkerd-identity"))
        code, out, _ = await tether(*check_argv(settings.kubeconfig))
        assert code == 1
        assert "\u00d7 control plane ClusterRoles exist" in out and "linkerd-linkerd-identity" in out
        assert "\nlinkerd-config\n" not in out and "\nlinkerd-identity\n" not in out  # fatal: nothing after it
