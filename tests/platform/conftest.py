"""Fixtures for the local platform's kernel tests: this run's host network, IPAM and pods.

The session fixture first removes leftovers of dead test runs, then owns one name prefix and
one /24 pod range (both derived from the pid) and tears everything of that prefix down at the
end.  Each pod and each socket is removed by its own finalizer, even when the test fails.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import socket
from collections.abc import Callable, Iterator

import netlab
import pytest

from tether.platform.local.firewall import FirewallBinaries, apply_rules
from tether.platform.local.ipam import Ipam, IpamConfig
from tether.platform.local.netns import HostNet, NetnsConfig, PodNet
from tether.platform.local.proxy_init import ProxyInitConfig


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[netlab.Lab]:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"):
        pytest.skip("needs root, iproute2 and iptables")
    netlab.remove_dead_runs()
    pid = os.getpid()
    prefix = netlab.run_prefix(pid)
    net = HostNet(NetnsConfig(prefix=prefix, bridge=prefix + "br"))
    cidr = ipaddress.IPv4Network(f"10.199.{pid % 256}.0/24")
    ipam = Ipam(IpamConfig(state_dir=tmp_path_factory.mktemp("ipam"), pod_cidr=cidr))
    try:
        yield netlab.Lab(net, ipam)
    finally:
        net.teardown_all()


_pod_numbers = itertools.count()


@pytest.fixture
def make_pod(lab: netlab.Lab, request: pytest.FixtureRequest) -> Callable[..., PodNet]:
    """Make a pod (bridge ensured, address from IPAM), optionally with proxy-init's rules."""

    def make(name: str, rules: ProxyInitConfig | None = None, binaries: FirewallBinaries = FirewallBinaries()) -> PodNet:
        pod_name = f"{name}{next(_pod_numbers)}"
        lab.net.ensure_bridge(lab.ipam.gateway)
        address = lab.ipam.allocate(pod_name)
        request.addfinalizer(lambda: lab.ipam.release(pod_name))
        request.addfinalizer(lambda: lab.net.delete_pod(pod_name))
        pod = lab.net.create_pod(pod_name, address, lab.ipam.gateway.ip)
        if rules is not None:
            apply_rules(rules, pod.netns, binaries)
        return pod

    return make


@pytest.fixture
def keep(request: pytest.FixtureRequest) -> Callable[[socket.socket], socket.socket]:
    """Close this socket when the test ends."""

    def register(sock: socket.socket) -> socket.socket:
        request.addfinalizer(sock.close)
        return sock

    return register
