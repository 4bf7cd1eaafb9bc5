"""Pack and unpack linkerd2-proxy-api addresses (`net.IPAddress`, `net.TcpAddress`).

Used by the control plane when it translates endpoints into Update / policy
messages and by the proxy when it reads them back, so both sides agree on the
packing: IPv4 is one integer with the first octet most significant (sent as a
fixed32); IPv6 is split into `first` (upper 64 bits) and `last` (lower 64 bits).
"""

from __future__ import annotations

import ipaddress

from tether.api import net_pb2

_MAX_PORT = 0xFFFF
_LOW_64 = (1 << 64) - 1


class InvalidAddress(ValueError):
    """An address cannot be packed into, or read from, the wire messages."""


def to_ip_address(ip: str) -> net_pb2.IPAddress:
    """Pack an IPv4 or IPv6 address string ("10.1.2.3", "fd00::1")."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError as err:
        raise InvalidAddress(f"not an IP address: {ip!r}") from err
    if isinstance(addr, ipaddress.IPv4Address):
        return net_pb2.IPAddress(ipv4=int(addr))
    if addr.scope_id is not None:
        # The wire has no place for a zone, so dropping it would change the address.
        raise InvalidAddress(f"scoped IPv6 addresses cannot be sent: {ip!r}")
    value = int(addr)
    return net_pb2.IPAddress(ipv6=net_pb2.IPv6(first=value >> 64, last=value & _LOW_64))


def from_ip_address(msg: net_pb2.IPAddress) -> str:
    """Unpack to the address's standard string form (IPv6 compressed)."""
    kind = msg.WhichOneof("ip")
    if kind == "ipv4":
        return str(ipaddress.IPv4Address(msg.ipv4))
    if kind == "ipv6":
        return str(ipaddress.IPv6Address((msg.ipv6.first << 64) | msg.ipv6.last))
    raise InvalidAddress("IPAddress has neither ipv4 nor ipv6 set")


def to_tcp_address(ip: str, port: int) -> net_pb2.TcpAddress:
    """Pack (ip, port); the port must fit in 16 bits."""
    _check_port(port)
    return net_pb2.TcpAddress(ip=to_ip_address(ip), port=port)


def from_tcp_address(msg: net_pb2.TcpAddress) -> tuple[str, int]:
    """Unpack to (ip string, port); an unset ip or a port beyond 16 bits is an error."""
    if not msg.HasField("ip"):
        raise InvalidAddress("TcpAddress has no ip")
    _check_port(msg.port)
    return from_ip_address(msg.ip), msg.port


def _check_port(port: int) -> None:
    if not 0 <= port <= _MAX_PORT:
        raise InvalidAddress(f"port {port} is outside 0-{_MAX_PORT}")
