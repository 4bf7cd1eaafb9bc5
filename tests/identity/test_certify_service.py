"""Certify over real gRPC and TLS on loopback: issuance, refusals and their statuses, issuer reloads, admin."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from identity_helpers import (
    IDENTITY_SVC,
    WEB,
    FakeClock,
    Pki,
    certify_stub,
    config_for,
    csr_for,
    make_pki,
    openssl_verify,
    request,
    running_identity,
    web_token,
)

from tether.identity import pem, pki
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.identity.certifier import Certifier
from tether.identity.errors import CertifyError, Reason
from tether.identity.server import ConfigError, IdentityService
from tether.platform.local.tokens import LocalTokenSigner, LocalTokenVerifier, TokenKey
from tether.platform.tokens import TokenClaims, VerifierUnavailable

NAME = WEB.dns_name


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: admin\r\n\r\n".encode())
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


async def served_certificate(port: int, anchors_pem: bytes) -> x509.Certificate:
    """The certificate the service presents to a new TLS connection (verified for its name)."""
    tls = ssl.create_default_context(cadata=anchors_pem.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls, server_hostname=IDENTITY_SVC)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der)


def reload_failures(service: IdentityService) -> float:
    return service.metrics.registry.get_sample_value("identity_issuer_reload_failures_total") or 0.0


def metric(text: str, sample: str) -> float:
    """The value of one sample line (``name{labels}``) of a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not in metrics")


def test_issued_chain_verifies_with_openssl(
    ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running_identity(ca_files, verifier, clock) as service:
            async with certify_stub(service.port, ca_files.anchors_pem) as stub:
                return await stub.Certify(request(NAME, web_token(signer), csr_for(NAME)), timeout=10)

    response = asyncio.run(scenario())
    leaf = x509.load_der_x509_certificate(response.leaf_certificate)
    assert list(response.intermediate_certificates) == [ca_files.issuer.public_bytes(Encoding.DER)]
    assert response.valid_until.ToDatetime().replace(tzinfo=leaf.not_valid_after_utc.tzinfo) == leaf.not_valid_after_utc
    verified = openssl_verify(tmp_path / "verify", ca_files.anchors_pem, response.intermediate_certificates, response.leaf_certificate)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "leaf.pem: OK" in verified.stdout


BAD_CSRS: dict[str, tuple[Callable[[], bytes], grpc.StatusCode]] = {
    "second-san": (lambda: csr_for(NAME, extra_sans=[x509.DNSName("evil.example")]), grpc.StatusCode.FAILED_PRECONDITION),
    "rsa-key": (lambda: csr_for(NAME, rsa.generate_private_key(65537, 2048)), grpc.StatusCode.FAILED_PRECONDITION),
    "wrong-identity": (
        lambda: csr_for("db.emojivoto.serviceaccount.identity.linkerd.cluster.local"), grpc.StatusCode.FAILED_PRECONDITION
    ),
    "garbage": (lambda: b"not a certificate signing request", grpc.StatusCode.INVALID_ARGUMENT),
}


def expired_token(key: TokenKey, clock: FakeClock, tmp_path: Path) -> bytes:
    two_minutes_ago = FakeClock(clock.now - timedelta(minutes=2))
    signer = LocalTokenSigner(key, two_minutes_ago)
    return signer.mint(namespace="emojivoto", service_account="web", pod="web-0", lifetime=timedelta(minutes=1))


def forged_token(key: TokenKey, clock: FakeClock, tmp_path: Path) -> bytes:
    return web_token(LocalTokenSigner(TokenKey.load_or_create(tmp_path / "elsewhere"), clock))


BAD_TOKENS: dict[str, tuple[Callable[[TokenKey, FakeClock, Path], bytes], grpc.StatusCode]] = {
    "wrong-service-account": (
        lambda k, c, p: web_token(LocalTokenSigner(k, c), service_account="db"), grpc.StatusCode.FAILED_PRECONDITION
    ),
    "wrong-namespace": (
        lambda k, c, p: web_token(LocalTokenSigner(k, c), namespace="other"), grpc.StatusCode.FAILED_PRECONDITION
    ),
    "expired": (expired_token, grpc.StatusCode.INVALID_ARGUMENT),
    "forged-signature": (forged_token, grpc.StatusCode.INVALID_ARGUMENT),
    "missing": (lambda k, c, p: b"", grpc.StatusCode.INVALID_ARGUMENT),
}


def call_expecting_error(
    ca_files: Pki, verifier: LocalTokenVerifier, clock: FakeClock, req: object, after_start: Callable[[], None] = lambda: None
) -> tuple[grpc.aio.AioRpcError, str]:
    async def scenario() -> tuple[grpc.aio.AioRpcError, str]:
        async with running_identity(ca_files, verifier, clock) as service:
            after_start()
            async with certify_stub(service.port, ca_files.anchors_pem) as stub:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Certify(req, timeout=10)
            _, metrics = await http_get(service.admin_port, "/metrics")
            return caught.value, metrics

    return asyncio.run(scenario())


@pytest.mark.parametrize("case", BAD_CSRS, ids=list(BAD_CSRS))
def test_bad_csrs_are_refused(
    case: str, ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock
) -> None:
    make_csr, status = BAD_CSRS[case]
    error, metrics = call_expecting_error(ca_files, verifier, clock, request(NAME, web_token(signer), make_csr()))
    assert error.code() == status, error.details()
    reason = "malformed_csr" if status == grpc.StatusCode.INVALID_ARGUMENT else "csr_rejected"
    assert metric(metrics, f'identity_certify_failures_total{{reason="{reason}"}}') == 1
    assert metric(metrics, "identity_certificates_issued_total") == 0


@pytest.mark.parametrize("case", BAD_TOKENS, ids=list(BAD_TOKENS))
def test_bad_tokens_are_refused(
    case: str, ca_files: Pki, verifier: LocalTokenVerifier, token_key: TokenKey, clock: FakeClock, tmp_path: Path
) -> None:
    make_token, status = BAD_TOKENS[case]
    token = make_token(token_key, clock, tmp_path)
    error, metrics = call_expecting_error(ca_files, verifier, clock, request(NAME, token, csr_for(NAME)))
    assert error.code() == status, error.details()
    assert metric(metrics, "identity_certificates_issued_total") == 0


def test_expired_issuer_is_a_failed_precondition(
    tmp_path: Path, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock
) -> None:
    ca = make_pki(tmp_path / "pki", clock.now, issuer_valid_for=timedelta(days=2))
    token = signer.mint(namespace="emojivoto", service_account="web", pod="web-0", lifetime=timedelta(days=5))
    # The service signs its own TLS certificate at start; then the (fake) clock passes the issuer's expiry.
    error, metrics = call_expecting_error(
        ca, verifier, clock, request(NAME, token, csr_for(NAME)), lambda: clock.advance(timedelta(days=3))
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "issuer expired" in error.details()
    assert metric(metrics, 'identity_certify_failures_total{reason="issuer_not_valid"}') == 1


def test_issuer_rotation_on_disk_is_picked_up_while_calls_run(
    ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock
) -> None:
    old_issuer = ca_files.issuer
    new_issuer, new_key = ca_files.new_issuer(clock.now)

    async def scenario() -> tuple[list[x509.Certificate], list[BaseException]]:
        seen: list[x509.Certificate] = []
        failures: list[BaseException] = []
        warmed_up, rotated = asyncio.Event(), asyncio.Event()
        async with running_identity(ca_files, verifier, clock) as service:
            async with certify_stub(service.port, ca_files.anchors_pem) as stub:

                async def caller() -> None:
                    # Keep calling until this caller has been answered by the new issuer.
                    while True:
                        try:
                            response = await stub.Certify(request(NAME, web_token(signer), csr_for(NAME)), timeout=10)
                        except grpc.aio.AioRpcError as exc:
                            failures.append(exc)
                            return
                        issuer = x509.load_der_x509_certificate(response.intermediate_certificates[0])
                        seen.append(issuer)
                        if len(seen) >= 8:
                            warmed_up.set()
                        if rotated.is_set() and issuer == new_issuer:
                            return

                callers = [asyncio.create_task(caller()) for _ in range(4)]
                await warmed_up.wait()
                ca_files.write_issuer(new_issuer, new_key)
                await service.issuer.wait_for(lambda: service.issuer.current.issuer.certificate == new_issuer)  # type: ignore[union-attr]
                rotated.set()
                await asyncio.gather(*callers)
            # New connections get the service's own certificate re-signed by the new issuer.
            served = await served_certificate(service.port, ca_files.anchors_pem)
            assert pki.link_problem(served, new_issuer) is None
        return seen, failures

    seen, failures = asyncio.run(scenario())
    assert failures == []
    assert seen[0] == old_issuer and seen[-1] == new_issuer
    # Once the new issuer answered, the old one never did again: the swap is atomic.
    first_new = seen.index(new_issuer)
    assert old_issuer not in seen[first_new + 4 :]


@pytest.mark.parametrize("breakage", ["garbage", "foreign-issuer", "mismatched-key"])
def test_unloadable_new_issuer_keeps_the_old_one(
    breakage: str, ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock, tmp_path: Path
) -> None:
    old_issuer = ca_files.issuer

    def break_issuer() -> None:
        if breakage == "garbage":
            ca_files.issuer_cert_path.write_bytes(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
        elif breakage == "foreign-issuer":
            foreign = make_pki(tmp_path / "foreign", clock.now)
            ca_files.write_issuer(foreign.issuer, foreign.issuer_key)
        else:
            pem.write_file(ca_files.issuer_key_path, pem.private_key_pem(ec.generate_private_key(ec.SECP256R1())), private=True)

    async def scenario() -> tuple[x509.Certificate, str]:
        async with running_identity(ca_files, verifier, clock) as service:
            break_issuer()
            await service.issuer.wait_for(lambda: reload_failures(service) >= 1)
            async with certify_stub(service.port, ca_files.anchors_pem) as stub:
                response = await stub.Certify(request(NAME, web_token(signer), csr_for(NAME)), timeout=10)
            _, metrics = await http_get(service.admin_port, "/metrics")
            return x509.load_der_x509_certificate(response.intermediate_certificates[0]), metrics

    issuer, metrics = asyncio.run(scenario())
    assert issuer == old_issuer
    assert metric(metrics, "identity_issuer_reload_failures_total") == 1
    assert metric(metrics, "identity_issuer_reloads_total") == 1


def test_admin_port_serves_health_and_metrics(
    ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock
) -> None:
    async def scenario() -> dict[str, tuple[int, str]]:
        async with running_identity(ca_files, verifier, clock) as service:
            async with certify_stub(service.port, ca_files.anchors_pem) as stub:
                await stub.Certify(request(NAME, web_token(signer), csr_for(NAME)), timeout=10)
            return {path: await http_get(service.admin_port, path) for path in ("/ready", "/live", "/metrics", "/nope")}

    pages = asyncio.run(scenario())
    assert pages["/ready"][0] == 200 and pages["/live"][0] == 200 and pages["/nope"][0] == 404
    metrics = pages["/metrics"][1]
    assert metric(metrics, "identity_certificates_issued_total") == 1
    assert metric(metrics, "identity_issuer_expiry_timestamp_seconds") == ca_files.issuer.not_valid_after_utc.timestamp()
    assert 364 * 86400 < metric(metrics, "issuer_cert_ttl_seconds") <= 365 * 86400
    assert metric(metrics, 'identity_certify_failures_total{reason="invalid_token"}') == 0


def test_identity_waits_for_its_issuer_and_is_not_ready_meanwhile(
    ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock
) -> None:
    cert, key = ca_files.issuer, ca_files.issuer_key
    ca_files.issuer_cert_path.unlink()

    async def scenario() -> tuple[int, int]:
        service = IdentityService(config_for(ca_files), verifier, clock=clock)
        starting = asyncio.create_task(service.start())
        try:
            await service.issuer.wait_for(lambda: reload_failures(service) >= 1)
            not_ready, _ = await http_get(service.admin_port, "/ready")
            ca_files.write_issuer(cert, key)
            await starting
            ready, _ = await http_get(service.admin_port, "/ready")
            async with certify_stub(service.port, ca_files.anchors_pem) as stub:
                await stub.Certify(request(NAME, web_token(signer), csr_for(NAME)), timeout=10)
            return not_ready, ready
        finally:
            await service.stop(grace=None)

    assert asyncio.run(scenario()) == (500, 200)


def test_service_presents_the_identity_name_proxies_expect(
    ca_files: Pki, verifier: LocalTokenVerifier, clock: FakeClock
) -> None:
    async def scenario() -> x509.Certificate:
        async with running_identity(ca_files, verifier, clock) as service:
            return await served_certificate(service.port, ca_files.anchors_pem)

    leaf = asyncio.run(scenario())
    assert pki.subject_cn(leaf) == IDENTITY_SVC
    assert pki.link_problem(leaf, ca_files.issuer) is None


def test_unreadable_trust_anchors_name_the_file(ca_files: Pki, verifier: LocalTokenVerifier, tmp_path: Path) -> None:
    missing = tmp_path / "missing.crt"
    with pytest.raises(ConfigError, match=str(missing)):
        IdentityService(config_for(ca_files, trust_anchors=missing), verifier)
    with pytest.raises(ConfigError, match="admin address"):
        IdentityService(config_for(ca_files, admin_addr="nowhere"), verifier)


class _StubVerifier:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def verify(self, token: bytes, audience: str) -> TokenClaims:
        if self.error:
            raise self.error
        raise AssertionError("not reached")


def test_certifier_without_an_issuer_is_unavailable(clock: FakeClock) -> None:
    certifier = Certifier(lambda: None, _StubVerifier(), control_plane_ns="linkerd", trust_domain="cluster.local", clock=clock)
    with pytest.raises(CertifyError) as caught:
        certifier.certify(NAME, b"token", csr_for(NAME))
    assert caught.value.reason.code == grpc.StatusCode.UNAVAILABLE


def test_verifier_failure_is_internal_not_the_callers_fault(ca_files: Pki, clock: FakeClock) -> None:
    authority = CertificateAuthority(Issuer.validated([ca_files.issuer], ca_files.issuer_key, [ca_files.anchor]), IssuanceSettings())
    certifier = Certifier(
        lambda: authority, _StubVerifier(VerifierUnavailable("API server unreachable")),
        control_plane_ns="linkerd", trust_domain="cluster.local", clock=clock,
    )
    with pytest.raises(CertifyError) as caught:
        certifier.certify(NAME, b"token", csr_for(NAME))
    assert caught.value.reason is Reason.INTERNAL


def test_token_is_verified_before_anything_else_is_read(ca_files: Pki, clock: FakeClock, verifier: LocalTokenVerifier, signer: LocalTokenSigner) -> None:
    authority = CertificateAuthority(Issuer.validated([ca_files.issuer], ca_files.issuer_key, [ca_files.anchor]), IssuanceSettings())
    certifier = Certifier(lambda: authority, verifier, control_plane_ns="linkerd", trust_domain="cluster.local", clock=clock)
    outcomes = {}
    cases = (("garbage-token", b"junk"), ("garbage-csr", b"junk"),
             ("second-san", csr_for(NAME, extra_sans=[x509.DNSName("x.example")])))
    for case, csr in cases:
        if case == "second-san":
            clock.advance(timedelta(days=400))  # the issuer has expired (the token is minted after)
        token = b"token" if case == "garbage-token" else web_token(signer)
        with pytest.raises(CertifyError) as caught:
            certifier.certify(NAME, token, csr)
        outcomes[case] = caught.value.reason
    # Without a valid token the CSR is never parsed; then a bad CSR is a bad request whatever the
    # issuer, and the issuer is checked before the CSR's rules.
    assert outcomes == {"garbage-token": Reason.INVALID_TOKEN, "garbage-csr": Reason.MALFORMED_CSR,
                        "second-san": Reason.ISSUER_NOT_VALID}
