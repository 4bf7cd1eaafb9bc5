"""Real redirection: with proxy-init's rules in a pod, traffic lands where Linkerd's proxy expects.

Pod ``meshed`` has the rules and listeners where its proxy would listen (outbound
127.0.0.1:4140, inbound 0.0.0.0:4143, tap 4190, admin 4191) plus an app port 8080; pod
``peer`` has none and listens on 8080 and 4567.  Each test makes one connection and asserts
which listener it reached - exactly one does - and, when redirected, the original destination
the proxy would read with SO_ORIGINAL_DST.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

import netlab
import pytest

from tether.platform.local.firewall import apply_rules
from tether.platform.local.netns import PodNet
from tether.platform.local.proxy_init import ProxyInitConfig

Keep = Callable[[socket.socket], socket.socket]


@dataclass
class Mesh:
    meshed: PodNet
    peer: PodNet
    listeners: dict[str, socket.socket]

    @property
    def meshed_ip(self) -> str:
        return str(self.meshed.address.ip)

    @property
    def peer_ip(self) -> str:
        return str(self.peer.address.ip)


def _mesh(make_pod: Callable[..., PodNet], keep: Keep, rules: ProxyInitConfig) -> Mesh:
    meshed = make_pod("meshed", rules=rules)
    peer = make_pod("peer")
    listeners = {
        "meshed:4140": keep(netlab.listen(meshed, 4140, "127.0.0.1")),
        "meshed:4143": keep(netlab.listen(meshed, 4143)),
        "meshed:4190": keep(netlab.listen(meshed, 4190)),
        "meshed:4191": keep(netlab.listen(meshed, 4191)),
        "meshed:8080": keep(netlab.listen(meshed, 8080)),
        "peer:8080": keep(netlab.listen(peer, 8080)),
        "peer:4567": keep(netlab.listen(peer, 4567)),
    }
    return Mesh(meshed, peer, listeners)


@pytest.fixture
def mesh(make_pod: Callable[..., PodNet], keep: Keep) -> Mesh:
    return _mesh(make_pod, keep, ProxyInitConfig(ipv6=False))


def test_outbound_lands_on_the_proxy_with_the_original_destination(mesh: Mesh, keep: Keep) -> None:
    keep(netlab.connect(mesh.meshed, mesh.peer_ip, 8080))
    where, conn = netlab.landed(mesh.listeners)
    keep(conn)
    assert where == "meshed:4140"
    assert netlab.original_dst(conn) == (mesh.peer_ip, 8080)


def test_inbound_lands_on_the_proxy_with_the_original_destination(mesh: Mesh, keep: Keep) -> None:
    keep(netlab.connect(mesh.peer, mesh.meshed_ip, 8080))
    where, conn = netlab.landed(mesh.listeners)
    keep(conn)
    assert where == "meshed:4143"
    assert netlab.original_dst(conn) == (mesh.meshed_ip, 8080)


@pytest.mark.parametrize("port", [4190, 4191])
def test_inbound_proxy_ports_are_not_redirected(mesh: Mesh, keep: Keep, port: int) -> None:
    keep(netlab.connect(mesh.peer, mesh.meshed_ip, port))
    where, conn = netlab.landed(mesh.listeners)
    keep(conn)
    assert where == f"meshed:{port}"


def test_ignored_outbound_port_goes_straight_to_the_peer(mesh: Mesh, keep: Keep) -> None:
    keep(netlab.connect(mesh.meshed, mesh.peer_ip, 4567))
    where, conn = netlab.landed(mesh.listeners)
    keep(conn)
    assert where == "peer:4567"


@pytest.mark.parametrize("target", ["127.0.0.1", "pod-ip"])
def test_loopback_traffic_is_not_redirected(mesh: Mesh, keep: Keep, target: str) -> None:
    address = mesh.meshed_ip if target == "pod-ip" else target
    keep(netlab.connect(mesh.meshed, address, 8080))
    where, conn = netlab.landed(mesh.listeners)
    keep(conn)
    assert where == "meshed:8080"


@pytest.mark.parametrize(("uid", "expected"), [(2102, "peer:8080"), (2103, "meshed:4140")])
def test_only_the_proxy_uid_bypasses_the_outbound_redirect(
    mesh: Mesh, lab: netlab.Lab, keep: Keep, uid: int, expected: str
) -> None:
    script = f"exec 3<>/dev/tcp/{mesh.peer_ip}/8080 && printf hi >&3"
    proc = lab.net.spawn(mesh.meshed.name, ["bash", "-c", script], uid=uid)
    assert proc.wait(timeout=netlab.DEADLINE_S) == 0
    where, conn = netlab.landed(mesh.listeners)
    keep(conn)
    assert where == expected
    assert conn.recv(2) == b"hi"


def test_ignored_source_subnet_bypasses_the_inbound_redirect(mesh: Mesh, keep: Keep) -> None:
    apply_rules(ProxyInitConfig(ipv6=False, subnets_to_ignore=(mesh.peer.address.network,)), mesh.meshed.netns)
    keep(netlab.connect(mesh.peer, mesh.meshed_ip, 8080))
    where, conn = netlab.landed(mesh.listeners)
    keep(conn)
    assert where == "meshed:8080"
