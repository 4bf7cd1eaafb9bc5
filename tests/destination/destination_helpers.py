"""Helpers for the destination tests: a PKI made with ``cryptography``, object builders, a running service.

``Harness`` runs the real ``DestinationService`` (TLS, real grpc.aio server)
over a real store in the test's temp dir, fed by the local platform's watcher,
with the local platform's EndpointSlice and ExternalWorkload controllers keeping
the Services' slices (as ``tether up`` runs them), and opens real gRPC streams against it.  ``ServerStream.next`` (tests/grpc_streams.py) awaits the next
message (bounded by a timeout, never a sleep).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_streams import WAIT, ServerStream
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tether.api import destination_pb2 as pb
from tether.api import destination_pb2_grpc
from tether.destination import DestinationConfig, DestinationService, TlsFiles
from tether.destination.client import ClientTls, open_channel, profile_dict, update_dict
from tether.naming import control_plane_identity
from tether.platform.local.endpointslices import EndpointSliceController, desired_slices, selects
from tether.platform.local.endpointslices import external_workload_controller
from tether.platform.local.watch import LocalResourceWatcher
from tether.store import Store

DESTINATION_NAME = control_plane_identity("destination").dns_name
CLIENT_NAME = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
NS = "emojivoto"
CD = "cluster.local"


# -- PKI -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(cn: str) -> x509.Name:
    # A common name holds at most 64 characters; the SAN carries the full identity.
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])])


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _leaf(name: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, now: dt.datetime,
          usage: x509.ObjectIdentifier) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def make_pki(directory: Path) -> Pki:
    """A root CA, the destination's serving certificate (its mesh identity) and a proxy's client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("root.linkerd.cluster.local"))
        .issuer_name(_name("root.linkerd.cluster.local"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server, server_key = _leaf(DESTINATION_NAME, ca, ca_key, now, x509.ExtendedKeyUsageOID.SERVER_AUTH)
    client, client_key = _leaf(CLIENT_NAME, ca, ca_key, now, x509.ExtendedKeyUsageOID.CLIENT_AUTH)
    pem = serialization.Encoding.PEM
    return Pki(
        dir=directory,
        ca=_write(directory / "ca.crt", ca.public_bytes(pem)),
        server_cert=_write(directory / "dst.crt", server.public_bytes(pem)),
        server_key=_write(directory / "dst.key", _key_pem(server_key)),
        client_cert=_write(directory / "client.crt", client.public_bytes(pem)),
        client_key=_write(directory / "client.key", _key_pem(client_key)),
    )


# -- resources ----------------------------------------------------------------------------------------


def namespace(name: str = NS, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": annotations or {}}}


def service(name: str = "web", ns: str = NS, *, selector: dict[str, str] | None = None,
            ports: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None,
            cluster_ip: str | None = None, type_: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"app": name} if selector is None else selector,
        "ports": ports if ports is not None else [{"name": "http", "port": 80, "targetPort": 8080}],
    }
    if cluster_ip:
        spec["clusterIP"] = cluster_ip
    if type_ == "ExternalName":
        spec = {"type": "ExternalName", "externalName": "example.com"}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}}, "spec": spec}


def pod(name: str, ip: str | None, *, app: str = "web", ns: str = NS, ready: bool = True, phase: str = "Running",
        meshed: bool = True, control_plane: str | None = "linkerd", sa: str = "web",
        annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        ports: list[tuple[str, int]] | None = None, template_hash: str | None = "5d4f8",
        native_sidecar: bool = False, proxy_env: bool = True) -> dict[str, Any]:
    """A pod as a Deployment's ReplicaSet makes it; ``meshed`` adds the proxy (as the injector would)."""
    pod_labels = {"app": app, **(labels or {})}
    if template_hash:
        pod_labels["pod-template-hash"] = template_hash
    if meshed and control_plane:
        pod_labels["linkerd.io/control-plane-ns"] = control_plane
    containers: list[dict[str, Any]] = [{
        "name": app, "image": f"example/{app}:v1",
        "ports": [{"name": n, "containerPort": p} for n, p in (ports if ports is not None else [("http", 8080)])],
    }]
    init_containers: list[dict[str, Any]] = []
    if meshed:
        proxy: dict[str, Any] = {
            "name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy:edge",
            "ports": [{"name": "linkerd-proxy", "containerPort": 4143},
                      {"name": "linkerd-admin", "containerPort": 4191}],
        }
        if proxy_env:
            proxy["env"] = [
                {"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
                {"name": "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "value": "0.0.0.0:4191"},
                {"name": "LINKERD2_PROXY_CONTROL_LISTEN_ADDR", "value": "0.0.0.0:4190"},
            ]
        if native_sidecar:
            init_containers.append({**proxy, "restartPolicy": "Always"})
        else:
            containers.insert(0, proxy)
    metadata: dict[str, Any] = {"name": name, "namespace": ns, "labels": pod_labels,
                                "annotations": annotations or {}}
    if template_hash:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-{template_hash}",
                                        "uid": "rs-uid", "controller": True}]
    spec: dict[str, Any] = {"serviceAccountName": sa, "containers": containers}
    if init_containers:
        spec["initContainers"] = init_containers
    status: dict[str, Any] = {"phase": phase,
                              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def server(name: str, *, app: str = "web", port: int | str = 8080, protocol: str = "opaque",
           ns: str = NS) -> dict[str, Any]:
    return {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server", "metadata": {"name": name, "namespace": ns},
            "spec": {"podSelector": {"matchLabels": {"app": app}}, "port": port, "proxyProtocol": protocol}}


def profile(svc: str = "web", svc_ns: str = NS, *, ns: str | None = None,
            routes: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body = {"routes": routes if routes is not None else [{"name": "GET /", "condition": {"method": "GET"}}], **spec}
    return {"apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
            "metadata": {"name": f"{svc}.{svc_ns}.svc.{CD}", "namespace": ns or svc_ns}, "spec": body}


def authority(svc: str = "web", port: int = 80, ns: str = NS) -> str:
    return f"{svc}.{ns}.svc.{CD}:{port}"


def token(ns: str) -> str:
    return json.dumps({"ns": ns, "nodeName": "node-1", "pod": "client-0"})


# -- running -----------------------------------------------------------------------------------------------


class Harness:
    """A store in ``directory``, the destination over it (TLS), and a client channel."""

    def __init__(self, directory: Path, pki: Pki, *objects: dict[str, Any], require_client_certs: bool = False,
                 history: int = 10_000, **config: Any) -> None:
        """``objects`` are stored before the service starts, so the index holds them when streams open."""
        self.directory = directory
        self._objects = list(objects)
        self.pki = pki
        self._require_client_certs = require_client_certs
        self._history = history
        self._config = config
        self.store: Store
        self.service: DestinationService
        self.channel: grpc.aio.Channel

    async def __aenter__(self) -> "Harness":
        # A short poll interval: the store's cross-process wake-ups are its own business (and tests).
        self.store = Store(self.directory / "store.db", history=self._history, poll_interval=0.2)
        if self._objects:
            self.store.apply_many(self._objects)
        self.slices = EndpointSliceController(self.store)
        self.external_slices = external_workload_controller(self.store)
        self._slices_tasks = [asyncio.create_task(c.run()) for c in (self.slices, self.external_slices)]
        for controller in (self.slices, self.external_slices):  # the first slices are in before streams open
            await asyncio.wait_for(controller.reconciled.wait(), WAIT)
        tls = TlsFiles(self.pki.server_cert, self.pki.server_key,
                       self.pki.ca if self._require_client_certs else None)
        config = DestinationConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0", tls=tls, **self._config)
        self.service = DestinationService(config, LocalResourceWatcher(self.store))
        await self.service.start()
        self.channel = self.open_channel()
        return self

    def client_tls(self, *, with_cert: bool | None = None) -> ClientTls:
        with_cert = self._require_client_certs if with_cert is None else with_cert
        return ClientTls(roots=self.pki.ca, server_name=DESTINATION_NAME,
                         cert=self.pki.client_cert if with_cert else None,
                         key=self.pki.client_key if with_cert else None)

    def open_channel(self, **options: Any) -> grpc.aio.Channel:
        return open_channel(self.address, self.client_tls(**options))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.service.port}"

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.service.stop()
        for task in self._slices_tasks:
            task.cancel()
        await asyncio.gather(*self._slices_tasks, return_exceptions=True)
        self.store.close()

    def apply(self, *objs: dict[str, Any]) -> None:
        self.store.apply_many(list(objs))

    def delete(self, kind: str, name: str, ns: str | None = NS) -> None:
        self.store.delete(kind, ns, name)

    def get(self, path: str, context_token: str = "", channel: grpc.aio.Channel | None = None) -> ServerStream:
        stub = destination_pb2_grpc.DestinationStub(channel or self.channel)
        return ServerStream(stub.Get(pb.GetDestination(scheme="k8s", path=path, context_token=context_token)), update_dict)

    def get_profile(self, path: str, context_token: str = "", channel: grpc.aio.Channel | None = None) -> ServerStream:
        stub = destination_pb2_grpc.DestinationStub(channel or self.channel)
        return ServerStream(stub.GetProfile(pb.GetDestination(scheme="k8s", path=path, context_token=context_token)),
                      profile_dict)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.service.metrics.registry.get_sample_value(name, labels or {})


def with_slices(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``objects`` plus the EndpointSlices the local platform's controller keeps for their Services."""
    pods = [o for o in objects if o["kind"] == "Pod"]
    slices = [s for o in objects if o["kind"] == "Service" and selects(o) for s in desired_slices(o, pods)]
    return objects + slices


async def eventually(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    """Wait for server-side bookkeeping that sends no message (an unsubscribe after a cancel)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def addrs(update: dict[str, Any]) -> list[str]:
    """The addresses an ``add`` carries, sorted."""
    return sorted(a["addr"] for a in update["add"]["addrs"])


def by_addr(update: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["addr"]: a for a in update["add"]["addrs"]}
