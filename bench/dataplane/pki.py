"""Certificates for the proxies' mTLS: a trust anchor, an issuer, two leaves.

The chain has the mesh's shape (ECDSA P-256; anchor -> issuer -> 24 h leaf with
the workload identity as DNS SAN and CN, usable for server and client auth), so
Envoy and HAProxy do the same crypto a Tether proxy does. ``issue_mesh_certs``
is the one place that makes them: when the identity tooling can issue to files,
that function becomes a call to it (the Tether variants use the real identity
component instead).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tether.naming import WorkloadIdentity, issuer_name, trust_anchor_name

CLIENT_IDENTITY = WorkloadIdentity("bench-client", "bench")
SERVER_IDENTITY = WorkloadIdentity("bench-server", "bench")


@dataclass(frozen=True)
class Leaf:
    name: str  # the identity's DNS name (SAN and CN)
    chain: Path  # leaf then issuer, PEM
    key: Path  # PKCS#8 PEM
    bundle: Path  # chain then key in one file (HAProxy's `crt`)


@dataclass(frozen=True)
class MeshCerts:
    anchor: Path  # the trust anchor, PEM: what every proxy trusts
    client: Leaf
    server: Leaf


def issue_mesh_certs(directory: Path) -> MeshCerts:
    """Write an anchor, an issuer and a client and a server leaf into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    anchor_key = ec.generate_private_key(ec.SECP256R1())
    anchor = _cert(trust_anchor_name(), anchor_key, trust_anchor_name(), anchor_key, now, 365, ca_path=1)
    issuer_key = ec.generate_private_key(ec.SECP256R1())
    issuer = _cert(issuer_name(), issuer_key, trust_anchor_name(), anchor_key, now, 365, ca_path=0)
    (directory / "anchor.crt").write_bytes(_pem(anchor))

    def leaf(identity: WorkloadIdentity, stem: str) -> Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(identity.dns_name, key, issuer_name(), issuer_key, now, 1, ca_path=None)
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        chain = _pem(cert) + _pem(issuer)
        paths = Leaf(identity.dns_name, directory / f"{stem}.crt", directory / f"{stem}.key", directory / f"{stem}.pem")
        paths.chain.write_bytes(chain)
        paths.key.write_bytes(key_pem)
        paths.bundle.write_bytes(chain + key_pem)
        for p in (paths.key, paths.bundle):
            p.chmod(0o600)
        return paths

    return MeshCerts(directory / "anchor.crt", leaf(CLIENT_IDENTITY, "client"), leaf(SERVER_IDENTITY, "server"))


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    signer: ec.EllipticCurvePrivateKey,
    not_before: dt.datetime,
    days: int,
    ca_path: int | None,
) -> x509.Certificate:
    is_ca = ca_path is not None
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=ca_path), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
    )
    if is_ca:
        b = b.add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
    else:
        b = (
            b.add_extension(
                x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                              data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                              encipher_only=False, decipher_only=False),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        )
    return b.sign(signer, hashes.SHA256())
