"""The proxy's identity client against the real service: certify, rotate, survive outages, use the TLS."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtensionOID
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st
from identity_helpers import IDENTITY_SVC, WEB, FakeClock, Pki, config_for, make_pki, running_identity, web_token

from tether.api import identity_pb2, identity_pb2_grpc
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer, check_csr, parse_csr
from tether.identity.server import IdentityService
from tether.naming import WorkloadIdentity
from tether.platform.local.tokens import LocalTokenSigner, LocalTokenVerifier
from tether.proxy.core import certs
from tether.proxy.core.certified import CertError, RefreshPolicy
from tether.proxy.io.identity_client import IdentityClient, IdentityClientConfig, TlsMaterial
from tether.proxy.io.tls import peer_identities

NAME = WEB.dns_name
SHORT_LIVED = IssuanceSettings(lifetime=timedelta(seconds=100))
FAST = RefreshPolicy(min_refresh=timedelta(seconds=1))


def client_for(
    ca: Pki,
    port: int,
    token_path: Path,
    clock: FakeClock,
    name: str = NAME,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> IdentityClient:
    config = IdentityClientConfig(
        local_name=name,
        trust_anchors_pem=ca.anchors_pem,
        token_path=token_path,
        svc_addr=f"127.0.0.1:{port}",
        svc_name=IDENTITY_SVC,
        refresh=FAST,
    )
    return IdentityClient(config, clock=clock, sleep=sleep or clock.sleep, random_fraction=lambda: 0.0)


@pytest.fixture
def token_file(tmp_path: Path, signer: LocalTokenSigner) -> Path:
    path = tmp_path / "token"
    path.write_bytes(web_token(signer))
    return path


# --- refresh timing (pure) ---------------------------------------------------------------------------------


def test_refresh_at_70_percent_of_the_remaining_life() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    policy = RefreshPolicy()
    assert policy.after_success(now + timedelta(hours=24), now) == timedelta(hours=24) * 0.7
    assert policy.after_success(now + timedelta(seconds=5), now) == timedelta(seconds=10)  # min_refresh
    assert policy.after_success(now + timedelta(days=30), now) == timedelta(hours=24)  # max_refresh
    assert policy.after_success(None, now) == timedelta(seconds=10)
    assert policy.after_success(now - timedelta(seconds=1), now) == timedelta(seconds=10)


def test_failures_back_off_exponentially_with_bounded_jitter() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    policy = RefreshPolicy()
    held = now + timedelta(hours=24)
    no_jitter = [policy.after_failure(n, held, now, lambda: 0.0) for n in range(1, 12)]
    assert no_jitter[:4] == [timedelta(milliseconds=100 * 2**i) for i in range(4)]
    assert no_jitter[-1] == timedelta(seconds=60)  # the backoff's max
    assert policy.after_failure(1, held, now, lambda: 1.0) == timedelta(milliseconds=110)
    # Without a certificate, retries never wait past min_refresh.
    assert policy.after_failure(20, None, now, lambda: 1.0) == timedelta(seconds=10)


@given(
    failures=st.integers(min_value=1, max_value=10_000),
    remaining=st.integers(min_value=-3600, max_value=10 * 86400),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_retry_always_comes_before_the_held_certificate_is_due(failures: int, remaining: int, jitter: float) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    policy = RefreshPolicy()
    held = now + timedelta(seconds=remaining)
    delay = policy.after_failure(failures, held, now, lambda: jitter)
    assert timedelta() < delay <= min(policy.backoff.max, policy.after_success(held, now))


# --- checking a Certify answer (pure) ----------------------------------------------------------------------


def authority_of(ca: Pki) -> CertificateAuthority:
    return CertificateAuthority(Issuer.validated([ca.issuer], ca.issuer_key, [ca.anchor]), IssuanceSettings())


def test_check_certified_accepts_a_good_answer_and_refuses_bad_ones(ca_files: Pki, clock: FakeClock, tmp_path: Path) -> None:
    key = certs.new_key()
    leaf = authority_of(ca_files).issue(key.public_key(), WEB, clock.now)
    good = dict(key=key, name=NAME, anchors=[ca_files.anchor], now=clock.now)
    chain = [ca_files.issuer.public_bytes(Encoding.DER)]
    leaf_der = leaf.public_bytes(Encoding.DER)
    certified = certs.check_certified(leaf_der, chain, leaf.not_valid_after_utc, **good)  # type: ignore[arg-type]
    assert certified.chain_pem == leaf.public_bytes(Encoding.PEM) + ca_files.issuer.public_bytes(Encoding.PEM)
    refusals = {
        "no valid_until": (leaf_der, chain, None, good),
        "expired already": (leaf_der, chain, clock.now - timedelta(seconds=1), good),
        "not for this proxy's key": (leaf_der, chain, leaf.not_valid_after_utc, good | {"key": certs.new_key()}),
        "does not verify": (leaf_der, chain, leaf.not_valid_after_utc, good | {"name": "db." + NAME.partition(".")[2]}),
        "does not parse": (b"junk", chain, leaf.not_valid_after_utc, good),
    }
    other = make_pki(tmp_path / "other", clock.now)
    refusals["against the trust anchors"] = (leaf_der, chain, leaf.not_valid_after_utc, good | {"anchors": [other.anchor]})
    for words, (leaf_bytes, chain_bytes, valid_until, kwargs) in refusals.items():
        with pytest.raises(CertError, match=words):
            certs.check_certified(leaf_bytes, chain_bytes, valid_until, **kwargs)  # type: ignore[arg-type]


def test_csr_is_what_identity_accepts() -> None:
    key = certs.new_key()
    csr = parse_csr(certs.csr_der(key, NAME))
    check_csr(csr, NAME)
    assert csr.public_key() == key.public_key()


# --- against the running service --------------------------------------------------------------------------


def test_client_certifies_and_publishes_tls_material(
    ca_files: Pki, verifier: LocalTokenVerifier, clock: FakeClock, token_file: Path, tmp_path: Path
) -> None:
    published: list[TlsMaterial] = []
    files_before = sorted(p for p in tmp_path.rglob("*"))

    async def scenario() -> TlsMaterial:
        async with running_identity(ca_files, verifier, clock) as service:
            client = client_for(ca_files, service.port, token_file, clock)
            client.add_listener(published.append)
            delay = await client.refresh_once()
            material = await client.ready()
            assert delay == FAST.after_success(material.expires_at, clock.now)
            return material

    material = asyncio.run(scenario())
    assert published == [material]
    leaf = _leaf(material)
    assert material.expires_at == leaf.not_valid_after_utc
    assert leaf.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value.get_values_for_type(
        x509.DNSName) == [NAME]
    assert sorted(p for p in tmp_path.rglob("*")) == files_before  # nothing written: the key stayed in memory
    assert not any("tether-identity" in os.readlink(f"/proc/self/fd/{fd}") for fd in _open_fds())


def _leaf(material: TlsMaterial) -> x509.Certificate:
    return x509.load_pem_x509_certificates(material.certified.chain_pem)[0]


def _open_fds() -> list[str]:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{fd}")
            fds.append(fd)
        except OSError:
            pass
    return fds


def test_two_proxies_do_mutual_tls_with_their_material(
    ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock, tmp_path: Path
) -> None:
    db = WorkloadIdentity("db", "emojivoto")
    (tmp_path / "web-token").write_bytes(web_token(signer))
    (tmp_path / "db-token").write_bytes(web_token(signer, service_account="db"))

    async def scenario() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        async with running_identity(ca_files, verifier, clock) as service:
            web_client = client_for(ca_files, service.port, tmp_path / "web-token", clock)
            db_client = client_for(ca_files, service.port, tmp_path / "db-token", clock, name=db.dns_name)
            await web_client.refresh_once()
            await db_client.refresh_once()
            server_tls = (await db_client.ready()).server_context
            client_tls = (await web_client.ready()).client_context
        seen_clients: list[tuple[str, ...]] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen_clients.append(peer_identities(writer.get_extra_info("ssl_object")))
            writer.write(b"hi")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_tls)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls, server_hostname=db.dns_name)
        server_ids = peer_identities(writer.get_extra_info("ssl_object"))
        assert writer.get_extra_info("ssl_object").version() == "TLSv1.3"
        assert await reader.read() == b"hi"
        writer.close()
        # A client without a mesh certificate is let in too (the server only asks for one).
        anonymous = ssl.create_default_context(cadata=ca_files.anchors_pem.decode())
        anonymous.check_hostname = False
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=anonymous, server_hostname=db.dns_name)
        assert await reader.read() == b"hi"
        writer.close()
        server.close()
        await server.wait_closed()
        return server_ids, seen_clients[0], seen_clients[1]

    server_ids, authenticated, anonymous = asyncio.run(scenario())
    assert db.dns_name in server_ids
    assert authenticated[0] == NAME  # the client's identity is its first SAN
    assert anonymous == ()


def test_client_refreshes_before_expiry_on_its_schedule(
    ca_files: Pki, verifier: LocalTokenVerifier, clock: FakeClock, token_file: Path
) -> None:
    rotations: list[TlsMaterial] = []

    async def scenario() -> None:
        async with running_identity(ca_files, verifier, clock, issuance=SHORT_LIVED) as service:
            third_sleep = asyncio.Event()

            async def sleep(seconds: float) -> None:
                held = client.material
                assert held is not None and clock.now + timedelta(seconds=seconds) < held.expires_at
                await clock.sleep(seconds)
                if len(clock.slept) == 3:
                    third_sleep.set()
                    await asyncio.Future()  # park the loop here; the test cancels it

            client = client_for(ca_files, service.port, token_file, clock, sleep=sleep)
            client.add_listener(rotations.append)
            running = asyncio.create_task(client.run())
            parked = asyncio.create_task(third_sleep.wait())
            await asyncio.wait([running, parked], return_when=asyncio.FIRST_COMPLETED)
            if running.done():
                running.result()  # the loop died: show why
            running.cancel()

    asyncio.run(scenario())
    assert len(rotations) == 3
    serials = {_leaf(m).serial_number for m in rotations}
    assert len(serials) == 3
    # Each wait was 70 % of the 2 min window (100 s + 20 s skew) minus what had passed since issuance.
    for waited in clock.slept:
        assert 80 <= waited <= 84


def test_client_keeps_its_certificate_while_identity_is_down_then_recovers(
    ca_files: Pki, verifier: LocalTokenVerifier, clock: FakeClock, token_file: Path
) -> None:
    async def scenario() -> tuple[list[timedelta], IdentityClient, TlsMaterial, TlsMaterial]:
        async with running_identity(ca_files, verifier, clock) as service:
            port = service.port
            client = client_for(ca_files, port, token_file, clock)
            await client.refresh_once()
            before = client.material
        assert before is not None
        # Identity is down: each attempt fails fast, the old certificate stays, waits grow.
        delays = [await client.refresh_once() for _ in range(4)]
        assert client.material is before
        async with running_identity(ca_files, verifier, clock, addr=f"127.0.0.1:{port}"):
            await client.refresh_once()
        assert client.material is not None
        return delays, client, before, client.material

    delays, client, before, after = asyncio.run(scenario())
    assert delays == [timedelta(milliseconds=100 * 2**i) for i in range(4)]
    assert after is not before and _leaf(after).serial_number != _leaf(before).serial_number
    assert client.refreshes == {"ok": 2, "error": 4}


def test_token_is_read_at_each_call(
    ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock, token_file: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> IdentityClient:
        async with running_identity(ca_files, verifier, clock) as service:
            client = client_for(ca_files, service.port, token_file, clock)
            await client.refresh_once()
            token_file.write_bytes(web_token(signer, service_account="db"))  # a token for someone else
            await client.refresh_once()
            token_file.unlink()
            await client.refresh_once()
            return client

    client = asyncio.run(scenario())
    assert client.refreshes == {"ok": 1, "error": 2}
    assert "FAILED_PRECONDITION" in caplog.text
    assert f"token file {token_file}" in caplog.text


class _CraftedIdentity(identity_pb2_grpc.IdentityServicer):
    """A misbehaving identity service that signs correctly but answers with a chosen flaw."""

    def __init__(self, ca: Pki, flaw: str, now: datetime) -> None:
        self._ca, self._flaw, self._now = ca, flaw, now

    async def Certify(self, request, context):  # noqa: ANN001, ANN201, N802
        csr = x509.load_der_x509_csr(request.certificate_signing_request)
        key = csr.public_key() if self._flaw != "foreign-key" else certs.new_key().public_key()
        leaf = authority_of(self._ca).issue(key, WEB, self._now)
        response = identity_pb2.CertifyResponse(
            leaf_certificate=leaf.public_bytes(Encoding.DER),
            intermediate_certificates=[self._ca.issuer.public_bytes(Encoding.DER)],
        )
        if self._flaw != "no-valid-until":
            stamp = Timestamp()
            stamp.FromDatetime(self._now - timedelta(seconds=1) if self._flaw == "expired" else leaf.not_valid_after_utc)
            response.valid_until.CopyFrom(stamp)
        return response


FLAWS = {"no-valid-until": "no valid_until", "expired": "expired already", "foreign-key": "not for this proxy's key"}


@pytest.mark.parametrize("flaw", FLAWS)
def test_client_refuses_flawed_answers(
    flaw: str, ca_files: Pki, clock: FakeClock, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> IdentityClient:
        server = grpc.aio.server()
        identity_pb2_grpc.add_IdentityServicer_to_server(_CraftedIdentity(ca_files, flaw, clock.now), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            config = IdentityClientConfig(NAME, ca_files.anchors_pem, token_file, f"127.0.0.1:{port}", svc_name=None)
            client = IdentityClient(config, clock=clock)
            await client.refresh_once()
            return client
        finally:
            await server.stop(None)

    client = asyncio.run(scenario())
    assert client.material is None
    assert client.refreshes == {"ok": 0, "error": 1}
    assert FLAWS[flaw] in caplog.text


def test_service_restarted_on_the_same_port_is_reachable(ca_files: Pki, verifier: LocalTokenVerifier, clock: FakeClock) -> None:
    """Guards the outage test's premise: a stopped service frees its port for the next one."""

    async def scenario() -> None:
        service = IdentityService(config_for(ca_files), verifier, clock=clock)
        await service.start()
        port = service.port
        await service.stop(grace=None)
        again = IdentityService(config_for(ca_files, addr=f"127.0.0.1:{port}"), verifier, clock=clock)
        await again.start()
        assert again.port == port
        await again.stop(grace=None)

    asyncio.run(scenario())
