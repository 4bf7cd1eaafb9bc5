"""Helpers for the local platform's kernel tests: sockets inside pods, rule and name snapshots.

Every name a test run makes starts with ``tp<pid in hex>`` (``tp1a2b-<pod>`` namespaces,
``tp1a2b<hash>`` veths, bridge ``tp1a2bbr``), so ``remove_dead_runs`` can tell leftovers of
runs that are gone from what a live run (maybe another engineer's) is using.  Sockets are
opened inside a pod with setns(2) on this thread only, so a test needs no helper process
except where the uid matters.  Used by ``conftest.py`` and the ``test_local_*`` modules.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import select
import socket
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tether.platform.local.ipam import Ipam
from tether.platform.local.netns import HostNet, NetnsConfig, PodNet

DEADLINE_S = 10.0
_CLONE_NEWNET = 0x40000000
_SO_ORIGINAL_DST = 80
_RUN_NAME = re.compile(r"^(tp([0-9a-f]+))(?:-|br$)")
_BUILTIN_CHAIN = re.compile(r"^:(PREROUTING|INPUT|OUTPUT|POSTROUTING) ")
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class Lab:
    """This test run's host network (bridge and pods) and its IPAM."""

    net: HostNet
    ipam: Ipam


def run_prefix(pid: int) -> str:
    return f"tp{pid:x}"


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


@contextmanager
def in_netns(netns: str) -> Iterator[None]:
    """Run the block with this thread in ``netns``; sockets made there stay there."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def listen(pod: PodNet, port: int, host: str = "0.0.0.0") -> socket.socket:
    with in_netns(pod.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(8)
    return sock


def connect(pod: PodNet, address: str, port: int) -> socket.socket:
    with in_netns(pod.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(DEADLINE_S)
    sock.connect((address, port))
    return sock


def landed(listeners: dict[str, socket.socket]) -> tuple[str, socket.socket]:
    """Which listener the one pending connection reached, and the accepted socket."""
    ready, _, _ = select.select(list(listeners.values()), [], [], DEADLINE_S)
    assert len(ready) == 1, f"expected exactly one listener to get the connection, got {len(ready)}"
    name = next(name for name, sock in listeners.items() if sock is ready[0])
    conn, _ = ready[0].accept()
    conn.settimeout(DEADLINE_S)
    return name, conn


def original_dst(conn: socket.socket) -> tuple[str, int]:
    """SO_ORIGINAL_DST of a redirected IPv4 connection, read as the proxy reads it."""
    raw = conn.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    port, address = struct.unpack("!2xH4s8x", raw)
    return socket.inet_ntoa(address), port


def _stdout(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def save_nat(pod: PodNet, save_bin: str = "iptables-save") -> list[str]:
    """The pod's nat table as iptables-save prints it, minus comments and builtin chain heads."""
    out = _stdout(["ip", "netns", "exec", pod.netns, save_bin, "-t", "nat"])
    return [line for line in out.splitlines() if not line.startswith("#") and not _BUILTIN_CHAIN.match(line)]


def host_nat() -> list[str]:
    """The host's own nat tables (IPv4 and IPv6), without timestamps and counters."""
    lines = []
    for save in ("iptables-save", "ip6tables-save"):
        out = _stdout([save, "-t", "nat"])
        lines += [re.sub(r"\[\d+:\d+\]", "", line) for line in out.splitlines() if not line.startswith("#")]
    return lines


def names_with(prefix: str) -> set[str]:
    """Network namespaces and host links whose names start with ``prefix``."""
    netns = json.loads(_stdout(["ip", "-j", "netns", "list"]) or "[]")
    links = json.loads(_stdout(["ip", "-j", "link", "show"]) or "[]")
    return {n["name"] for n in netns if n["name"].startswith(prefix)} | {
        link["ifname"] for link in links if link["ifname"].startswith(prefix)
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def remove_dead_runs() -> None:
    """Tear down what test runs whose process is gone left behind."""
    runs = {m.group(1): int(m.group(2), 16) for m in map(_RUN_NAME.match, names_with("tp")) if m}
    for prefix, pid in runs.items():
        if not _alive(pid):
            HostNet(NetnsConfig(prefix=prefix, bridge=prefix + "br")).teardown_all()
