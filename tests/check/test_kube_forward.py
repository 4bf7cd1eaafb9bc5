"""``tether diagnostics endpoints|profile|policy --platform kubernetes``: components reached with only a kubeconfig.

The API server is kmock (a mock, as in every Kubernetes test here): it holds the
workloads the destination watches, the control plane's pods and the trust-roots
ConfigMap.  kmock speaks no port-forward protocol (neither SPDY nor the WebSocket
``v4.channel.k8s.io``), so the one module that does — ``tether.platform.kubernetes.
tunnel`` — is replaced by a loopback stand-in: each tunnel is a TCP connection to
the real destination service this test runs (real gRPC, real TLS verified against
the anchors read from the ConfigMap).  Everything else runs as in a cluster: the
ready destination pod is found through the API, a loopback port is forwarded, the
CLI's gRPC client connects to it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from destination.destination_helpers import make_pki
from policy import policy_helpers
from k8s.kube_helpers import emulated_api
from k8s.test_controllers import SLICES, WEB_ID, endpoint_slice, namespace, pod, service
from tether.cli import kube_forward
from tether.cli.platform_opts import Platform
from tether.destination import DestinationConfig, DestinationService, TlsFiles
from tether.platform.kubernetes.portforward import PortForwardError

from .test_kube_diagnostics import tether

AUTHORITY = "web.emojivoto.svc.cluster.local:80"


class LoopbackTunnel:
    """The stand-in for the API server's port-forward: a TCP connection to a port on this machine."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self) -> bytes:
        return await self._reader.read(65536)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()


def loopback_to(port: int, dialed: list[tuple[str, str, int]]) -> Callable[[Platform], Any]:
    """A ``kube_forward.tunnel_factory`` whose tunnels are TCP connections to ``port`` here; records what was asked."""

    def factory(_: Platform) -> Callable[[str, str, int], Any]:
        def dialer(namespace_: str, pod_: str, pod_port: int) -> Any:
            dialed.append((namespace_, pod_, pod_port))

            async def dial() -> LoopbackTunnel:
                return LoopbackTunnel(*await asyncio.open_connection("127.0.0.1", port))

            return dial

        return dialer

    return factory


def control_plane_pod(name: str, ready: bool, component: str = "destination") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "linkerd",
                         "labels": {"linkerd.io/control-plane-component": component}},
            "spec": {"containers": [{"name": "destination", "image": "tether"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}}


async def test_endpoints_and_profile_through_a_forward_to_the_ready_destination_pod(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pki = make_pki(tmp_path / "pki")
    async with emulated_api(tmp_path) as (api, _, settings):
        for resource in ("policy.linkerd.io/v1beta3/servers", "linkerd.io/v1alpha2/serviceprofiles",
                         "discovery.k8s.io/v1/endpointslices", "workload.linkerd.io/v1beta1/externalworkloads",
                         "v1/configmaps", "v1/nodes", "apps/v1/replicasets", "batch/v1/jobs"):
            api.resources[resource] = {}
        api.namespaces.append(namespace("emojivoto"))
        await api.post("/api/v1/namespaces/emojivoto/services", json=service("web", "emojivoto", "10.96.0.10"))
        await api.post("/api/v1/namespaces/emojivoto/pods", json=pod("web-1", "emojivoto", "web", "10.1.0.1"))
        await api.post(SLICES, json=endpoint_slice("web", "emojivoto", ("web-1", "10.1.0.1")))
        await api.post("/api/v1/namespaces/linkerd/pods", json=control_plane_pod("linkerd-destination-a", ready=False))
        await api.post("/api/v1/namespaces/linkerd/pods", json=control_plane_pod("linkerd-destination-b", ready=True))
        kube = ["--platform", "kubernetes", "--kubeconfig", str(settings.kubeconfig)]

        code, _, err = await tether("diagnostics", "endpoints", AUTHORITY, *kube)
        assert code == 1 and "ConfigMap linkerd/linkerd-identity-trust-roots not found" in err

        await api.post("/api/v1/namespaces/linkerd/configmaps", json=trust_roots(pki.ca.read_text()))
        watcher = Platform("kubernetes", settings.kubeconfig).resource_watcher()
        config = DestinationConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0",
                                   tls=TlsFiles(pki.server_cert, pki.server_key))
        destination = DestinationService(config, watcher)
        await asyncio.wait_for(destination.start(), 20)
        dialed: list[tuple[str, str, int]] = []
        monkeypatch.setattr(kube_forward, "tunnel_factory", loopback_to(destination.port, dialed))
        try:
            code, out, err = await tether("diagnostics", "endpoints", AUTHORITY, "-o", "json", *kube)
            assert code == 0, err
            (addr,) = json.loads(out)["add"]["addrs"]
            assert addr["addr"] == "10.1.0.1:8080" and addr["tls_identity"] == WEB_ID
            assert dialed == [("linkerd", "linkerd-destination-b", 8086)]  # the ready pod, the gRPC port

            code, out, err = await tether("diagnostics", "profile", AUTHORITY, "-o", "json", *kube)
            assert code == 0, err
            assert json.loads(out)["fully_qualified_name"] == "web.emojivoto.svc.cluster.local"

            code, _, err = await tether("diagnostics", "endpoints", "nope.emojivoto.svc.cluster.local:80", *kube)
            assert code == 1 and "unknown service" in err

            code, _, err = await tether("diagnostics", "endpoints", AUTHORITY, "--destination-addr", "x:1", *kube)
            assert code == 2 and "--destination-addr is for the local platform" in err

            def refused(_: Platform) -> Callable[[str, str, int], Any]:
                async def dial() -> LoopbackTunnel:
                    raise PortForwardError("port-forward to pod linkerd/linkerd-destination-b:8086: "
                                           "the API server answered 403 Forbidden")

                return lambda *_: dial

            monkeypatch.setattr(kube_forward, "tunnel_factory", refused)
            code, _, err = await tether("diagnostics", "endpoints", AUTHORITY, "--timeout", "2", *kube)
            assert code == 1 and "linkerd/linkerd-destination-b" in err and "403 Forbidden" in err, err
        finally:
            await destination.stop()

        await api.delete("/api/v1/namespaces/linkerd/pods/linkerd-destination-b")
        code, _, err = await tether("diagnostics", "endpoints", AUTHORITY, *kube)
        assert code == 1 and "no ready destination pod in namespace linkerd" in err and "1 pod(s), none ready" in err



def trust_roots(pem_text: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "linkerd-identity-trust-roots", "namespace": "linkerd"},
            "data": {"ca-bundle.crt": pem_text}}


async def test_policy_through_a_forward_to_the_ready_policy_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pki").mkdir()
    pki = policy_helpers.make_pki(tmp_path / "pki")
    async with emulated_api(tmp_path) as (api, _, settings):
        for resource in ("v1/configmaps", "v1/pods"):
            api.resources[resource] = {}
        await api.post("/api/v1/namespaces/linkerd/pods", json=control_plane_pod("linkerd-policy-1", True, "policy"))
        await api.post("/api/v1/namespaces/linkerd/configmaps", json=trust_roots(pki.ca.read_text()))
        async with policy_helpers.Harness(tmp_path, pki, policy_helpers.namespace(), policy_helpers.pod()) as h:
            dialed: list[tuple[str, str, int]] = []
            monkeypatch.setattr(kube_forward, "tunnel_factory", loopback_to(h.service.port, dialed))
            kube = ["--platform", "kubernetes", "--kubeconfig", str(settings.kubeconfig)]
            # The harness's controller asks for a client certificate (mTLS); the roots still come from the cluster.
            mtls = ["--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
            code, out, err = await tether("diagnostics", "policy", "po/web-0", "8080", "-n", policy_helpers.NS,
                                          "-o", "json", *mtls, *kube)
            assert code == 0, err
            assert json.loads(out)["labels"]["kind"] == "default", out
            assert dialed == [("linkerd", "linkerd-policy-1", 8090)]

            code, _, err = await tether("diagnostics", "policy", "po/web-0", "8080", "--policy-addr", "x:1", *kube)
            assert code == 2 and "--policy-addr is for the local platform" in err
