"""What the outbound proxy knows of one endpoint, and how it connects to it (proxy.md §5.2, §6.2).

``Endpoint.from_proto`` reads a destination ``WeightedAddr`` (the set's metric
labels first, the address's own winning); ``plan`` turns an endpoint and the
connection's protocol into the ``Connect`` command and the transport header to
send once the session is up. Pure: no I/O.

Callers: ``io.discovery`` (reading updates) and ``core.outbound``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tether.api import destination_pb2 as pb
from tether.api.addresses import InvalidAddress, from_tcp_address
from tether.ports import is_port
from tether.proxy.core import labels
from tether.proxy.codec.addrs import IpAddress, SocketAddr, is_dns_name, parse_ip
from tether.proxy.core.commands import ClientTls, Connect
from tether.proxy.codec.transport_header import SessionProtocol, TransportHeader, encode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint of a service (or the single endpoint a profile names)."""

    addr: SocketAddr
    weight: int = 1
    dst_labels: str = ""  # rendered dst_* labels
    server_id: str | None = None  # tls_identity: the identity the server must prove
    sni: str | None = None  # the ClientHello's server name
    opaque: bool = False  # protocol hint opaque: no session protocol in the header
    opaque_transport_port: int | None = None  # connect here with a transport header
    h2: bool = False
    # HTTP/2 keep-alive towards it (WeightedAddr.http2.keep_alive): (interval, timeout, while idle), seconds.
    h2_keep_alive: tuple[float, float, bool] | None = None

    @classmethod
    def from_proto(cls, weighted: pb.WeightedAddr, set_labels: Mapping[str, str] = {}) -> Endpoint:
        """Raises ``InvalidAddress`` if the address cannot be used."""
        ip, port = from_tcp_address(weighted.addr)
        if not is_port(port):
            raise InvalidAddress(f"endpoint port {port} is outside 1-65535")
        merged = {**set_labels, **weighted.metric_labels}
        server_id = sni = None
        if weighted.HasField("tls_identity"):
            server_id, sni = _identity(weighted.tls_identity)
        hint = weighted.protocol_hint
        transport_port = hint.opaque_transport.inbound_port if hint.HasField("opaque_transport") else 0
        return cls(
            addr=SocketAddr(parse_ip(ip), port),
            weight=weighted.weight or 1,
            dst_labels=labels.dst_labels(merged),
            server_id=server_id,
            sni=sni,
            opaque=hint.WhichOneof("protocol") == "opaque",
            opaque_transport_port=transport_port if is_port(transport_port) else None,
            h2=hint.WhichOneof("protocol") == "h2",
            h2_keep_alive=_keep_alive(weighted, SocketAddr(parse_ip(ip), port)),
        )

    @classmethod
    def forward(cls, addr: SocketAddr) -> Endpoint:
        """The original destination itself, when discovery knows nothing better."""
        return cls(addr)


_UNAPPLIED_HTTP2: set[str] = set()  # the WeightedAddr.http2 fields already warned about (once per process)


def _warn_unapplied_http2(weighted: pb.WeightedAddr, addr: SocketAddr) -> None:
    """Discovery's per-endpoint HTTP/2 settings other than the keep-alive are not applied: said once per field."""
    http2 = weighted.http2
    fields = [f"http2.{name}.{f.name}" for name in ("flow_control", "internals") if http2.HasField(name)
              for f, _ in getattr(http2, name).ListFields()]
    new = [f for f in fields if f not in _UNAPPLIED_HTTP2]
    if new:
        _UNAPPLIED_HTTP2.update(new)
        log.warning("endpoint %s: discovery's %s not applied (only http2.keep_alive is)", addr, ", ".join(new))


def _keep_alive(weighted: pb.WeightedAddr, addr: SocketAddr) -> tuple[float, float, bool] | None:
    """The endpoint's HTTP/2 keep-alive, if discovery gives one with both durations above zero."""
    if not weighted.HasField("http2"):
        return None
    _warn_unapplied_http2(weighted, addr)
    if not weighted.http2.HasField("keep_alive"):
        return None
    keep_alive = weighted.http2.keep_alive
    interval = keep_alive.interval.ToTimedelta().total_seconds()
    timeout = keep_alive.timeout.ToTimedelta().total_seconds()
    if interval <= 0 or timeout <= 0:
        return None
    return interval, timeout, keep_alive.while_idle


def _identity(tls: pb.TlsIdentity) -> tuple[str | None, str | None]:
    """(server id, SNI); both None when TLS cannot be used (a URI id without a server name)."""
    kind = tls.WhichOneof("strategy")
    if kind == "dns_like_identity" and is_dns_name(tls.dns_like_identity.name):
        server_id = tls.dns_like_identity.name.lower()
        default_sni: str | None = server_id
    elif kind == "uri_like_identity" and tls.uri_like_identity.uri:
        server_id, default_sni = tls.uri_like_identity.uri, None
    else:
        return None, None
    sni = tls.server_name.name.lower() if tls.HasField("server_name") and is_dns_name(tls.server_name.name) else None
    sni = sni or default_sni
    return (server_id, sni) if sni else (None, None)


@dataclass(frozen=True, slots=True)
class Plan:
    """How to reach an endpoint: the command, and the header to send once ALPN agreed to it."""

    connect: Connect
    header: bytes | None


def plan(
    endpoint: Endpoint,
    *,
    local_ips: frozenset[IpAddress],
    protocol: SessionProtocol | None,
    timeout: float,
    authority: str = "",
) -> Plan:
    """The connection to ``endpoint`` for a connection carrying ``protocol`` (None: opaque TCP)."""
    addr = endpoint.addr
    if addr.ip in local_ips:
        # Our own pod: no mTLS, no header (Linkerd's "loopback" endpoint).
        tls_labels = labels.no_tls(labels.LOOPBACK)
        return Plan(Connect(addr, None, timeout, labels.connect_outbound(addr, tls_labels, endpoint.dst_labels,
                                                                         authority),
                            h2_keep_alive=endpoint.h2_keep_alive), None)
    if endpoint.server_id is None or endpoint.sni is None:
        tls_labels = labels.no_tls(labels.NOT_PROVIDED_BY_SERVICE_DISCOVERY)
        return Plan(Connect(addr, None, timeout, labels.connect_outbound(addr, tls_labels, endpoint.dst_labels,
                                                                         authority),
                            h2_keep_alive=endpoint.h2_keep_alive), None)
    header = None
    target = addr
    if endpoint.opaque_transport_port is not None:
        target = SocketAddr(addr.ip, endpoint.opaque_transport_port)
        # An endpoint hinted opaque gets no session protocol, whatever the client speaks.
        header = encode(TransportHeader(port=addr.port, protocol=None if endpoint.opaque else protocol))
    tls = ClientTls(server_id=endpoint.server_id, sni=endpoint.sni, alpn=header is not None)
    tls_labels = labels.tls_connected(endpoint.server_id)
    return Plan(Connect(target, tls, timeout, labels.connect_outbound(addr, tls_labels, endpoint.dst_labels,
                                                                      authority),
                        header_port=addr.port if header is not None else 0, h2_keep_alive=endpoint.h2_keep_alive),
                header)


def upgrade_plan(
    endpoint: Endpoint,
    *,
    local_ips: frozenset[IpAddress],
    timeout: float,
    authority: str = "",
) -> Plan | None:
    """How HTTP/1 requests reach ``endpoint`` over HTTP/2 (``l5d-orig-proto``, proxy.md §7.7): when discovery
    hints it ``h2`` and it is not one of our own addresses; else None (HTTP/1 stays HTTP/1)."""
    if not endpoint.h2 or endpoint.opaque or endpoint.addr.ip in local_ips:
        return None
    route = plan(endpoint, local_ips=local_ips, protocol=SessionProtocol.HTTP2, timeout=timeout,
                 authority=authority)
    return Plan(replace(route.connect, upgrade=True), route.header)
