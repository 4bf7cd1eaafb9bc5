"""The outbound index's settings: the part of the policy controller's flags outbound policy depends on.

The policy process builds one from its own configuration (``--cluster-domain``,
``--cluster-networks``, ``--global-egress-network-namespace``,
``--default-opaque-ports``, ``--allow-l5d-request-headers``); the defaults of
those flags live with the flags, not here.  ``cluster_networks`` decide which
addresses get the egress fallback and what an EgressNetwork without
``networks`` covers; EgressNetworks in ``global_egress_network_namespace``
apply to clients of every namespace that has none of its own;
``default_opaque_ports`` apply to Services (and EgressNetworks) without
``config.linkerd.io/opaque-ports``; ``allow_l5d_request_headers`` is copied
onto every route rule.  Nothing here reads the environment.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from tether.naming import DEFAULT_CLUSTER_DOMAIN
from tether.ports import DEFAULT_OPAQUE_PORTS, PortSet

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class OutboundConfig:
    cluster_networks: tuple[IPNetwork, ...]
    global_egress_network_namespace: str
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    default_opaque_ports: PortSet = DEFAULT_OPAQUE_PORTS
    allow_l5d_request_headers: bool = False

    def in_cluster(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(ip.version == net.version and ip in net for net in self.cluster_networks)
