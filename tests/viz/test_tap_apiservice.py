"""The tap APIService: the API server's proxied tap requests over real TLS, authorized, streamed from two real pods.

kmock stands in for the Kubernetes API server: it serves the
``extension-apiserver-authentication`` ConfigMap and answers the
SubjectAccessReviews (alice may watch ``deployments/tap`` in emojivoto; no one
else may).  The requests themselves come over real TLS with a front-proxy
client certificate, as the API server's aggregator sends them; the tap
controller and the two "pods" it taps are ``taplab``'s real ones.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest

from k8s.kube_helpers import emulated_api
from tether.api import tap_pb2, viz_tap_pb2
from tether.cli.install_cmd import webhook_certificate
from tether.platform.kubernetes.client import KubeClient
from tether.viz import tap_apiservice as rules
from tether.viz import tap_apiservice_server as server
from viz.taplab import NS, TapLab

SAR = kmock.resource("authorization.k8s.io", "v1", "subjectaccessreviews")
VM = viz_tap_pb2.TapByResourceRequest.Match
WEB = f"{rules.PREFIX}{NS}/deployments/web/tap"


def test_routes_read_as_linkerd_s() -> None:
    assert rules.parse_route(WEB) == rules.Route(NS, "deployments", "web")
    assert rules.parse_route(f"{rules.PREFIX}{NS}/tap") == rules.Route(NS, "namespaces", "")
    with pytest.raises(rules.NotFound, match="type one of pods"):
        rules.parse_route(f"{rules.PREFIX}{NS}/secrets/x/tap")
    request = viz_tap_pb2.TapByResourceRequest()
    request.target.resource.CopyFrom(viz_tap_pb2.Resource(namespace=NS, type="deployment", name="web"))
    assert rules.expected_path(request) == WEB
    review = rules.access_review(rules.parse_route(WEB), rules.User("alice", ("devs",), {"scopes": ("a",)}))
    assert review["spec"] == {"resourceAttributes": {
        "namespace": NS, "verb": "watch", "group": "tap.linkerd.io", "version": "v1alpha1",
        "resource": "deployments", "subresource": "tap", "name": "web"}, "user": "alice", "groups": ["devs"],
        "extra": {"scopes": ["a"]}}
    buffer = bytearray(rules.frame(b"abc") + rules.frame(b"") + rules.frame(b"de")[:3])
    assert rules.read_frames(buffer) == [b"abc", b""] and len(buffer) == 3


def test_the_configmap_s_missing_ca_is_named() -> None:
    with pytest.raises(ValueError, match="requestheader-client-ca-file"):
        rules.RequestHeaderAuth.from_configmap({"data": {}})
    with pytest.raises(ValueError, match="requestheader-allowed-names is not a JSON list"):
        rules.RequestHeaderAuth.from_configmap({"data": {"requestheader-client-ca-file": "x",
                                                         "requestheader-username-headers": '["X-Remote-User"]',
                                                         "requestheader-allowed-names": "front"}})


@pytest.fixture(scope="module")
def lab() -> Iterator[TapLab]:
    lab = TapLab()
    yield lab
    lab.close()


def _sar(request: Any) -> dict[str, Any]:
    """RBAC as the cluster would answer: alice (group devs) may watch deployments/tap in emojivoto."""
    spec = request.data["spec"]
    attrs = spec["resourceAttributes"]
    allowed = (spec["user"] == "alice" and "devs" in spec["groups"] and attrs["namespace"] == NS
               and attrs["resource"] == "deployments" and attrs["subresource"] == "tap"
               and attrs["verb"] == "watch" and attrs["group"] == "tap.linkerd.io")
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
            "status": {"allowed": allowed, **({} if allowed else {"reason": "no RBAC policy matched"})}}


def _tap_body(kind: str, name: str, path: str = "") -> bytes:
    request = viz_tap_pb2.TapByResourceRequest(maxRps=10)
    request.target.resource.CopyFrom(viz_tap_pb2.Resource(namespace=NS, type=kind, name=name))
    if path:
        request.match.CopyFrom(VM(http=VM.Http(path=path)))
    return request.SerializeToString()


def _client(tmp_path: Path, name: str, ca: str, crt: str, key: str) -> ssl.SSLContext:
    (tmp_path / f"{name}.crt").write_text(crt)
    (tmp_path / f"{name}.key").write_text(key)
    context = ssl.create_default_context(cadata=ca)
    context.check_hostname = False  # the aggregator dials the Service by IP and checks the APIService's caBundle
    context.load_cert_chain(tmp_path / f"{name}.crt", tmp_path / f"{name}.key")
    return context


async def _exercise(lab: TapLab, tmp_path: Path) -> dict[str, Any]:
    now = datetime.now(UTC)
    tap_ca, tap_crt, tap_key = webhook_certificate("tap.linkerd-viz.svc", "cluster.local", now)
    front_ca, front_crt, front_key = webhook_certificate("front-proxy-client", "cluster.local", now)
    _, other_crt, other_key = webhook_certificate("front-proxy-client", "cluster.local", now)  # another CA's
    (tmp_path / "tap.crt").write_text(tap_crt)
    (tmp_path / "tap.key").write_text(tap_key)
    out: dict[str, Any] = {}
    async with emulated_api(tmp_path, kmock.KubernetesScaffold) as (api, _srv, settings):
        api["get /api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"] << {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extension-apiserver-authentication"},
            "data": {"requestheader-client-ca-file": front_ca,
                     "requestheader-allowed-names": '["front-proxy-client"]',
                     "requestheader-username-headers": '["X-Remote-User"]',
                     "requestheader-group-headers": '["X-Remote-Group"]',
                     "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]'}}
        api["post", SAR] << _sar
        kube = KubeClient(settings)
        auth = await server.load_auth(kube)
        service = server.TapApiService(kube, auth, lab.controller)
        runner = await server.serve(service, server.tls_context(tmp_path / "tap.crt", tmp_path / "tap.key",
                                                                auth.client_ca_pem), "127.0.0.1", 0)
        base = f"https://127.0.0.1:{runner.addresses[0][1]}"
        front = _client(tmp_path, "front", tap_ca, front_crt, front_key)
        try:
            async with aiohttp.ClientSession() as session:
                async def post(path: str, body: bytes, user: str = "alice", tls: ssl.SSLContext = front,
                               ) -> tuple[int, str, bytes]:
                    headers = {"X-Remote-User": user, "X-Remote-Group": "devs"} if user else {}
                    async with session.post(base + path, data=body, headers=headers, ssl=tls) as r:
                        return r.status, r.headers.get(rules.ERROR_HEADER, ""), await r.read()

                out["mallory"] = await post(WEB, _tap_body("deployment", "web"), user="mallory")
                out["anonymous"] = await post(WEB, _tap_body("deployment", "web"), user="")
                out["mismatch"] = await post(WEB, _tap_body("deployment", "emoji"))
                out["untappable"] = await post(f"{rules.PREFIX}{NS}/deployments/emoji/tap",
                                               _tap_body("deployment", "emoji"))
                out["discovery"] = await (await session.get(f"{base}/apis/tap.linkerd.io/v1alpha1", ssl=front)).json()
                try:
                    await post(WEB, b"", tls=_client(tmp_path, "other", tap_ca, other_crt, other_key))
                    out["other CA"] = "served"
                except aiohttp.ClientError:
                    out["other CA"] = "refused"
                # alice taps deploy/web for /api: both pods' matching requests, framed as Linkerd's protohttp.
                async with session.post(base + WEB, data=_tap_body("deployment", "web", "/api"),
                                        headers={"X-Remote-User": "alice", "X-Remote-Group": "devs"},
                                        ssl=front) as r:
                    out["status"], out["content-type"] = r.status, r.content_type
                    feeder = asyncio.run_coroutine_threadsafe(lab.serve_requests(["/api/a", "/web", "/api/b"]),
                                                              lab.loop)
                    buffer, events = bytearray(), []
                    async for chunk in r.content.iter_any():
                        buffer += chunk
                        events += [tap_pb2.TapEvent.FromString(f) for f in rules.read_frames(buffer)]
                        if len(events) >= 12:  # 2 pods x 2 matching requests x 3 events
                            break
                    out["events"] = events
                    await asyncio.wrap_future(feeder)
                # The client went away: both pods' taps close.
                for proxy in lab.proxies:
                    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                        asyncio.wait_for(lab.until_no_taps(proxy), 10), lab.loop))
                out["taps closed"] = True
        finally:
            await runner.cleanup()
            await kube.close()
        out["reviews"] = [r.data["spec"] for r in api["post", SAR]]
    return out


def test_the_apiservice_authorizes_then_streams_the_pods_events(lab: TapLab, tmp_path: Path) -> None:
    out = asyncio.run(_exercise(lab, tmp_path))
    code, header, body = out["mallory"]
    assert code == 403 and header == "Forbidden"
    (frame,) = rules.read_frames(bytearray(body))
    message = rules.error_message(frame)
    assert "user 'mallory' may not watch deployments/tap" in message and "no RBAC policy matched" in message
    code, _, body = out["anonymous"]
    assert code == 401 and b"no user named in X-Remote-User" in body
    code, _, body = out["mismatch"]
    assert code == 400 and b"tap request body did not match APIServer URL" in body
    code, header, body = out["untappable"]
    assert code == 404 and header == "Not Found" and b"emoji-5d8f7c9b4-aaaaa: tap not enabled" in body
    assert out["other CA"] == "refused"  # a client certificate the front-proxy CA did not sign: no handshake
    assert {"name": "deployments/tap", "singularName": "", "namespaced": True, "kind": "Tap",
            "verbs": ["watch"]} in out["discovery"]["resources"]
    assert out["taps closed"]
    assert out["status"] == 200 and out["content-type"] == rules.CONTENT_TYPE
    inits = [e for e in out["events"] if e.http.WhichOneof("event") == "request_init"]
    assert sorted((e.http.request_init.path, e.http.request_init.id.base) for e in inits) == [
        ("/api/a", 1), ("/api/a", 2), ("/api/b", 1), ("/api/b", 2)]
    # Every request was reviewed for its user; mallory's and alice's both reached the API server.
    assert {s["user"] for s in out["reviews"]} == {"alice", "mallory"}
    assert all(s["resourceAttributes"]["subresource"] == "tap" for s in out["reviews"])
