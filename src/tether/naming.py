"""The mesh's naming rules, in one place, pure, shared by control plane and proxy.

Identity names follow Linkerd's DNS-like form
``<sa>.<ns>.serviceaccount.identity.<control-plane-ns>.<trust-domain>``; service
names follow Kubernetes' ``<svc>.<ns>.svc.<cluster-domain>``.  Nothing else in
Tether formats or parses these names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_TRUST_DOMAIN = "cluster.local"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
DEFAULT_CONTROL_PLANE_NS = "linkerd"
# The control plane's ConfigMap of trust anchors (``ca-bundle.crt``), as Linkerd's charts name it: installed by
# ``tether install``, read by ``tether diagnose``/``check`` and the tap controller.
TRUST_ROOTS_CONFIGMAP = "linkerd-identity-trust-roots"

# DNS-1123 (RFC 1123) names as Kubernetes validates them: a label (namespaces, service accounts,
# container and Service port names) and a subdomain (most object names; Linkerd's trust domain).
# ``tether.resources.formats`` reports these rules with Kubernetes' messages.
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL = re.compile(_LABEL_PATTERN)
_SUBDOMAIN = re.compile(rf"{_LABEL_PATTERN}(\.{_LABEL_PATTERN})*")


def is_dns1123_label(value: str) -> bool:
    """Lower case letters, digits and '-', starting and ending with a letter or digit, at most 63 long."""
    return len(value) <= DNS1123_LABEL_MAX and _LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    """Dot-separated DNS-1123 labels, at most 253 long (like Kubernetes, no per-label length check)."""
    return len(value) <= DNS1123_SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(value) is not None


class InvalidName(ValueError):
    """A name does not follow the mesh's naming rules."""


# A SPIFFE ID as Linkerd's policy admission accepts one: ``spiffe://<trust domain>[/<path>]``, trust-domain
# characters ``[a-z0-9-._]``, path segments ``[A-Za-z0-9-._]``, none empty, ``.`` or ``..``, no trailing slash.
_SPIFFE_ID = re.compile(r"spiffe://[a-z0-9\-._]+(/[A-Za-z0-9\-._]+)*")


def is_spiffe_id(value: str) -> bool:
    return _SPIFFE_ID.fullmatch(value) is not None and not any(seg in (".", "..") for seg in value.split("/")[3:])


def check_label(what: str, value: str) -> str:
    """Return ``value`` if it is a DNS-1123 label (as namespaces are), else raise ``InvalidName`` naming ``what``."""
    if not is_dns1123_label(value):
        raise InvalidName(f"{what} {value!r} is not a DNS-1123 label")
    return value


def check_trust_domain(value: str) -> str:
    """Return ``value`` if it is a valid trust domain (a DNS-1123 subdomain), else raise ``InvalidName``."""
    if not is_dns1123_subdomain(value):
        raise InvalidName(f"trust domain {value!r} is not a DNS-1123 subdomain")
    return value


@dataclass(frozen=True, slots=True)
class WorkloadIdentity:
    """A service account's identity in the mesh."""

    service_account: str
    namespace: str
    control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS
    trust_domain: str = DEFAULT_TRUST_DOMAIN

    def __post_init__(self) -> None:
        check_label("service account", self.service_account)
        check_label("namespace", self.namespace)
        check_label("control-plane namespace", self.control_plane_ns)
        check_trust_domain(self.trust_domain)

    @property
    def dns_name(self) -> str:
        return (
            f"{self.service_account}.{self.namespace}.serviceaccount.identity."
            f"{self.control_plane_ns}.{self.trust_domain}"
        )

    @property
    def spiffe_uri(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    @classmethod
    def parse(
        cls,
        name: str,
        control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
    ) -> "WorkloadIdentity":
        """Parse a DNS-like identity issued by this control plane and trust domain."""
        suffix = f".serviceaccount.identity.{control_plane_ns}.{trust_domain}"
        if not name.endswith(suffix):
            raise InvalidName(f"identity {name!r} does not end with {suffix!r}")
        parts = name[: -len(suffix)].split(".")
        if len(parts) != 2:
            raise InvalidName(f"identity {name!r} is not <serviceaccount>.<namespace>{suffix}")
        return cls(parts[0], parts[1], control_plane_ns, trust_domain)


def issuer_name(control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> str:
    """The issuer certificate's common name, as Linkerd's identity expects."""
    return f"identity.{control_plane_ns}.{trust_domain}"


def trust_anchor_name(control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> str:
    """The trust anchor's common name; distinct from the issuer's so the issuer never looks self-issued."""
    return f"root.{control_plane_ns}.{trust_domain}"


def control_plane_identity(
    component: str, control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS, trust_domain: str = DEFAULT_TRUST_DOMAIN
) -> WorkloadIdentity:
    """A control-plane component's identity, e.g. ``linkerd-identity.<cp-ns>.serviceaccount.identity...``.

    Linkerd's control-plane service accounts are ``linkerd-<component>`` in the control-plane namespace.
    """
    return WorkloadIdentity(f"linkerd-{component}", control_plane_ns, control_plane_ns, trust_domain)


@dataclass(frozen=True, slots=True)
class ServiceAuthority:
    """``<svc>.<ns>.svc.<cluster-domain>:<port>``: what proxies ask the destination for."""

    service: str
    namespace: str
    port: int
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN

    @property
    def fqdn(self) -> str:
        """The host part; also the name of the service's ServiceProfile."""
        return f"{self.service}.{self.namespace}.svc.{self.cluster_domain}"

    def __str__(self) -> str:
        return f"{self.fqdn}:{self.port}"

    @classmethod
    def parse(cls, authority: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> "ServiceAuthority":
        """Parse ``host[:port]``; port 80 when absent, as Linkerd's destination does."""
        return cls.parse_with_instance(authority, cluster_domain, allow_instance=False)[1]

    @classmethod
    def parse_with_instance(
        cls, authority: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN, *, allow_instance: bool = True
    ) -> tuple[str | None, "ServiceAuthority"]:
        """Parse ``[<instance>.]<svc>.<ns>.svc.<cd>[:port]``: the instance is an endpoint's hostname
        (a StatefulSet pod's), None when absent."""
        host, sep, port_s = authority.rpartition(":")
        if not sep:
            host, port_s = authority, "80"
        if not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise InvalidName(f"authority {authority!r} has an invalid port")
        host = host.rstrip(".")
        suffix = f".svc.{cluster_domain}"
        if not host.endswith(suffix):
            raise InvalidName(f"authority {authority!r} is not a service in cluster domain {cluster_domain!r}")
        parts = host[: -len(suffix)].split(".")
        instance = None
        if allow_instance and len(parts) == 3:
            instance = parts.pop(0)
            check_label("instance", instance)
        if len(parts) != 2:
            shape = "[<instance>.]<service>.<namespace>" if allow_instance else "<service>.<namespace>"
            raise InvalidName(f"authority {authority!r} is not {shape}{suffix}")
        check_label("service", parts[0])
        check_label("namespace", parts[1])
        return instance, cls(parts[0], parts[1], int(port_s), cluster_domain)
