"""`viz tap`, `top`, `profile --tap` and `list` with ``--platform kubernetes``: through the API server's tap APIService.

kmock stands in for the Kubernetes API server (not a cluster); ``Aggregator``
adds the aggregator's part for ``tap.linkerd.io``: it maps the kubeconfig's
bearer token to a user and proxies the request to the real tap APIService
(``tap_apiservice_server``) over TLS with a front-proxy client certificate
naming that user, as kube-apiserver does. Behind it, the tap controller and
its two "pods" are ``taplab``'s real ones, and RBAC (SubjectAccessReviews)
lets alice watch ``deployments/tap`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
import yaml
from aiohttp import web
from click.testing import CliRunner

from k8s.kube_helpers import PODS, emulated_api, listing, write_kubeconfig
from tether.api import viz_tap_pb2
from tether.cli.install_cmd import webhook_certificate
from tether.cli.main import cli
from tether.platform.kubernetes.client import ClientSettings, KubeClient
from tether.viz.dashboard.views import Views
from tether.viz.metrics_api import Mesh
from tether.viz.prometheus import Prometheus
from tether.viz import tap_apiclient
from tether.viz import tap_apiservice as rules
from tether.viz import tap_apiservice_server as server
from viz.taplab import NS, TapLab, _objects
from viz.test_tap_apiservice import SAR, _sar

USERS = {"test-token": "alice", "mallory-token": "mallory"}


class Aggregator(kmock.KubernetesScaffold):
    """kmock, plus kube-apiserver's aggregator for ``/apis/tap.linkerd.io/``: bearer token -> user -> the APIService."""

    upstream: str | None = None  # the tap APIService's base URL; None: not installed (the API server's 404)
    front: ssl.SSLContext

    async def __call__(self, raw_request: Any) -> Any:
        if not raw_request.path.startswith(f"/apis/{rules.GROUP}/"):
            return await super().__call__(raw_request)
        if self.upstream is None:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                                      "reason": "NotFound", "message": "the server could not find the requested resource"},
                                     status=404)
        user = USERS.get(raw_request.headers.get("Authorization", "").removeprefix("Bearer "), "")
        body = await raw_request.read()
        async with aiohttp.ClientSession() as session, session.post(
                self.upstream + raw_request.path, data=body, ssl=self.front,
                headers={"X-Remote-User": user, "X-Remote-Group": "devs",
                         "Content-Type": raw_request.headers.get("Content-Type", "")}) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", rules.ERROR_HEADER)})
            await response.prepare(raw_request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


@pytest.fixture(scope="module")
def lab() -> Iterator[TapLab]:
    lab = TapLab()
    yield lab
    lab.close()


def _viz(kubeconfig: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["viz", *args, "--platform", "kubernetes", "--kubeconfig", str(kubeconfig)],
                              env={"TETHER_HOME": str(kubeconfig.parent)}, catch_exceptions=False)


async def _exercise(lab: TapLab, tmp_path: Path) -> dict[str, Any]:
    now = datetime.now(UTC)
    tap_ca, tap_crt, tap_key = webhook_certificate("tap.linkerd-viz.svc", "cluster.local", now)
    front_ca, front_crt, front_key = webhook_certificate("front-proxy-client", "cluster.local", now)
    for name, text in (("tap.crt", tap_crt), ("tap.key", tap_key), ("front.crt", front_crt), ("front.key", front_key)):
        (tmp_path / name).write_text(text)
    out: dict[str, Any] = {}
    async with emulated_api(tmp_path, Aggregator) as (api, srv, settings):
        assert settings.kubeconfig is not None
        mallory = write_kubeconfig(tmp_path / "mallory.kubeconfig", str(srv.url), "mallory-token")
        # Before the APIService is installed: the API server's own 404, and a hint.
        out["not installed"] = await asyncio.to_thread(_viz, settings.kubeconfig, "tap", "deploy/web", "-n", NS)
        api["get /api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"] << {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extension-apiserver-authentication"},
            "data": {"requestheader-client-ca-file": front_ca,
                     "requestheader-allowed-names": '["front-proxy-client"]',
                     "requestheader-username-headers": '["X-Remote-User"]',
                     "requestheader-group-headers": '["X-Remote-Group"]'}}
        api["post", SAR] << _sar
        api["list", PODS] << listing("1", *_objects().list("Pod", NS))
        kube = KubeClient(settings)
        auth = await server.load_auth(kube)
        service = server.TapApiService(kube, auth, lab.controller)
        runner = await server.serve(service, server.tls_context(tmp_path / "tap.crt", tmp_path / "tap.key",
                                                                auth.client_ca_pem), "127.0.0.1", 0)
        api.upstream = f"https://127.0.0.1:{runner.addresses[0][1]}"
        api.front = ssl.create_default_context(cadata=tap_ca)
        api.front.check_hostname = False  # the aggregator checks the APIService's caBundle, dialing the Service's IP
        api.front.load_cert_chain(tmp_path / "front.crt", tmp_path / "front.key")
        try:
            out["mallory"] = await asyncio.to_thread(_viz, mallory, "tap", "deploy/web", "-n", NS)
            out["untappable"] = await asyncio.to_thread(_viz, settings.kubeconfig, "tap", "deploy/emoji", "-n", NS)
            out["tap server flag"] = await asyncio.to_thread(_viz, settings.kubeconfig, "tap", "deploy/web", "-n", NS,
                                                             "--tap-server", "127.0.0.1:1")
            out["list"] = await asyncio.to_thread(_viz, settings.kubeconfig, "list", "-n", NS)
            # alice: `viz profile --tap` over the APIService stops at two routes, made from both pods' requests.
            profile = asyncio.create_task(asyncio.to_thread(
                _viz, settings.kubeconfig, "profile", "web", "--tap", "deploy/web", "-n", NS,
                "--tap-route-limit", "2", "--tap-duration", "30s"))
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                lab.serve_requests(["/api/a", "/web"]), lab.loop))
            out["profile"] = await profile
            for proxy in lab.proxies:  # the CLI went away: both pods' taps close
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                    asyncio.wait_for(lab.until_no_taps(proxy), 10), lab.loop))
            # The client itself: events as they come, the request as the path names it.
            request = viz_tap_pb2.TapByResourceRequest(maxRps=10)
            request.target.resource.CopyFrom(viz_tap_pb2.Resource(namespace=NS, type="deployment", name="web"))
            events: list[Any] = []

            class Enough(Exception):
                pass

            def take(event: Any) -> None:
                events.append(event)
                if len(events) >= 6:  # 2 pods x 1 request x 3 events
                    raise Enough

            feeder = asyncio.run_coroutine_threadsafe(lab.serve_requests(["/api/b"]), lab.loop)
            with pytest.raises(Enough):
                await tap_apiclient.stream(settings, request, take)
            await asyncio.wrap_future(feeder)
            out["events"] = events
            for proxy in lab.proxies:  # that tap closed too, so the next one is the only one open
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                    asyncio.wait_for(lab.until_no_taps(proxy), 10), lab.loop))
            # The dashboard's live tap on Kubernetes goes the same way: lines as they come, refusals in place.
            views = Views(Prometheus("http://127.0.0.1:9"), _objects(), Mesh(), tap_api=settings)
            lines: list[dict[str, Any]] = []
            feeder = asyncio.run_coroutine_threadsafe(lab.serve_requests(["/api/c"]), lab.loop)
            async with contextlib.aclosing(views.tap_events({"resource": "deploy/web", "namespace": NS})) as items:
                async for item in items:  # closed on leaving, as the page's going away cancels it
                    lines.append(item)
                    if len(lines) >= 6:
                        break
            await asyncio.wrap_future(feeder)
            out["dashboard"] = lines
            mallory_views = Views(Prometheus("http://127.0.0.1:9"), _objects(), Mesh(),
                                  tap_api=ClientSettings(kubeconfig=mallory))
            out["dashboard mallory"] = [i async for i in mallory_views.tap_events(
                {"resource": "deploy/web", "namespace": NS})]
        finally:
            await runner.cleanup()
            await kube.close()
        out["reviews"] = [r.data["spec"] for r in api["post", SAR]]
    return out


def test_tap_goes_through_the_api_server_as_the_kubeconfig_s_user(lab: TapLab, tmp_path: Path) -> None:
    out = asyncio.run(_exercise(lab, tmp_path))
    missing = out["not installed"]
    assert missing.exit_code == 1 and "the Kubernetes API refused POST /apis/tap.linkerd.io/v1alpha1/watch/" \
        "namespaces/emojivoto/deployments/web/tap: 404 NotFound" in missing.output
    assert "kubectl get apiservice v1alpha1.tap.linkerd.io" in missing.output
    denied = out["mallory"]
    assert denied.exit_code == 1 and "user 'mallory' may not watch deployments/tap" in denied.output
    assert "no RBAC policy matched" in denied.output and "Traceback" not in denied.output
    untappable = out["untappable"]
    assert untappable.exit_code == 1 and "emoji-5d8f7c9b4-aaaaa: tap not enabled" in untappable.output
    flag = out["tap server flag"]
    assert flag.exit_code == 2 and "--tap-server: not used with --platform kubernetes" in flag.output
    listed = out["list"]
    assert listed.exit_code == 0
    rows = {line.split()[1]: " ".join(line.split()[2:]) for line in listed.output.splitlines()[1:]}
    assert rows["web-5d8f7c9b4-abcde"] == "enabled" and rows["web-5d8f7c9b4-fghij"] == "enabled"
    assert rows["emoji-5d8f7c9b4-ccccc"] == "tap disabled (viz.linkerd.io/disable-tap)"
    profile = out["profile"]
    assert profile.exit_code == 0, profile.output
    doc = yaml.safe_load(profile.output)
    assert [r["name"] for r in doc["spec"]["routes"]] == ["GET /api/a", "GET /web"]
    inits = [e for e in out["events"] if e.http.WhichOneof("event") == "request_init"]
    assert sorted((e.http.request_init.path, e.http.request_init.id.base) for e in inits) == [
        ("/api/b", 1), ("/api/b", 2)]
    dashboard = out["dashboard"]
    assert [d["kind"] for d in dashboard].count("request_init") == 2 and all("line" in d for d in dashboard)
    assert all(":path=/api/c" in d["line"] for d in dashboard if d["kind"] == "request_init")
    (refused,) = out["dashboard mallory"]
    assert "user 'mallory' may not watch deployments/tap" in refused["error"]
    # Each tap was reviewed for the user the token named; mallory's was refused there.
    assert {s["user"] for s in out["reviews"]} == {"alice", "mallory"}


def test_the_dashboard_on_kubernetes_refuses_a_local_tap_server(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["viz", "dashboard", "--platform", "kubernetes", "--tap-server", "127.0.0.1:1",
                                      "--prometheus-url", "http://127.0.0.1:9", "--show", "url"],
                                env={"TETHER_HOME": str(tmp_path)})
    assert result.exit_code == 2 and "--tap-server: not used with --platform kubernetes" in result.output
