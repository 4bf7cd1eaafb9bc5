"""IPv6 cannot bypass redirection (#19, item 1): pods have no IPv6 on their network, so an app bound to ``::``
is reached only through its proxy, and a meshed app cannot reach out over IPv6 past its proxy.

Before the fix eth0 kept an ``fe80::`` address and proxy-init's rules (IPv4 only, as the local platform
installs them) did not see IPv6: any pod could connect straight to the app.  Here each test tries exactly
that, to the address eth0 would have had (EUI-64 of its MAC), and shows the kernel refuses while the same
connection over IPv4 lands on the proxy's port.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import time
from collections.abc import Callable

import netlab
import pytest
from test_local_redirect import Keep, Mesh, _mesh

from tether.platform.local.netns import PodNet
from tether.platform.local.proxy_init import ProxyInitConfig


@pytest.fixture
def mesh(make_pod: Callable[..., PodNet], keep: Keep) -> Mesh:
    return _mesh(make_pod, keep, ProxyInitConfig(ipv6=False))  # as the local platform's injector sets it


def _addresses(pod: PodNet, device: str) -> list[str]:
    out = subprocess.run(["ip", "-n", pod.netns, "-j", "-6", "addr", "show", "dev", device],
                         capture_output=True, text=True, check=True).stdout
    return [a["local"] for link in json.loads(out or "[]") for a in link.get("addr_info", [])]


def _settled(pod: PodNet) -> None:
    """Wait until no address of eth0 is still in duplicate address detection (none when IPv6 is off)."""
    deadline = time.monotonic() + netlab.DEADLINE_S
    while time.monotonic() < deadline:
        out = subprocess.run(["ip", "-n", pod.netns, "-j", "-6", "addr", "show", "dev", "eth0"],
                             capture_output=True, text=True, check=True).stdout
        if not any(a.get("tentative") for link in json.loads(out or "[]") for a in link.get("addr_info", [])):
            return
        time.sleep(0.1)
    raise AssertionError(f"{pod.netns}: eth0 still has tentative IPv6 addresses")


def _would_be_link_local(pod: PodNet) -> str:
    """The fe80:: address the kernel gives eth0 when IPv6 is on (EUI-64 of its MAC)."""
    _settled(pod)
    out = subprocess.run(["ip", "-n", pod.netns, "-j", "link", "show", "eth0"], capture_output=True, text=True, check=True)
    mac = [int(b, 16) for b in json.loads(out.stdout)[0]["address"].split(":")]
    eui = bytes([mac[0] ^ 2, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]])
    return str(ipaddress.IPv6Address(b"\xfe\x80" + b"\x00" * 6 + eui))


def _listen_any_v6(pod: PodNet, port: int) -> socket.socket:
    """An app as most are written: bound to ``::``, taking IPv4 as well."""
    with netlab.in_netns(pod.netns):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", port))
    sock.listen(8)
    return sock


def _connect_v6(pod: PodNet, address: str, port: int) -> socket.socket:
    with netlab.in_netns(pod.netns):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        scope = socket.if_nametoindex("eth0")
    sock.settimeout(netlab.DEADLINE_S)
    try:
        sock.connect((address, port, 0, scope))
    except BaseException:
        sock.close()
        raise
    return sock


def test_pods_have_no_ipv6_on_their_network_but_keep_loopback(mesh: Mesh) -> None:
    for pod in (mesh.meshed, mesh.peer):
        assert _addresses(pod, "eth0") == []
        assert _addresses(pod, "lo") == ["::1"]


def test_inbound_to_an_app_bound_to_any_reaches_only_the_proxy(mesh: Mesh, keep: Keep) -> None:
    listeners = {**mesh.listeners, "meshed:9090": keep(_listen_any_v6(mesh.meshed, 9090))}
    target = _would_be_link_local(mesh.meshed)
    _settled(mesh.peer)
    with pytest.raises(OSError):
        keep(_connect_v6(mesh.peer, target, 9090))
    keep(netlab.connect(mesh.peer, mesh.meshed_ip, 9090))
    where, conn = netlab.landed(listeners)
    keep(conn)
    assert where == "meshed:4143"
    assert netlab.original_dst(conn) == (mesh.meshed_ip, 9090)


def test_outbound_from_a_meshed_app_cannot_skip_its_proxy_over_ipv6(mesh: Mesh, keep: Keep) -> None:
    listeners = {**mesh.listeners, "peer:9090": keep(_listen_any_v6(mesh.peer, 9090))}
    target = _would_be_link_local(mesh.peer)
    _settled(mesh.meshed)
    with pytest.raises(OSError):
        keep(_connect_v6(mesh.meshed, target, 9090))
    keep(netlab.connect(mesh.meshed, mesh.peer_ip, 9090))
    where, conn = netlab.landed(listeners)
    keep(conn)
    assert where == "meshed:4140"
