"""``tether check``: health checks of the control plane and (with ``--proxy``) the data plane, as ``linkerd check``.

    tether check                      # the local platform of $TETHER_HOME
    tether check --proxy -n emojivoto # ... and the meshed pods of one namespace
    tether check --pre                # can a platform be started here?
    tether check -o json
    tether check --platform kubernetes [--kubeconfig FILE] [--crds | --pre | --proxy]
    tether check --platform kubernetes --linkerd-cni-enabled --expected-version 0.1.0

Prints each category as Linkerd does (``√``, ``‼`` for a warning, ``×`` with the
error and a hint), then ``Status check results are √`` (or ``×``); exits 0 only
when no check failed (warnings do not fail).  ``--wait`` retries the checks that
can become true by waiting (components and proxies becoming ready) for up to that
long, printing what it waits for on stderr.  The categories live in
``tether.diagnose.local`` and ``tether.diagnose.kube``.  Registered on the root
group by ``tether.cli.main``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import click

from tether import __version__
from tether.cli import home
from tether.cli.platform_opts import Platform, platform_options
from tether.cli.up import component_specs
from tether.diagnose import checks
from tether.diagnose.local import LocalChecks

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(ctx: click.Context, param: click.Parameter, value: str) -> float:
    text = value.strip()
    for unit in sorted(_DURATION_UNITS, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * _DURATION_UNITS[unit]
    if text.replace(".", "", 1).isdigit():
        return float(text)
    raise click.BadParameter(f"{value!r} is not a duration such as 30s, 5m or 0", param_hint="--wait")


def _install_objects() -> Any:
    """What `tether install` (default values) makes: the objects linkerd-existence looks for."""
    from datetime import UTC, datetime

    from tether.cli.install_cmd import build_values, complete_credentials, credentials_from, render_all
    from tether.cli.manifests import crds as crd_manifests
    from tether.diagnose.kube import Expected

    values = build_values(False, None, (), ())
    creds = complete_credentials(credentials_from(values, None, None, None), values, False, datetime.now(UTC))
    objects = [*crd_manifests.render(values), *render_all(values, creds, False)]
    namespace = next(o["metadata"]["name"] for o in objects if o["kind"] == "Namespace")
    return Expected(namespace, [(o["kind"], o["metadata"]["name"]) for o in objects])


@click.command()
@click.option("--pre", is_flag=True, help="Only check that a control plane can be started here.")
@click.option("--proxy", is_flag=True, help="Also check the data plane (meshed pods' proxies).")
@click.option("--crds", is_flag=True, help="Only check that the control plane's CRDs exist (Kubernetes).")
@click.option("-n", "--namespace", help="With --proxy: only the pods of this namespace [default: all].")
@click.option("--wait", default="5m", show_default=True, callback=_seconds,
              help="How long to retry checks that may pass by waiting (0: no retries).")
@click.option("-o", "--output", type=click.Choice(["table", "json", "short"]), default="table", show_default=True)
@click.option("--linkerd-cni-enabled", is_flag=True,
              help="Kubernetes: the Linkerd CNI plugin is used (also read from linkerd-config's cniEnabled): "
                   "run the linkerd-cni-plugin checks.")
@click.option("--cni-namespace", default="linkerd-cni", show_default=True,
              help="Kubernetes: the namespace of the Linkerd CNI plugin.")
@click.option("--expected-version", metavar="VERSION",
              help="Kubernetes: the latest version, to check that the cli and control plane are up-to-date "
                   "(Tether has no release channel to ask; without it those checks warn).")
@platform_options
def check(pre: bool, proxy: bool, crds: bool, namespace: str | None, wait: float, output: str,
          linkerd_cni_enabled: bool, cni_namespace: str, expected_version: str | None, platform: Platform) -> None:
    """Check the mesh's health, with Linkerd's categories and wording."""
    if pre and proxy:
        raise click.UsageError("--pre and --proxy cannot be used together")
    if namespace is not None and not proxy:
        raise click.UsageError("-n/--namespace selects the data plane: give --proxy too")
    kube = None
    if platform.kubernetes:
        from tether.diagnose.kube import KubeChecks, Options

        options = Options(linkerd_cni_enabled, cni_namespace, expected_version)
        kube = KubeChecks(platform.client_settings(), __version__, namespace, _install_objects(), options=options)
        categories = kube.categories(pre=pre, crds=crds, proxy=proxy)
    elif crds:
        raise click.UsageError("--crds checks a Kubernetes cluster: give --platform kubernetes")
    elif linkerd_cni_enabled or cni_namespace != "linkerd-cni" or expected_version is not None:
        raise click.UsageError("--linkerd-cni-enabled, --cni-namespace and --expected-version check a Kubernetes "
                               "cluster: give --platform kubernetes")
    else:
        categories = LocalChecks(home.state_dir(), component_specs, __version__, namespace).categories(
            proxy=proxy, pre=pre)

    try:
        success = run_categories(categories, output, wait)
    finally:
        if kube is not None:
            kube.close()
    if not success:
        sys.exit(1)


def run_categories(categories: Iterable[checks.Category], output: str, wait: float) -> bool:
    """Run ``categories`` and print them as ``tether check`` does (``-o``: basic, short or json; ``--wait``
    progress on stderr); whether no check failed. ``tether viz check`` prints its categories through it too."""

    def progress(category: str, description: str, error: str) -> None:
        if output != "json":
            click.echo(f"waiting: {category}: {description}: {error.splitlines()[0]}", err=True)

    if output == "json":
        report = checks.run(categories, wait=wait, progress=progress)
        click.echo(json.dumps(checks.render_json(report), indent=2))
    else:
        printer = checks.TextPrinter(click.echo, short=output == "short")
        report = checks.run(categories, printer, wait=wait, progress=progress)
        printer.finish(report)
    return report.success
