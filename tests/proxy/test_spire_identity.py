"""The proxy's identity from a SPIRE agent's Workload API (LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS).

The agent is a real gRPC server (grpcio, the generated ``SpiffeWorkloadAPI`` of proto/workload.proto)
on a Unix socket, issuing real X.509-SVIDs (a URI SAN, signed by the mesh's issuer) as SPIRE's agent
streams them; the proxy reads them with its own h2 gRPC client. The proxy then serves mTLS with the
SVID: a meshed pod's proxy calls it through a Service selecting an ExternalWorkload whose
``meshTLS.identity`` is the SPIFFE ID (the destination's answer), and a new SVID the agent pushes
is what new connections see.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from proxy_harness import Ca, EchoServer, Mesh, connection, run, samples, scrape

from tether.api import workload_pb2, workload_pb2_grpc
from tether.identity import pki
from tether.platform.local.endpointslices import external_workload_controller
from tether.proxy.app import Proxy
from tether.proxy.core.config import ConfigError, ProxyConfig, SpireIdentityConfig
from tether.proxy.io.grpc_client import Channel
from tether.proxy.io.identity_client import TlsMaterial
from tether.proxy.io.spire_client import SpireClient
from tether.proxy.io.tls import peer_identities

SPIFFE_ID = "spiffe://cluster.local/vm/billing"
SERVER_NAME = "billing.vm.cluster.local"
LINKERD_IDENTITY_VARS = ("LINKERD2_PROXY_IDENTITY_DIR", "LINKERD2_PROXY_IDENTITY_TOKEN_FILE",
                         "LINKERD2_PROXY_IDENTITY_LOCAL_NAME", "LINKERD2_PROXY_IDENTITY_SVC_ADDR",
                         "LINKERD2_PROXY_IDENTITY_SVC_NAME")



def _leaf(material: TlsMaterial) -> x509.Certificate:
    """The leaf certificate of the material a proxy holds."""
    return x509.load_pem_x509_certificates(material.certified.chain_pem)[0]

def svid(ca: Ca, spiffe_id: str = SPIFFE_ID, *, valid_for: timedelta = timedelta(hours=1),
         key: ec.EllipticCurvePrivateKey | None = None) -> tuple[workload_pb2.X509SVID, x509.Certificate]:
    """An X.509-SVID as SPIRE's agent hands one out: leaf then issuer (DER), PKCS#8 key, the bundle."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    start = datetime.now(UTC) - timedelta(minutes=1)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.ORGANIZATION_NAME, "SPIRE")]))
        .issuer_name(ca.issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + valid_for)
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(spiffe_id)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH,
                                              x509.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(pki.authority_key_id(ca.issuer), critical=False)
        .sign(ca.issuer_key, hashes.SHA256())
    )
    der = serialization.Encoding.DER
    message = workload_pb2.X509SVID(
        spiffe_id=spiffe_id,
        x509_svid=leaf.public_bytes(der) + ca.issuer.public_bytes(der),
        x509_svid_key=key.private_bytes(der, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        bundle=ca.anchor.public_bytes(der),
    )
    return message, leaf


class Agent(workload_pb2_grpc.SpiffeWorkloadAPIServicer):
    """A SPIRE agent's Workload API: each call gets the current SVIDs, then every update pushed."""

    def __init__(self) -> None:
        self.current: workload_pb2.X509SVIDResponse | None = None
        self._changed = asyncio.Condition()
        self.calls = 0
        self.fail_next: grpc.StatusCode | None = None

    async def push(self, *svids: workload_pb2.X509SVID) -> None:
        async with self._changed:
            self.current = workload_pb2.X509SVIDResponse(svids=list(svids))
            self._changed.notify_all()

    async def FetchX509SVID(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # noqa: N802
        self.calls += 1
        if dict(context.invocation_metadata()).get("workload.spiffe.io") != "true":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "security header missing from request")
        if self.fail_next is not None:
            code, self.fail_next = self.fail_next, None
            await context.abort(code, "agent restarting")
        sent = None
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: self.current is not None and self.current is not sent)
                sent = self.current
            yield sent


@contextlib.asynccontextmanager
async def agent_on(socket: Path) -> AsyncIterator[Agent]:
    agent = Agent()
    server = grpc.aio.server()
    workload_pb2_grpc.add_SpiffeWorkloadAPIServicer_to_server(agent, server)
    assert server.add_insecure_port(f"unix:{socket}")
    await server.start()
    try:
        yield agent
    finally:
        await server.stop(None)


async def rotated(client: Any) -> Any:
    """The next material the client installs."""
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def listener(material: Any) -> None:
        if not got.done():
            got.set_result(material)

    client.add_listener(listener)
    try:
        return await got
    finally:
        client.remove_listener(listener)


def spire_env(mesh: Mesh, pod: Any, socket: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in mesh.proxy_env(pod).items() if k not in LINKERD_IDENTITY_VARS}
    env.update({"LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS": f"unix://{socket}",
                "LINKERD2_PROXY_IDENTITY_SERVER_ID": SPIFFE_ID,
                "LINKERD2_PROXY_IDENTITY_SERVER_NAME": SERVER_NAME}, **extra)
    return env


def test_a_meshed_pod_calls_the_spire_proxy_over_mtls_and_a_rotated_svid_takes_over(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh, agent_on(tmp_path / "agent.sock") as agent:
            vm = mesh.pod("vm-0", app="vm", ports=[8080], apply=False)  # not a pod: an ExternalWorkload
            client = mesh.pod("web-0", app="web")
            env = spire_env(mesh, vm, tmp_path / "agent.sock")
            proxy = Proxy(ProxyConfig.from_env(env), env)
            await proxy.start()
            try:
                first, first_leaf = svid(mesh.ca)
                await agent.push(svid(mesh.ca, "spiffe://cluster.local/someone-else")[0], first)
                material = await proxy.identity.ready()
                assert (material.name, _leaf(material)) == (SPIFFE_ID, first_leaf)

                mesh.store.apply_many([{
                    "apiVersion": "workload.linkerd.io/v1beta1", "kind": "ExternalWorkload",
                    "metadata": {"name": "billing-vm", "namespace": vm.ns, "labels": {"app": "billing"}},
                    "spec": {"meshTLS": {"identity": SPIFFE_ID, "serverName": SERVER_NAME},
                             "ports": [{"name": "http", "port": 8080}], "workloadIPs": [{"ip": vm.ip}]},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}}])
                controller = external_workload_controller(mesh.store)
                slices = asyncio.create_task(controller.run())
                try:
                    svc = mesh.service("billing", [(80, 8080)], app="billing")
                    await mesh.start_proxy(client, outbound_to=[f"{svc}:80"])
                    async with EchoServer(vm.ip, 8080, "vm"):
                        # web's proxy: mTLS to the SNI billing.vm..., accepting only the SPIFFE ID.
                        async with connection(svc, 80) as (reader, writer):
                            writer.write(b"hello")
                            assert await reader.readexactly(8) == b"vm\nhello"

                        # What the VM's proxy presents, seen by a client of the mesh CA: the SVID.
                        tls = mesh.ca.client_context("web.emojivoto.serviceaccount.identity.linkerd.cluster.local",
                                                     alpn=["transport.l5d.io/v1"])
                        async with connection(vm.ip, 4143, ssl=tls, server_hostname=SERVER_NAME) as (_, w):
                            presented = w.get_extra_info("ssl_object").getpeercert(binary_form=True)
                            assert peer_identities(w.get_extra_info("ssl_object")) == (SPIFFE_ID,)
                        assert presented == first_leaf.public_bytes(serialization.Encoding.DER)

                        second, second_leaf = svid(mesh.ca)
                        waiting = asyncio.ensure_future(rotated(proxy.identity))
                        await agent.push(second)  # the agent rotates on its stream
                        assert _leaf(await waiting) == second_leaf
                        async with connection(vm.ip, 4143, ssl=tls, server_hostname=SERVER_NAME) as (_, w):
                            presented = w.get_extra_info("ssl_object").getpeercert(binary_form=True)
                        assert presented == second_leaf.public_bytes(serialization.Encoding.DER)
                        async with connection(svc, 80) as (reader, writer):
                            writer.write(b"again")
                            assert await reader.readexactly(8) == b"vm\nagain"
                        assert agent.calls == 1, "one stream carried both SVIDs"
                        metrics = await scrape(proxy)
                        assert samples(metrics, "control_identity_cert_refreshes_total", result="ok")[0][1] == 2
                        [(_, expiry)] = samples(metrics, "control_identity_cert_expiration_timestamp_seconds")
                        assert expiry == second_leaf.not_valid_after_utc.timestamp()
                finally:
                    slices.cancel()
                    await asyncio.gather(slices, return_exceptions=True)
            finally:
                await proxy.stop()

    run(scenario())


def minimal_env(ca: Ca, socket: str = "/run/spire/agent.sock") -> dict[str, str]:
    """The least a proxy with SPIRE identity needs."""
    return {"LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS": f"unix://{socket}",
            "LINKERD2_PROXY_IDENTITY_SERVER_ID": SPIFFE_ID, "LINKERD2_PROXY_IDENTITY_SERVER_NAME": SERVER_NAME,
            "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS": ca.anchors_pem.decode(),
            "LINKERD2_PROXY_DESTINATION_SVC_ADDR": "127.0.0.1:8086", "LINKERD2_PROXY_POLICY_SVC_ADDR": "127.0.0.1:8090",
            "LINKERD2_PROXY_POLICY_WORKLOAD": "{}"}


def _config(socket: Path, ca: Ca) -> SpireIdentityConfig:
    env = {**minimal_env(ca, str(socket)), "LINKERD2_PROXY_IDENTITY_SPIRE_EXP_BACKOFF_MIN": "10ms",
           "LINKERD2_PROXY_IDENTITY_SPIRE_EXP_BACKOFF_MAX": "20ms"}
    config = ProxyConfig.from_env(env).identity
    assert isinstance(config, SpireIdentityConfig)
    return config


def test_unusable_svids_are_refused_the_held_one_stays_and_a_failed_stream_is_opened_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        ca, other = Ca.create(tmp_path / "pki"), Ca.create(tmp_path / "other")
        async with agent_on(tmp_path / "agent.sock") as agent:
            agent.fail_next = grpc.StatusCode.UNAVAILABLE  # the first call fails: retried after the backoff
            client = SpireClient(_config(tmp_path / "agent.sock", ca))
            task = asyncio.create_task(client.run())
            try:
                good, good_leaf = svid(ca)
                await agent.push(good)
                assert _leaf(await client.ready()) == good_leaf
                assert agent.calls == 2 and client.refreshes == {"ok": 1, "error": 0}

                mismatched, _ = svid(ca)
                mismatched.x509_svid_key = svid(ca)[0].x509_svid_key  # another key than the certificate's
                for bad in (svid(other)[0], mismatched, svid(ca, "spiffe://cluster.local/other")[0]):
                    client.processed.clear()
                    await agent.push(bad)
                    await client.processed.wait()
                assert client.refreshes == {"ok": 1, "error": 3}
                assert client.material is not None and _leaf(client.material) == good_leaf
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    run(scenario())


@pytest.mark.parametrize(("env", "var", "message"), [
    ({"LINKERD2_PROXY_IDENTITY_SERVER_ID": "billing.vm.cluster.local"}, "LINKERD2_PROXY_IDENTITY_SERVER_ID",
     "must be a spiffe:// ID"),
    ({"LINKERD2_PROXY_IDENTITY_SERVER_NAME": None}, "LINKERD2_PROXY_IDENTITY_SERVER_NAME", "must be set"),
    ({"LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS": "agent.sock"},
     "LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS", "must be unix:///absolute/path"),
])
def test_spire_configuration_errors_name_the_variable(tmp_path: Path, env: dict[str, str | None], var: str,
                                                      message: str) -> None:
    base = minimal_env(Ca.create(tmp_path))
    for key, value in env.items():
        if value is None:
            base.pop(key)
        else:
            base[key] = value
    with pytest.raises(ConfigError, match=message) as error:
        ProxyConfig.from_env(base)
    assert error.value.variable == var


def test_the_deprecated_socket_variable_is_read_too(tmp_path: Path) -> None:
    env = minimal_env(Ca.create(tmp_path))
    del env["LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS"]
    env["LINKERD2_PROXY_IDENTITY_SPIRE_SOCKET"] = "/run/spire/agent.sock"  # a bare path, as older charts wrote it
    identity = ProxyConfig.from_env(env).identity
    assert isinstance(identity, SpireIdentityConfig)
    assert (identity.workload_api_addr, identity.local_name, identity.server_name) == (
        "unix:///run/spire/agent.sock", SPIFFE_ID, SERVER_NAME)
    assert (identity.backoff.min, identity.backoff.max, identity.backoff.jitter) == (
        timedelta(milliseconds=100), timedelta(seconds=1), 0.1)


def test_unix_socket_targets_of_the_grpc_client() -> None:
    """gRPC's spellings of a Unix socket (``unix:/path``, ``unix:///path``); a relative one is refused by name."""
    assert Channel("unix:///run/spire/agent.sock").path == "/run/spire/agent.sock"
    assert Channel("unix:/run/spire/agent.sock").path == "/run/spire/agent.sock"
    assert Channel("127.0.0.1:8081").path is None
    with pytest.raises(ValueError, match="'unix:agent.sock' is not unix:/absolute/path"):
        Channel("unix:agent.sock")
