"""``tether diagnostics proxy-metrics`` and ``controller-metrics``: the raw ``/metrics`` of proxies and components.

    tether diagnostics proxy-metrics deploy/web -n emojivoto
    tether diagnostics proxy-metrics po/web-6d8f...-x2x9k -n emojivoto
    tether diagnostics controller-metrics

As ``linkerd diagnostics``: each answer is printed whole, under a ``# POD NAME (i of
n)`` (or ``# COMPONENT NAME``) banner.  On the local platform proxies are asked at
their pod's IP, admin port 4191, and components at their admin address; with
``--platform kubernetes`` every pod is asked through the API server
(``tether.diagnose.kube_metrics``).  Exits 1 when one of them could not be read
(the others are still printed).  Registered on
``tether diagnostics`` by ``tether.cli.diagnostics``.
"""

from __future__ import annotations

import asyncio
import sys

import click

from tether.cli import home
from tether.cli.errors import CliError
from tether.cli.platform_opts import Platform, platform_options
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


def _emit(title: str, text: str | None, error: str | None) -> bool:
    """Print one answer under its banner; False when it failed (the error goes to stderr)."""
    _banner(title)
    if error is not None:
        click.echo(f"error: {error}", err=True)
        return False
    assert text is not None
    click.echo(text, nl=not text.endswith("\n"))
    return True


def _local_proxy(config: LocalPlatformConfig, pod: dict, timeout: float) -> tuple[str | None, str | None]:
    name, ip = pod["metadata"]["name"], proxies.pod_ip(pod)
    if not facts.meshed(pod):
        return None, f"pod {name} has no linkerd-proxy container"
    if not ip:
        return None, f"pod {name} has no IP (not running)"
    try:
        answer = proxies.admin_get(ip, "/metrics", timeout, netns=facts.netns_of(config, pod))
    except proxies.ProxyUnreachable as exc:
        return None, str(exc)
    if answer.status != 200:
        return None, f"{ip}:{proxies.ADMIN_PORT}/metrics answered {answer.status}"
    return answer.body, None


async def _kube_proxies(platform: Platform, targets: tuple[str, ...], namespace: str) -> list[tuple[str, str | None,
                                                                                                     str | None]]:
    from tether.diagnose import kube_metrics
    from tether.platform.kubernetes.client import KubeClient, KubeError

    client = KubeClient(platform.client_settings())
    try:
        pods = await kube_metrics.workload_pods(client, targets, namespace)
        out = []
        for pod in pods:
            scraped = await kube_metrics.scrape(client, pod, kube_metrics.PROXY_ADMIN_PORT)
            out.append((scraped.pod, scraped.text, scraped.error))
        return out
    except (kube_metrics.TargetNotFound, KubeError) as exc:
        raise CliError(str(exc)) from None
    finally:
        await client.close()


async def _kube_components(platform: Platform, namespace: str) -> list[tuple[str, str | None, str | None]]:
    from tether.diagnose import kube_metrics
    from tether.platform.kubernetes.client import KubeClient, KubeError

    client = KubeClient(platform.client_settings())
    try:
        out = []
        for pod in await kube_metrics.control_plane_pods(client, namespace):
            port = kube_metrics.admin_port(pod)
            if port is None:
                out.append((pod["metadata"]["name"], None, "no container port named admin-http"))
                continue
            scraped = await kube_metrics.scrape(client, pod, port)
            out.append((scraped.pod, scraped.text, scraped.error))
        if not out:
            raise CliError(f"no control plane pods in namespace {namespace}")
        return out
    except KubeError as exc:
        raise CliError(str(exc)) from None
    finally:
        await client.close()


@click.command("proxy-metrics")
@click.argument("targets", nargs=-1, required=True, metavar="po/NAME|deploy/NAME...")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True)
@platform_options
def proxy_metrics(targets: tuple[str, ...], namespace: str, timeout: float, platform: Platform) -> None:
    """The raw /metrics of the proxies of pods or of a deployment's pods."""
    if platform.kubernetes:
        answers = asyncio.run(_kube_proxies(platform, targets, namespace))
    else:
        config = local_config()
        pods = resolve_pods(config, targets, namespace)
        answers = [(p["metadata"]["name"], *_local_proxy(config, p, timeout)) for p in pods]
    ok = [_emit(f"POD {name} ({i} of {len(answers)})", text, error)
          for i, (name, text, error) in enumerate(answers, 1)]
    if not all(ok):
        sys.exit(1)


@click.command("controller-metrics")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True)
@click.option("-L", "--control-plane-ns", "--linkerd-namespace", default="linkerd", show_default=True,
              help="With --platform kubernetes: the control plane's namespace.")
@platform_options
def controller_metrics(timeout: float, control_plane_ns: str, platform: Platform) -> None:
    """The raw /metrics of each control-plane component."""
    if platform.kubernetes:
        answers = [(f"POD {name}", text, error) for name, text, error in
                   asyncio.run(_kube_components(platform, control_plane_ns))]
    else:
        from tether.cli.up import component_specs  # the local platform's components (and their imports)

        config = local_config()
        launcher = Launcher(config.layout.components, config.layout.logs)
        answers = [(f"COMPONENT {spec.name} ({spec.admin_url})", *_local_component(launcher, spec.name, timeout))
                   for spec in component_specs(config)]
    ok = [_emit(title, text, error) for title, text, error in answers]
    if not all(ok):
        sys.exit(1)


def _local_component(launcher: Launcher, name: str, timeout: float) -> tuple[str | None, str | None]:
    record = launcher.running(name)
    if record is None:
        return None, f"{name} is not running"
    host, _, port = record.admin_url.removeprefix("http://").rpartition(":")
    try:
        answer = proxies.admin_get(host, "/metrics", timeout, port=int(port))
    except proxies.ProxyUnreachable as exc:
        return None, f"{name}: {exc}"
    if answer.status != 200:
        return None, f"{name}: /metrics answered {answer.status}"
    return answer.body, None
