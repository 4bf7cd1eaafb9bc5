"""``tether viz check --platform kubernetes``: Linkerd's ``linkerd-viz`` checks against an API server.

The API server is kmock's emulator (a mock of the Kubernetes API only, as the
project's other Kubernetes tests); the objects are what ``tether viz install
--platform kubernetes`` prints, with its real tap certificate, and pods as the
kubelet would report them. ``--proxy`` asks a real Prometheus (Debian's),
scraping a proxy's metrics as viz's scrape configuration does.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml
from check.test_kube_check import _COLLECTIONS, _pod, tether
from tether import __version__
from k8s.kube_helpers import emulated_api
from viz.promlab import FakeProxy, PrometheusProcess, meshed_pod, wait_for

COLLECTIONS = {**_COLLECTIONS, "APIService": "/apis/apiregistration.k8s.io/v1/apiservices"}
NS = "linkerd-viz"


def results(out: str) -> dict[str, dict[str, Any]]:
    return {c["description"]: c for cat in json.loads(out)["categories"] for c in cat["checks"]}


async def _install_viz(api: Any, *, injected: bool = True, available: bool = True) -> list[dict[str, Any]]:
    code, out, _ = await tether("viz", "install", "--platform", "kubernetes")
    assert code == 0
    docs = [d for d in yaml.safe_load_all(out) if d]
    for obj in docs:
        kind, ns = obj["kind"], obj["metadata"].get("namespace", "")
        if kind == "Namespace":
            api.namespaces.append(obj)
        elif kind == "APIService":
            status = "True" if available else "False"
            obj = {**obj, "status": {"conditions": [{"type": "Available", "status": status,
                                                     "message": "" if available else "endpoints for service/tap "
                                                     "in \"linkerd-viz\" have no addresses"}]}}
            await api.post(COLLECTIONS[kind].format(ns=ns), json=obj)
        elif kind in COLLECTIONS:
            await api.post(COLLECTIONS[kind].format(ns=ns), json=obj)
        if kind == "Deployment":
            template = obj["spec"]["template"]["metadata"]
            meshed = (template.get("annotations") or {}).get("linkerd.io/inject") == "enabled"
            await api.post(COLLECTIONS["Pod"].format(ns=ns), json=_pod(
                f"{obj['metadata']['name']}-1", ns, template["labels"], proxy=meshed and injected,
                annotations={"linkerd.io/proxy-version": __version__} if meshed and injected else None))
    return docs


async def test_viz_check_reads_the_cluster(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["get /version"] << {"major": "1", "minor": "35", "gitVersion": "v1.35.0"}
        base = ["viz", "check", "--platform", "kubernetes", "--kubeconfig", str(settings.kubeconfig), "--wait", "0",
                "-o", "json"]

        # Nothing installed: the namespace is named, and so is every missing piece.
        code, out, _ = await tether(*base)
        found = results(out)
        assert code == 1
        assert found["can query the Kubernetes API"]["result"] == "success"
        assert found["linkerd-viz Namespace exists"]["error"] == 'the "linkerd-viz" namespace does not exist'
        assert "tap-k8s-tls Secret does not exist" in found["tap API server has valid cert"]["error"]
        assert "v1alpha1.tap.linkerd.io does not exist" in found["tap API service is running"]["error"]

        # Installed as `viz install` prints it, every pod up: all pass (the latest version given).
        docs = await _install_viz(api)
        code, out, _ = await tether(*base, "--expected-version", __version__)
        found = results(out)
        assert code == 0, {k: v for k, v in found.items() if v["result"] != "success"}
        assert [d for d, c in found.items() if c["result"] != "success"] == []
        assert "linkerd-viz pods are injected" in found and "viz extension proxies are healthy" in found
        # A newer release: the proxies are not up-to-date (a warning, naming each); without one, only a warning.
        code, out, _ = await tether(*base, "--expected-version", "99.0.0")
        stale = results(out)["viz extension proxies are up-to-date"]
        assert code == 0 and stale["result"] == "warning" and f"linkerd-viz/web-1 runs proxy {__version__}" in (
            stale["error"])
        code, out, _ = await tether(*base)
        assert code == 0 and results(out)["viz extension proxies are up-to-date"]["result"] == "warning"
        assert results(out)["viz extension proxies and cli versions match"]["result"] == "success"

        # The table names the category and the checks, as `linkerd viz check` does.
        code, table, _ = await tether(*base[:-2], "--expected-version", __version__)
        assert code == 0 and "linkerd-viz\n-----------" in table and "√ tap API service is running" in table

        # The tap certificate issued for another service name is refused, naming both.
        secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "tap-k8s-tls")
        other = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "tap-injector-k8s-tls")
        await api.patch(f"/api/v1/namespaces/{NS}/secrets/tap-k8s-tls",
                        json={"data": {**secret["data"], "tls.crt": other["data"]["tls.crt"]}})
        code, out, _ = await tether(*base)
        error = results(out)["tap API server has valid cert"]["error"]
        assert code == 1 and "tap-injector.linkerd-viz.svc" in error and "not tap.linkerd-viz.svc" in error
        assert base64.b64decode(other["data"]["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")


async def test_viz_check_names_uninjected_pods_and_an_unavailable_apiservice(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["get /version"] << {"major": "1", "minor": "35", "gitVersion": "v1.35.0"}
        await _install_viz(api, injected=False, available=False)
        code, out, _ = await tether("viz", "check", "--platform", "kubernetes", "--kubeconfig",
                                    str(settings.kubeconfig), "--wait", "0", "-o", "json")
        found = results(out)
        assert code == 1
        assert "is not available: endpoints for service/tap" in found["tap API service is running"]["error"]
        injected = found["linkerd-viz pods are injected"]["error"]
        assert "prometheus-1" in injected and "web-1" in injected and "tap-1" not in injected  # tap is not meshed
        assert found["viz extension pods are running"]["result"] == "success"


async def test_proxy_metrics_present_in_prometheus(tmp_path: Path) -> None:
    proxy = FakeProxy(lambda n: f"process_start_time_seconds 1700000000\nrequest_total {n}\n")
    scraped = meshed_pod("web-1", "emojivoto", "web", proxy.port)
    silent = meshed_pod("vote-1", "emojivoto", "vote", 1)  # nothing answers there: never scraped
    prom = PrometheusProcess(tmp_path / "prom", [scraped, silent])
    try:
        wait_for("the proxy's first scrape", lambda: any(
            t.get("health") == "up" for t in prom.client.targets()), timeout=60)
        async with emulated_api(tmp_path) as (api, _, settings):
            api["get /version"] << {"major": "1", "minor": "35", "gitVersion": "v1.35.0"}
            await _install_viz(api)
            api.namespaces.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "emojivoto"}})
            base = ["viz", "check", "--platform", "kubernetes", "--kubeconfig", str(settings.kubeconfig), "--wait",
                    "0", "-o", "json", "--proxy", "--prometheus-url", prom.url]
            await api.post(COLLECTIONS["Pod"].format(ns="emojivoto"), json=scraped)
            # Waiting as a user would: a scrape that took longer than the 1 s interval under load marks the target
            # down until the next one, and the check retries on its own ("wait for Prometheus' next scrape").
            at = base.index("--wait") + 1
            code, out, _ = await tether(*base[:at], "60s", *base[at + 1:], "-n", "emojivoto")
            found = results(out)
            assert code == 0, {k: v for k, v in found.items() if v["result"] != "success"}
            assert found["data plane proxy metrics are present in Prometheus"]["result"] == "success"
            await api.post(COLLECTIONS["Pod"].format(ns="emojivoto"), json=silent)
            # A few seconds of retries, so that the last attempt has web-1's next scrape if one was slow.
            code, out, _ = await tether(*base[:at], "3s", *base[at + 1:], "-n", "emojivoto")
            found = results(out)
            assert code == 1 and found["data plane proxy metrics are present in Prometheus"]["error"] == (
                "Data plane metrics not found for emojivoto/vote-1.")
            code, out, _ = await tether(*base, "-n", "nowhere")
            assert results(out)["data plane namespace exists"]["error"] == 'The "nowhere" namespace does not exist'
            code, _, err = await tether(*base[:-2])
            assert code == 2 and "--proxy asks Prometheus: give --prometheus-url" in err
    finally:
        prom.stop()
        proxy.close()


async def test_the_kubernetes_flags_are_refused_locally() -> None:
    code, _, err = await tether("viz", "check", "--viz-namespace", "viz")
    assert code == 2 and "--viz-namespace: not used with --platform local" in err
