"""Identity and destination on the Kubernetes platform, against kmock, answering real gRPC calls.

The services run as they do in a cluster, with the platform chosen the way the
command line chooses it (``Platform("kubernetes", kubeconfig)`` from
``tether.cli.platform_opts``), but the API server is kmock on localhost: its
emulator holds the Namespaces, Services and Pods the destination watches, and its
scaffold answers the identity's TokenReviews like a service-account authenticator.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import kmock
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tether.api import identity_pb2, identity_pb2_grpc
from tether.cli.platform_opts import Platform
from tether.destination import DestinationConfig, DestinationService
from tether.destination.client import DestinationError, open_channel, stream_endpoints, update_dict
from tether.identity import pem, pki
from tether.identity.server import IdentityConfig, IdentityService
from tether.naming import control_plane_identity
from tether.platform.tokens import IDENTITY_AUDIENCE

from .kube_helpers import TOKEN_REVIEWS, FakeAuthenticator, ThreadedApi, emulated_api, watching

WEB_ID = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"


# -- identity ---------------------------------------------------------------------------------------

def write_pki(directory: Path) -> tuple[Path, Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    anchor, anchor_key = pki.create_trust_anchor(control_plane_ns="linkerd", trust_domain="cluster.local",
                                                 valid_for=timedelta(days=30), now=now)
    issuer, issuer_key = pki.create_issuer(anchor, anchor_key, control_plane_ns="linkerd",
                                           trust_domain="cluster.local", valid_for=timedelta(days=30), now=now)
    paths = directory / "ca-bundle.crt", directory / "crt.pem", directory / "key.pem"
    pem.write_file(paths[0], pem.certificate_pem(anchor), private=False)
    pem.write_file(paths[1], pem.certificate_pem(issuer), private=False)
    pem.write_file(paths[2], pem.private_key_pem(issuer_key), private=True)
    return paths


def csr_for(identity: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(identity)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.DER)


async def certify(port: int, anchors: Path, identity: str, token: bytes) -> identity_pb2.CertifyResponse:
    credentials = grpc.ssl_channel_credentials(root_certificates=anchors.read_bytes())
    server_name = control_plane_identity("identity", "linkerd", "cluster.local").dns_name
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials,
                                       options=[("grpc.ssl_target_name_override", server_name)]) as channel:
        stub = identity_pb2_grpc.IdentityStub(channel)
        request = identity_pb2.CertifyRequest(identity=identity, token=token,
                                              certificate_signing_request=csr_for(identity))
        return await stub.Certify(request, timeout=20)


def test_identity_certifies_with_tokens_the_api_server_vouches_for(tmp_path: Path) -> None:
    anchors, issuer_cert, issuer_key = write_pki(tmp_path / "pki")
    auth = FakeAuthenticator()
    auth.add("web-token", "system:serviceaccount:emojivoto:web", [IDENTITY_AUDIENCE], pod="web-1")
    auth.add("legacy-token", "system:serviceaccount:emojivoto:web", ["https://kubernetes.default.svc.cluster.local"])
    auth.add("other-token", "system:serviceaccount:emojivoto:vote", [IDENTITY_AUDIENCE])
    # The token verifier blocks the identity's loop while it waits: the API runs on a thread of its own.
    with ThreadedApi(tmp_path, kmock.KubernetesScaffold) as api:
        async def script() -> None:
            api.api["post", TOKEN_REVIEWS] << auth

        api.call(script)
        platform = Platform("kubernetes", api.settings.kubeconfig)
        verifier = platform.token_verifier(tmp_path / "unused-state")
        config = IdentityConfig(trust_anchors=anchors, issuer_cert=issuer_cert, issuer_key=issuer_key,
                                addr="127.0.0.1:0", admin_addr="127.0.0.1:0")

        async def scenario() -> None:
            service = IdentityService(config, verifier)
            await service.start()
            try:
                issued = await certify(service.port, anchors, WEB_ID, b"web-token")
                leaf = x509.load_der_x509_certificate(issued.leaf_certificate)
                sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                assert sans.get_values_for_type(x509.DNSName) == [WEB_ID]
                assert len(issued.intermediate_certificates) == 1

                issued = await certify(service.port, anchors, WEB_ID, b"legacy-token")  # reviewed twice
                assert issued.leaf_certificate

                for token, code in [(b"forged", grpc.StatusCode.INVALID_ARGUMENT),
                                    (b"other-token", grpc.StatusCode.FAILED_PRECONDITION)]:
                    with pytest.raises(grpc.aio.AioRpcError) as failure:
                        await certify(service.port, anchors, WEB_ID, token)
                    assert failure.value.code() == code, failure.value.details()
            finally:
                await service.stop()

        try:
            asyncio.run(scenario())
        finally:
            verifier.close()  # type: ignore[attr-defined]

        reviews = api.call(_posted_reviews(api.api))
        assert [r["spec"].get("audiences") for r in reviews] == [
            [IDENTITY_AUDIENCE], [IDENTITY_AUDIENCE], None, [IDENTITY_AUDIENCE], [IDENTITY_AUDIENCE]]


def _posted_reviews(api: Any) -> Any:
    async def read() -> list[dict[str, Any]]:
        return [r.data for r in api["post"]]

    return read


# -- destination ------------------------------------------------------------------------------------

def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def service(name: str, ns: str, cluster_ip: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": name}, "clusterIP": cluster_ip,
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


def pod(name: str, ns: str, app: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app, "linkerd.io/control-plane-ns": "linkerd"}},
        "spec": {"serviceAccountName": app, "nodeName": "node-1", "containers": [
            {"name": "linkerd-proxy", "image": "tether/proxy", "ports": [{"name": "linkerd-proxy", "containerPort": 4143}],
             "env": [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"}]},
            {"name": app, "image": f"example/{app}", "ports": [{"name": "http", "containerPort": 8080}]},
        ]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def endpoint_slice(service_name: str, ns: str, *pods: tuple[str, str]) -> dict[str, Any]:
    """The slice Kubernetes' EndpointSlice controller keeps for a Service's ready pods ((name, ip) pairs)."""
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{service_name}-abcde", "namespace": ns,
                     "labels": {"kubernetes.io/service-name": service_name}},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True, "serving": True, "terminating": False},
                       "targetRef": {"kind": "Pod", "namespace": ns, "name": name}} for name, ip in pods],
    }


SLICES = "/apis/discovery.k8s.io/v1/namespaces/emojivoto/endpointslices"


async def test_destination_serves_endpoints_of_pods_and_services_from_the_api(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        for group_version_plural in ("policy.linkerd.io/v1beta3/servers", "linkerd.io/v1alpha2/serviceprofiles",
                                     "discovery.k8s.io/v1/endpointslices", "workload.linkerd.io/v1beta1/externalworkloads",
                                     "apps/v1/replicasets", "batch/v1/jobs"):
            api.resources[group_version_plural] = {}
        api.namespaces.append(namespace("emojivoto"))  # kmock cannot serve Namespaces: a recorded answer
        await api.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})
        await api.post("/api/v1/namespaces/emojivoto/services", json=service("web", "emojivoto", "10.96.0.10"))
        await api.post("/api/v1/namespaces/emojivoto/pods", json=pod("web-1", "emojivoto", "web", "10.1.0.1"))
        await api.post(SLICES, json=endpoint_slice("web", "emojivoto", ("web-1", "10.1.0.1")))
        platform = Platform("kubernetes", settings.kubeconfig)
        watcher = platform.resource_watcher()
        service_ = DestinationService(DestinationConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0"), watcher)
        Platform.export_metrics(watcher, service_.metrics.registry)
        await asyncio.wait_for(service_.start(), 20)
        try:
            async with open_channel(f"127.0.0.1:{service_.port}", None) as channel:
                updates = stream_endpoints(channel, "web.emojivoto.svc.cluster.local:80", timeout=10)
                first = update_dict(await anext(updates))
                assert [a["addr"] for a in first["add"]["addrs"]] == ["10.1.0.1:8080"]
                assert first["add"]["addrs"][0]["tls_identity"] == WEB_ID

                await watching(api, 9)  # every watched kind is being watched, so the next change streams
                await api.post("/api/v1/namespaces/emojivoto/pods", json=pod("web-2", "emojivoto", "web", "10.1.0.2"))
                await api.patch(f"{SLICES}/web-abcde", json=endpoint_slice(
                    "web", "emojivoto", ("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")))
                second = update_dict(await anext(updates))
                assert [a["addr"] for a in second["add"]["addrs"]] == ["10.1.0.2:8080"]

                await api.delete("/api/v1/namespaces/emojivoto/pods/web-1")
                await api.patch(f"{SLICES}/web-abcde", json=endpoint_slice("web", "emojivoto", ("web-2", "10.1.0.2")))
                third = update_dict(await anext(updates))
                assert third["remove"] == ["10.1.0.1:8080"]
                await updates.aclose()

                with pytest.raises(DestinationError) as missing:
                    await anext(stream_endpoints(channel, "nope.emojivoto.svc.cluster.local:80", timeout=10))
                assert missing.value.code == grpc.StatusCode.NOT_FOUND
            from prometheus_client import generate_latest

            exported = generate_latest(service_.metrics.registry).decode()
            assert 'kube_watch_synced{resource="Pod"} 1.0' in exported
        finally:
            await service_.stop()
        assert [r.get("watch") for r in api.namespace_requests] == [None, "true"]
        assert {r.url.path for r in api["list"]} >= {
            "/api/v1/services", "/api/v1/pods", "/apis/discovery.k8s.io/v1/endpointslices",
            "/apis/policy.linkerd.io/v1beta3/servers", "/apis/linkerd.io/v1alpha2/serviceprofiles"}
