"""Kubernetes' string formats, rule by rule."""

import pytest

from tether.resources import formats


@pytest.mark.parametrize(
    ("check", "value", "problem"),
    [
        (formats.dns1123_label, "emojivoto", None),
        (formats.dns1123_label, "a" * 63, None),
        (formats.dns1123_label, "a" * 64, "must be no more than 63 characters"),
        (formats.dns1123_label, "emoji.voto", "must be a DNS-1123 label: lower case letters, digits and '-', starting and ending with a letter or digit"),
        (formats.dns1123_label, "-web", "must be a DNS-1123 label: lower case letters, digits and '-', starting and ending with a letter or digit"),
        (formats.dns1123_subdomain, "web-svc.emojivoto.svc.cluster.local", None),
        (formats.dns1123_subdomain, ".".join(["a" * 63] * 4), "must be no more than 253 characters"),
        (formats.dns1123_subdomain, "web..svc", "must be a DNS-1123 subdomain: lower case letters, digits, '-' and '.', starting and ending with a letter or digit"),
        (formats.dns1035_label, "web-svc", None),
        (formats.dns1035_label, "w" * 64, "must be no more than 63 characters"),
        (formats.dns1035_label, "1web", "must be a DNS-1035 label: lower case letters, digits and '-', starting with a letter and ending with a letter or digit"),
        (formats.iana_svc_name, "http", None),
        (formats.iana_svc_name, "grpc-web-8080", None),
        (formats.iana_svc_name, "http-alternative", "must be no more than 15 characters"),
        (formats.iana_svc_name, "http_alt", "must contain only lower case letters, digits and '-'"),
        (formats.iana_svc_name, "http--alt", "must not contain consecutive hyphens"),
        (formats.iana_svc_name, "-http", "must not begin or end with a hyphen"),
        (formats.iana_svc_name, "8080", "must contain at least one letter"),
        (formats.qualified_name, "app", None),
        (formats.qualified_name, "app.kubernetes.io/name", None),
        (formats.qualified_name, "App_Name.v2", None),
        (formats.qualified_name, "/name", "prefix part must be non-empty"),
        (formats.qualified_name, "Example.com/name", "prefix part must be a DNS-1123 subdomain: lower case letters, digits, '-' and '.', starting and ending with a letter or digit"),
        (formats.qualified_name, "example.com/", "name part must be non-empty"),
        (formats.qualified_name, "n" * 64, "name part must be no more than 63 characters"),
        (formats.qualified_name, "_name", "name part must consist of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"),
        (formats.label_value, "", None),
        (formats.label_value, "v1.2_rc-1", None),
        (formats.label_value, "v" * 64, "must be no more than 63 characters"),
        (formats.label_value, "v1 ", "a label value must be empty or consist of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"),
        (formats.ip_address, "10.42.0.17", None),
        (formats.ip_address, "fd00::11", None),
        (formats.ip_address, "10.42.0.0/16", "must be an IP address"),
        (formats.non_empty, "x", None),
        (formats.non_empty, "", "must not be empty"),
    ],
)
def test_format_rules(check, value, problem):
    assert check(value) == problem


@pytest.mark.parametrize(
    ("identity", "valid"),
    [
        ("*", True),
        ("web.emojivoto.serviceaccount.identity.linkerd.cluster.local", True),
        ("*.emojivoto.serviceaccount.identity.linkerd.cluster.local", True),
        ("spiffe://cluster.local/ns/emojivoto/sa/web", True),
        ("spiffe://root.linkerd.cluster.local", True),
        ("spiffe://cluster.local/ns/../sa/web", False),
        ("spiffe://cluster.local/ns/./sa", False),
        ("spiffe://cluster.local/ns/", False),
        ("spiffe://Cluster.Local/ns", False),
        ("web.*.cluster.local", False),
        ("Web.emojivoto", False),
        ("", False),
    ],
)
def test_proxy_identities_are_dns_like_or_spiffe(identity, valid):
    assert (formats.proxy_identity(identity) is None) is valid
