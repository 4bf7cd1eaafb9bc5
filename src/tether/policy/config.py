"""The policy controller's configuration: one typed object, built by ``tether.cli.policy`` from flags.

Mirrors the flags of Linkerd's policy controller that Tether implements
(``--grpc-addr``, ``--admin-addr``, ``--cluster-networks``, ``--default-policy``,
``--probe-networks``, ``--identity-domain``, ``--cluster-domain``,
``--control-plane-namespace``, ``--default-opaque-ports``,
``--global-egress-network-namespace``, ``--allow-l5d-request-headers``, ``--patch-timeout-ms``) plus the TLS
files of the gRPC port.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from tether.naming import DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN, WorkloadIdentity
from tether.policy.defaults import DefaultPolicy
from tether.ports import DEFAULT_OPAQUE_PORTS, PortSet
from tether.resources.policy import Network
from tether.serving.grpc_server import TlsFiles
from tether.serving.stream import DEFAULT_MAX_BYTES

DEFAULT_ADDR = "0.0.0.0:8090"
DEFAULT_ADMIN_ADDR = "0.0.0.0:9990"
DEFAULT_WEBHOOK_ADDR = "0.0.0.0:9443"
DEFAULT_CLUSTER_NETWORKS = "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8"
DEFAULT_PROBE_NETWORKS = "0.0.0.0/0,::/0"
DEFAULT_EGRESS_NAMESPACE = "linkerd-egress"
DEFAULT_STREAM_QUEUE_CAPACITY = 100
DEFAULT_PATCH_TIMEOUT_MS = 5000  # Linkerd's --patch-timeout-ms


class InvalidNetworks(ValueError):
    """A network list item that is not a CIDR."""


def parse_networks(text: str) -> tuple[Network, ...]:
    """``10.0.0.0/8,fd00::/8`` -> networks; an empty text is no network."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            out.append(Network(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise InvalidNetworks(f"{item!r} is not a CIDR") from None
    return tuple(out)


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """Where the validating admission webhook listens, and its serving certificate (PEM files)."""

    addr: str
    tls_cert: Path
    tls_key: Path


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    addr: str = DEFAULT_ADDR
    admin_addr: str = DEFAULT_ADMIN_ADDR
    tls: TlsFiles | None = None
    cluster_networks: tuple[Network, ...] = parse_networks(DEFAULT_CLUSTER_NETWORKS)
    default_policy: DefaultPolicy = DefaultPolicy("all-unauthenticated")
    probe_networks: tuple[Network, ...] = parse_networks(DEFAULT_PROBE_NETWORKS)
    identity_domain: str = DEFAULT_TRUST_DOMAIN
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS
    default_opaque_ports: PortSet = DEFAULT_OPAQUE_PORTS
    global_egress_network_namespace: str = DEFAULT_EGRESS_NAMESPACE
    # Outbound route rules let request headers (l5d-retry-*, l5d-timeout) tune retries and timeouts.
    allow_l5d_request_headers: bool = False
    stream_queue_capacity: int = DEFAULT_STREAM_QUEUE_CAPACITY
    stream_queue_bytes: int = DEFAULT_MAX_BYTES
    # How long one status write may take before the round gives it up (counted, retried next round).
    patch_timeout: float = DEFAULT_PATCH_TIMEOUT_MS / 1000
    shutdown_grace: float = 2.0
    webhook: WebhookSettings | None = None  # None: no admission webhook (the local platform validates on apply)

    def service_account_identity(self, namespace: str, name: str) -> str:
        return WorkloadIdentity(name, namespace, self.control_plane_ns, self.identity_domain).dns_name

    def namespace_identity(self, namespace: str) -> str:
        """``*.<ns>.serviceaccount.identity.<cp-ns>.<td>``: every service account of the namespace."""
        return "*." + self.service_account_identity(namespace, "x").partition(".")[2]
