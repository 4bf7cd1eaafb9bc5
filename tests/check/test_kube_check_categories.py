"""More of ``tether check --platform kubernetes`` against kmock (a mock API server, as tests/k8s use).

``--pre``'s permissions (SelfSubjectAccessReviews answered as an authorizer would, from a set of refusals),
the front-proxy CA and the nodes' clocks; ``linkerd-cni-plugin``; ``linkerd-version`` and
``control-plane-version`` against ``--expected-version`` and ``linkerd-config``; the issuer judged under the
trust domain ``linkerd-config`` holds; ``linkerd-control-plane-proxy``; extension checks and ``linkerd-viz``.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kmock
import yaml
from aiohttp import web

from k8s.kube_helpers import Emulator, emulated_api, write_kubeconfig
from tether import __version__
from tether.viz.manifests import WebhookTls, render

from .test_kube_check import ASYNC_TEST_DEADLINE, _COLLECTIONS, _install, _manifests, _pod, check_argv, results, tether

SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class Authorizer:
    """Answers SelfSubjectAccessReviews: allowed unless ``(verb, resource)`` is refused."""

    def __init__(self, refused: set[tuple[str, str]]) -> None:
        self.refused = refused
        self.asked: list[dict[str, Any]] = []

    def __call__(self, review: dict[str, Any]) -> dict[str, Any]:
        attributes = review["spec"]["resourceAttributes"]
        self.asked.append(attributes)
        allowed = (attributes["verb"], attributes["resource"]) not in self.refused
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": review["spec"],
                "status": {"allowed": allowed, **({} if allowed else {"reason": "RBAC: no rule allows it"})}}


class ReviewingApi(Emulator):
    """kube_helpers' emulator, answering SelfSubjectAccessReviews with ``authorizer`` (kmock's emulator would
    store each review as an object, and a second nameless one conflicts with the first)."""

    authorizer: Authorizer

    async def __call__(self, raw_request: Any) -> Any:
        if raw_request.method == "POST" and raw_request.path == SSAR_PATH:
            return web.json_response(self.authorizer(await raw_request.json()))
        return await super().__call__(raw_request)


def node(name: str, heartbeat: datetime) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                                       "lastHeartbeatTime": heartbeat.strftime("%Y-%m-%dT%H:%M:%SZ")}]}}


async def test_pre_asks_for_each_permission_and_reads_the_nodes_clocks(tmp_path: Path) -> None:
    api = ReviewingApi()
    api.namespaces, api.namespace_requests, api.namespace_watches, api.namespace_version = [], [], [], 1
    api.namespace_gate = asyncio.Event()
    api.namespace_gate.set()
    authorizer = api.authorizer = Authorizer({("create", "clusterroles"), ("get", "secrets")})
    async with api, kmock.Server(api) as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url))
        api["get /version"] << {"major": "1", "minor": "35"}
        for resource in ("v1/nodes", "v1/configmaps"):
            api.resources[resource] = {}
        now = datetime.now(UTC)
        await api.post("/api/v1/nodes", json=node("node-a", now))
        await api.post("/api/v1/nodes", json=node("node-b", now - timedelta(minutes=7)))
        base = check_argv(kubeconfig, "--pre")

        code, out, _ = await tether(*base, "-o", "json")
        assert code == 1
        found = results(out)
        assert found["control plane namespace does not already exist"]["result"] == "success"
        cluster = found["can create non-namespaced resources"]
        assert cluster["result"] == "error"
        assert cluster["error"] == "not authorized to create clusterroles.rbac.authorization.k8s.io: RBAC: no rule allows it"
        assert found["can create Deployments"]["result"] == "success"
        assert found["can read Secrets"]["error"].startswith("not authorized to get secrets in namespace linkerd")
        assert found["can read extension-apiserver-authentication configmap"]["result"] == "error"
        skew = found["no clock skew detected"]
        assert skew["result"] == "warning" and skew["error"] == "clock skew detected for node(s): node-b"
        assert {"verb": "create", "group": "batch", "resource": "cronjobs", "namespace": "linkerd"} in authorizer.asked
        assert {"verb": "create", "group": "apiextensions.k8s.io", "resource": "customresourcedefinitions"} \
            in authorizer.asked

        authorizer.refused.clear()
        await api.post("/api/v1/namespaces/kube-system/configmaps", json={
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {"requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\n..."}})
        code, out, _ = await tether(*base)
        assert code == 0, out
        assert "\u221a can create non-namespaced resources" in out
        assert "\u221a can read extension-apiserver-authentication configmap" in out
        assert "\u203c no clock skew detected" in out and "node-b" in out


async def _cluster(api: Any, **install: Any) -> None:
    api["get /version"] << {"major": "1", "minor": "35"}
    await _install(api, **install)


async def test_cni_versions_and_control_plane_proxies(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _cluster(api)
        api.resources.setdefault("apps/v1/daemonsets", {})
        base = check_argv(settings.kubeconfig, "-o", "json")

        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 0 and "cni plugin ConfigMap exists" not in found  # not enabled: not checked
        assert "control plane proxies are healthy" not in found  # tether's control plane runs without proxies
        assert found["can determine the latest version"]["result"] == "warning"
        assert found["control plane and cli versions match"]["result"] == "success"

        code, out, _ = await tether(*base, "--expected-version", "99.0.0")
        found = results(out)
        assert code == 0
        assert found["cli is up-to-date"]["error"] == f"is running version {__version__} but the latest version is 99.0.0"
        assert found["control plane is up-to-date"]["result"] == "warning"
        code, out, _ = await tether(*base, "--expected-version", __version__)
        # Only the Gateway API's absence warns (kmock holds no Gateway API CRD).
        assert all(c["result"] == "success" for d, c in results(out).items() if d != "Gateway API is installed"), out

        # The CNI plugin: its objects, then its DaemonSet's readiness; fatal, so nothing runs after it.
        code, out, _ = await tether(*base, "--linkerd-cni-enabled")
        found = results(out)
        assert code == 1 and found["cni plugin ConfigMap exists"]["error"] == "missing ConfigMap: linkerd-cni-config"
        assert "certificate config is valid" not in found
        meta = {"namespace": "linkerd-cni"}
        await api.post(_COLLECTIONS["ConfigMap"].format(ns="linkerd-cni"), json={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "linkerd-cni-config", **meta}})
        for kind in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount"):
            await api.post(_COLLECTIONS[kind].format(ns="linkerd-cni"), json={
                "apiVersion": "v1", "kind": kind, "metadata": {"name": "linkerd-cni", **meta}})
        await api.post("/apis/apps/v1/namespaces/linkerd-cni/daemonsets", json={
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "linkerd-cni", **meta},
            "status": {"desiredNumberScheduled": 3, "numberReady": 2}})
        code, out, _ = await tether(*base, "--linkerd-cni-enabled")
        found = results(out)
        assert code == 1 and found["cni plugin DaemonSet exists"]["result"] == "success"
        assert found["cni plugin pod is running on all nodes"]["error"] == "number ready: 2, number scheduled: 3"

        # A control-plane pod carrying a proxy that is not ready.
        await api.post(_COLLECTIONS["Pod"].format(ns="linkerd"), json=_pod(
            "linkerd-destination-2", "linkerd", {"linkerd.io/control-plane-component": "destination"},
            proxy=True, ready=False, annotations={"linkerd.io/proxy-version": __version__}))
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 1
        assert "linkerd/linkerd-destination-2: the linkerd-proxy container is not ready" in \
            found["control plane proxies are healthy"]["error"]


async def test_cluster_networks_contain_every_node_pod_and_service(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _cluster(api)
        api.namespaces.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        await api.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
                                              "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]}})
        inside = _pod("web-1", "shop", {"app": "web"})
        inside["status"]["podIPs"] = [{"ip": "10.244.0.7"}]
        await api.post("/api/v1/namespaces/shop/pods", json=inside)
        host = _pod("agent-1", "shop", {"app": "agent"})  # host network: the node's address, not checked
        host["spec"]["hostNetwork"] = True
        host["status"]["podIP"] = "203.0.113.4"
        await api.post("/api/v1/namespaces/shop/pods", json=host)
        await api.post("/api/v1/namespaces/shop/services", json={
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}})
        await api.post("/api/v1/namespaces/shop/services", json={
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "headless", "namespace": "shop"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}})
        base = check_argv(settings.kubeconfig, "-o", "json")
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 0, out
        for description in ("cluster networks contains all node podCIDRs", "cluster networks contains all pods",
                            "cluster networks contains all services"):
            assert found[description]["result"] == "success"

        # A node, a pod and a Service outside the default networks (a cloud's own ranges).
        await api.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"},
                                              "spec": {"podCIDRs": ["198.18.0.0/24"]}})
        outside = _pod("web-2", "shop", {"app": "web"})
        outside["status"]["podIP"] = "198.18.0.9"
        await api.post("/api/v1/namespaces/shop/pods", json=outside)
        await api.post("/api/v1/namespaces/shop/services", json={
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "shop"},
            "spec": {"clusterIP": "34.118.224.5", "clusterIPs": ["34.118.224.5"], "ports": [{"port": 80}]}})
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 1
        networks = "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8"
        nodes = found["cluster networks contains all node podCIDRs"]
        assert nodes["result"] == "error" and nodes["error"] == (
            "node has podCIDR(s) [198.18.0.0/24] which are not contained in the Linkerd clusterNetworks.\n\t"
            'Try installing linkerd via --set clusterNetworks="' + networks.replace(",", "\\,") + '\\,198.18.0.0/24"')
        assert found["cluster networks contains all pods"]["error"] == (
            f"the Linkerd clusterNetworks [{networks!r}] do not include pod shop/web-2 (198.18.0.9)")
        services = found["cluster networks contains all services"]
        assert services["error"] == f"the Linkerd clusterNetworks [{networks!r}] do not include svc shop/api (34.118.224.5)"
        assert "l5d-cluster-networks-pods" in services["hint"]


async def test_each_webhooks_certificate_is_checked(tmp_path: Path) -> None:
    from tether.cli.install_cmd import CA_LIFETIME, webhook_certificate

    async def replace_secret(name: str, issued: datetime) -> None:
        _, crt, key = webhook_certificate("linkerd-policy-validator.linkerd.svc", "cluster.local", issued)
        path = f"/api/v1/namespaces/linkerd/secrets/{name}"
        await api.delete(path)
        await api.post("/api/v1/namespaces/linkerd/secrets", json={
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": "linkerd"},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in (("tls.crt", crt), ("tls.key", key))}})

    async with emulated_api(tmp_path) as (api, _, settings):
        await _cluster(api)
        base = check_argv(settings.kubeconfig, "-o", "json")
        now = datetime.now(UTC)  # (both pass on a fresh install: test_a_healthy_cluster_passes_in_text_and_json)
        await replace_secret("linkerd-policy-validator-k8s-tls", now - CA_LIFETIME + timedelta(days=10))
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 0  # a warning only
        soon = found["policy-validator cert is valid for at least 60 days"]
        assert soon["result"] == "warning" and soon["error"].startswith("policy-validator cert will expire on")
        assert "linkerd-policy-validator-k8s-tls" in soon["hint"]
        assert found["proxy-injector cert is valid for at least 60 days"]["result"] == "success"

        await replace_secret("linkerd-policy-validator-k8s-tls", now - CA_LIFETIME - timedelta(days=1))
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 1 and found["policy-validator webhook has valid cert"]["result"] == "error"
        assert found["proxy-injector webhook has valid cert"]["result"] == "success"


def _crd(plural: str, *served: str) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.gateway.networking.k8s.io"},
            "spec": {"group": "gateway.networking.k8s.io", "names": {"plural": plural},
                     "versions": [{"name": v, "served": True, "storage": i == 0} for i, v in enumerate(served)]}}


async def test_the_gateway_api_crds_are_optional_but_must_serve_the_watched_versions(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _cluster(api)
        base = check_argv(settings.kubeconfig, "-o", "json")
        code, out, _ = await tether(*base)
        found = results(out)
        installed = found["Gateway API is installed"]
        assert code == 0 and installed["result"] == "warning"
        assert installed["error"].startswith("the httproutes.gateway.networking.k8s.io and "
                                             "grpcroutes.gateway.networking.k8s.io CRDs are not installed")
        assert found["Gateway API CRDs serve the versions the policy controller watches"]["result"] == "success"

        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        await api.post(crds, json=_crd("httproutes", "v1", "v1beta1"))
        await api.post(crds, json=_crd("grpcroutes", "v1alpha2"))  # older than Gateway API v1.1: no v1
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 1 and found["Gateway API is installed"]["result"] == "success"
        versions = found["Gateway API CRDs serve the versions the policy controller watches"]
        assert versions["result"] == "error" and versions["error"].startswith(
            "the grpcroutes.gateway.networking.k8s.io CRD does not serve v1 (it serves v1alpha2)")


async def test_ha_wants_several_replicas_of_each_component(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _cluster(api)
        base = check_argv(settings.kubeconfig, "-o", "json")

        # linkerd-config says highAvailability, but each component has one ready pod: a warning.
        path = "/api/v1/namespaces/linkerd/configmaps/linkerd-config"
        (config,) = [d for d in _manifests() if (d["kind"], d["metadata"]["name"]) == ("ConfigMap", "linkerd-config")]
        values = yaml.safe_load(config["data"]["values"])
        await api.delete(path)
        await api.post("/api/v1/namespaces/linkerd/configmaps", json={
            **config, "data": {**config["data"], "values": yaml.safe_dump({**values, "highAvailability": True})}})
        code, out, _ = await tether(*base)
        replicas = results(out)["multiple replicas of control plane pods"]
        assert code == 0 and replicas["result"] == "warning"
        assert replicas["error"].startswith("not enough replicas available for ") and "destination" in replicas["error"]



async def test_opaque_ports_must_be_marked_on_both_the_service_and_its_pods(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _cluster(api)
        base = check_argv(settings.kubeconfig, "-o", "json")
        # --proxy: a Service marking 3306 opaque in front of a pod that does not, and the other way round.
        api.namespaces.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        db = _pod("db-1", "shop", {"app": "db"}, proxy=True)
        db["spec"]["containers"][0]["ports"] = [{"name": "mysql", "containerPort": 3306}]
        web = _pod("web-1", "shop", {"app": "web"}, proxy=True,
                   annotations={"config.linkerd.io/opaque-ports": "8080"})
        for pod in (db, web):
            await api.post("/api/v1/namespaces/shop/pods", json=pod)
        for name, app, port, annotations in (("db", "db", 3306, {"config.linkerd.io/opaque-ports": "3306"}),
                                             ("web", "web", 8080, {})):
            await api.post("/api/v1/namespaces/shop/services", json={
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
                "spec": {"selector": {"app": app}, "ports": [{"port": port, "targetPort": port}]}})
        _, out, _ = await tether(*base, "--proxy", "-n", "shop")
        opaque = results(out)["opaque ports are properly annotated"]
        assert opaque["result"] == "warning"  # as Linkerd's
        assert "* service db targets the opaque port 3306 but pod db-1 does not mark port 3306 opaque" in opaque["error"]
        assert ("* pod web-1 has the annotation config.linkerd.io/opaque-ports with port 8080 but service web does "
                "not mark port 8080 opaque") in opaque["error"]


async def test_the_issuer_is_judged_under_the_trust_domain_of_linkerd_config(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _cluster(api)
        path = "/api/v1/namespaces/linkerd/configmaps/linkerd-config"
        values = {"identityTrustDomain": "example.org", "clusterDomain": "cluster.local",
                  "linkerdVersion": __version__}
        await api.delete(path)
        await api.post("/api/v1/namespaces/linkerd/configmaps", json={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "linkerd-config", "namespace": "linkerd"},
            "data": {"values": yaml.safe_dump(values)}})
        code, out, _ = await tether(*check_argv(settings.kubeconfig, "-o", "json"))
        found = results(out)
        assert code == 1
        assert found["certificate config is valid"]["error"] == (
            "the issuer certificate is for identity.linkerd.cluster.local, not identity.linkerd.example.org "
            "(the trust domain linkerd-config holds)")


async def test_extensions_and_viz(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _cluster(api)
        base = check_argv(settings.kubeconfig, "-o", "json")
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 0 and found["namespace configuration for extensions"]["result"] == "success"
        assert "viz extension pods are running" not in found  # viz is not installed

        for obj in render(tap_injector_tls=WebhookTls("", "", ""), tap_tls=WebhookTls("", "", "")):
            kind, ns = obj["kind"], obj["metadata"].get("namespace", "")
            if kind == "Namespace":
                api.namespaces.append(obj)
            elif kind in _COLLECTIONS:
                await api.post(_COLLECTIONS[kind].format(ns=ns), json=obj)
            if kind == "Deployment":
                labels = obj["spec"]["template"]["metadata"]["labels"]
                await api.post(_COLLECTIONS["Pod"].format(ns=ns), json=_pod(
                    f"{obj['metadata']['name']}-1", ns, labels, ready=obj["metadata"]["name"] != "tap-injector"))
        api.namespaces.append({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": "other-viz", "labels": {"linkerd.io/extension": "viz"}}})
        api.namespaces.append({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": "foo", "labels": {"linkerd.io/extension": "foo"}}})
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 1
        labels = found["namespace configuration for extensions"]
        assert labels["result"] == "warning" and "other-viz" in labels["error"] and "linkerd-viz" in labels["error"]
        assert found["Linkerd extension command linkerd-foo exists"]["result"] == "warning"
        assert found["linkerd-viz ClusterRoles exist"]["result"] == "success"
        assert found["prometheus is installed and configured correctly"]["result"] == "success"
        assert "not ready: tap-injector-1" in found["viz extension pods are running"]["error"]


async def test_the_kubernetes_only_flags_are_refused_on_the_local_platform() -> None:
    for flags in (["--linkerd-cni-enabled"], ["--cni-namespace", "cni"], ["--expected-version", "1.0.0"]):
        code, _, err = await tether("check", *flags)
        assert code == 2 and "check a Kubernetes cluster: give --platform kubernetes" in err, err
