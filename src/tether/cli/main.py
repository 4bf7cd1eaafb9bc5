"""Entry point of the ``tether`` command: the root group and its subcommands.

Subcommands are imported only when invoked, so ``tether get`` does not pay for
importing gRPC servers and ``--help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys

import click


# name -> "module:attribute" of the click command; listed in help order.
_COMMANDS = {
    "apply": "tether.cli.resources_cmds:apply",
    "get": "tether.cli.resources_cmds:get",
    "delete": "tether.cli.resources_cmds:delete",
    "identity": "tether.cli.identity:identity",
    "destination": "tether.cli.destination:destination",
    "policy": "tether.cli.policy:policy",
    "authz": "tether.cli.authz:authz",
    "diagnostics": "tether.cli.diagnostics:diagnostics",
    "init": "tether.cli.init_cmd:init",
    "network-validator": "tether.cli.network_validator:network_validator",
    "await": "tether.cli.await_cmd:await_",
    "up": "tether.cli.up:up",
    "down": "tether.cli.up:down",
    "status": "tether.cli.up:status",
    "stat": "tether.cli.stat_cmd:stat",
    "viz": "tether.cli.viz:viz",
    "logs": "tether.cli.up:logs",
    "platform": "tether.cli.up:platform",
    "proxy": "tether.cli.proxy_cmd:proxy",
    "inject": "tether.cli.inject_cmd:inject",
    "uninject": "tether.cli.inject_cmd:uninject",
    "injector": "tether.cli.injector_cmd:injector",
    "install": "tether.cli.install_cmd:install",
    "upgrade": "tether.cli.install_cmd:upgrade",
    "uninstall": "tether.cli.install_cmd:uninstall",
    "check": "tether.cli.check:check",
    "diagnose": "tether.cli.diagnose:diagnose",
    "profile": "tether.cli.profile_cmd:profile",
    "version": "tether.cli.version_cmd:version",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = _COMMANDS.get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Tether: a service mesh implementing Linkerd 2.20's architecture."""


def main() -> None:
    """Run the CLI; never lets a Python traceback reach the user for bad input."""
    try:
        cli.main(prog_name="tether", standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)
