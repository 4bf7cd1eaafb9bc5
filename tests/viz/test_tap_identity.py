"""The tap server on Kubernetes: its identity certified by a real identity service, and `tether viz tap-apiserver`.

The identity service here checks tokens with the local platform's verifier
(on a cluster it asks the API server with a TokenReview, tested in
tests/identity); the client's side -- key, CSR, token file, TLS to identity
under its name -- is what runs in the tap pod. kmock stands in for the
Kubernetes API server (trust roots, front-proxy authentication, pods, RBAC).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from tether.api import tap_pb2, tap_pb2_grpc
from tether.identity import pem, pki
from tether.identity.ca import IssuanceSettings
from tether.identity.server import IdentityConfig, IdentityService
from tether.naming import WorkloadIdentity, control_plane_identity
from tether.platform.local.tokens import LocalTokenSigner, LocalTokenVerifier, TokenKey
from tether.proxy.core.tap import Taps
from tether.proxy.io.tap_server import TapServer
from tether.viz.tap_identity import IdentityRenewer, IdentitySource, TapIdentityError, certify
from tether.viz.tap_injector import tap_identity
from viz.pkilab import server_context

TAP = tap_identity()


async def _identity(tmp_path: Path) -> tuple[IdentityService, LocalTokenSigner, bytes]:
    now = datetime.now(UTC) - timedelta(minutes=1)
    anchor, anchor_key = pki.create_trust_anchor(control_plane_ns="linkerd", trust_domain="cluster.local",
                                                 valid_for=timedelta(days=1), now=now)
    issuer, issuer_key = pki.create_issuer(anchor, anchor_key, control_plane_ns="linkerd",
                                           trust_domain="cluster.local", valid_for=timedelta(days=1), now=now)
    pem.write_file(tmp_path / "ca.crt", pem.certificate_pem(anchor), private=False)
    pem.write_file(tmp_path / "issuer.crt", pem.certificate_pem(issuer), private=False)
    pem.write_file(tmp_path / "issuer.key", pem.private_key_pem(issuer_key), private=True)
    key = TokenKey.load_or_create(tmp_path / "state")
    service = IdentityService(
        IdentityConfig(trust_anchors=tmp_path / "ca.crt", issuer_cert=tmp_path / "issuer.crt",
                       issuer_key=tmp_path / "issuer.key", addr="127.0.0.1:0", admin_addr="127.0.0.1:0",
                       issuance=IssuanceSettings(lifetime=timedelta(hours=1))),
        LocalTokenVerifier(key))
    await service.start()
    return service, LocalTokenSigner(key), pem.certificate_pem(anchor)


def _source(tmp_path: Path, service: IdentityService, anchors: bytes, token: bytes) -> IdentitySource:
    (tmp_path / "token").write_bytes(token)
    return IdentitySource(addr=f"127.0.0.1:{service.port}",
                          server_name=control_plane_identity("identity").dns_name, anchors_pem=anchors,
                          token_file=tmp_path / "token", name=TAP)


def test_the_tap_identity_is_certified_and_a_proxy_serves_it(tmp_path: Path) -> None:
    async def body() -> None:
        service, signer, anchors = await _identity(tmp_path)
        try:
            source = _source(tmp_path, service, anchors, signer.mint(namespace="linkerd-viz", service_account="tap",
                                                                     pod="tap-0"))
            renewer = IdentityRenewer(source, lambda credentials: None)
            renewing = asyncio.create_task(renewer.run())
            await asyncio.wait_for(renewer.ready.wait(), 30)
            renewing.cancel()
            credentials = renewer.current
            assert credentials is not None and renewer.expires is not None
            assert timedelta(minutes=50) < renewer.expires - datetime.now(UTC) <= timedelta(hours=1, minutes=1)
            # A proxy's tap server (its own certificate from the same identity) serves the tap identity.
            web = _source(tmp_path / "web", service, anchors, signer.mint(
                namespace="emojivoto", service_account="web", pod="web-0"))
            web = IdentitySource(web.addr, web.server_name, anchors, web.token_file,
                                 WorkloadIdentity("web", "emojivoto").dns_name)
            web_creds, _ = await certify(web, ec.generate_private_key(ec.SECP256R1()))
            taps = Taps(base=1)
            server = TapServer(taps, TAP, lambda: server_context(web_creds.key_pem, web_creds.chain_pem, anchors))
            await server.start("127.0.0.1", 0)
            try:
                channel_creds = grpc.ssl_channel_credentials(root_certificates=anchors,
                                                             private_key=credentials.key_pem,
                                                             certificate_chain=credentials.chain_pem)
                async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", channel_creds, options=[
                        ("grpc.ssl_target_name_override", web.name)]) as channel:
                    call = tap_pb2_grpc.TapStub(channel).Observe(tap_pb2.ObserveRequest(limit=1))
                    reading = asyncio.create_task(call.read())
                    await asyncio.wait_for(server.wait_for_taps(1), 10)  # accepted: not UNAUTHENTICATED
                    call.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await reading
            finally:
                await server.stop()
            # Another service account's token does not get the tap identity.
            wrong = _source(tmp_path / "wrong", service, anchors, signer.mint(
                namespace="emojivoto", service_account="web", pod="web-0"))
            with pytest.raises(TapIdentityError, match=f"identity at 127.0.0.1:{service.port} refused {TAP}"):
                await certify(wrong, ec.generate_private_key(ec.SECP256R1()))
            missing = IdentitySource(source.addr, source.server_name, anchors, tmp_path / "nothing", TAP)
            with pytest.raises(TapIdentityError, match="cannot read the service-account token"):
                await certify(missing, ec.generate_private_key(ec.SECP256R1()))
        finally:
            await service.stop()

    for sub in ("web", "wrong"):
        (tmp_path / sub).mkdir()
    asyncio.run(asyncio.wait_for(body(), 60))


def test_the_tap_apiserver_command_serves_taps_as_the_certified_tap_identity(tmp_path: Path) -> None:
    """`tether viz tap-apiserver` as it runs in its pod: kmock as the API server (trust roots, front-proxy
    authentication, pods, RBAC), the real identity service, and a real proxy tap server at a pod's IP:4190."""
    import random
    import ssl
    from datetime import UTC, datetime

    import aiohttp
    import kmock

    from k8s.kube_helpers import PODS, emulated_api, listing
    from tether.cli import viz as viz_cli
    from tether.cli.install_cmd import webhook_certificate
    from tether.proxy.core.tap import INBOUND, TapRequest
    from tether.viz import metrics_api
    from tether.viz import tap_apiservice as rules
    from viz.promlab import deployment, free_port
    from viz.taplab import _tappable
    from viz.test_tap_apiservice import SAR, _sar, _tap_body

    ip = f"127.{random.randrange(64, 250)}.{random.randrange(256)}.{random.randrange(2, 250)}"
    pod = _tappable("web-5d8f7c9b4-abcde", ip)

    async def body() -> None:
        service, signer, anchors = await _identity(tmp_path)
        now = datetime.now(UTC)
        tap_ca, tap_crt, tap_key = webhook_certificate("tap.linkerd-viz.svc", "cluster.local", now)
        front_ca, front_crt, front_key = webhook_certificate("front-proxy-client", "cluster.local", now)
        for name, text in (("tap.crt", tap_crt), ("tap.key", tap_key), ("front.crt", front_crt),
                           ("front.key", front_key)):
            (tmp_path / name).write_text(text)
        web = IdentitySource(f"127.0.0.1:{service.port}", control_plane_identity("identity").dns_name, anchors,
                             tmp_path / "web-token", WorkloadIdentity("web", "emojivoto").dns_name)
        web.token_file.write_bytes(signer.mint(namespace="emojivoto", service_account="web", pod=pod["metadata"]["name"]))
        web_creds, _ = await certify(web, ec.generate_private_key(ec.SECP256R1()))
        taps = Taps(base=7)
        proxy = TapServer(taps, TAP, lambda: server_context(web_creds.key_pem, web_creds.chain_pem, anchors))
        await proxy.start(ip, 4190)
        (tmp_path / "tap-token").write_bytes(signer.mint(namespace="linkerd-viz", service_account="tap", pod="tap-0"))
        task = None
        try:
            async with emulated_api(tmp_path, kmock.KubernetesScaffold) as (api, _srv, settings):
                api["get /api/v1/namespaces/linkerd/configmaps/linkerd-identity-trust-roots"] << {
                    "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "linkerd-identity-trust-roots"},
                    "data": {"ca-bundle.crt": anchors.decode()}}
                api["get /api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"] << {
                    "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extension-apiserver-authentication"},
                    "data": {"requestheader-client-ca-file": front_ca,
                             "requestheader-username-headers": '["X-Remote-User"]',
                             "requestheader-group-headers": '["X-Remote-Group"]'}}
                api["post", SAR] << _sar
                api["list", PODS] << listing("1", pod)
                api["list", kmock.resource("apps", "v1", "deployments")] << listing("1", deployment("web", "emojivoto"))
                port = free_port()
                source = IdentitySource(f"127.0.0.1:{service.port}", control_plane_identity("identity").dns_name,
                                        b"", tmp_path / "tap-token", TAP)
                listening = asyncio.Event()
                task = asyncio.create_task(viz_cli._serve_tap_apiservice(
                    settings, source, metrics_api.Mesh(), tmp_path / "tap.crt", tmp_path / "tap.key", "127.0.0.1",
                    port, listening))
                front = ssl.create_default_context(cadata=tap_ca)
                front.check_hostname = False
                front.load_cert_chain(tmp_path / "front.crt", tmp_path / "front.key")
                url = f"https://127.0.0.1:{port}{rules.PREFIX}emojivoto/deployments/web/tap"
                async with aiohttp.ClientSession() as session:
                    waits = [task, asyncio.create_task(listening.wait())]
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)  # certified by identity, listening
                    assert listening.is_set(), task
                    response = await session.post(url, data=_tap_body("deployment", "web"), ssl=front,
                                                  headers={"X-Remote-User": "alice", "X-Remote-Group": "devs"})
                    async with response:
                        assert response.status == 200, await response.text()
                        await asyncio.wait_for(proxy.wait_for_taps(1), 10)
                        loop = asyncio.get_running_loop()
                        stream = taps.begin(TapRequest(INBOUND, ("10.0.0.1", 5000), (ip, 8080), "GET", "http",
                                                       "web.emojivoto.svc.cluster.local:80", "/api/x"), loop.time())
                        assert stream is not None
                        stream.response_init(200, [], loop.time())
                        stream.response_end(loop.time())
                        buffer, events = bytearray(), []
                        async for chunk in response.content.iter_any():
                            buffer += chunk
                            events += [tap_pb2.TapEvent.FromString(f) for f in rules.read_frames(buffer)]
                            if len(events) >= 3:
                                break
                assert [e.http.WhichOneof("event") for e in events] == ["request_init", "response_init", "response_end"]
                assert events[0].http.request_init.path == "/api/x"
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await proxy.stop()
            await service.stop()

    asyncio.run(asyncio.wait_for(body(), 60))
