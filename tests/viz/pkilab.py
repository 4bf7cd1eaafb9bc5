"""A throwaway mesh PKI for tap's tests: a trust anchor, an issuer, and leaf certificates per identity."""

from __future__ import annotations

import os
import ssl
from datetime import UTC, datetime, timedelta

from tether.identity import pem, pki
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.naming import WorkloadIdentity


class Pki:
    def __init__(self) -> None:
        now = datetime.now(UTC)
        anchor, anchor_key = pki.create_trust_anchor(control_plane_ns="linkerd", trust_domain="cluster.local",
                                                     valid_for=timedelta(days=1), now=now - timedelta(minutes=5))
        issuer, issuer_key = pki.create_issuer(anchor, anchor_key, control_plane_ns="linkerd",
                                               trust_domain="cluster.local", valid_for=timedelta(days=1),
                                               now=now - timedelta(minutes=5))
        self.anchors_pem = pem.certificate_pem(anchor)
        self._issuer = Issuer.validated([issuer], issuer_key, [anchor])
        self._ca = CertificateAuthority(self._issuer, IssuanceSettings(lifetime=timedelta(hours=1)))

    def leaf(self, service_account: str, namespace: str) -> tuple[str, bytes, bytes]:
        """(identity, key PEM, chain PEM) for ``<sa>.<ns>.serviceaccount.identity.linkerd.cluster.local``."""
        identity = WorkloadIdentity(service_account, namespace)
        key = pki.new_key()
        cert = self._ca.issue(key.public_key(), identity, datetime.now(UTC))
        return identity.dns_name, pem.private_key_pem(key), pem.certificate_pem(cert, *self._issuer.intermediates)


def server_context(key_pem: bytes, chain_pem: bytes, anchors_pem: bytes) -> ssl.SSLContext:
    """A TLS server context as the proxy's tap server gets from its identity: its key and chain, client
    certificates asked for (verified against ``anchors_pem``) but not required, ALPN h2."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.load_verify_locations(cadata=anchors_pem.decode())
    ctx.set_alpn_protocols(["h2"])
    fd = os.memfd_create("pkilab-key", os.MFD_CLOEXEC)
    try:
        os.write(fd, chain_pem + key_pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return ctx
