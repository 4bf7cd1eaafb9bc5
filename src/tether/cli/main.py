"""Entry point of the ``tether`` command: the root group and its subcommands."""

from __future__ import annotations

import sys

import click

from tether import __version__
from tether.cli.resources_cmds import apply, delete, get


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Tether: a service mesh implementing Linkerd 2.20's architecture."""


@cli.command()
def version() -> None:
    """Print the client version."""
    click.echo(f"Client version: {__version__}")


for _command in (apply, get, delete):
    cli.add_command(_command)


def main() -> None:
    """Run the CLI; never lets a Python traceback reach the user for bad input."""
    try:
        cli.main(prog_name="tether", standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)
