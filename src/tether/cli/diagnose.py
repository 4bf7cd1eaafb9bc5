"""``tether diagnose TARGET [--to AUTHORITY]``: the first failing layer of a workload's call, with evidence.

    tether diagnose deploy/web -n emojivoto
    tether diagnose deploy/web -n emojivoto --to emoji-svc.emojivoto:8080 -o json
    tether diagnose deploy/web -n emojivoto --to emoji-svc.emojivoto:8080 --platform kubernetes

Walks injection -> redirection -> identity -> discovery -> policy -> proxy ->
application on the local platform (``tether.diagnose.layers``) or, with
``--platform kubernetes``, against the API server and through its port-forwards
(``tether.diagnose.kube_layers``), and prints the failing layer first, its
reason, the evidence and what to do next; ``-o json`` prints the contract of
``docs/diagnose.md``.  Exits 0 when the call is ok, 1 when a layer failed.
Registered on the root group by ``tether.cli.main``.
"""

from __future__ import annotations

import asyncio
import json
import sys

import click

from tether.cli.diagnostics_scrape import local_config
from tether.cli.errors import CliError
from tether.cli.platform_opts import Platform, platform_options
from tether.diagnose.layers import LocalDiagnosis
from tether.diagnose.walk import DiagnoseError, Diagnosis
from tether.naming import DEFAULT_CONTROL_PLANE_NS
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
@click.option("-L", "--control-plane-ns", default=DEFAULT_CONTROL_PLANE_NS, show_default=True,
              help="With --platform kubernetes: the control plane's namespace.")
@platform_options
def diagnose(target: str, to: str | None, namespace: str, output: str, control_plane_ns: str,
             platform: Platform) -> None:
    """Find the first layer at which TARGET (deploy/NAME or po/NAME), or its call to --to, fails.

    On the local platform the proxy and application layers make one real call from
    inside the source pod.  With --platform kubernetes every fact comes from the API
    server and, through its port-forward, from the proxies (metrics, served
    certificate) and the destination and policy controllers; no call is made: those
    two layers judge the traffic the proxies already carried.
    """
    try:
        if platform.kubernetes:
            result = asyncio.run(_kube(platform, target, namespace, to, control_plane_ns))
        else:
            if control_plane_ns != DEFAULT_CONTROL_PLANE_NS:
                raise click.UsageError("-L/--control-plane-ns is for --platform kubernetes (the local platform's "
                                       "control plane is in $TETHER_HOME)")
            result = LocalDiagnosis(local_config()).run(target, namespace, to)
    except (DiagnoseError, StoreError) as exc:
        raise CliError(str(exc)) from None
    if output == "json":
        click.echo(json.dumps(result.as_json(), indent=2))
    else:
        _print(result)
    if not result.ok:
        sys.exit(1)


async def _kube(platform: Platform, target: str, namespace: str, to: str | None, control_plane_ns: str) -> Diagnosis:
    from tether.cli import kube_forward  # its gRPC channel module only for a cluster
    from tether.diagnose.kube_layers import KubeDiagnosis
    from tether.platform.kubernetes.client import KubeClient, KubeError

    client = KubeClient(platform.client_settings())
    try:
        return await KubeDiagnosis(client, kube_forward.tunnel_factory(platform), control_plane_ns).run(
            target, namespace, to)
    except KubeError as exc:
        raise DiagnoseError(str(exc)) from None
    finally:
        await client.close()
