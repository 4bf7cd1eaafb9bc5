"""A real OutboundPolicies server for the tests: mTLS with certificates from Tether's own CA, fed by a real store.

``Harness`` stores objects in a SQLite store in the test's directory; the local
platform's watcher feeds an ``OutboundIndex`` (coalescing on the event loop);
the servicer is served by a grpc.aio server that requires a client certificate
from the same trust anchor; the client is the stub generated from ``proto/``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography.hazmat.primitives import serialization
from outbound_helpers import CONFIG, NS, type_key

from tether.api import outbound_pb2 as pb
from tether.api import outbound_pb2_grpc
from tether.api.addresses import to_tcp_address
from tether.identity import pki
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.naming import WorkloadIdentity, control_plane_identity
from tether.platform.local.watch import LocalResourceWatcher
from tether.policy.outbound import WATCHED, OutboundIndex
from tether.policy.outbound.server import OutboundPoliciesServicer
from tether.serving.rpc import StreamSet
from tether.store import Store

POLICY_NAME = control_plane_identity("policy").dns_name
WAIT = 10.0


@dataclass(frozen=True)
class Certificates:
    anchor: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(directory: Path) -> Certificates:
    """A trust anchor and issuer as ``tether install`` makes them; leaves for the policy controller and a proxy."""
    now = dt.datetime.now(dt.timezone.utc)
    anchor, anchor_key = pki.create_trust_anchor(control_plane_ns="linkerd", trust_domain="cluster.local",
                                                 valid_for=dt.timedelta(days=1), now=now)
    issuer, issuer_key = pki.create_issuer(anchor, anchor_key, control_plane_ns="linkerd",
                                           trust_domain="cluster.local", valid_for=dt.timedelta(days=1), now=now)
    ca = CertificateAuthority(Issuer.validated([issuer], issuer_key, [anchor]), IssuanceSettings())
    pem = serialization.Encoding.PEM
    files: dict[str, Path] = {"anchor": directory / "anchor.crt"}
    files["anchor"].write_bytes(anchor.public_bytes(pem))
    for role, identity in (("server", control_plane_identity("policy")),
                           ("client", WorkloadIdentity("web", NS, "linkerd", "cluster.local"))):
        key = pki.new_key()
        leaf = ca.issue(key.public_key(), identity, now)
        files[f"{role}_cert"] = directory / f"{role}.crt"
        files[f"{role}_cert"].write_bytes(leaf.public_bytes(pem) + issuer.public_bytes(pem))
        files[f"{role}_key"] = directory / f"{role}.key"
        files[f"{role}_key"].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    return Certificates(**files)


def workload(ns: str = NS, pod: str = "client-0") -> str:
    return json.dumps({"ns": ns, "pod": pod})


class Harness:
    def __init__(self, directory: Path, certs: Certificates, *objects: dict[str, Any], capacity: int = 100) -> None:
        self.directory = directory
        self.certs = certs
        self._objects = list(objects)
        self._capacity = capacity
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Harness:
        self.store = Store(self.directory / "store.db", poll_interval=0.2)
        if self._objects:
            self.store.apply_many(self._objects)
        loop = asyncio.get_running_loop()
        self.index = OutboundIndex(CONFIG, schedule=loop.call_soon)
        watcher = LocalResourceWatcher(self.store)
        synced = asyncio.Event()

        async def feed(key: str) -> None:
            async for event in watcher.watch(key):
                self.index.apply(key, event)
                if self.index.synced:
                    synced.set()

        self._tasks = [asyncio.create_task(feed(key)) for key in WATCHED]
        await asyncio.wait_for(synced.wait(), WAIT)
        self.streams = StreamSet(self._capacity)
        self.servicer = OutboundPoliciesServicer(self.index, self.streams)
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((self.servicer.handler(),))
        credentials = grpc.ssl_server_credentials(
            [(self.certs.server_key.read_bytes(), self.certs.server_cert.read_bytes())],
            root_certificates=self.certs.anchor.read_bytes(), require_client_auth=True)
        self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        await self.server.start()
        self.channel = self.open_channel()
        self.stub = outbound_pb2_grpc.OutboundPoliciesStub(self.channel)
        return self

    def open_channel(self, *options: tuple[str, Any]) -> grpc.aio.Channel:
        credentials = grpc.ssl_channel_credentials(
            self.certs.anchor.read_bytes(), self.certs.client_key.read_bytes(), self.certs.client_cert.read_bytes())
        return grpc.aio.secure_channel(f"127.0.0.1:{self.port}", credentials,
                                       options=[("grpc.ssl_target_name_override", POLICY_NAME), *options])

    async def __aexit__(self, *exc: object) -> None:
        self.streams.shutdown()
        await self.channel.close()
        await self.server.stop(1)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.store.close()

    def apply(self, *objs: dict[str, Any]) -> None:
        self.store.apply_many(list(objs))

    def delete(self, obj: dict[str, Any]) -> None:
        self.store.delete(type_key(obj), obj["metadata"].get("namespace"), obj["metadata"]["name"])

    def watch(self, authority: str | None = None, addr: tuple[str, int] | None = None, ns: str = NS,
              stub: Any = None) -> Any:
        return (stub or self.stub).Watch(spec(authority, addr, ns))

    async def get(self, authority: str | None = None, addr: tuple[str, int] | None = None,
                  ns: str = NS) -> pb.OutboundPolicy:
        return await asyncio.wait_for(self.stub.Get(spec(authority, addr, ns)), WAIT)


def spec(authority: str | None, addr: tuple[str, int] | None, ns: str) -> pb.TrafficSpec:
    if addr is not None:
        return pb.TrafficSpec(source_workload=workload(ns), addr=to_tcp_address(*addr))
    return pb.TrafficSpec(source_workload=workload(ns), authority=authority or "")


async def next_policy(call: Any) -> pb.OutboundPolicy:
    message = await asyncio.wait_for(call.read(), WAIT)
    assert message is not grpc.aio.EOF, "the stream ended"
    return message


async def eventually(condition: Any, timeout: float = WAIT) -> None:
    """Wait for server-side bookkeeping that sends no message."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)
