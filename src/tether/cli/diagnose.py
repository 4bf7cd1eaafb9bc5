"""``tether diagnose TARGET [--to AUTHORITY]``: the first failing layer of a workload's call, with evidence.

    tether diagnose deploy/web -n emojivoto
    tether diagnose deploy/web -n emojivoto --to emoji-svc.emojivoto:8080 -o json

Walks injection -> redirection -> identity -> discovery -> policy -> proxy ->
application on the local platform (``tether.diagnose.layers``) and prints the
failing layer first, its reason, the evidence and what to do next; ``-o json``
prints the contract of ``docs/diagnose.md``.  Exits 0 when the call is ok, 1 when
a layer failed.  Registered on the root group by ``tether.cli.main``.
"""

from __future__ import annotations

import json
import sys

import click

from tether.cli.diagnostics_scrape import local_config
from tether.cli.errors import CliError
from tether.diagnose.layers import DiagnoseError, Diagnosis, LocalDiagnosis
from tether.store import StoreError


def _print(result: Diagnosis) -> None:
    subject = result.target + (f" -> {result.to}" if result.to else "")
    if result.ok:
        click.echo(f"ok: {subject}")
        click.echo(f"  {result.reason}")
    else:
        click.echo(f"{result.layer}: FAILED: {subject}")
        click.echo(f"  {result.reason}")
        click.echo(f"  next: {result.next}")
    if result.passed:
        click.echo("  layers passed: " + ", ".join(result.passed))
    if result.evidence:
        click.echo("  evidence:")
        for item in result.evidence:
            click.echo(f"    {item.source}: {item.detail}")


@click.command()
@click.argument("target")
@click.option("--to", "to", metavar="AUTHORITY",
              help="The service the workload calls: SVC.NS:PORT or SVC.NS.svc.CLUSTER-DOMAIN:PORT.")
@click.option("-n", "--namespace", default="default", show_default=True, help="The namespace of TARGET.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def diagnose(target: str, to: str | None, namespace: str, output: str) -> None:
    """Find the first layer at which TARGET (deploy/NAME or po/NAME), or its call to --to, fails."""
    config = local_config()
    try:
        result = LocalDiagnosis(config).run(target, namespace, to)
    except (DiagnoseError, StoreError) as exc:
        raise CliError(str(exc)) from None
    if output == "json":
        click.echo(json.dumps(result.as_json(), indent=2))
    else:
        _print(result)
    if not result.ok:
        sys.exit(1)
