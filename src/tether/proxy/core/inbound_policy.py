"""The inbound default policies (proxy.md §8.2, §8.3), applied per connection until the policy controller exists.

``authorize`` answers whether a connection from ``client_ip`` with the given
mesh TLS status may be forwarded, under ``LINKERD2_PROXY_INBOUND_DEFAULT_POLICY``.
Every policy also admits unauthenticated clients from localhost (Linkerd's
implicit ``default:localhost`` authorization). Pure.

Caller: ``core.inbound``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from tether.proxy.codec.addrs import IpAddress, IpNetwork
from tether.proxy.core.config import DefaultPolicy

_ALL = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
_LOCALHOST = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128"))


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    authz: str  # the authorization's name, for metrics: "all-unauthenticated", "localhost", or "" when denied


def authorize(
    policy: DefaultPolicy,
    *,
    client_ip: IpAddress,
    mesh_tls: bool,
    client_id: str | None,
    cluster_networks: tuple[IpNetwork, ...],
) -> Decision:
    ip = client_ip.ipv4_mapped or client_ip if isinstance(client_ip, ipaddress.IPv6Address) else client_ip
    if _within(ip, _LOCALHOST) and policy is not DefaultPolicy.DENY:
        return Decision(True, "localhost")
    if policy is DefaultPolicy.DENY:
        return Decision(False, "")
    networks = cluster_networks if policy.value.startswith("cluster-") else _ALL
    if not _within(ip, networks):
        return Decision(False, "")
    if policy in (DefaultPolicy.ALL_AUTHENTICATED, DefaultPolicy.CLUSTER_AUTHENTICATED):
        return Decision(mesh_tls and client_id is not None, policy.value if client_id else "")
    return Decision(True, policy.value)


def _within(ip: IpAddress, networks: tuple[IpNetwork, ...]) -> bool:
    return any(ip.version == net.version and ip in net for net in networks)
