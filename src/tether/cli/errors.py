"""How the CLI turns failures into messages and exit codes (0 ok, 1 error, 2 usage)."""

from __future__ import annotations

import click


class CliError(click.ClickException):
    """An error the user can act on; printed as ``error: <message>`` with exit code 1."""

    exit_code = 1

    def show(self, file=None) -> None:  # noqa: ANN001 - click's signature
        click.echo(f"error: {self.format_message()}", err=True)
