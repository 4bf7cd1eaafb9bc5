"""The mesh PKI's certificate authorities: making trust anchors and issuers, and checking chain links.

Called by the CLI (``tether identity create-trust-anchor / create-issuer / inspect``) and by
``tether.identity.ca`` when it validates an issuer against the trust anchors.  Every check of
"does this certificate sign that one" in the identity component goes through ``link_problem``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.x509.oid import NameOID

from tether.naming import issuer_name, trust_anchor_name

DEFAULT_CA_LIFETIME = timedelta(days=365)


class PkiError(Exception):
    """A certificate or key does not meet the mesh's rules for a CA."""


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 key: the only key type Linkerd's identity issues for or signs with."""
    return ec.generate_private_key(ec.SECP256R1())


def is_p256(key: PublicKeyTypes | PrivateKeyTypes) -> bool:
    return isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) and isinstance(
        key.curve, ec.SECP256R1
    )


def is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def create_trust_anchor(
    *, control_plane_ns: str, trust_domain: str, valid_for: timedelta, now: datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed root CA (no path-length limit), as ``linkerd install`` makes."""
    key = new_key()
    name = _name(trust_anchor_name(control_plane_ns, trust_domain))
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return builder.sign(key, hashes.SHA256()), key


def create_issuer(
    anchor: x509.Certificate,
    anchor_key: PrivateKeyTypes,
    *,
    control_plane_ns: str,
    trust_domain: str,
    valid_for: timedelta,
    now: datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """An intermediate CA signed by ``anchor``, allowed to sign only leaves (path length 0).

    Its expiry is clamped to the anchor's, since a chain is never valid past its root.
    """
    check_ca_pair(anchor, anchor_key)
    key = new_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(issuer_name(control_plane_ns, trust_domain)))
        .issuer_name(anchor.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(min(now + valid_for, anchor.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(authority_key_id(anchor), critical=False)
    )
    return builder.sign(anchor_key, hashes.SHA256()), key  # type: ignore[arg-type]  # checked above


def check_ca_pair(cert: x509.Certificate, key: PrivateKeyTypes) -> None:
    """Raise ``PkiError`` unless ``key`` is the P-256 key of ``cert`` and ``cert`` is a CA."""
    if not is_p256(key):
        raise PkiError(f"the key is {describe_key(key)}, not ECDSA P-256")
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise PkiError("the private key does not match the certificate")
    if not is_ca(cert):
        raise PkiError(f"{subject_cn(cert)!r} is not a CA certificate")


def authority_key_id(issuer: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    """The AKI pointing at ``issuer``: its SKI when it has one (chain builders match on it)."""
    try:
        ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.public_key())  # type: ignore[arg-type]


def link_problem(child: x509.Certificate, parent: x509.Certificate) -> str | None:
    """Why ``parent`` did not sign ``child``, or ``None`` when it did (names, CA flag, signature)."""
    if child.issuer != parent.subject:
        return f"issuer {child.issuer.rfc4514_string()!r} is not {parent.subject.rfc4514_string()!r}"
    if not is_ca(parent):
        return f"{subject_cn(parent)!r} is not a CA"
    try:
        child.verify_directly_issued_by(parent)
    except InvalidSignature:
        return "signature does not verify"
    except (ValueError, TypeError) as exc:
        return f"cannot verify signature ({exc})"
    return None


def signing_anchor(cert: x509.Certificate, anchors: Sequence[x509.Certificate]) -> x509.Certificate | None:
    """The anchor of the bundle that signed ``cert`` (any of several, for rotation), if any."""
    return next((a for a in anchors if link_problem(cert, a) is None), None)


@dataclass(frozen=True, slots=True)
class LinkVerdict:
    """How one certificate of a chain relates to the next one up (or to the trust anchors)."""

    cert: x509.Certificate
    signer: str  # who it was checked against: a subject, "trust anchors", or "itself"
    problem: str | None  # None when the link verifies


def chain_verdicts(chain: Sequence[x509.Certificate], anchors: Sequence[x509.Certificate]) -> list[LinkVerdict]:
    """Check each link of ``chain`` (leaf first), then the top against ``anchors`` when given.

    Without anchors a self-signed top is checked against itself; with anchors, the top must be
    one of them or be signed by one of them.
    """
    verdicts = [
        LinkVerdict(child, subject_cn(parent), link_problem(child, parent))
        for child, parent in zip(chain, chain[1:])
    ]
    top = chain[-1]
    if anchors:
        if top in anchors:
            verdicts.append(LinkVerdict(top, "trust anchors", None))
        else:
            found = signing_anchor(top, anchors)
            problem = None if found else "not signed by any of the trust anchors"
            verdicts.append(LinkVerdict(top, "trust anchors", problem))
    elif top.issuer == top.subject:
        verdicts.append(LinkVerdict(top, "itself", link_problem(top, top)))
    return verdicts


def subject_cn(cert: x509.Certificate) -> str:
    """A short name for ``cert``: its CN, else its first DNS SAN (leaves with long names have no CN)."""
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if cns:
        return str(cns[0].value)
    dns = [n for n in sans(cert) if isinstance(n, x509.DNSName)]
    return dns[0].value if dns else cert.subject.rfc4514_string()


def sans(cert: x509.Certificate | x509.CertificateSigningRequest) -> list[x509.GeneralName]:
    """The subject alternative names, in order (none when the extension is absent)."""
    try:
        return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return []


def describe_key(key: PublicKeyTypes | PrivateKeyTypes) -> str:
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        return f"ECDSA {_CURVE_NAMES.get(key.curve.name, key.curve.name)}"
    if isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        return f"RSA {key.key_size}"
    if isinstance(key, ed25519.Ed25519PublicKey | ed25519.Ed25519PrivateKey):
        return "Ed25519"
    return type(key).__name__


_CURVE_NAMES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}

_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
