"""Fixtures for the proxy tests: a valid LINKERD2_PROXY_* environment and a trust anchor."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@pytest.fixture(scope="session")
def trust_anchor_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "root.linkerd.cluster.local")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture(scope="session")
def minimal_env(trust_anchor_pem: str) -> dict[str, str]:
    """The variables Linkerd's proxy requires, as the injector would set them."""
    return {
        "LINKERD2_PROXY_DESTINATION_SVC_ADDR": "linkerd-dst-headless.linkerd.svc.cluster.local.:8086",
        "LINKERD2_PROXY_DESTINATION_SVC_NAME": "linkerd-destination.linkerd.serviceaccount.identity.linkerd.cluster.local",
        "LINKERD2_PROXY_POLICY_SVC_ADDR": "linkerd-policy.linkerd.svc.cluster.local.:8090",
        "LINKERD2_PROXY_POLICY_SVC_NAME": "linkerd-destination.linkerd.serviceaccount.identity.linkerd.cluster.local",
        "LINKERD2_PROXY_POLICY_WORKLOAD": '{"ns":"emojivoto","pod":"web-0"}',
        "LINKERD2_PROXY_IDENTITY_DIR": "/var/run/linkerd/identity/end-entity",
        "LINKERD2_PROXY_IDENTITY_TOKEN_FILE": "/var/run/secrets/tokens/linkerd-identity-token",
        "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS": trust_anchor_pem,
        "LINKERD2_PROXY_IDENTITY_LOCAL_NAME": "web.emojivoto.serviceaccount.identity.linkerd.cluster.local",
        "LINKERD2_PROXY_IDENTITY_SVC_ADDR": "linkerd-identity-headless.linkerd.svc.cluster.local.:8080",
        "LINKERD2_PROXY_IDENTITY_SVC_NAME": "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local",
    }
