"""``tether diagnose`` and ``tether identity po/NAME`` with ``--platform kubernetes``.

The API server is kmock (a mock, as in every Kubernetes test here): it holds the
pods, namespaces and services as a cluster would serve them — each pod object as
the injector and the kubelet make it (``linkerd-init`` or the CNI validator and
their reported state, the trust-root annotation) — and the control plane's
ConfigMaps, issuer Secret and pods.  kmock speaks no port-forward protocol, so
the one module that does (``tether.platform.kubernetes.tunnel``) is replaced by a
loopback stand-in: each tunnel is a TCP connection to the real process the pod
port stands for.  Everything the evidence says about proxies comes from real
proxies (``tests/proxy/proxy_harness.py``: real identity, destination and policy
controllers, real mTLS between real proxies on loopback addresses) and real calls
between them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from check.test_kube_diagnostics import tether
from check.test_kube_forward import LoopbackTunnel, control_plane_pod, trust_roots
from k8s.kube_helpers import emulated_api
from proxy.proxy_harness import DESTINATION_SVC, NS, App, HttpServer, Mesh, Pod, connection, namespace, run
from tether.cli import kube_forward
from tether.cli.platform_opts import Platform
from tether.identity import pem
from tether.injector.annotations import TRUST_ROOT_SHA256, trust_root_sha256
from tether.platform.kubernetes.portforward import PortForwardError
from tether.platform.local.watch import LocalResourceWatcher
from tether.policy import PolicyConfig, PolicyService
from tether.serving.grpc_server import TlsFiles


class Failing(App):
    """An HTTP/1.1 app that answers every request 500."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom")
            await writer.drain()


def as_served(pod: Pod, anchors_pem: str, *, init: dict[str, Any] | None = None,
              init_name: str = "linkerd-init", root: str | None = None) -> dict[str, Any]:
    """``pod`` as the API server serves it once injected and started: the proxy's identity variables, the
    trust-root annotation, the init container and the kubelet's report of it (exit 0 unless ``init``)."""
    obj = copy.deepcopy(pod.manifest())
    obj["metadata"]["annotations"] = {**obj["metadata"]["annotations"],
                                      TRUST_ROOT_SHA256: root or trust_root_sha256(anchors_pem)}
    proxy = obj["spec"]["containers"][0]
    proxy["env"] += [{"name": "LINKERD2_PROXY_IDENTITY_LOCAL_NAME", "value": pod.identity}]
    obj["spec"]["initContainers"] = [{"name": init_name, "image": "tether"}]
    obj["status"]["initContainerStatuses"] = [
        {"name": init_name, "state": init or {"terminated": {"exitCode": 0, "reason": "Completed"}}}]
    return obj


def unmeshed(name: str, app: str, ip: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": app},
                         "annotations": {"linkerd.io/inject": "disabled"}},
            "spec": {"containers": [{"name": app, "image": "x"}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


@dataclass
class Cluster:
    """kmock as the API server, the mesh's real processes behind the tunnels, and the CLI's arguments."""

    api: Any
    mesh: Mesh
    kube: list[str]
    pods: dict[str, str] = field(default_factory=dict)  # pod name -> its loopback IP (the tunnels' target)
    dialed: list[tuple[str, str, int]] = field(default_factory=list)

    async def add(self, *objects: dict[str, Any]) -> None:
        for obj in objects:
            meta = obj["metadata"]
            plural = {"Pod": "pods", "Service": "services", "ConfigMap": "configmaps", "Secret": "secrets"}[obj["kind"]]
            await self.api.post(f"/api/v1/namespaces/{meta['namespace']}/{plural}", json=obj)
            if obj["kind"] == "Pod" and (obj.get("status") or {}).get("podIP"):
                self.pods[meta["name"]] = obj["status"]["podIP"]

    def tunnels(self, control: dict[str, int]) -> Callable[[Platform], Any]:
        def factory(_: Platform) -> Callable[[str, str, int], Any]:
            def dialer(ns: str, pod: str, port: int) -> Any:
                self.dialed.append((ns, pod, port))

                async def dial() -> LoopbackTunnel:
                    if ns == "linkerd":
                        host, target = "127.0.0.1", control[pod]
                    elif pod in self.pods:
                        host, target = self.pods[pod], port
                    else:
                        raise PortForwardError(f"port-forward to pod {ns}/{pod}:{port}: pods \"{pod}\" not found")
                    return LoopbackTunnel(*await asyncio.open_connection(host, target))

                return dial

            return dialer

        return factory

    async def diagnose(self, *args: str) -> tuple[int, dict[str, Any]]:
        code, out, err = await tether("diagnose", *args, "-n", NS, "-o", "json", *self.kube)
        assert code in (0, 1) and out, err
        return code, json.loads(out)


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with Mesh(tmp_path / "mesh") as mesh, emulated_api(tmp_path) as (api, _, settings):
        for resource in ("v1/pods", "v1/services", "v1/configmaps", "v1/secrets", "apps/v1/deployments"):
            api.resources[resource] = {}
        api.namespaces.append(namespace())
        cert, key = mesh.ca.write_leaf(DESTINATION_SVC, "policy")
        policy = PolicyService(PolicyConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0", tls=TlsFiles(cert, key)),
                               LocalResourceWatcher(mesh.store))
        await policy.start()
        try:
            env = Cluster(api, mesh, ["--platform", "kubernetes", "--kubeconfig", str(settings.kubeconfig)])
            anchors = mesh.ca.anchors_pem.decode()
            issuer = pem.certificate_pem(mesh.ca.issuer)
            await env.add(
                trust_roots(anchors),
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "linkerd-config", "namespace": "linkerd"},
                 "data": {"values": yaml.safe_dump({"clusterDomain": "cluster.local",
                                                    "identityTrustDomain": "cluster.local"})}},
                {"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "linkerd-identity-issuer", "namespace": "linkerd"},
                 "data": {"crt.pem": base64.b64encode(issuer).decode()}},
                control_plane_pod("linkerd-identity-1", True, "identity"),
                control_plane_pod("linkerd-destination-1", True, "destination"),
                control_plane_pod("linkerd-policy-1", True, "policy"),
            )
            monkeypatch.setattr(kube_forward, "tunnel_factory", env.tunnels(
                {"linkerd-destination-1": mesh.destination.port, "linkerd-policy-1": policy.port}))
            yield env
        finally:
            await policy.stop()


async def meshed_server(env: Cluster, name: str, app_cls: type[App], *, port: int = 8080,
                        annotations: dict[str, str] | None = None) -> tuple[Pod, str]:
    """A pod of app ``name`` with a running proxy and app, and its Service (port 80), in the store and the API."""
    mesh = env.mesh
    pod = mesh.pod(f"{name}-1", app=name, ports=[port], annotations=annotations or {})
    svc_ip = mesh.service(name, [(80, port)])
    await env.add(as_served(pod, mesh.ca.anchors_pem.decode()),
                  {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
                   "spec": {"selector": {"app": name}, "clusterIP": svc_ip,
                            "ports": [{"name": "http", "port": 80, "targetPort": port}]}})
    await mesh.start_proxy(pod)
    server = app_cls(pod.ip, port, name) if app_cls is HttpServer else app_cls(pod.ip, port)
    await env.stack.enter_async_context(server)
    return pod, svc_ip


async def call(svc_ip: str, service: str) -> int:
    """One request from the client app through its proxy, as the app makes it; the status."""
    async with connection(svc_ip, 80) as (reader, writer):
        writer.write(f"GET / HTTP/1.1\r\nhost: {service}.{NS}.svc.cluster.local:80\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1])


def test_a_call_in_a_cluster_layer_by_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # On uvloop, as the proxies run; one platform for every scenario (a few seconds each), so a longer deadline.
    run(layer_by_layer(tmp_path, monkeypatch), deadline=240)


async def layer_by_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with cluster(tmp_path, monkeypatch) as env, contextlib.AsyncExitStack() as stack:
        env.stack = stack
        mesh = env.mesh
        anchors = mesh.ca.anchors_pem.decode()
        _, web_ip = await meshed_server(env, "web", HttpServer)
        _, broken_ip = await meshed_server(env, "broken", Failing)
        locked, _ = await meshed_server(env, "locked", HttpServer,
                                         annotations={"config.linkerd.io/default-inbound-policy": "deny"})
        # A Service selecting no pod.
        ghost_ip = mesh.service("ghost", [(80, 8080)])
        await env.add({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ghost", "namespace": NS},
                       "spec": {"selector": {"app": "ghost"}, "clusterIP": ghost_ip,
                                "ports": [{"port": 80, "targetPort": 8080}]}})
        client = mesh.pod("client-1", app="client")
        await env.add(as_served(client, anchors))
        await mesh.start_proxy(client, outbound_to=[f"{web_ip}:80", f"{broken_ip}:80", f"{ghost_ip}:80"])

        # No call made yet: on Kubernetes diagnose reads the traffic the proxies carried, and there is none.
        code, result = await env.diagnose("po/client-1", "--to", "web.emojivoto:80")
        assert code == 1 and result["layer"] == "proxy", result
        assert "makes no call itself" in result["reason"]
        sources = {e["source"] for e in result["evidence"]}
        assert {"api: pod emojivoto/client-1", "component destination", "component policy"} <= sources
        assert any(e["detail"] == "init container linkerd-init (proxy-init): terminated, exit code 0 (Completed)"
                   for e in result["evidence"])
        assert any(e["source"].startswith("tls emojivoto/web-1:4143") and "web.emojivoto.serviceaccount" in e["detail"]
                   for e in result["evidence"]), result["evidence"]
        assert any(e["source"] == "destination Get web.emojivoto.svc.cluster.local:80"
                   and "pod=web-1" in e["detail"] for e in result["evidence"])
        assert ("emojivoto", "web-1", 4191) in env.dialed and ("emojivoto", "web-1", 4143) in env.dialed
        assert ("linkerd", "linkerd-destination-1", 8086) in env.dialed
        assert ("linkerd", "linkerd-policy-1", 8090) in env.dialed

        # A real call through both proxies: now the call is seen, mTLS, and it succeeded.
        assert await call(web_ip, "web") == 200
        code, result = await env.diagnose("po/client-1", "--to", "web.emojivoto:80")
        assert code == 0 and result["ok"] and result["layer"] is None, result
        # The same through the client's Deployment (its pods found by its selector).
        await env.api.post(f"/apis/apps/v1/namespaces/{NS}/deployments", json={
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "client", "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": "client"}}, "template": {}}})
        code, result = await env.diagnose("deploy/client", "--to", "web.emojivoto:80")
        assert code == 0 and result["ok"] and result["target"] == "deploy/client", result
        assert any(e["source"] == "proxy metrics emojivoto/web-1" and 'tls="true"' in e["detail"]
                   and client.identity in e["detail"] for e in result["evidence"]), result["evidence"]

        # The app answers 500 to everything: the application layer, from the source proxy's response_total.
        assert await call(broken_ip, "broken") == 500
        code, result = await env.diagnose("po/client-1", "--to", "broken.emojivoto:80")
        assert code == 1 and result["layer"] == "application", result
        assert any(e["source"] == "proxy metrics emojivoto/client-1" and 'status_code="500"' in e["detail"]
                   for e in result["evidence"]), result["evidence"]

        # The target's default policy denies: the policy controller's answer, through its port-forward.
        code, result = await env.diagnose("po/client-1", "--to", "locked.emojivoto:80")
        assert code == 1 and result["layer"] == "policy", result
        assert f"{NS}/{locked.name}:8080" in result["reason"] and client.identity in result["reason"]

        # The Service selecting no pod: the client's call fails fast (504), diagnose names discovery with the
        # failfast its proxy counted.
        assert await call(ghost_ip, "ghost") == 504
        code, result = await env.diagnose("po/client-1", "--to", "ghost.emojivoto:80")
        assert code == 1 and result["layer"] == "discovery" and "no ready endpoints" in result["reason"], result
        assert any(e["source"] == "proxy metrics emojivoto/client-1"
                   and e["detail"].startswith('outbound_http_errors_total{error="failfast"} 1')
                   for e in result["evidence"]), result["evidence"]
        # Calls to other services fail fast too: web's answered mTLS calls still decide it is reachable.
        code, result = await env.diagnose("po/client-1", "--to", "web.emojivoto:80")
        assert code == 0 and result["ok"], result

        # Only the API server's objects decide the first layers (no proxy is asked for them).
        ip = mesh.addresses.ip()
        await env.add(unmeshed("plain-1", "plain", ip))
        code, result = await env.diagnose("po/plain-1")
        assert code == 1 and result["layer"] == "injection", result
        assert "injection_disable_annotation_present" in result["reason"]

        other = mesh.pod("stale-1", app="stale", apply=False)
        await env.add(as_served(other, anchors, root="0" * 64))
        code, result = await env.diagnose("po/stale-1")
        assert code == 1 and result["layer"] == "identity" and "trusts other trust anchors" in result["reason"], result

        cni = mesh.pod("cni-1", app="cni", apply=False)
        failed = {"waiting": {"reason": "CrashLoopBackOff"}}
        served = as_served(cni, anchors, init=failed, init_name="linkerd-network-validator")
        served["status"]["phase"] = "Pending"
        served["status"]["initContainerStatuses"][0]["lastState"] = {
            "terminated": {"exitCode": 1, "message": "no redirection: connection to 1.1.1.1:9 was not redirected"}}
        await env.add(served)
        code, result = await env.diagnose("po/cni-1")
        assert code == 1 and result["layer"] == "redirection", result
        assert "CNI plugin" in result["reason"] and "was not redirected" in result["reason"]

        skipping = mesh.pod("skip-1", app="skip", apply=False,
                            annotations={"config.linkerd.io/skip-outbound-ports": "80"})
        await env.add(as_served(skipping, anchors))
        code, result = await env.diagnose("po/skip-1", "--to", "web.emojivoto:80")
        assert code == 1 and result["layer"] == "redirection" and "skip-outbound-ports" in result["reason"]

        code, out, err = await tether("identity", "po/web-1", "-n", NS, *env.kube)
        assert code == 0, err
        assert "web.emojivoto.serviceaccount.identity.linkerd.cluster.local" in out and "issuer:" in out
        code, _, err = await tether("identity", "po/plain-1", "-n", NS, *env.kube)
        assert code == 1 and "not a running meshed pod" in err


async def test_bad_questions_are_errors_not_diagnoses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with cluster(tmp_path, monkeypatch) as env:
        code, _, err = await tether("diagnose", "po/ghost", "-n", NS, *env.kube)
        assert code == 1 and 'pods "ghost" in namespace emojivoto not found' in err
        code, _, err = await tether("diagnose", "po/ghost", "--to", "web", "-n", NS, *env.kube)
        assert code == 1 and "--to: 'web' is not SVC.NS:PORT" in err
        code, _, err = await tether("diagnose", "po/ghost", "-n", NS, "-L", "elsewhere", *env.kube)
        assert code == 1 and "ConfigMap elsewhere/linkerd-config not found" in err
        code, _, err = await tether("diagnose", "po/ghost", "-L", "elsewhere")
        assert code == 2 and "-L/--control-plane-ns is for --platform kubernetes" in err
