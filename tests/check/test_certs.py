"""The ``linkerd-identity`` checks on real certificates: each rule's pass, warning and failure, text and JSON."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from tether.diagnose import checks
from tether.diagnose.certs import Credentials, IdentityHints, identity_checks
from tether.identity import pki

NOW = datetime(2026, 6, 1, tzinfo=UTC)
HINTS = IdentityHints("fix the config", "fix the anchors", "fix the issuer")
CP = {"control_plane_ns": "linkerd", "trust_domain": "cluster.local"}


def anchor(days: int = 365, start: datetime = NOW - timedelta(days=1)):
    return pki.create_trust_anchor(valid_for=timedelta(days=days), now=start, **CP)


def issuer(anchor_pair, days: int = 365, start: datetime = NOW - timedelta(days=1)):
    return pki.create_issuer(*anchor_pair, valid_for=timedelta(days=days), now=start, **CP)


def self_signed(key, name: str = "odd", days: int = 365, hash_=hashes.SHA256()) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(NOW - timedelta(days=1))
            .not_valid_after(NOW + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hash_))


def outcomes(anchors, issuer_cert) -> dict[str, checks.Result]:
    category = checks.Category("linkerd-identity", identity_checks(lambda: Credentials(anchors, issuer_cert),
                                                                   lambda: NOW, HINTS))
    report = checks.run([category])
    return {r.description: r for r in report.results}


def test_a_fresh_pki_passes_every_check() -> None:
    a = anchor()
    results = outcomes([a[0]], issuer(a)[0])
    assert len(results) == 8
    assert all(r.outcome is checks.Outcome.SUCCESS for r in results.values())


def test_an_issuer_valid_for_less_than_60_days_is_a_warning_and_the_run_still_succeeds() -> None:
    a = anchor()
    results = outcomes([a[0]], issuer(a, days=30)[0])
    soon = results["issuer cert is valid for at least 60 days"]
    assert soon.outcome is checks.Outcome.WARNING
    assert "will expire on" in soon.error and soon.hint == "fix the issuer"
    assert results["issuer cert is within its validity period"].outcome is checks.Outcome.SUCCESS
    assert checks.Report(list(results.values())).success


def test_an_expired_issuer_is_an_error() -> None:
    a = anchor(days=3650, start=NOW - timedelta(days=400))
    results = outcomes([a[0]], issuer(a, days=30, start=NOW - timedelta(days=60))[0])
    expired = results["issuer cert is within its validity period"]
    assert expired.outcome is checks.Outcome.ERROR and "Expired on" in expired.error
    assert not checks.Report(list(results.values())).success


def test_anchors_soon_expiring_and_expired() -> None:
    soon = anchor(days=20)
    results = outcomes([soon[0]], issuer(soon)[0])
    assert results["trust anchors are valid for at least 60 days"].outcome is checks.Outcome.WARNING
    assert results["trust anchors are within their validity period"].outcome is checks.Outcome.SUCCESS
    old = anchor(days=10, start=NOW - timedelta(days=20))
    results = outcomes([old[0]], issuer(old, start=NOW - timedelta(days=15))[0])
    error = results["trust anchors are within their validity period"]
    assert error.outcome is checks.Outcome.ERROR
    assert error.error.startswith("Invalid anchors:") and "not valid anymore" in error.error


def test_an_issuer_from_another_anchor_is_not_issued_by_the_trust_anchor() -> None:
    a, other = anchor(), anchor()
    results = outcomes([a[0]], issuer(other)[0])
    verdict = results["issuer cert is issued by the trust anchor"]
    assert verdict.outcome is checks.Outcome.ERROR and "not issued by any trust anchor" in verdict.error
    # With both anchors in the bundle (a rotation), it is.
    assert outcomes([a[0], other[0]], issuer(other)[0])[verdict.description].outcome is checks.Outcome.SUCCESS


@pytest.mark.parametrize("key, anchors_ok, issuer_ok", [
    (ec.generate_private_key(ec.SECP384R1()), False, False),
    (rsa.generate_private_key(65537, 2048), True, False),
    (rsa.generate_private_key(65537, 3072), False, False),
])
def test_supported_crypto(key, anchors_ok: bool, issuer_ok: bool) -> None:
    cert = self_signed(key)
    results = outcomes([cert], cert)
    anchors = results["trust anchors are using supported crypto algorithm"]
    issuer_ = results["issuer cert is using supported crypto algorithm"]
    assert (anchors.outcome is checks.Outcome.SUCCESS) is anchors_ok, anchors.error
    assert (issuer_.outcome is checks.Outcome.SUCCESS) is issuer_ok, issuer_.error
    if not anchors_ok:
        assert anchors.error.startswith("Invalid roots:\n* ")


def test_a_sha384_signature_is_not_supported() -> None:
    cert = self_signed(ec.generate_private_key(ec.SECP256R1()), hash_=hashes.SHA384())
    assert "sha384" in outcomes([cert], cert)["trust anchors are using supported crypto algorithm"].error


def test_an_unreadable_config_fails_the_first_check_and_the_rest_say_why() -> None:
    def broken() -> Credentials:
        raise checks.Problem("ca.crt: not PEM")

    category = checks.Category("linkerd-identity", identity_checks(broken, lambda: NOW, HINTS))
    report = checks.run([category])
    first, *rest = report.results
    assert first.outcome is checks.Outcome.ERROR and first.error == "ca.crt: not PEM" and first.hint == "fix the config"
    assert all(r.outcome is not checks.Outcome.SUCCESS for r in rest)
