"""The viz commands with ``--platform kubernetes``: objects from the API server (kmock, a mock of it, not a
cluster), numbers from a real Prometheus (the ``lab`` fixture's, scraping fake proxies)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kmock
import pytest
from click.testing import CliRunner

from k8s.kube_helpers import ThreadedApi, listing, status
from tether.cli.main import cli
from viz.promlab import NS, PROMETHEUS

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus package (dev/setup.sh)")

RESOURCES = {"Pod": kmock.resource("", "v1", "pods"), "Deployment": kmock.resource("apps", "v1", "deployments"),
             "Service": kmock.resource("", "v1", "services"),
             "ServiceProfile": kmock.resource("linkerd.io", "v1alpha2", "serviceprofiles")}


def _serve(api: ThreadedApi, objs: list[dict[str, Any]], *, profiles: bool = True) -> None:
    async def script() -> None:
        for kind, resource in RESOURCES.items():
            items = [o for o in objs if o["kind"] == kind]
            if kind == "ServiceProfile" and not profiles:
                api.api["list", resource] << 404 << status(404, "NotFound", "the server could not find the resource")
            else:
                api.api["list", resource] << listing("7", *items)

    api.call(script)


def _viz(api: ThreadedApi, prom_url: str, tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["viz", *args, "--platform", "kubernetes", "--kubeconfig",
                                    str(api.settings.kubeconfig), "--prometheus-url", prom_url],
                              env={"TETHER_HOME": str(tmp_path)}, catch_exceptions=False)


def test_stat_routes_and_edges_read_the_cluster_s_objects(lab, tmp_path: Path) -> None:
    prom, objs = lab
    with ThreadedApi(tmp_path, kmock.KubernetesScaffold) as api:
        _serve(api, objs)
        result = _viz(api, prom.url, tmp_path, "stat", "deploy", "-n", NS, "-t", "30s", "-o", "json")
        assert result.exit_code == 0, result.output
        rows = {r["name"]: r for r in json.loads(result.output)}
        assert rows["web"]["meshed"] == "1/1" and rows["emoji"]["meshed"] == "1/1"
        assert rows["web"]["stats"]["success"] == pytest.approx(10 / 12, rel=0.02)
        routes = _viz(api, prom.url, tmp_path, "routes", "deploy/web", "-n", NS, "--to", "deploy/emoji", "-t", "30s")
        assert routes.exit_code == 0, routes.output
        assert "GET /list" in routes.output
        edges = _viz(api, prom.url, tmp_path, "edges", "deploy", "-n", NS, "-o", "json")
        (edge,) = json.loads(edges.output)
        assert edge["client_id"].startswith("web.emojivoto.serviceaccount.")


def test_no_serviceprofile_crd_means_no_routes_and_an_unreachable_api_is_named(lab, tmp_path: Path) -> None:
    prom, objs = lab
    with ThreadedApi(tmp_path, kmock.KubernetesScaffold) as api:
        _serve(api, objs, profiles=False)
        routes = _viz(api, prom.url, tmp_path, "routes", "deploy/emoji", "-n", NS)
        assert routes.exit_code == 1 and "no ServiceProfile found" in routes.output
    gone = tmp_path / "gone.kubeconfig"
    gone.write_text((tmp_path / "kubeconfig").read_text())
    result = CliRunner().invoke(cli, ["viz", "stat", "deploy", "-n", NS, "--platform", "kubernetes", "--kubeconfig",
                                      str(gone), "--prometheus-url", prom.url], env={"TETHER_HOME": str(tmp_path)})
    assert result.exit_code == 1 and "cannot list /api/v1/namespaces/emojivoto/pods from the Kubernetes API" in result.output


def test_routes_lists_the_cluster_s_policy_routes_without_traffic(lab, tmp_path: Path) -> None:
    """The HTTPRoutes of both groups and GRPCRoutes come from the API server (kmock): a route of the Service that
    carried nothing has its row without figures; a group whose CRD is not served (404) has none."""
    prom, objs = lab
    plain = [o for o in objs if o["kind"] != "ServiceProfile"]
    route = {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "HTTPRoute",
             "metadata": {"name": "emoji-canary", "namespace": NS},
             "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "emoji", "port": 8080}]}}
    with ThreadedApi(tmp_path, kmock.KubernetesScaffold) as api:
        _serve(api, plain)

        async def routes() -> None:
            api.api["list", kmock.resource("policy.linkerd.io", "v1beta3", "httproutes")] << listing("8", route)
            api.api["list", kmock.resource("policy.linkerd.io", "v1beta3", "servers")] << listing("8")
            for plural in ("httproutes", "grpcroutes"):
                api.api["list", kmock.resource("gateway.networking.k8s.io", "v1", plural)] << 404 << status(
                    404, "NotFound", "the server could not find the resource")

        api.call(routes)
        out = _viz(api, prom.url, tmp_path, "routes", "deploy/web", "-n", NS, "--to", "svc/emoji", "-t", "30s")
        assert out.exit_code == 0, out.output
        rows = {line.split()[0]: line.split() for line in out.output.splitlines()[1:]}
        assert set(rows["emoji-canary"][2:]) == {"-"} and rows["emoji-split"][2] != "-"
