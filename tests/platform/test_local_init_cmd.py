"""``tether init``: Linkerd proxy-init's flags, --simulate output, applying in --netns, clear errors."""

from __future__ import annotations

from collections.abc import Callable

import netlab
import pytest
from click.testing import CliRunner, Result

from tether.cli.init_cmd import init
from tether.platform.local.netns import PodNet
from tether.platform.local.proxy_init import ProxyInitConfig, nat_rules, parse_ports, parse_subnets


def _init(*args: str) -> Result:
    result = CliRunner().invoke(init, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_simulate_prints_linkerds_default_rules_for_both_families() -> None:
    result = _init("--simulate")
    assert result.exit_code == 0
    expected = nat_rules(ProxyInitConfig())
    assert result.stdout == f"# iptables-restore --noflush\n{expected}# ip6tables-restore --noflush\n{expected}"


def test_simulate_with_linkerd_chart_arguments() -> None:
    result = _init(
        "--firewall-bin-path", "iptables-nft",
        "--firewall-save-bin-path", "iptables-nft-save",
        "--ipv6=false",
        "--incoming-proxy-port", "4143",
        "--outgoing-proxy-port", "4140",
        "--proxy-uid", "2102",
        "--proxy-gid", "2103",
        "--inbound-ports-to-ignore", "4190,4191,4567,4568",
        "--inbound-ports-to-ignore", "9000-9010",
        "--outbound-ports-to-ignore", "443,6443",
        "--subnets-to-ignore", "10.1.0.0/16",
        "--simulate",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = ProxyInitConfig(
        proxy_gid=2103,
        inbound_ports_to_ignore=parse_ports("4190,4191,4567,4568,9000-9010", "i"),
        outbound_ports_to_ignore=parse_ports("443,6443", "o"),
        subnets_to_ignore=parse_subnets("10.1.0.0/16", "s"),
        ipv6=False,
    )
    assert result.stdout == "# iptables-nft-restore --noflush\n" + nat_rules(config)
    assert "--dports 4190,4191,4567,4568,9000:9010 " in result.stdout


def test_no_uid_rule_with_minus_one() -> None:
    result = _init("--simulate", "--ipv6=false", "--proxy-uid", "-1")
    assert result.exit_code == 0
    assert "--uid-owner" not in result.stdout and "--gid-owner" not in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--incoming-proxy-port", "0"], "error: invalid --incoming-proxy-port: 0 is not a valid TCP port number"),
        (["--outgoing-proxy-port", "65536"], "error: invalid --outgoing-proxy-port: 65536 is not a valid TCP port number"),
        (["--inbound-ports-to-ignore", "80,9-1"], "error: invalid --inbound-ports-to-ignore: '9-1' is not a range"),
        (["--outbound-ports-to-ignore", "https"], "error: invalid --outbound-ports-to-ignore: 'https' is not a port"),
        (["--subnets-to-ignore", "10.0.0.0/40"], "error: invalid --subnets-to-ignore: '10.0.0.0/40' is not a valid CIDR"),
        (["--netns", "tp-no-such-ns"], "error: --netns: network namespace 'tp-no-such-ns' does not exist"),
        # Binaries that do not exist: should the guard ever fail, nothing touches the host.
        (
            ["--ipv6=false", "--firewall-bin-path", "/nonexistent/iptables", "--firewall-save-bin-path", "/nonexistent/save"],
            "error: refusing to redirect the host's own traffic: name a pod namespace with --netns",
        ),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    result = _init(*args)
    assert result.exit_code == 1
    assert result.stderr.startswith(message)
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "flag"), [(["--proxy-uid", "root"], "--proxy-uid"), (["--ipv6=maybe"], "--ipv6")])
def test_malformed_values_are_usage_errors_naming_the_flag(args: list[str], flag: str) -> None:
    result = _init(*args)
    assert result.exit_code == 2
    assert f"Invalid value for '{flag}'" in result.stderr


def test_applies_in_the_named_namespace(make_pod: Callable[..., PodNet]) -> None:
    pod = make_pod("cli")
    host_before = netlab.host_nat()
    result = _init("--netns", pod.netns, "--outbound-ports-to-ignore", "443")
    assert result.exit_code == 0, result.output
    config = ProxyInitConfig(outbound_ports_to_ignore=parse_ports("443", "o"))
    assert netlab.save_nat(pod) == nat_rules(config).splitlines()
    assert netlab.save_nat(pod, "ip6tables-save") == nat_rules(config, ipv6=True).splitlines()
    assert netlab.host_nat() == host_before
