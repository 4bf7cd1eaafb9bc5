"""The string formats Kubernetes validates (names, label keys and values, port names, IPs), each written once.

The DNS-1123 label and subdomain rules themselves live in ``tether.naming`` (shared with the
identity names); this module adds Kubernetes' reasons.

Every check returns ``None`` when the value is fine, else the reason, so callers
(`meta`, `selectors`, `references`, the per-kind modules) attach their own field path.
"""

from __future__ import annotations

import ipaddress
import re

from tether.naming import (
    DNS1123_LABEL_MAX,
    DNS1123_SUBDOMAIN_MAX,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_spiffe_id,
)

_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_IANA_SVC_NAME = re.compile(r"[-a-z0-9]+")
_HAS_LETTER = re.compile(r"[a-z]")

# Proxy identities as Linkerd accepts them: DNS-like (optionally ``*.``-prefixed) or SPIFFE IDs.
_DNS_LIKE_IDENTITY = re.compile(r"(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

LABEL_MAX = DNS1123_LABEL_MAX
SUBDOMAIN_MAX = DNS1123_SUBDOMAIN_MAX
IANA_SVC_NAME_MAX = 15


def dns1123_label(value: str) -> str | None:
    """Namespaces, container names, Service port names: ``my-name``."""
    if len(value) > LABEL_MAX:
        return f"must be no more than {LABEL_MAX} characters"
    if not is_dns1123_label(value):
        return (
            "must be a DNS-1123 label: lower case letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return None


def dns1123_subdomain(value: str) -> str | None:
    """Most object names: ``my-name`` or ``web-svc.emojivoto.svc.cluster.local``."""
    if len(value) > SUBDOMAIN_MAX:
        return f"must be no more than {SUBDOMAIN_MAX} characters"
    if not is_dns1123_subdomain(value):
        return (
            "must be a DNS-1123 subdomain: lower case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def dns1035_label(value: str) -> str | None:
    """Service names: a DNS-1123 label that starts with a letter."""
    if len(value) > LABEL_MAX:
        return f"must be no more than {LABEL_MAX} characters"
    if not _DNS1035_LABEL.fullmatch(value):
        return (
            "must be a DNS-1035 label: lower case letters, digits and '-', "
            "starting with a letter and ending with a letter or digit"
        )
    return None


def iana_svc_name(value: str) -> str | None:
    """Container port names and named target ports: ``http``, ``grpc-web``."""
    if len(value) > IANA_SVC_NAME_MAX:
        return f"must be no more than {IANA_SVC_NAME_MAX} characters"
    if not _IANA_SVC_NAME.fullmatch(value):
        return "must contain only lower case letters, digits and '-'"
    if "--" in value:
        return "must not contain consecutive hyphens"
    if value.startswith("-") or value.endswith("-"):
        return "must not begin or end with a hyphen"
    if not _HAS_LETTER.search(value):
        return "must contain at least one letter"
    return None


def qualified_name(value: str) -> str | None:
    """Label and annotation keys: ``app`` or ``app.kubernetes.io/name``."""
    prefix, slash, name = value.rpartition("/")
    if slash:
        if not prefix:
            return "prefix part must be non-empty"
        problem = dns1123_subdomain(prefix)
        if problem:
            return f"prefix part {problem}"
    if not name:
        return "name part must be non-empty"
    if len(name) > LABEL_MAX:
        return f"name part must be no more than {LABEL_MAX} characters"
    if not _QUALIFIED_NAME_PART.fullmatch(name):
        return (
            "name part must consist of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def label_value(value: str) -> str | None:
    """Label values: empty, or like a qualified name's name part."""
    if len(value) > LABEL_MAX:
        return f"must be no more than {LABEL_MAX} characters"
    if value and not _QUALIFIED_NAME_PART.fullmatch(value):
        return (
            "a label value must be empty or consist of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def ip_address(value: str) -> str | None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "must be an IP address"
    return None


def non_empty(value: str) -> str | None:
    return None if value else "must not be empty"


def proxy_identity(value: str) -> str | None:
    """A client identity in MeshTLSAuthentication or ServerAuthorization."""
    if _DNS_LIKE_IDENTITY.fullmatch(value):
        return None
    if is_spiffe_id(value):
        return None
    return "must be a DNS-like identity (optionally starting with '*.'), '*', or a spiffe:// ID"
