"""Who may talk to an inbound port: Linkerd's authorization decision (proxy.md §8.3), pure.

An ``Authorization`` admits a client when its IP is in one of the
authorization's networks (less that network's exceptions) **and** its
authentication holds:

- ``UNAUTHENTICATED``: always;
- ``MESH_TLS``: the connection's mesh TLS was terminated by this proxy, with or
  without a client identity;
- ``IDENTITIES``: the client identity is one of ``identities`` or -- DNS-like
  identities only -- ends with one of ``suffixes`` (an empty suffix is every
  DNS-like identity). A SPIFFE identity (``spiffe://...``) must be listed exactly.

``authorize`` answers the first authorization that admits the client, or None.
``LOCALHOST`` is the implicit ``default:localhost`` authorization every
discovered policy carries (unauthenticated clients on 127.0.0.1 and ::1).

Callers: ``core.server_policy`` (policies hold authorizations) and
``core.inbound_authz`` (the per-connection and per-request checks).
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from tether.proxy.codec.addrs import IpAddress, IpNetwork
from tether.proxy.core import labels


@dataclass(frozen=True, slots=True)
class Meta:
    """Where a policy object came from: a resource (group, kind, name) or a default (kind ``default``)."""

    group: str
    kind: str
    name: str

    @classmethod
    def default(cls, name: str) -> Meta:
        return cls("", "default", name)

    def labels(self, prefix: str) -> str:
        """``<prefix>_group``, ``<prefix>_kind`` and ``<prefix>_name``, as Linkerd labels metrics."""
        return _meta_labels(self, prefix)


@dataclass(frozen=True, slots=True)
class Network:
    net: IpNetwork
    excepts: tuple[IpNetwork, ...] = ()

    def contains(self, ip: IpAddress) -> bool:
        return _within(ip, self.net) and not any(_within(ip, e) for e in self.excepts)


class Authn(enum.Enum):
    UNAUTHENTICATED = "unauthenticated"  # anything goes
    MESH_TLS = "mesh-tls"  # mesh TLS terminated here, client identity or not
    IDENTITIES = "identities"  # mesh TLS with a client identity among identities/suffixes


@dataclass(frozen=True, slots=True)
class Authorization:
    meta: Meta
    networks: tuple[Network, ...]
    authn: Authn
    identities: frozenset[str] = frozenset()
    suffixes: tuple[tuple[str, ...], ...] = ()  # labels in normal order; () is every DNS-like identity

    def admits(self, client_ip: IpAddress, mesh_tls: bool, client_id: str | None) -> bool:
        if not any(network.contains(client_ip) for network in self.networks):
            return False
        if self.authn is Authn.UNAUTHENTICATED:
            return True
        if not mesh_tls:
            return False
        if self.authn is Authn.MESH_TLS:
            return True
        if client_id is None:
            return False
        if client_id in self.identities:
            return True
        if client_id.startswith("spiffe://"):
            return False  # URI identities match exactly only
        name = client_id.rstrip(".").lower()
        return any(_has_suffix(name, suffix) for suffix in self.suffixes)


def authorize(authorizations: Iterable[Authorization], *, client_ip: IpAddress, mesh_tls: bool,
              client_id: str | None) -> Authorization | None:
    """The first of ``authorizations`` that admits the client, or None (denied)."""
    ip = _unmapped(client_ip)
    for authz in authorizations:
        if authz.admits(ip, mesh_tls, client_id):
            return authz
    return None


ALL_NETWORKS = (Network(ipaddress.ip_network("0.0.0.0/0")), Network(ipaddress.ip_network("::/0")))
LOCALHOST = Authorization(
    Meta.default("localhost"),
    (Network(ipaddress.ip_network("127.0.0.1/32")), Network(ipaddress.ip_network("::1/128"))),
    Authn.UNAUTHENTICATED,
)


@functools.lru_cache(maxsize=4096)
def _meta_labels(meta: Meta, prefix: str) -> str:
    """Rendered once per (meta, prefix): every inbound request labels its counters with its server's, route's
    and authorization's metas, and escaping them each time was a tenth of the server proxy's Python calls."""
    return labels.render((f"{prefix}_group", meta.group), (f"{prefix}_kind", meta.kind), (f"{prefix}_name", meta.name))


def _has_suffix(name: str, suffix: tuple[str, ...]) -> bool:
    if not suffix:
        return True
    tail = ".".join(part.lower() for part in suffix)
    return name == tail or name.endswith("." + tail)


def _unmapped(ip: IpAddress) -> IpAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _within(ip: IpAddress, net: IpNetwork) -> bool:
    return ip.version == net.version and ip in net
