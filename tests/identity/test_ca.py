"""The CA's rules without the network: CSR checks, the leaf's shape and lifetime, issuer validation."""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from identity_helpers import WEB, FakeClock, Pki, csr_for, make_pki

from tether.identity import pki
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer, check_csr, parse_csr
from tether.identity.errors import CertifyError, Reason
from tether.naming import WorkloadIdentity

NAME = WEB.dns_name
SHORT = "a.b.serviceaccount.identity.l.c"


def authority(ca: Pki, **settings: object) -> CertificateAuthority:
    return CertificateAuthority(Issuer.validated([ca.issuer], ca.issuer_key, [ca.anchor]), IssuanceSettings(**settings))  # type: ignore[arg-type]


def test_conforming_csr_passes_with_or_without_cn() -> None:
    check_csr(parse_csr(csr_for(NAME)), NAME)
    check_csr(parse_csr(csr_for(SHORT, cn=SHORT)), SHORT)


def test_the_csr_proxies_and_the_tap_controller_send_passes_for_its_name_only() -> None:
    from tether.csr import csr_der

    csr = parse_csr(csr_der(ec.generate_private_key(ec.SECP256R1()), NAME))
    check_csr(csr, NAME)
    with pytest.raises(CertifyError):
        check_csr(csr, SHORT)


@pytest.mark.parametrize(
    ("csr", "reason", "words"),
    [
        (lambda: b"\x30\x03garbage", Reason.MALFORMED_CSR, "does not parse"),
        (lambda: csr_for(NAME, extra_sans=[x509.DNSName("other.example")]), Reason.CSR_REJECTED, "exactly one SAN"),
        (lambda: csr_for(NAME, extra_sans=[x509.UniformResourceIdentifier("spiffe://x/y")]), Reason.CSR_REJECTED, "exactly one SAN"),
        (lambda: csr_for(NAME, extra_sans=[x509.IPAddress(ipaddress.ip_address("10.0.0.1"))]), Reason.CSR_REJECTED, "exactly one SAN"),
        (lambda: csr_for("db.emojivoto.serviceaccount.identity.linkerd.cluster.local"), Reason.CSR_REJECTED, "not the requested"),
        (lambda: csr_for(NAME, rsa.generate_private_key(65537, 2048)), Reason.CSR_REJECTED, "RSA 2048"),
        (lambda: csr_for(NAME, ec.generate_private_key(ec.SECP384R1())), Reason.CSR_REJECTED, "P-384"),
        (lambda: csr_for(NAME, cn="someone-else"), Reason.CSR_REJECTED, "common name"),
    ],
    ids=["garbage", "second-dns-san", "uri-san", "ip-san", "wrong-identity", "rsa-key", "p384-key", "cn-mismatch"],
)
def test_nonconforming_csrs_are_refused(csr, reason: Reason, words: str) -> None:  # noqa: ANN001
    with pytest.raises(CertifyError) as caught:
        check_csr(parse_csr(csr()), NAME)
    assert caught.value.reason is reason
    assert words in str(caught.value)


def test_csr_with_a_broken_signature_is_malformed() -> None:
    der = bytearray(csr_for(NAME))
    der[-3] ^= 0xFF  # inside the signature's BIT STRING
    with pytest.raises(CertifyError) as caught:
        parse_csr(bytes(der))
    assert caught.value.reason is Reason.MALFORMED_CSR


def test_leaf_has_the_name_usages_and_window(ca_files: Pki, clock: FakeClock) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = authority(ca_files).issue(key.public_key(), WEB, clock.now)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [NAME]
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == []
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment and not usage.key_cert_sign
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    skew = timedelta(seconds=20)
    start = clock.now.replace(microsecond=0)
    assert leaf.not_valid_before_utc == start - skew
    assert leaf.not_valid_after_utc == start + timedelta(hours=24) + skew
    leaf.verify_directly_issued_by(ca_files.issuer)


def test_cn_carries_the_name_when_it_fits(ca_files: Pki, clock: FakeClock) -> None:
    leaf = authority(ca_files).issue(ec.generate_private_key(ec.SECP256R1()).public_key(), WEB, clock.now)
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == NAME
    assert not leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).critical


def test_long_names_get_an_empty_subject_and_a_critical_san(ca_files: Pki, clock: FakeClock) -> None:
    long = WorkloadIdentity("linkerd-identity", "linkerd")
    assert len(long.dns_name) > 64  # RFC 5280's bound on a CN
    leaf = authority(ca_files).issue(ec.generate_private_key(ec.SECP256R1()).public_key(), long, clock.now)
    assert list(leaf.subject) == []
    assert pki.subject_cn(leaf) == long.dns_name
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).critical


def test_spiffe_uri_san_is_a_setting(ca_files: Pki, clock: FakeClock) -> None:
    leaf = authority(ca_files, spiffe_uri_san=True).issue(ec.generate_private_key(ec.SECP256R1()).public_key(), WEB, clock.now)
    uris = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    )
    assert uris == ["spiffe://cluster.local/ns/emojivoto/sa/web"]


def test_leaf_never_outlives_its_issuer(tmp_path: Path, clock: FakeClock) -> None:
    ca = make_pki(tmp_path, clock.now, issuer_valid_for=timedelta(hours=2))
    leaf = authority(ca).issue(ec.generate_private_key(ec.SECP256R1()).public_key(), WEB, clock.now)
    assert leaf.not_valid_after_utc == ca.issuer.not_valid_after_utc


def test_expired_and_not_yet_valid_issuers_refuse_to_sign(ca_files: Pki, clock: FakeClock) -> None:
    ca = authority(ca_files)
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    for moment, words in ((clock.now + timedelta(days=400), "expired"), (clock.now - timedelta(days=1), "not valid until")):
        with pytest.raises(CertifyError) as caught:
            ca.issue(key, WEB, moment)
        assert caught.value.reason is Reason.ISSUER_NOT_VALID
        assert words in str(caught.value)


def test_issuer_must_match_its_key_be_a_ca_and_chain_to_an_anchor(ca_files: Pki, tmp_path: Path, clock: FakeClock) -> None:
    other = make_pki(tmp_path / "other", clock.now)
    with pytest.raises(pki.PkiError, match="does not match"):
        Issuer.validated([ca_files.issuer], other.issuer_key, [ca_files.anchor])
    with pytest.raises(pki.PkiError, match="not signed by any of the trust anchors"):
        Issuer.validated([other.issuer], other.issuer_key, [ca_files.anchor])
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = authority(ca_files).issue(leaf_key.public_key(), WEB, clock.now)
    with pytest.raises(pki.PkiError, match="not a CA"):
        Issuer.validated([leaf], leaf_key, [ca_files.anchor])


def test_any_anchor_of_a_bundle_accepts_its_issuer(ca_files: Pki, tmp_path: Path, clock: FakeClock) -> None:
    other = make_pki(tmp_path / "other", clock.now)
    bundle = [ca_files.anchor, other.anchor]
    assert Issuer.validated([ca_files.issuer], ca_files.issuer_key, bundle).anchor == ca_files.anchor
    assert Issuer.validated([other.issuer], other.issuer_key, bundle).anchor == other.anchor


def test_chain_verdicts_name_the_broken_link(ca_files: Pki, tmp_path: Path, clock: FakeClock) -> None:
    leaf = authority(ca_files).issue(ec.generate_private_key(ec.SECP256R1()).public_key(), WEB, clock.now)
    good = pki.chain_verdicts([leaf, ca_files.issuer], [ca_files.anchor])
    assert [v.problem for v in good] == [None, None]
    other = make_pki(tmp_path / "other", clock.now)
    bad = pki.chain_verdicts([leaf, other.issuer], [ca_files.anchor])
    assert bad[0].problem == "signature does not verify"
    assert bad[1].problem == "not signed by any of the trust anchors"
