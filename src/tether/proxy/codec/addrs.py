"""Addresses and DNS names as the proxy's configuration and wire formats spell them.

- DNS names follow Linkerd's ``dns::Name`` (webpki's rules, RFC 5280 §7.2, with
  underscores allowed): labels of 1–63 letters, digits, ``-`` or ``_``, not
  starting or ending with ``-``; at most 253 characters; one optional trailing
  dot; a last label that is not all digits (so an IP is never a name). Names are
  compared case-insensitively, so they are kept in lower case.
- A socket address is ``ip:port`` with IPv6 in brackets (``[::1]:4140``); a
  control-plane address may also be ``name:port``.

Callers: ``tether.proxy.core.config`` (listen and control-plane addresses, identity
names, IP sets and networks), ``tether.proxy.codec.client_hello`` (SNI) and
``tether.proxy.codec.transport_header`` (the target name).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from tether.ports import parse_port

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAX_NAME_LENGTH = 253
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?", re.ASCII)


def is_dns_name(text: str) -> bool:
    """True if ``text`` is a valid DNS name (case-insensitive; trailing dot allowed)."""
    # ASCII first: str.lower() maps some non-ASCII letters (the Kelvin sign) to ASCII ones.
    if not text.isascii():
        return False
    name = text.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > _MAX_NAME_LENGTH:
        return False
    labels = name.split(".")
    return all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


def parse_dns_name(text: str) -> str:
    """Return ``text`` in lower case if it is a valid DNS name; else raise ``ValueError``."""
    if not is_dns_name(text):
        raise ValueError(f"{text!r} is not a valid DNS name")
    return text.lower()


def parse_ip(text: str) -> IpAddress:
    """Parse an IPv4 or IPv6 address (no brackets, no zone); raises ``ValueError``."""
    # ipaddress accepts "fe80::1%eth0"; Linkerd's addresses carry no zone.
    if "%" in text:
        raise ValueError(f"{text!r} is not an IP address (zone ids are not supported)")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None


def parse_network(text: str) -> IpNetwork:
    """Parse a CIDR such as ``10.0.0.0/8``; host bits may be set, as Linkerd's ``ipnet`` allows."""
    if "/" not in text or "%" in text:
        raise ValueError(f"{text!r} is not a network in CIDR form (e.g. 10.0.0.0/8)")
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"{text!r} is not a network in CIDR form (e.g. 10.0.0.0/8)") from None


@dataclass(frozen=True, slots=True)
class SocketAddr:
    """An IP and a port."""

    ip: IpAddress
    port: int

    @property
    def is_loopback(self) -> bool:
        return self.ip.is_loopback

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.ip.version == 6 else f"{self.ip}:{self.port}"


@dataclass(frozen=True, slots=True)
class NameAddr:
    """A DNS name (lower case) and a port."""

    name: str
    port: int

    @property
    def is_loopback(self) -> bool:
        return self.name.rstrip(".") == "localhost"

    def __str__(self) -> str:
        return f"{self.name}:{self.port}"


def parse_socket_addr(text: str) -> SocketAddr:
    """Parse ``ip:port`` or ``[ipv6]:port`` for a listener; port 0 means any free port."""
    host, port = _split_host_port(text, allow_zero_port=True)
    return SocketAddr(parse_ip(host), port)


def parse_addr(text: str) -> SocketAddr | NameAddr:
    """Parse ``host:port`` to connect to, where host is an IP or a DNS name; port must be 1–65535."""
    host, port = _split_host_port(text, allow_zero_port=False)
    try:
        return SocketAddr(parse_ip(host), port)
    except ValueError:
        pass
    if not is_dns_name(host):
        raise ValueError(f"{text!r}: host {host!r} is neither an IP address nor a DNS name")
    return NameAddr(host.lower(), port)


def _split_host_port(text: str, *, allow_zero_port: bool) -> tuple[str, int]:
    if text.startswith("["):
        host, sep, port_s = text[1:].partition("]:")
        if not sep or ":" not in host:
            raise ValueError(f"{text!r} is not [ipv6]:port")
    else:
        host, sep, port_s = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r} is not host:port")
        if ":" in host:
            raise ValueError(f"{text!r}: an IPv6 address needs brackets, e.g. [::1]:4140")
    try:
        return host, parse_port(port_s, allow_zero=allow_zero_port)
    except ValueError as e:
        raise ValueError(f"{text!r}: {e}") from None
