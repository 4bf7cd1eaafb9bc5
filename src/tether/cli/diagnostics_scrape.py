"""``tether diagnostics proxy-metrics`` and ``controller-metrics``: the raw ``/metrics`` of proxies and components.

    tether diagnostics proxy-metrics deploy/web -n emojivoto
    tether diagnostics proxy-metrics po/web-6d8f...-x2x9k -n emojivoto
    tether diagnostics controller-metrics

As ``linkerd diagnostics``: each answer is printed whole, under a ``# POD NAME (i of
n)`` (or ``# COMPONENT NAME``) banner.  On the local platform proxies are asked at
their pod's IP, admin port 4191, and components at their admin address.  Exits 1
when one of them could not be read (the others are still printed).  Registered on
``tether diagnostics`` by ``tether.cli.diagnostics``.
"""

from __future__ import annotations

import sys

import click

from tether.cli import home
from tether.cli.errors import CliError
from tether.cli.up import component_specs
from tether.diagnose import facts, proxies
from tether.platform.local import config as platform_config
from tether.platform.local.config import LocalPlatformConfig, PlatformConfigError
from tether.platform.local.launcher import Launcher
from tether.store import Store, StoreError


def local_config() -> LocalPlatformConfig:
    state = home.state_dir()
    try:
        config = platform_config.load(state)
    except PlatformConfigError as exc:
        raise CliError(str(exc)) from None
    if config is None:
        raise CliError(f"no local platform in {state}: run `tether up`")
    return config


def resolve_pods(config: LocalPlatformConfig, targets: tuple[str, ...], namespace: str) -> list[dict]:
    try:
        with Store(config.layout.store) as store:
            return [pod for target in targets for pod in facts.workload_pods(store, target, namespace)]
    except (facts.TargetError, StoreError) as exc:
        raise CliError(str(exc)) from None


def _banner(title: str) -> None:
    click.echo(f"#\n# {title}\n#")


@click.command("proxy-metrics")
@click.argument("targets", nargs=-1, required=True, metavar="po/NAME|deploy/NAME...")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True)
def proxy_metrics(targets: tuple[str, ...], namespace: str, timeout: float) -> None:
    """The raw /metrics of the proxies of pods or of a deployment's pods."""
    config = local_config()
    pods = resolve_pods(config, targets, namespace)
    failed = False
    for index, pod in enumerate(pods, 1):
        name = pod["metadata"]["name"]
        _banner(f"POD {name} ({index} of {len(pods)})")
        ip = proxies.pod_ip(pod)
        problem = None
        if not facts.meshed(pod):
            problem = f"pod {name} has no linkerd-proxy container"
        elif not ip:
            problem = f"pod {name} has no IP (not running)"
        else:
            try:
                answer = proxies.admin_get(ip, "/metrics", timeout)
                if answer.status != 200:
                    problem = f"{ip}:{proxies.ADMIN_PORT}/metrics answered {answer.status}"
                else:
                    click.echo(answer.body, nl=not answer.body.endswith("\n"))
            except proxies.ProxyUnreachable as exc:
                problem = str(exc)
        if problem:
            failed = True
            click.echo(f"error: {problem}", err=True)
    if failed:
        sys.exit(1)


@click.command("controller-metrics")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True)
def controller_metrics(timeout: float) -> None:
    """The raw /metrics of each control-plane component."""
    config = local_config()
    launcher = Launcher(config.layout.components, config.layout.logs)
    failed = False
    for spec in component_specs(config):
        _banner(f"COMPONENT {spec.name} ({spec.admin_url})")
        record = launcher.running(spec.name)
        if record is None:
            failed = True
            click.echo(f"error: {spec.name} is not running", err=True)
            continue
        host, _, port = record.admin_url.removeprefix("http://").rpartition(":")
        try:
            answer = proxies.admin_get(host, "/metrics", timeout, port=int(port))
        except proxies.ProxyUnreachable as exc:
            failed = True
            click.echo(f"error: {spec.name}: {exc}", err=True)
            continue
        if answer.status != 200:
            failed = True
            click.echo(f"error: {spec.name}: /metrics answered {answer.status}", err=True)
            continue
        click.echo(answer.body, nl=not answer.body.endswith("\n"))
    if failed:
        sys.exit(1)
