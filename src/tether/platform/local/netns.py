"""Pods as Linux network namespaces on a host bridge, driven through iproute2's ``ip``.

Role: create and delete the host bridge (carrying the pod range's gateway address, at a MAC fixed by
its name) and pod namespaces: a veth pair whose host end is a bridge port and whose pod end is ``eth0`` with the
pod IP (and no IPv6: see ``create_pod``), a default route via the gateway, ``lo`` up.  Run processes inside a pod namespace,
optionally as another uid/gid (the proxy runs as 2102).  Everything made here carries the
configured name prefix, so ``teardown_all`` finds and removes it all, leftovers included.

Why ``ip`` and not pyroute2: the commands are the ones a user types to inspect the result
(``ip netns``, ``ip link``), ``ip netns exec`` is also how iptables and processes enter a pod,
and it adds no dependency.

Callers: the local pod runner, ``tether down --purge``, ``tether.platform.local.firewall``
(``exec_argv``/``run``) and the platform tests.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import select
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NETNS_DIR = Path("/run/netns")
IFNAMSIZ = 15  # longest interface name Linux accepts
POD_IFACE = "eth0"
KILL_TIMEOUT_S = 10.0

_PREFIX = re.compile(r"^[a-z][a-z0-9]{1,8}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
_POD_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,200}[a-z0-9])?$")


class LocalNetError(RuntimeError):
    """The pod network could not be made as asked; the message says why."""


class CommandError(LocalNetError):
    """A command this module ran failed; the message has the command and its stderr."""

    def __init__(self, argv: Sequence[str], detail: str) -> None:
        super().__init__(f"`{' '.join(argv)}` failed: {detail}")
        self.argv = list(argv)


def run(argv: Sequence[str], *, stdin: str | None = None) -> str:
    """Run a command to completion and return its stdout; raise ``CommandError`` on failure."""
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise CommandError(argv, f"{argv[0]}: command not found") from None
    if done.returncode != 0:
        raise CommandError(argv, f"exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def exec_argv(netns: str | None, argv: Sequence[str], *, uid: int | None = None, gid: int | None = None) -> list[str]:
    """The command line running ``argv`` inside ``netns`` (or here when None), as ``uid``/``gid``.

    The gid defaults to the uid; supplementary groups are dropped.
    """
    prefix = ["ip", "netns", "exec", netns] if netns else []
    if uid is not None:
        prefix += ["setpriv", f"--reuid={uid}", f"--regid={uid if gid is None else gid}", "--clear-groups"]
    return [*prefix, *argv]


def bridge_mac(bridge: str) -> str:
    """The MAC address of bridge ``bridge``: fixed by its name, locally administered, unicast."""
    digest = hashlib.sha256(bridge.encode()).digest()
    return ":".join(f"{b:02x}" for b in ((digest[0] & 0xFC) | 0x02, *digest[1:6]))


def netns_exists(netns: str) -> bool:
    return (NETNS_DIR / netns).exists()


@dataclass(frozen=True)
class NetnsConfig:
    """Names: namespaces are ``<prefix>-<pod>``, host veths ``<prefix><hash>``, plus the bridge."""

    prefix: str = "tether"
    bridge: str = "tether0"

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"prefix: {self.prefix!r} must be 2-9 lowercase letters or digits, starting with a letter")
        if not _IFNAME.match(self.bridge):
            raise ValueError(f"bridge: {self.bridge!r} is not a valid interface name (at most {IFNAMSIZ} characters)")


@dataclass(frozen=True)
class PodNet:
    """A pod's network: its namespace, the host end of its veth and its address."""

    name: str
    netns: str
    host_veth: str
    address: ipaddress.IPv4Interface


class HostNet:
    """The host side of the local pod network: one bridge and the pod namespaces on it."""

    def __init__(self, config: NetnsConfig) -> None:
        self.config = config

    def netns_name(self, pod: str) -> str:
        return f"{self.config.prefix}-{pod}"

    def veth_name(self, pod: str) -> str:
        digest = hashlib.sha256(pod.encode()).hexdigest()
        return self.config.prefix + digest[: IFNAMSIZ - len(self.config.prefix)]

    # -- bridge ---------------------------------------------------------------------------

    def ensure_bridge(self, gateway: ipaddress.IPv4Interface) -> None:
        """Create the bridge if missing, with ``gateway`` (address/prefix) on it, and bring it up."""
        bridge = self.config.bridge
        for route in json.loads(run(["ip", "-j", "route", "show"]) or "[]"):
            dst = route.get("dst", "default")
            if dst != "default" and route.get("dev") != bridge:
                if ipaddress.ip_network(dst, strict=False).overlaps(gateway.network):
                    raise LocalNetError(f"pod range {gateway.network} overlaps host route {dst} on {route.get('dev')}")
        if bridge not in self._host_links():
            run(["ip", "link", "add", bridge, "type", "bridge"])
        # A bridge without an address of its own takes the lowest of its ports' and changes it as pods come
        # and go. Pods learn the new one only from the host's one gratuitous ARP; one that misses or ignores
        # it (an entry updated less than ``locktime`` ago keeps its address) sends to a MAC the host drops,
        # cut off from the gateway and the control plane until its entry is resolved again.
        run(["ip", "link", "set", bridge, "address", bridge_mac(bridge)])
        run(["ip", "addr", "replace", str(gateway), "dev", bridge])
        run(["ip", "link", "set", bridge, "up"])

    def delete_bridge(self) -> None:
        if self.config.bridge in self._host_links():
            run(["ip", "link", "del", self.config.bridge])

    # -- pods -----------------------------------------------------------------------------

    def create_pod(self, pod: str, address: ipaddress.IPv4Interface, gateway: ipaddress.IPv4Address) -> PodNet:
        """Make the pod's namespace and veth; on any failure nothing is left behind."""
        if not _POD_NAME.match(pod):
            raise ValueError(f"pod: {pod!r} must be lowercase letters, digits, '.' or '-'")
        net = PodNet(pod, self.netns_name(pod), self.veth_name(pod), address)
        if netns_exists(net.netns):
            raise LocalNetError(f"pod {pod}: network namespace {net.netns} already exists")
        run(["ip", "netns", "add", net.netns])
        in_pod = ["ip", "-n", net.netns]
        try:
            # No IPv6 on the pod network: proxy-init's rules here are IPv4 only, so a link-local
            # IPv6 address on eth0 would let any pod reach an app bound to ``::`` past its proxy
            # (and an app reach out past it).  Set before eth0 exists, so it never gets one; the
            # loopback keeps ``::1``.  An app bound to ``::`` still takes IPv4, which is redirected.
            run(exec_argv(net.netns, ["sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1",
                                      "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.lo.disable_ipv6=0"]))
            run(["ip", "link", "add", net.host_veth, "type", "veth", "peer", "name", POD_IFACE, "netns", net.netns])
            run(["ip", "link", "set", net.host_veth, "master", self.config.bridge, "up"])
            run([*in_pod, "addr", "add", str(address), "dev", POD_IFACE])
            run([*in_pod, "link", "set", POD_IFACE, "up"])
            run([*in_pod, "link", "set", "lo", "up"])
            run([*in_pod, "route", "add", "default", "via", str(gateway)])
        except CommandError:
            self.delete_pod(pod)
            raise
        return net

    def delete_pod(self, pod: str) -> None:
        """Kill the pod's processes, remove its veth pair and namespace (each only if present)."""
        netns = self.netns_name(pod)
        if netns_exists(netns):
            _kill_all(netns)
        if self.veth_name(pod) in self._host_links():
            run(["ip", "link", "del", self.veth_name(pod)])
        if netns_exists(netns):
            run(["ip", "netns", "del", netns])

    def pods(self) -> list[str]:
        """Names of the pods whose namespaces exist, leftovers of earlier runs included."""
        mark = self.config.prefix + "-"
        names = [entry["name"] for entry in json.loads(run(["ip", "-j", "netns", "list"]) or "[]")]
        return sorted(name[len(mark) :] for name in names if name.startswith(mark))

    def spawn(
        self, pod: str, argv: Sequence[str], *, uid: int | None = None, gid: int | None = None, **popen: Any
    ) -> subprocess.Popen:
        """Start ``argv`` inside the pod's namespace; the handle's pid is the program's own."""
        netns = self.netns_name(pod)
        if not netns_exists(netns):
            raise LocalNetError(f"pod {pod}: network namespace {netns} does not exist")
        return subprocess.Popen(exec_argv(netns, argv, uid=uid, gid=gid), **popen)

    def teardown_all(self) -> None:
        """Remove every pod namespace, veth and the bridge this prefix owns (rules go with them)."""
        for pod in self.pods():
            self.delete_pod(pod)
        ours = re.compile(re.escape(self.config.prefix) + "[0-9a-f]+")
        for name, kind in self._host_links().items():
            if kind == "veth" and ours.fullmatch(name):
                run(["ip", "link", "del", name])
        self.delete_bridge()

    def _host_links(self) -> dict[str, str]:
        """Host interfaces by name, with their kind (``bridge``, ``veth``, or "" for physical)."""
        links = json.loads(run(["ip", "-j", "-d", "link", "show"]) or "[]")
        return {link["ifname"]: link.get("linkinfo", {}).get("info_kind", "") for link in links}


def _kill_all(netns: str) -> None:
    """SIGKILL every process in ``netns`` and wait, by pidfd, until each has exited."""
    for pid in (int(p) for p in run(["ip", "netns", "pids", netns]).split()):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            if not poller.poll(int(KILL_TIMEOUT_S * 1000)):
                raise LocalNetError(f"process {pid} in {netns} did not exit after SIGKILL")
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)
