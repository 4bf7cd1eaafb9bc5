"""Applies proxy-init's nat rules inside a network namespace with iptables-save/-restore.

Role: the I/O half of proxy-init.  For IPv4 (and IPv6 when the config says so) it reads the
namespace's nat table with the save binary, renders ``proxy_init.nat_rules`` against it (so
existing jumps are kept, not doubled) and feeds the text to ``<firewall-bin-path>-restore
--noflush``, which replaces the two PROXY_INIT chains atomically and touches nothing else.
It refuses to redirect the host's own traffic: without a namespace name it must already run
inside some other network namespace.

Callers: ``tether init`` and the local pod runner (before it starts a meshed pod's app).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePath

from tether.platform.local.netns import LocalNetError, exec_argv, netns_exists, run
from tether.platform.local.proxy_init import ProxyInitConfig, nat_rules


@dataclass(frozen=True)
class FirewallBinaries:
    """Linkerd's ``--firewall-bin-path``/``--firewall-save-bin-path``; restore is ``<bin>-restore``.

    The IPv6 binaries are the same names with ``iptables`` replaced by ``ip6tables``
    (``iptables-nft`` -> ``ip6tables-nft``).
    """

    bin_path: str = "iptables"
    save_bin_path: str = "iptables-save"

    @property
    def restore_path(self) -> str:
        return f"{self.bin_path}-restore"

    def for_ipv6(self) -> FirewallBinaries:
        return FirewallBinaries(
            _ip6(self.bin_path, "firewall-bin-path"), _ip6(self.save_bin_path, "firewall-save-bin-path")
        )


def _ip6(path: str, flag: str) -> str:
    name = PurePath(path).name
    if not name.startswith("iptables"):
        raise LocalNetError(f"--{flag}: cannot derive the ip6tables binary from {path!r}; use --ipv6=false")
    return str(PurePath(path).with_name("ip6" + name[2:]))


# The kernel gives the initial network namespace this fixed inode (PROC_NET_INIT_INO).
_INIT_NET_INODE = 0xEFFFFFF9


def _in_host_namespace() -> bool:
    """Whether we run in the machine's (or container's) own namespace rather than a pod's."""
    own = os.stat("/proc/self/ns/net").st_ino
    try:
        host = os.stat("/proc/1/ns/net").st_ino
    except PermissionError:
        host = _INIT_NET_INODE
    return own in (host, _INIT_NET_INODE)


def apply_rules(config: ProxyInitConfig, netns: str | None, binaries: FirewallBinaries = FirewallBinaries()) -> None:
    """Install (or replace) the rules in ``netns``, or in the current namespace when None."""
    if netns is None and _in_host_namespace():
        raise LocalNetError("refusing to redirect the host's own traffic: name a pod namespace with --netns")
    if netns is not None and not netns_exists(netns):
        raise LocalNetError(f"--netns: network namespace {netns!r} does not exist")
    families = [(False, binaries)]
    if config.ipv6:
        families.append((True, binaries.for_ipv6()))
    for ipv6, bins in families:
        installed = run(exec_argv(netns, [bins.save_bin_path, "-t", "nat"]))
        run(exec_argv(netns, [bins.restore_path, "--noflush"]), stdin=nat_rules(config, ipv6=ipv6, installed=installed))
