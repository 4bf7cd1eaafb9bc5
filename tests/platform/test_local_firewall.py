"""firewall.apply_rules installs proxy-init's chains in a pod namespace, idempotently, host untouched."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import netlab
import pytest

from tether.platform.local.firewall import FirewallBinaries, apply_rules
from tether.platform.local.netns import CommandError, LocalNetError, PodNet
from tether.platform.local.proxy_init import ProxyInitConfig, nat_rules, parse_ports, parse_subnets

BACKENDS = [
    pytest.param(FirewallBinaries(f"iptables{suffix}", f"iptables{suffix}-save"), id=f"iptables{suffix}")
    for suffix in ("", "-nft", "-legacy")
    if shutil.which(f"iptables{suffix}-restore") and shutil.which(f"ip6tables{suffix}-restore")
]
CUSTOM = ProxyInitConfig(
    proxy_gid=2102,
    inbound_ports_to_ignore=parse_ports("8080-8090", "inbound"),
    outbound_ports_to_ignore=parse_ports("443", "outbound"),
    subnets_to_ignore=parse_subnets("10.1.0.0/16,fd00::/8", "subnets"),
)


@pytest.mark.parametrize("binaries", BACKENDS)
def test_applied_rules_read_back_exactly(make_pod: Callable[..., PodNet], binaries: FirewallBinaries) -> None:
    host_before = netlab.host_nat()
    pod = make_pod("fw")
    assert not any("PROXY_INIT" in line for line in netlab.save_nat(pod, binaries.save_bin_path))

    apply_rules(CUSTOM, pod.netns, binaries)

    assert netlab.save_nat(pod, binaries.save_bin_path) == nat_rules(CUSTOM).splitlines()
    v6 = binaries.for_ipv6()
    assert netlab.save_nat(pod, v6.save_bin_path) == nat_rules(CUSTOM, ipv6=True).splitlines()
    assert netlab.host_nat() == host_before


def test_reapplying_replaces_and_keeps_other_rules(make_pod: Callable[..., PodNet]) -> None:
    pod = make_pod("re")
    other = "-A OUTPUT -p udp -m comment --comment not-ours -j RETURN"
    subprocess.run(
        ["ip", "netns", "exec", pod.netns, "iptables-restore", "--noflush"],
        input=f"*nat\n{other}\nCOMMIT\n",
        text=True,
        check=True,
    )
    apply_rules(ProxyInitConfig(), pod.netns)
    apply_rules(ProxyInitConfig(), pod.netns)
    apply_rules(CUSTOM, pod.netns)

    saved = netlab.save_nat(pod)
    ours = [line for line in saved if line != other]
    assert other in saved
    assert ours == nat_rules(CUSTOM).splitlines()
    assert sum("-j PROXY_INIT_REDIRECT" in line for line in saved) == 1


def test_ipv6_off_leaves_ip6tables_alone(make_pod: Callable[..., PodNet]) -> None:
    pod = make_pod("v4")
    apply_rules(ProxyInitConfig(ipv6=False), pod.netns)
    assert any("PROXY_INIT_OUTPUT" in line for line in netlab.save_nat(pod))
    assert not any("PROXY_INIT" in line for line in netlab.save_nat(pod, "ip6tables-save"))


def test_refuses_the_hosts_own_namespace() -> None:
    before = netlab.host_nat()
    harmless = FirewallBinaries("/nonexistent/iptables", "/nonexistent/iptables-save")  # should the guard fail
    with pytest.raises(LocalNetError, match="refusing to redirect the host's own traffic"):
        apply_rules(ProxyInitConfig(ipv6=False), None, harmless)
    assert netlab.host_nat() == before


def test_missing_namespace_is_named() -> None:
    with pytest.raises(LocalNetError, match="'tp-no-such-ns' does not exist"):
        apply_rules(ProxyInitConfig(), "tp-no-such-ns")


def test_missing_binary_is_named(make_pod: Callable[..., PodNet]) -> None:
    pod = make_pod("bin")
    with pytest.raises(CommandError, match="no-such-iptables-save"):
        apply_rules(ProxyInitConfig(ipv6=False), pod.netns, FirewallBinaries("iptables", "no-such-iptables-save"))
    with pytest.raises(LocalNetError, match="--firewall-bin-path: cannot derive the ip6tables binary"):
        apply_rules(ProxyInitConfig(), pod.netns, FirewallBinaries("/opt/xt", "iptables-save"))
