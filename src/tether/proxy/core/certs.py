"""Pure X.509 rules of the proxy's identity: key and CSR, checking a Certify answer or a SPIRE
X.509-SVID, refresh timing.

Used by ``tether.proxy.io.identity_client`` and ``io.spire_client`` (and their tests); the proxy's
TLS layer uses ``identities`` to read a peer's mesh identity.  Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import Encoding, load_der_private_key
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

REFRESH_FRACTION = 0.7  # renew at 70 % of the remaining lifetime, as linkerd2-proxy


class CertError(Exception):
    """Trust anchors or a Certify answer the proxy cannot use."""


def new_key() -> ec.EllipticCurvePrivateKey:
    """The proxy's ECDSA P-256 key; it stays in memory (see ``io.identity_client``)."""
    return ec.generate_private_key(ec.SECP256R1())


def csr_der(key: ec.EllipticCurvePrivateKey, name: str) -> bytes:
    """A DER CSR whose only SAN is the DNS name ``name`` and whose subject is empty (CN is optional)."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=True)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(Encoding.DER)


def parse_anchors(pem: bytes) -> tuple[x509.Certificate, ...]:
    """The certificates of a PEM trust-anchor bundle (one or more roots)."""
    try:
        anchors = tuple(x509.load_pem_x509_certificates(pem))
    except ValueError as exc:
        raise CertError(f"trust anchors: no readable PEM certificate ({exc})") from None
    return anchors


@dataclass(frozen=True, slots=True)
class Certified:
    """A verified answer to Certify."""

    leaf: x509.Certificate
    intermediates: tuple[x509.Certificate, ...]
    valid_until: datetime

    def chain_pem(self) -> bytes:
        """Leaf then intermediates, as a TLS stack presents them."""
        return b"".join(c.public_bytes(Encoding.PEM) for c in (self.leaf, *self.intermediates))


def check_certified(
    leaf_der: bytes,
    intermediates_der: Sequence[bytes],
    valid_until: datetime | None,
    *,
    key: ec.EllipticCurvePrivateKey,
    name: str,
    anchors: Sequence[x509.Certificate],
    now: datetime,
) -> Certified:
    """Accept a Certify answer only if it is current, for our key, and chains to an anchor for ``name``."""
    if valid_until is None:
        raise CertError("response has no valid_until")
    if valid_until <= now:
        raise CertError(f"response expired already (valid_until {valid_until.isoformat()})")
    try:
        leaf = x509.load_der_x509_certificate(leaf_der)
        intermediates = tuple(x509.load_der_x509_certificate(d) for d in intermediates_der)
    except ValueError as exc:
        raise CertError(f"response certificate does not parse: {exc}") from None
    if leaf.public_key() != key.public_key():
        raise CertError("leaf certificate is not for this proxy's key")
    verifier = PolicyBuilder().store(Store(list(anchors))).time(now).build_server_verifier(x509.DNSName(name))
    try:
        verifier.verify(leaf, list(intermediates))
    except VerificationError as exc:
        raise CertError(f"leaf does not verify for {name!r} against the trust anchors: {exc}") from None
    return Certified(leaf, intermediates, valid_until)


def split_der_certificates(data: bytes) -> list[bytes]:
    """The DER certificates concatenated in ``data`` (the Workload API's ``x509_svid`` and ``bundle``)."""
    out, at = [], 0
    while at < len(data):
        if data[at] != 0x30 or at + 2 > len(data):
            raise CertError(f"not a DER certificate at byte {at}")
        length, head = data[at + 1], 2
        if length & 0x80:  # long form: the next (length & 0x7f) bytes hold the length
            count = length & 0x7F
            if not 1 <= count <= 4 or at + 2 + count > len(data):
                raise CertError(f"bad DER length at byte {at}")
            length, head = int.from_bytes(data[at + 2:at + 2 + count], "big"), 2 + count
        end = at + head + length
        if end > len(data):
            raise CertError(f"truncated DER certificate at byte {at}")
        out.append(data[at:end])
        at = end
    return out


def check_svid(chain_der: bytes, key_der: bytes, *, spiffe_id: str, anchors: Sequence[x509.Certificate],
               now: datetime) -> tuple[Certified, PrivateKeyTypes]:
    """Accept a SPIRE X.509-SVID (``x509_svid``: leaf then intermediates; ``x509_svid_key``: PKCS#8) only if
    its key matches, it is current, chains to the trust anchors and its URI SAN is ``spiffe_id``."""
    blocks = split_der_certificates(chain_der)
    if not blocks:
        raise CertError("the SVID has no certificate")
    if not key_der:
        raise CertError("the SVID has no private key")
    try:
        leaf, *intermediates = (x509.load_der_x509_certificate(b) for b in blocks)
        key = load_der_private_key(key_der, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"the SVID does not parse: {exc}") from None
    if leaf.public_key() != key.public_key():
        raise CertError("the SVID's private key is not its certificate's")
    verifier = PolicyBuilder().store(Store(list(anchors))).time(now).build_client_verifier()
    try:
        verified = verifier.verify(leaf, intermediates)
    except VerificationError as exc:
        raise CertError(f"the SVID does not verify against the trust anchors: {exc}") from None
    uris = [n.value for n in verified.subjects or () if isinstance(n, x509.UniformResourceIdentifier)]
    if spiffe_id not in uris:
        raise CertError(f"the SVID names {', '.join(uris) or 'no URI'}, not {spiffe_id}")
    return Certified(leaf, tuple(intermediates), leaf.not_valid_after_utc), key


def identities(cert_der: bytes) -> tuple[str, ...]:
    """The mesh identities a peer certificate claims: its DNS and URI SANs, in order.

    A client's identity is the first of them (proxy reference 5.1); a server is accepted when
    the one expected is among them.
    """
    cert = x509.load_der_x509_certificate(cert_der)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return tuple(n.value for n in sans if isinstance(n, x509.DNSName | x509.UniformResourceIdentifier))


@dataclass(frozen=True, slots=True)
class RefreshPolicy:
    """When to call Certify again.

    After a success: 70 % of the remaining lifetime, kept within ``[min_refresh, max_refresh]``.
    After failures: exponential backoff from ``backoff_min`` (doubling, up to ``backoff_max``,
    plus up to ``jitter`` of itself at random), but never later than the success schedule of the
    certificate still held, so a retry always comes before it expires.
    """

    min_refresh: timedelta = timedelta(seconds=10)
    max_refresh: timedelta = timedelta(hours=24)
    backoff_min: timedelta = timedelta(milliseconds=100)
    backoff_max: timedelta = timedelta(seconds=60)
    jitter: float = 0.1

    def after_success(self, valid_until: datetime | None, now: datetime) -> timedelta:
        if valid_until is None or valid_until <= now:
            return self.min_refresh
        return min(max((valid_until - now) * REFRESH_FRACTION, self.min_refresh), self.max_refresh)

    def after_failure(
        self, failures: int, valid_until: datetime | None, now: datetime, random: Callable[[], float]
    ) -> timedelta:
        """The wait after ``failures`` consecutive failures (1 for the first)."""
        base = min(self.backoff_min * 2 ** min(failures - 1, 32), self.backoff_max)  # 2**32 caps any sane max
        backoff = min(base + base * self.jitter * random(), self.backoff_max)
        wait: timedelta = min(backoff, self.after_success(valid_until, now))
        return wait
