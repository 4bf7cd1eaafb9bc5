"""The naming rules: identity names and service authorities, formatted and parsed in one place."""

import pytest

from tether.naming import InvalidName, ServiceAuthority, WorkloadIdentity, is_dns1123_label, is_dns1123_subdomain, issuer_name


def test_identity_dns_name_matches_linkerds_form() -> None:
    ident = WorkloadIdentity("default", "emojivoto")
    assert ident.dns_name == "default.emojivoto.serviceaccount.identity.linkerd.cluster.local"
    assert ident.spiffe_uri == "spiffe://cluster.local/ns/emojivoto/sa/default"


def test_identity_parse_round_trips_with_custom_domain() -> None:
    ident = WorkloadIdentity("web", "shop", control_plane_ns="tether", trust_domain="example.org")
    assert WorkloadIdentity.parse(ident.dns_name, "tether", "example.org") == ident


@pytest.mark.parametrize(
    "name",
    [
        "default.emojivoto.serviceaccount.identity.linkerd.other.domain",
        "a.b.c.serviceaccount.identity.linkerd.cluster.local",
        "emojivoto.serviceaccount.identity.linkerd.cluster.local",
        "Bad_SA.ns.serviceaccount.identity.linkerd.cluster.local",
    ],
)
def test_identity_parse_rejects_foreign_or_malformed(name: str) -> None:
    with pytest.raises(InvalidName):
        WorkloadIdentity.parse(name)


def test_issuer_name() -> None:
    assert issuer_name() == "identity.linkerd.cluster.local"


def test_authority_parse_and_format() -> None:
    auth = ServiceAuthority.parse("web-svc.emojivoto.svc.cluster.local:8080")
    assert (auth.service, auth.namespace, auth.port) == ("web-svc", "emojivoto", 8080)
    assert str(auth) == "web-svc.emojivoto.svc.cluster.local:8080"
    assert auth.fqdn == "web-svc.emojivoto.svc.cluster.local"


def test_authority_defaults_to_port_80_and_accepts_trailing_dot() -> None:
    assert ServiceAuthority.parse("web.ns.svc.cluster.local.").port == 80


@pytest.mark.parametrize(
    "authority",
    ["10.0.0.1:80", "web.ns.svc.other.domain:80", "web.svc.cluster.local:80", "web.ns.svc.cluster.local:0",
     "web.ns.svc.cluster.local:http", "web.ns.svc.cluster.local:70000"],
)
def test_authority_rejects_ips_other_domains_and_bad_ports(authority: str) -> None:
    with pytest.raises(InvalidName):
        ServiceAuthority.parse(authority)


@pytest.mark.parametrize(
    ("value", "label", "subdomain"),
    [
        ("web", True, True),
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        ("web-svc.emojivoto.svc", False, True),
        ("-web", False, False),
        ("Web", False, False),
        ("web\n", False, False),  # fullmatch: a trailing newline is not allowed in
        ("a." * 126 + "a", False, True),  # 253 characters
        ("a." * 127, False, False),
    ],
)
def test_dns1123_rules(value: str, label: bool, subdomain: bool) -> None:
    assert (is_dns1123_label(value), is_dns1123_subdomain(value)) == (label, subdomain)
