"""``tether init``: Linkerd's proxy-init for a local pod - the nat rules that redirect its traffic.

Role: a thin shell over ``tether.platform.local.proxy_init`` (the rules) and
``tether.platform.local.firewall`` (applying them), with linkerd2-proxy-init's flag names and
Tether's defaults (Linkerd's chart values).  ``--netns NAME`` (a Tether addition) applies inside
that network namespace; ``--simulate`` prints the iptables-restore text instead.
Caller: ``tether.cli.main`` registers the command.
"""

from __future__ import annotations

import click

from tether.cli.errors import CliError
from tether.platform.local.firewall import FirewallBinaries, apply_rules
from tether.platform.local.netns import LocalNetError
from tether.platform.local.proxy_init import ProxyInitConfig, ProxyInitError, nat_rules, parse_ports, parse_subnets

_DEFAULT_SKIP_PORTS = "4567,4568"


@click.command("init")
@click.option("--incoming-proxy-port", "-p", type=int, default=4143, show_default=True, help="Port to redirect incoming traffic to.")
@click.option("--outgoing-proxy-port", "-o", type=int, default=4140, show_default=True, help="Port to redirect outgoing traffic to.")
@click.option("--proxy-uid", "-u", type=int, default=2102, show_default=True, help="Uid of the proxy, whose traffic is not redirected (-1: none).")
@click.option("--proxy-gid", "-g", type=int, default=-1, show_default=True, help="Gid of the proxy, whose traffic is not redirected (-1: none).")
@click.option(
    "--inbound-ports-to-ignore",
    multiple=True,
    default=[_DEFAULT_SKIP_PORTS],
    show_default=True,
    help="Inbound ports or ranges (4000-4010) not redirected; 4190 and 4191 always are not.",
)
@click.option(
    "--outbound-ports-to-ignore",
    multiple=True,
    default=[_DEFAULT_SKIP_PORTS],
    show_default=True,
    help="Outbound ports or ranges (4000-4010) not redirected.",
)
@click.option("--subnets-to-ignore", multiple=True, help="Source subnets (CIDR) whose inbound traffic is not redirected.")
@click.option("--firewall-bin-path", default="iptables", show_default=True, help="iptables binary; <path>-restore applies the rules.")
@click.option("--firewall-save-bin-path", default="iptables-save", show_default=True, help="iptables-save binary.")
@click.option(
    "--ipv6",
    type=click.BOOL,
    default=True,
    is_flag=False,
    flag_value=True,
    show_default=True,
    help="Also set the rules with ip6tables (--ipv6=false to skip).",
)
@click.option("--simulate", is_flag=True, help="Print the iptables-restore text instead of applying it.")
@click.option("--netns", metavar="NAME", help="Network namespace (as in `ip netns list`) to apply the rules in.")
def init(
    incoming_proxy_port: int,
    outgoing_proxy_port: int,
    proxy_uid: int,
    proxy_gid: int,
    inbound_ports_to_ignore: tuple[str, ...],
    outbound_ports_to_ignore: tuple[str, ...],
    subnets_to_ignore: tuple[str, ...],
    firewall_bin_path: str,
    firewall_save_bin_path: str,
    ipv6: bool,
    simulate: bool,
    netns: str | None,
) -> None:
    """Redirect a pod's TCP traffic through its proxy, as Linkerd's linkerd-init does."""
    try:
        config = ProxyInitConfig(
            incoming_proxy_port=incoming_proxy_port,
            outgoing_proxy_port=outgoing_proxy_port,
            proxy_uid=proxy_uid if proxy_uid > 0 else None,
            proxy_gid=proxy_gid if proxy_gid > 0 else None,
            inbound_ports_to_ignore=parse_ports(inbound_ports_to_ignore, "inbound_ports_to_ignore"),
            outbound_ports_to_ignore=parse_ports(outbound_ports_to_ignore, "outbound_ports_to_ignore"),
            subnets_to_ignore=parse_subnets(subnets_to_ignore, "subnets_to_ignore"),
            ipv6=ipv6,
        )
    except ProxyInitError as err:
        raise CliError(f"invalid --{err.field.replace('_', '-')}: {err.reason}") from None
    binaries = FirewallBinaries(firewall_bin_path, firewall_save_bin_path)
    try:
        if simulate:
            click.echo(f"# {binaries.restore_path} --noflush")
            click.echo(nat_rules(config), nl=False)
            if config.ipv6:
                click.echo(f"# {binaries.for_ipv6().restore_path} --noflush")
                click.echo(nat_rules(config, ipv6=True), nl=False)
        else:
            apply_rules(config, netns, binaries)
    except LocalNetError as err:
        raise CliError(str(err)) from None
