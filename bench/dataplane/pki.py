"""The benchmark's PKI, made with Tether's identity tooling: a trust anchor, an issuer, leaves.

``issue_mesh_certs`` makes, once per run:

- a trust anchor and an issuer with ``tether.identity.pki`` (what
  ``tether identity create-trust-anchor`` / ``create-issuer`` write), ECDSA P-256;
- a client and a server leaf (24 h, the workload identity as DNS SAN and CN,
  server and client auth) signed by the identity component's own CA code
  (``tether.identity.ca.CertificateAuthority``, the code behind Certify), for
  the proxies that read certificates from files (Envoy, HAProxy);
- the destination service's serving certificate, for the Tether variants;
- the tap identity's leaf (``tap.linkerd-viz``), for the variants that open a tap.

The Tether variants do not use the leaves: they run ``tether identity serve``
with this issuer, and each proxy gets its certificate from it through Certify
with a local-platform token. Every proxy in the run trusts the same anchor, so
the harness's TLS probe (as ``CLIENT_IDENTITY``) works against every variant.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from tether.identity import pem, pki
from tether.identity.ca import CertificateAuthority, Issuer, IssuanceSettings
from tether.naming import DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN, WorkloadIdentity, control_plane_identity

CLIENT_IDENTITY = WorkloadIdentity("bench-client", "bench")
SERVER_IDENTITY = WorkloadIdentity("bench-server", "bench")
DESTINATION_IDENTITY = control_plane_identity("destination")
TAP_IDENTITY = WorkloadIdentity("tap", "linkerd-viz")  # what tether.viz.tap_injector.tap_identity() names


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
    issuer_cert: Path | None = None  # the issuer (for `tether identity serve`)
    issuer_key: Path | None = None
    destination: Leaf | None = None  # the destination service's serving certificate
    tap: Leaf | None = None  # the tap server's identity (Observe is served to it only)


def issue_mesh_certs(directory: Path) -> MeshCerts:
    """Write an anchor, an issuer and the leaves into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    names = {"control_plane_ns": DEFAULT_CONTROL_PLANE_NS, "trust_domain": DEFAULT_TRUST_DOMAIN}
    anchor, anchor_key = pki.create_trust_anchor(valid_for=dt.timedelta(days=365), now=now, **names)
    issuer, issuer_key = pki.create_issuer(anchor, anchor_key, valid_for=dt.timedelta(days=365), now=now, **names)
    pem.write_file(directory / "anchor.crt", pem.certificate_pem(anchor), private=False)
    pem.write_file(directory / "issuer.crt", pem.certificate_pem(issuer), private=False)
    pem.write_file(directory / "issuer.key", pem.private_key_pem(issuer_key), private=True)
    ca = CertificateAuthority(Issuer.validated([issuer], issuer_key, [anchor]), IssuanceSettings())

    def leaf(identity: WorkloadIdentity, stem: str) -> Leaf:
        key = pki.new_key()
        cert = ca.issue(key.public_key(), identity, now + dt.timedelta(minutes=5))
        chain = pem.certificate_pem(cert, issuer)
        key_pem = pem.private_key_pem(key)
        paths = Leaf(identity.dns_name, directory / f"{stem}.crt", directory / f"{stem}.key", directory / f"{stem}.pem")
        pem.write_file(paths.chain, chain, private=False)
        pem.write_file(paths.key, key_pem, private=True)
        pem.write_file(paths.bundle, chain + key_pem, private=True)
        return paths

    return MeshCerts(directory / "anchor.crt", leaf(CLIENT_IDENTITY, "client"), leaf(SERVER_IDENTITY, "server"),
                     directory / "issuer.crt", directory / "issuer.key", leaf(DESTINATION_IDENTITY, "destination"),
                     leaf(TAP_IDENTITY, "tap"))
