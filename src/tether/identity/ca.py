"""The identity CA: an issuer checked against the trust anchors, CSR rules, and leaf issuance.

``tether.identity.certifier`` reads each CSR with ``parse_csr``, checks it with ``check_csr``
and signs through ``CertificateAuthority.issue``; ``tether.identity.serving`` signs the
service's own TLS certificate the same way.  ``tether.identity.issuer_source`` builds an
``Issuer`` from files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tether.identity import pki
from tether.identity.errors import CertifyError, Reason
from tether.naming import WorkloadIdentity

DEFAULT_LIFETIME = timedelta(hours=24)
DEFAULT_CLOCK_SKEW = timedelta(seconds=20)  # Linkerd chart's clockSkewAllowance


@dataclass(frozen=True, slots=True)
class IssuanceSettings:
    """How leaves are issued."""

    lifetime: timedelta = DEFAULT_LIFETIME
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW  # notBefore is backdated by this, notAfter extended
    spiffe_uri_san: bool = False  # also put spiffe://<td>/ns/<ns>/sa/<sa> in the SANs


@dataclass(frozen=True, slots=True)
class Issuer:
    """A validated issuer: a P-256 CA key and certificate that chain to one of the trust anchors."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey = field(repr=False)
    chain: tuple[x509.Certificate, ...]  # certificates above the issuer, below the anchor (often none)
    anchor: x509.Certificate

    @classmethod
    def validated(
        cls, certs: Sequence[x509.Certificate], key: PrivateKeyTypes, anchors: Sequence[x509.Certificate]
    ) -> Issuer:
        """Check ``certs`` (issuer first, then its chain) and ``key``; raise ``pki.PkiError`` if wrong."""
        issuer, *chain = certs
        pki.check_ca_pair(issuer, key)
        for child, parent in zip(certs, chain):
            if problem := pki.link_problem(child, parent):
                raise pki.PkiError(f"chain link {pki.subject_cn(child)!r}: {problem}")
        anchor = pki.signing_anchor(certs[-1], anchors)
        if anchor is None:
            raise pki.PkiError(f"{pki.subject_cn(certs[-1])!r} is not signed by any of the trust anchors")
        return cls(issuer, key, tuple(chain), anchor)  # type: ignore[arg-type]  # check_ca_pair: EC key

    @property
    def intermediates(self) -> tuple[x509.Certificate, ...]:
        """What Certify returns after the leaf: the issuer and its chain, without the anchor."""
        return (self.certificate, *self.chain)

    @property
    def not_before(self) -> datetime:
        return max(c.not_valid_before_utc for c in (*self.intermediates, self.anchor))

    @property
    def not_after(self) -> datetime:
        """When the first certificate between issuer and anchor expires; no leaf may outlive it."""
        return min(c.not_valid_after_utc for c in (*self.intermediates, self.anchor))


def parse_csr(data: bytes) -> x509.CertificateSigningRequest:
    """A CSR whose self-signature verifies: DER as proxies send it, or PEM; else ``MALFORMED_CSR``."""
    try:
        csr = x509.load_pem_x509_csr(data) if data.lstrip().startswith(b"-----BEGIN") else x509.load_der_x509_csr(data)
        signature_ok = csr.is_signature_valid
        pki.sans(csr)  # extensions are parsed lazily: surface a broken one here
    except ValueError as exc:
        raise CertifyError(Reason.MALFORMED_CSR, f"certificate signing request does not parse: {exc}") from None
    if not signature_ok:
        raise CertifyError(Reason.MALFORMED_CSR, "certificate signing request signature does not verify")
    return csr


def check_csr(csr: x509.CertificateSigningRequest, identity: str) -> None:
    """Apply Linkerd's rules for ``identity``; raise ``CertifyError(CSR_REJECTED)`` otherwise.

    The CSR must carry a P-256 key, have exactly one SAN -- a DNS name equal to ``identity`` --
    and a CN that is empty or the same name.
    """
    public_key = csr.public_key()
    if not pki.is_p256(public_key):
        raise CertifyError(Reason.CSR_REJECTED, f"CSR key is {pki.describe_key(public_key)}; ECDSA P-256 required")
    sans = pki.sans(csr)
    if [type(n) for n in sans] != [x509.DNSName]:
        raise CertifyError(Reason.CSR_REJECTED, f"CSR must have exactly one SAN, a DNS name; found {_show(sans)}")
    if sans[0].value != identity:
        raise CertifyError(Reason.CSR_REJECTED, f"CSR DNS SAN {sans[0].value!r} is not the requested {identity!r}")
    cns = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if any(cn.value != identity for cn in cns):
        raise CertifyError(Reason.CSR_REJECTED, f"CSR common name {cns[0].value!r} is not the requested {identity!r}")


class CertificateAuthority:
    """Signs leaves with one issuer.  Immutable: a new issuer means a new instance."""

    def __init__(self, issuer: Issuer, settings: IssuanceSettings) -> None:
        self.issuer = issuer
        self._settings = settings
        self._aki = pki.authority_key_id(issuer.certificate)

    def check_valid_at(self, now: datetime) -> None:
        """Raise ``CertifyError(ISSUER_NOT_VALID)`` when ``now`` is outside the issuer chain's validity."""
        if now < self.issuer.not_before:
            raise CertifyError(Reason.ISSUER_NOT_VALID, f"issuer is not valid until {_iso(self.issuer.not_before)}")
        if now >= self.issuer.not_after:
            raise CertifyError(Reason.ISSUER_NOT_VALID, f"issuer expired at {_iso(self.issuer.not_after)}")

    def issue(self, public_key: PublicKeyTypes, identity: WorkloadIdentity, now: datetime) -> x509.Certificate:
        """A leaf for ``identity`` over ``public_key`` (a P-256 key, already checked by the caller).

        Valid from ``now - skew`` to ``now + lifetime + skew`` (as Linkerd's window), cut short
        so it never outlives the issuer's chain.
        """
        self.check_valid_at(now)
        skew = self._settings.clock_skew
        not_after = min(now + self._settings.lifetime + skew, self.issuer.not_after)
        sans: list[x509.GeneralName] = [x509.DNSName(identity.dns_name)]
        if self._settings.spiffe_uri_san:
            sans.append(x509.UniformResourceIdentifier(identity.spiffe_uri))
        subject = _leaf_subject(identity.dns_name)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.issuer.certificate.subject)
            .public_key(public_key)  # type: ignore[arg-type]  # checked P-256 by the caller
            # Random serials rather than Linkerd's per-issuer counter: unique across restarts and reloads.
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - skew)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_LEAF_KEY_USAGE, critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
            # RFC 5280 4.2.1.6: with an empty subject the SAN extension must be critical.
            .add_extension(x509.SubjectAlternativeName(sans), critical=not subject)
            .add_extension(self._aki, critical=False)
        )
        return builder.sign(self.issuer.key, hashes.SHA256())


# digitalSignature for the TLS handshake; keyEncipherment because Linkerd sets it too.
_LEAF_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=True,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=False,
    crl_sign=False,
    encipher_only=False,
    decipher_only=False,
)


def _leaf_subject(name: str) -> x509.Name:
    """CN = the identity, as Linkerd, when it fits RFC 5280's 64-character CN bound; else empty.

    Identity names often exceed 64 characters and cryptography enforces the bound; the DNS SAN,
    which is what every verifier (and Linkerd's proxy) reads, always carries the full name.
    """
    if len(name) > _CN_MAX:
        return x509.Name([])
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


_CN_MAX = 64  # ub-common-name


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _show(sans: list[x509.GeneralName]) -> str:
    return ", ".join(f"{type(n).__name__} {n.value!r}" for n in sans) or "none"
