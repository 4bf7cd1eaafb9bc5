"""Helpers for the identity tests: a PKI on disk, a settable clock, CSRs, a running service, openssl.

There is no pytest-asyncio here: async scenarios are plain coroutines run with ``asyncio.run``.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import Encoding

from tether.api import identity_pb2, identity_pb2_grpc
from tether.identity import pem, pki
from tether.identity.server import IdentityConfig, IdentityService
from tether.naming import WorkloadIdentity, control_plane_identity
from tether.platform.local.tokens import LocalTokenSigner

WEB = WorkloadIdentity("web", "emojivoto")
IDENTITY_SVC = control_plane_identity("identity").dns_name


class FakeClock:
    """A clock tests move by hand; ``sleep`` advances it instead of waiting."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime.now(UTC)
        self.slept: list[float] = []

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(timedelta(seconds=seconds))


@dataclass
class Pki:
    """A trust anchor and an issuer, as files in ``dir``."""

    dir: Path
    anchor: x509.Certificate
    anchor_key: ec.EllipticCurvePrivateKey
    issuer: x509.Certificate
    issuer_key: ec.EllipticCurvePrivateKey

    @property
    def anchors_path(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def issuer_cert_path(self) -> Path:
        return self.dir / "issuer.crt"

    @property
    def issuer_key_path(self) -> Path:
        return self.dir / "issuer.key"

    @property
    def anchors_pem(self) -> bytes:
        return self.anchors_path.read_bytes()

    def new_issuer(self, now: datetime, valid_for: timedelta = timedelta(days=365)) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        return pki.create_issuer(
            self.anchor, self.anchor_key, control_plane_ns="linkerd", trust_domain="cluster.local",
            valid_for=valid_for, now=now,
        )

    def write_issuer(self, cert: x509.Certificate, key: PrivateKeyTypes) -> None:
        pem.write_file(self.issuer_cert_path, pem.certificate_pem(cert), private=False)
        pem.write_file(self.issuer_key_path, pem.private_key_pem(key), private=True)  # type: ignore[arg-type]
        self.issuer, self.issuer_key = cert, key  # type: ignore[assignment]


def make_pki(directory: Path, now: datetime, issuer_valid_for: timedelta = timedelta(days=365)) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    anchor, anchor_key = pki.create_trust_anchor(
        control_plane_ns="linkerd", trust_domain="cluster.local", valid_for=timedelta(days=365), now=now
    )
    pem.write_file(directory / "ca.crt", pem.certificate_pem(anchor), private=False)
    made = Pki(directory, anchor, anchor_key, anchor, anchor_key)
    made.write_issuer(*made.new_issuer(now, issuer_valid_for))
    return made


def web_token(signer: LocalTokenSigner, **overrides: str) -> bytes:
    claims = {"namespace": "emojivoto", "service_account": "web", "pod": "web-0"} | overrides
    return signer.mint(**claims)


def csr_for(
    name: str,
    key: PrivateKeyTypes | None = None,
    *,
    extra_sans: Sequence[x509.GeneralName] = (),
    cn: str | None = None,
) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, cn)] if cn else [])
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject).add_extension(
        x509.SubjectAlternativeName([x509.DNSName(name), *extra_sans]), critical=False
    )
    return builder.sign(key, hashes.SHA256()).public_bytes(Encoding.DER)  # type: ignore[arg-type]


def config_for(ca: Pki, **overrides: object) -> IdentityConfig:
    base = IdentityConfig(
        trust_anchors=ca.anchors_path,
        issuer_cert=ca.issuer_cert_path,
        issuer_key=ca.issuer_key_path,
        addr="127.0.0.1:0",
        admin_addr="127.0.0.1:0",
        issuer_poll_interval=0.02,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


@asynccontextmanager
async def running_identity(ca: Pki, verifier: object, clock: FakeClock, **overrides: object) -> AsyncIterator[IdentityService]:
    service = IdentityService(config_for(ca, **overrides), verifier, clock=clock)  # type: ignore[arg-type]
    try:
        await service.start()
        yield service
    finally:
        await service.stop(grace=None)


@asynccontextmanager
async def certify_stub(port: int, anchors_pem: bytes) -> AsyncIterator[identity_pb2_grpc.IdentityStub]:
    """A TLS client of the service, verifying its name as a proxy does."""
    credentials = grpc.ssl_channel_credentials(root_certificates=anchors_pem)
    options = [("grpc.ssl_target_name_override", IDENTITY_SVC)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        yield identity_pb2_grpc.IdentityStub(channel)


def request(identity: str, token: bytes, csr: bytes) -> identity_pb2.CertifyRequest:
    return identity_pb2.CertifyRequest(identity=identity, token=token, certificate_signing_request=csr)


def openssl_verify(directory: Path, anchors_pem: bytes, chain_der: Sequence[bytes], leaf_der: bytes) -> subprocess.CompletedProcess:
    """``openssl verify -CAfile anchors -untrusted intermediates leaf``, on files written to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "anchors.pem").write_bytes(anchors_pem)
    (directory / "untrusted.pem").write_bytes(
        b"".join(pem.certificate_pem(x509.load_der_x509_certificate(d)) for d in chain_der)
    )
    (directory / "leaf.pem").write_bytes(pem.certificate_pem(x509.load_der_x509_certificate(leaf_der)))
    return subprocess.run(
        ["openssl", "verify", "-CAfile", "anchors.pem", "-untrusted", "untrusted.pem", "leaf.pem"],
        cwd=directory, capture_output=True, text=True, timeout=30,
    )
