"""Helpers for the policy tests: a PKI from Tether's own CA, object builders, the running controller.

``Harness`` runs the real ``PolicyService`` (mTLS: it requires a client
certificate chained to the trust anchor, as proxies present) over a real store
in the test's temp dir, fed by the local platform's watcher, and calls it with
the client stubs generated from ``proto/`` as a linkerd2-proxy would.
``Harness.watch`` opens a ``ServerStream`` (tests/grpc_streams.py), whose ``next`` awaits the next message (bounded by a timeout, never a sleep).
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

from tether.api import inbound_pb2 as pb
from tether.api import inbound_pb2_grpc
from tether.identity import pem, pki as pki_mod
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.naming import WorkloadIdentity, control_plane_identity
from tether.platform.local.watch import LocalResourceWatcher
from tether.policy import PolicyConfig, PolicyService
from tether.policy.client import server_dict
from tether.policy.status import LocalStatusWriter, StatusWriter, desired_statuses
from tether.serving.channel import ClientTls, open_channel
from tether.serving.grpc_server import TlsFiles
from tether.resources import kinds
from tether.store import Store

SERVER_IDENTITY = control_plane_identity("destination")  # proxies expect the policy service to be this
SERVER_NAME = SERVER_IDENTITY.dns_name
NS = "emojivoto"
TD = "cluster.local"


def sa_id(sa: str, ns: str = NS) -> str:
    return WorkloadIdentity(sa, ns).dns_name


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(directory: Path) -> Pki:
    now = dt.datetime.now(dt.timezone.utc)
    anchor, anchor_key = pki_mod.create_trust_anchor(control_plane_ns="linkerd", trust_domain=TD,
                                                     valid_for=dt.timedelta(days=2), now=now)
    issuer_cert, issuer_key = pki_mod.create_issuer(anchor, anchor_key, control_plane_ns="linkerd", trust_domain=TD,
                                                    valid_for=dt.timedelta(days=1), now=now)
    issuer = Issuer.validated([issuer_cert], issuer_key, [anchor])
    authority = CertificateAuthority(issuer, IssuanceSettings())

    def leaf(name: WorkloadIdentity, stem: str) -> tuple[Path, Path]:
        key = pki_mod.new_key()
        cert = authority.issue(key.public_key(), name, now)
        pem.write_file(directory / f"{stem}.key", pem.private_key_pem(key), private=True)
        pem.write_file(directory / f"{stem}.crt", pem.certificate_pem(cert, *issuer.intermediates), private=False)
        return directory / f"{stem}.crt", directory / f"{stem}.key"

    pem.write_file(directory / "ca.crt", pem.certificate_pem(anchor), private=False)
    server_cert, server_key = leaf(SERVER_IDENTITY, "policy")
    client_cert, client_key = leaf(WorkloadIdentity("web", NS), "client")
    return Pki(directory / "ca.crt", server_cert, server_key, client_cert, client_key)


# -- resources ---------------------------------------------------------------------------------------


def namespace(name: str = NS, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": annotations or {}}}


def pod(name: str = "web-0", *, ns: str = NS, app: str = "web", sa: str = "web", meshed: bool = True,
        annotations: dict[str, str] | None = None, ports: list[tuple[str, int]] | None = None,
        probes: dict[str, tuple[str | int, str]] | None = None, ip: str = "10.1.0.10") -> dict[str, Any]:
    """A meshed pod (``linkerd.io/control-plane-ns`` set, as injection leaves it); ``probes``: kind -> (port, path)."""
    labels = {"app": app}
    if meshed:
        labels["linkerd.io/control-plane-ns"] = "linkerd"
    container: dict[str, Any] = {
        "name": app, "image": f"example/{app}:v1",
        "ports": [{"name": n, "containerPort": p} for n, p in (ports if ports is not None else [("http", 8080)])],
    }
    for kind, (port, path) in (probes or {}).items():
        container[f"{kind}Probe"] = {"httpGet": {"port": port, "path": path}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations or {}},
            "spec": {"serviceAccountName": sa, "containers": [container]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def _meta(name: str, ns: str, created: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if created:
        meta["creationTimestamp"] = created
    if labels:
        meta["labels"] = labels
    return meta


def server(name: str, *, port: int | str = 8080, app: str = "web", protocol: str | None = None, ns: str = NS,
           access_policy: str | None = None, created: str | None = None,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": {"matchLabels": {"app": app}}, "port": port}
    if protocol:
        spec["proxyProtocol"] = protocol
    if access_policy:
        spec["accessPolicy"] = access_policy
    return {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server", "metadata": _meta(name, ns, created, labels),
            "spec": spec}


def policy(name: str, target: tuple[str, str, str], authns: list[tuple[str, str, str]], ns: str = NS,
           created: str | None = None) -> dict[str, Any]:
    """``target``/``authns``: (group, kind, name)."""
    group, kind, target_name = target
    return {"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "AuthorizationPolicy",
            "metadata": _meta(name, ns, created),
            "spec": {"targetRef": {"group": group, "kind": kind, "name": target_name},
                     "requiredAuthenticationRefs": [{"group": g, "kind": k, "name": n} for g, k, n in authns]}}


def mesh_tls(name: str, *, identities: list[str] | None = None, refs: list[dict[str, str]] | None = None,
             ns: str = NS) -> dict[str, Any]:
    spec: dict[str, Any] = {"identities": identities} if identities is not None else {"identityRefs": refs}
    return {"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "MeshTLSAuthentication",
            "metadata": _meta(name, ns), "spec": spec}


def network_authn(name: str, networks: list[dict[str, Any]], ns: str = NS) -> dict[str, Any]:
    return {"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "NetworkAuthentication",
            "metadata": _meta(name, ns), "spec": {"networks": networks}}


def server_authz(name: str, client: dict[str, Any], *, server_name: str | None = None,
                 selector: dict[str, str] | None = None, ns: str = NS) -> dict[str, Any]:
    srv: dict[str, Any] = {"name": server_name} if server_name else {"selector": {"matchLabels": selector}}
    return {"apiVersion": "policy.linkerd.io/v1beta1", "kind": "ServerAuthorization", "metadata": _meta(name, ns),
            "spec": {"server": srv, "client": client}}


def http_route(name: str, server_name: str, rules: list[dict[str, Any]] | None = None, *, ns: str = NS,
               gateway: bool = False, created: str | None = None) -> dict[str, Any]:
    group = "gateway.networking.k8s.io" if gateway else "policy.linkerd.io"
    return {"apiVersion": f"{group}/{'v1' if gateway else 'v1beta3'}", "kind": "HTTPRoute",
            "metadata": _meta(name, ns, created),
            "spec": {"parentRefs": [{"group": "policy.linkerd.io", "kind": "Server", "name": server_name}],
                     "rules": rules if rules is not None else [{"matches": [{"path": {"value": "/api"}}]}]}}


def grpc_route(name: str, server_name: str, service: str, ns: str = NS) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute", "metadata": _meta(name, ns),
            "spec": {"parentRefs": [{"group": "policy.linkerd.io", "kind": "Server", "name": server_name}],
                     "rules": [{"matches": [{"method": {"service": service}}]}]}}


def ratelimit(name: str, server_name: str, total: int, identity: int | None = None,
              overrides: list[tuple[int, str]] | None = None, ns: str = NS, created: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"targetRef": {"group": "policy.linkerd.io", "kind": "Server", "name": server_name},
                            "total": {"requestsPerSecond": total}}
    if identity is not None:
        spec["identity"] = {"requestsPerSecond": identity}
    if overrides:
        spec["overrides"] = [{"requestsPerSecond": rps, "clientRefs": [{"kind": "ServiceAccount", "name": sa}]}
                             for rps, sa in overrides]
    return {"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "HTTPLocalRateLimitPolicy",
            "metadata": _meta(name, ns, created), "spec": spec}


def external_workload(name: str = "vm-1", *, ns: str = NS, app: str = "billing",
                      ports: list[tuple[str, int]] | None = None, annotations: dict[str, str] | None = None,
                      ip: str = "192.168.50.10") -> dict[str, Any]:
    """A VM in the mesh: its SPIFFE identity, named ports and address."""
    return {"apiVersion": "workload.linkerd.io/v1beta1", "kind": "ExternalWorkload",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}, "annotations": annotations or {}},
            "spec": {"meshTLS": {"identity": f"spiffe://{TD}/ns/{ns}/sa/{name}", "serverName": f"{name}.{TD}"},
                     "ports": [{"name": n, "port": p} for n, p in (ports if ports is not None else [("http", 8080)])],
                     "workloadIPs": [{"ip": ip}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def workload(pod_name: str = "web-0", ns: str = NS, *, external: bool = False) -> str:
    return json.dumps({"ns": ns, "external_workload" if external else "pod": pod_name})


# -- the running controller ---------------------------------------------------------------------------


class Harness:
    """A store in ``directory``, the policy controller over it (mTLS), and a client channel with a certificate."""

    def __init__(self, directory: Path, pki: Pki, *objects: dict[str, Any],
                 status_writer: Callable[[Path], StatusWriter] | None = LocalStatusWriter, **config: Any) -> None:
        """``status_writer``: makes the status writer from the store's path (the status loop runs, as in
        ``tether policy serve``: routes and rate limits count once their status is written), or None."""
        self.directory = directory
        self._objects = list(objects)
        self.pki = pki
        self._status_writer = status_writer
        self._config = config
        self._on_exit: list[Callable[[], None]] = []
        self.store: Store
        self.service: PolicyService
        self.channel: grpc.aio.Channel

    async def __aenter__(self) -> "Harness":
        self.store = Store(self.directory / "store.db", poll_interval=0.2)
        if self._objects:
            self.store.apply_many(self._objects)
        tls = TlsFiles(self.pki.server_cert, self.pki.server_key, self.pki.ca)
        config = PolicyConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0", tls=tls, **self._config)
        writer = None if self._status_writer is None else self._status_writer(self.store.path)
        self.service = PolicyService(config, LocalResourceWatcher(self.store), writer)
        await self.service.start()
        self.channel = open_channel(self.address, self.client_tls())
        if self._status_writer is LocalStatusWriter:  # the status tests' writers stall or fail on purpose
            await self.settled()
        return self

    async def settled(self) -> None:
        """Once the status loop runs: wait until the index has read back every route's and rate limit's
        acceptance the status controller decides (they count only then, as in Linkerd)."""
        if self.service.status is None:
            return
        index, outbound = self.service.index, self.service.outbound_index

        def read_back() -> bool:
            desired = desired_statuses(index, outbound.services, outbound.egress_networks)
            for (type_key, ns, name), status in desired.items():
                if type_key == kinds.EGRESS_NETWORK.key:
                    # Read back too: a route's acceptance on it waits for the network's own.
                    if outbound.egress_networks[(ns, name)].accepted != (
                            status["conditions"][0]["status"] == "True"):
                        return False
                    continue
                facts = index.objects.get(type_key, {}).get(ns, {}).get(name)
                if facts is None:
                    continue
                if "parents" in status:
                    accepted = [p["parentRef"] for p in status["parents"] if p["conditions"][0]["status"] == "True"]
                    route = outbound.routes.get((type_key, ns, name))
                    if route is not None and route.accepted != {
                            (r["kind"], r["name"], r.get("port")) for r in accepted if r["kind"] != "Server"}:
                        return False
                    want = {r["name"] for r in accepted if r["kind"] == "Server"}
                else:
                    accepted = status["conditions"][0]["status"] == "True"
                    want = {facts.spec.target_ref.name} if accepted else set()
                if facts.accepted_by != want:
                    return False
            return True

        await eventually(read_back)
        await asyncio.sleep(0)  # the index's flush of what it read back runs in the next loop turn

    def client_tls(self, with_cert: bool = True) -> ClientTls:
        return ClientTls(self.pki.ca, SERVER_NAME, self.pki.client_cert if with_cert else None,
                         self.pki.client_key if with_cert else None)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.service.port}"

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the harness ends, after the service stopped."""
        self._on_exit.append(callback)

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.service.stop()
        for callback in self._on_exit:
            callback()
        self.store.close()

    def apply(self, *objs: dict[str, Any]) -> None:
        self.store.apply_many(list(objs))

    def delete(self, kind: str, name: str, ns: str | None = NS) -> None:
        """``kind`` as kubectl takes it (``srv``, ``httproutes.gateway.networking.k8s.io``)."""
        assert self.store.delete(kinds.lookup(kind).key, ns, name) is not None, f"no {kind} {name}"

    def watch(self, port: int = 8080, pod_name: str = "web-0", ns: str = NS, *, raw: str | None = None,
              channel: grpc.aio.Channel | None = None, external: bool = False) -> ServerStream:
        stub = inbound_pb2_grpc.InboundServerPoliciesStub(channel or self.channel)
        text = raw if raw is not None else workload(pod_name, ns, external=external)
        return ServerStream(stub.WatchPort(pb.PortSpec(workload=text, port=port)), server_dict)

    async def get(self, port: int = 8080, pod_name: str = "web-0", ns: str = NS, *,
                  raw: str | None = None, external: bool = False) -> dict[str, Any]:
        stub = inbound_pb2_grpc.InboundServerPoliciesStub(self.channel)
        text = raw if raw is not None else workload(pod_name, ns, external=external)
        message = await stub.GetPort(pb.PortSpec(workload=text, port=port), timeout=WAIT)
        return server_dict(message)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.service.metrics.registry.get_sample_value(name, labels or {})


async def eventually(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def stored(store: Store, type_key: str, name: str, check: Callable[[dict[str, Any] | None], bool],
                 ns: str = NS) -> dict[str, Any] | None:
    """The stored object once it satisfies ``check``: as listed now, else at the watch event that makes it so."""
    listed = store.list(type_key, ns)
    now = next((o for o in listed.items if o["metadata"]["name"] == name), None)
    if check(now):
        return now
    async with asyncio.timeout(WAIT):
        async for event in store.watch(type_key, listed.resource_version, ns):
            if event.object["metadata"]["name"] == name and check(event.object):
                return event.object
    raise AssertionError("the store was closed")
