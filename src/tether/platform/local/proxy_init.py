"""Linkerd proxy-init's nat rules as iptables-restore text (pure: no processes, no files).

Role: turn a ``ProxyInitConfig`` into the nat-table rules linkerd2-proxy-init installs in a pod.
Chain ``PROXY_INIT_REDIRECT`` (jumped to from ``PREROUTING``) sends inbound TCP to the proxy's
inbound port after skipping the ignored inbound ports and source subnets; chain
``PROXY_INIT_OUTPUT`` (jumped to from ``OUTPUT``) returns traffic of the proxy's uid (and gid),
traffic leaving through ``lo`` and the ignored outbound ports, then sends all other outbound TCP
to the proxy's outbound port.  Rules and comments are Linkerd's (``proxy-init/<what>``); the text
is in iptables-save's canonical order, so ``iptables-save -t nat`` prints the applied rules back
line for line.  Declaring a chain in restore text flushes it, so re-applying replaces the rules.

Callers: ``tether.platform.local.firewall`` (applies the text inside a pod namespace) and
``tether init`` (parses its flags with ``parse_ports``/``parse_subnets``; ``--simulate`` prints
the text).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tether.ports import PortListError, is_port, parse_port_ranges

REDIRECT_CHAIN = "PROXY_INIT_REDIRECT"
OUTPUT_CHAIN = "PROXY_INIT_OUTPUT"
# iptables' multiport match takes at most 15 ports; a range counts as two.
MULTIPORT_LIMIT = 15

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ProxyInitError(ValueError):
    """Invalid proxy-init input; ``field`` is the config field, which is also the flag's name."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class PortRange:
    """An inclusive TCP port range; a single port has ``first == last``."""

    first: int
    last: int

    def __str__(self) -> str:
        """The iptables multiport form: ``4190`` or ``4000:4010``."""
        return str(self.first) if self.first == self.last else f"{self.first}:{self.last}"

    @property
    def multiport_weight(self) -> int:
        return 1 if self.first == self.last else 2


def _ports(*ports: int) -> tuple[PortRange, ...]:
    return tuple(PortRange(port, port) for port in ports)


# The proxy's control (tap) and admin ports: always skipped inbound, as Linkerd's chart does.
PROXY_INBOUND_PORTS_TO_IGNORE = _ports(4190, 4191)
# Linkerd's default skip ports (Galera), inbound and outbound.
DEFAULT_PORTS_TO_IGNORE = _ports(4567, 4568)

def parse_ports(values: str | Iterable[str], field: str) -> tuple[PortRange, ...]:
    """Parse Linkerd's port-list syntax (``tether.ports``): ``"4190,4191,4000-4010"``, one string or several.

    Keeps the written order, which the rules follow, as Linkerd's do; a bad item raises
    ``ProxyInitError`` naming ``field`` and the item.
    """
    items = [values] if isinstance(values, str) else list(values)
    try:
        spans = parse_port_ranges(",".join(items))
    except PortListError as err:
        raise ProxyInitError(field, str(err)) from None
    return tuple(PortRange(first, last) for first, last in spans)


def parse_subnets(values: str | Iterable[str], field: str) -> tuple[Network, ...]:
    """Parse a comma-separated list of CIDRs (IPv4 or IPv6); host bits are cleared."""
    items = [values] if isinstance(values, str) else list(values)
    subnets: list[Network] = []
    for item in ",".join(items).split(","):
        item = item.strip()
        if not item:
            continue
        try:
            subnets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ProxyInitError(field, f"{item!r} is not a valid CIDR address") from None
    return tuple(subnets)


@dataclass(frozen=True)
class ProxyInitConfig:
    """What to redirect; field names match linkerd2-proxy-init's flags (``--incoming-proxy-port``...).

    ``inbound_ports_to_ignore`` are the user's skip ports: 4190 and 4191 are always skipped as
    well, ahead of them.  ``proxy_uid``/``proxy_gid`` of ``None`` add no owner rule.  ``ipv6``
    says whether ip6tables gets the same rules (IPv6 subnets only) besides iptables.
    """

    incoming_proxy_port: int = 4143
    outgoing_proxy_port: int = 4140
    proxy_uid: int | None = 2102
    proxy_gid: int | None = None
    inbound_ports_to_ignore: tuple[PortRange, ...] = DEFAULT_PORTS_TO_IGNORE
    outbound_ports_to_ignore: tuple[PortRange, ...] = DEFAULT_PORTS_TO_IGNORE
    subnets_to_ignore: tuple[Network, ...] = ()
    ipv6: bool = True

    def __post_init__(self) -> None:
        for name in ("incoming_proxy_port", "outgoing_proxy_port"):
            port = getattr(self, name)
            if not (isinstance(port, int) and is_port(port)):
                raise ProxyInitError(name, f"{port!r} is not a valid TCP port number")
        for name in ("proxy_uid", "proxy_gid"):
            ident = getattr(self, name)
            if ident is not None and not (isinstance(ident, int) and 0 < ident < 2**32 - 1):
                raise ProxyInitError(name, f"{ident!r} is not a non-root user or group id")


def _comment(what: str) -> str:
    return f'-m comment --comment "proxy-init/{what}"'


def _multiport_chunks(ports: Iterable[PortRange]) -> list[list[PortRange]]:
    """Split ports into groups that fit one multiport match, keeping order (Linkerd's packing)."""
    chunks: list[list[PortRange]] = []
    weight = MULTIPORT_LIMIT  # forces a first chunk
    for port in ports:
        if weight + port.multiport_weight > MULTIPORT_LIMIT:
            chunks.append([])
            weight = 0
        chunks[-1].append(port)
        weight += port.multiport_weight
    return chunks


def _ignore_ports(chain: str, ports: Iterable[PortRange]) -> list[str]:
    unique = list(dict.fromkeys(ports))
    rules = []
    for chunk in _multiport_chunks(unique):
        dports = ",".join(str(port) for port in chunk)
        rules.append(f"-A {chain} -p tcp -m multiport --dports {dports} {_comment('ignore-port-' + dports)} -j RETURN")
    return rules


def _jump_installed(builtin: str, chain: str, installed: str) -> bool:
    """Whether ``installed`` (iptables-save output) already jumps from ``builtin`` to ``chain``."""
    return re.search(rf"(?m)^-A {builtin} (.+ )?-j {chain}\b", installed) is not None


def nat_rules(config: ProxyInitConfig, *, ipv6: bool = False, installed: str = "") -> str:
    """The iptables-restore text for the nat table (for ip6tables when ``ipv6``).

    ``installed`` is the namespace's current ``iptables-save -t nat`` output: a jump from
    PREROUTING or OUTPUT that is already there is kept rather than added twice.
    """
    lines = ["*nat", f":{OUTPUT_CHAIN} - [0:0]", f":{REDIRECT_CHAIN} - [0:0]"]
    if not _jump_installed("PREROUTING", REDIRECT_CHAIN, installed):
        lines.append(f"-A PREROUTING {_comment('install-proxy-init-prerouting')} -j {REDIRECT_CHAIN}")
    if not _jump_installed("OUTPUT", OUTPUT_CHAIN, installed):
        lines.append(f"-A OUTPUT {_comment('install-proxy-init-output')} -j {OUTPUT_CHAIN}")

    if config.proxy_uid is not None:
        lines.append(f"-A {OUTPUT_CHAIN} -m owner --uid-owner {config.proxy_uid} {_comment('ignore-proxy-user-id')} -j RETURN")
    if config.proxy_gid is not None:
        lines.append(f"-A {OUTPUT_CHAIN} -m owner --gid-owner {config.proxy_gid} {_comment('ignore-proxy-group-id')} -j RETURN")
    lines.append(f"-A {OUTPUT_CHAIN} -o lo {_comment('ignore-loopback')} -j RETURN")
    lines += _ignore_ports(OUTPUT_CHAIN, config.outbound_ports_to_ignore)
    lines.append(
        f"-A {OUTPUT_CHAIN} -p tcp {_comment('redirect-all-outgoing-to-proxy-port')}"
        f" -j REDIRECT --to-ports {config.outgoing_proxy_port}"
    )

    lines += _ignore_ports(REDIRECT_CHAIN, PROXY_INBOUND_PORTS_TO_IGNORE + config.inbound_ports_to_ignore)
    family = 6 if ipv6 else 4
    for subnet in config.subnets_to_ignore:
        if subnet.version == family:
            lines.append(f"-A {REDIRECT_CHAIN} -s {subnet} {_comment(f'ignore-subnet-{subnet}')} -j RETURN")
    lines.append(
        f"-A {REDIRECT_CHAIN} -p tcp {_comment('redirect-all-incoming-to-proxy-port')}"
        f" -j REDIRECT --to-ports {config.incoming_proxy_port}"
    )
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"
