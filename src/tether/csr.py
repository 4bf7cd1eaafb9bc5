"""The certificate signing request a workload sends identity's ``Certify`` (Linkerd's identity contract).

An empty subject and the identity as the only, critical, DNS SAN, signed with
the workload's key (ECDSA P-256, SHA-256), DER-encoded. One home for the
proxy (``tether.proxy.core.certs``, run by ``tether.proxy.certify``) and the
tap controller (``tether.viz.tap_identity``), which may not import each
other; it imports nothing else of Tether.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding


def csr_der(key: ec.EllipticCurvePrivateKey, name: str) -> bytes:
    """A DER CSR whose only SAN is the DNS name ``name`` and whose subject is empty (CN is optional)."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=True)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(Encoding.DER)
