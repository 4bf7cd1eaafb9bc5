"""Pure X.509 rules of the proxy's identity: key and CSR (``tether.csr``), checking a Certify answer or an X.509-SVID.

They need ``cryptography`` (~12 MB resident), so the serving proxy never imports this module:
``tether.proxy.certify`` runs them in a short-lived process for ``io.identity_client`` and
``io.spire_client`` (what the proxy keeps is in ``core.certified``). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import Encoding, load_der_private_key
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from tether.csr import csr_der as csr_der  # the proxy's CSR (tether.proxy.certify asks it here): one home
from tether.proxy.core.certified import CertError, Certified


def new_key() -> ec.EllipticCurvePrivateKey:
    """The proxy's ECDSA P-256 key; it never touches a disk (see ``tether.proxy.certify``)."""
    return ec.generate_private_key(ec.SECP256R1())


def parse_anchors(pem: bytes) -> tuple[x509.Certificate, ...]:
    """The certificates of a PEM trust-anchor bundle (one or more roots)."""
    try:
        anchors = tuple(x509.load_pem_x509_certificates(pem))
    except ValueError as exc:
        raise CertError(f"trust anchors: no readable PEM certificate ({exc})") from None
    return anchors


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
    return Certified(_chain_pem(leaf, intermediates), valid_until)


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
    return Certified(_chain_pem(leaf, intermediates), leaf.not_valid_after_utc), key


def _chain_pem(leaf: x509.Certificate, intermediates: Sequence[x509.Certificate]) -> bytes:
    """Leaf then intermediates, as a TLS stack presents them."""
    return b"".join(c.public_bytes(Encoding.PEM) for c in (leaf, *intermediates))
