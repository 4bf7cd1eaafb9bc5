"""A throwaway mesh PKI for tap's tests: a trust anchor, an issuer, and leaf certificates per identity."""

from __future__ import annotations

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
