"""``tether viz``: Prometheus for the mesh, and the commands that read it (``linkerd viz``).

    tether viz install                       # Prometheus + discovery on the local platform (loopback only)
    tether viz stat deploy -n emojivoto      # golden metrics per deployment, from Prometheus
    tether viz stat deploy/web --to deploy/emoji -n emojivoto
    tether viz routes deploy/web -n emojivoto
    tether viz edges deploy -n emojivoto
    tether viz authz deploy/web -n emojivoto
    tether viz check
    tether viz dashboard

Every reading command asks Prometheus: the one ``viz install`` started (its
URL is in ``<state>/viz/viz.json``), or the user's own with
``--prometheus-url`` (or ``TETHER_PROMETHEUS_URL``).  Objects (which
deployments exist, meshed pod counts, ServiceProfiles, identities) come from
the store of ``$TETHER_HOME``.  ``tether stat`` is ``tether viz stat``.
Registered on the root group by ``tether.cli.main``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tether.cli import home
from tether.cli.errors import CliError
from tether.identity import pem, pki
from tether.naming import TRUST_ROOTS_CONFIGMAP, WorkloadIdentity, control_plane_identity
from tether.platform.local import config as platform_config
from tether.platform.local.config import LocalPlatformConfig, PlatformConfigError
from tether.store import Store
from tether.store.errors import StoreError
from tether.viz import local, tables
from tether.viz.objects import StoreObjects
from tether.viz.scrape_config import PROXY_JOB
from tether.viz import metrics_api as api
from tether.viz.prometheus import Prometheus, PrometheusError
from tether.viz.targets import NAMESPACE, Target, TargetError, kind_of, parse_one, parse_targets

DEFAULT_NAMESPACE = "default"
class Context:
    """What every reading command needs: the platform settings, the platform's objects and Prometheus."""

    def __init__(self, prometheus_url: str | None, kube: KubeTarget | None = None) -> None:
        state = home.state_dir()
        try:
            self.config = platform_config.load(state) or LocalPlatformConfig(state_dir=state)
        except PlatformConfigError as err:
            raise CliError(str(err)) from None
        try:
            self.settings = None if kube else local.load_settings(self.config)
        except local.VizError as err:
            raise CliError(str(err)) from None
        url = prometheus_url or (self.settings.url if self.settings else None)
        if url is None and kube:
            raise click.UsageError("--prometheus-url (or TETHER_PROMETHEUS_URL) is needed with --platform kubernetes")
        if url is None:
            raise CliError("no Prometheus to ask: run `tether viz install` (the local platform's own), "
                           "or pass --prometheus-url (or set TETHER_PROMETHEUS_URL) to use yours")
        try:
            self.prometheus = Prometheus(url)
        except PrometheusError as err:
            raise CliError(str(err)) from None
        self.store: Store | None = None
        self.objects: api.Objects
        if kube is not None:
            from tether.platform.kubernetes.client import ClientSettings
            from tether.viz.kube_objects import KubeObjects

            self.objects = KubeObjects(ClientSettings(kubeconfig=kube.kubeconfig, context=kube.context))
        else:
            path = self.config.layout.store
            if not path.exists():
                raise CliError(f"{path.parent}: no store here; start the platform with `tether up` "
                               "(or set TETHER_HOME)")
            try:
                self.store = Store(path)
            except StoreError as err:
                raise CliError(str(err)) from None
            self.objects = StoreObjects(self.store)
        self.mesh = api.Mesh(self.config.control_plane_ns, self.config.trust_domain, self.config.cluster_domain)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def run(self, call: Callable[[], Any]) -> Any:
        from tether.viz.kube_objects import ObjectsUnavailable

        try:
            return call()
        except (PrometheusError, ObjectsUnavailable) as err:
            raise CliError(str(err)) from None
        except (ValueError, LookupError) as err:
            raise CliError(str(err)) from None
        except StoreError as err:
            raise CliError(str(err)) from None
        finally:
            self.close()


@dataclass(frozen=True)
class KubeTarget:
    kubeconfig: Path | None
    context: str | None


def platform_option(f: Callable) -> Callable:
    """``--platform``, ``--kubeconfig``, ``--kube-context``: where the objects come from; the command gets ``kube``."""

    @functools.wraps(f)
    def wrapper(*args: Any, platform: str, kubeconfig: Path | None, kube_context: str | None, **kwargs: Any) -> Any:
        if platform != "kubernetes" and (kubeconfig or kube_context):
            raise click.UsageError("--kubeconfig and --kube-context need --platform kubernetes")
        kube = KubeTarget(kubeconfig, kube_context) if platform == "kubernetes" else None
        return f(*args, kube=kube, **kwargs)

    for option in reversed([
        click.option("--platform", type=click.Choice(["local", "kubernetes"]), default="local", show_default=True,
                     help="Where the objects (deployments, pods, profiles) come from: the local store or the API."),
        click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path),
                     help="(kubernetes) kubeconfig file [default: in-cluster, $KUBECONFIG, ~/.kube/config]."),
        click.option("--kube-context", help="(kubernetes) The kubeconfig context."),
    ]):
        wrapper = option(wrapper)
    return wrapper


def _window(value: str) -> str:
    try:
        api.window_seconds(value)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="-t/--time-window") from None
    return value


def prometheus_option(f: Callable) -> Callable:
    return click.option("--prometheus-url", envvar="TETHER_PROMETHEUS_URL",
                        help="Prometheus to query [default: the one `tether viz install` started].")(f)


def _namespace(namespace: str | None, all_namespaces: bool) -> str | None:
    return None if all_namespaces else (namespace or DEFAULT_NAMESPACE)


def _target(text: str, namespace: str | None, hint: str) -> Target:
    try:
        return parse_one(text, namespace)
    except TargetError as err:
        raise click.BadParameter(str(err), param_hint=hint) from None


@click.group()
def viz() -> None:
    """Watch the mesh's traffic: Prometheus, stat, routes, edges, authz and the dashboard."""


# -- install / uninstall / check ------------------------------------------------------------------


_LOCAL_ONLY = ("prometheus_url", "prometheus_port", "discovery_port", "tap_port", "tap_admin_port", "timeout")
_KUBERNETES_ONLY = ("viz_namespace", "prometheus_image", "output", "control_plane_ns", "trust_domain", "cluster_domain")


@viz.command()
@click.option("--platform", type=click.Choice(["local", "kubernetes"]), default="local", show_default=True,
              help="local: start viz on the local platform; kubernetes: print its manifests for kubectl apply -f -.")
@click.option("--viz-namespace", default="linkerd-viz", show_default=True, help="(kubernetes) The viz namespace.")
@click.option("--prometheus-image", default=None, help="(kubernetes) Prometheus' image [default: prom/prometheus:v2.55.1].")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="(kubernetes) The manifests' format.")
@click.option("--control-plane-ns", default="linkerd", show_default=True,
              help="(kubernetes) The control plane's namespace (tap's identity, the trust roots, the dashboard).")
@click.option("--trust-domain", default="cluster.local", show_default=True,
              help="(kubernetes) The mesh's trust domain (the identities tap and the dashboard check and show).")
@click.option("--cluster-domain", default="cluster.local", show_default=True,
              help="(kubernetes) The cluster's DNS domain.")
@click.option("--prometheus-url", help="Use this Prometheus (yours) instead of starting one.")
@click.option("--prometheus-port", type=click.IntRange(1, 65535), default=9090, show_default=True,
              help="Port of the local Prometheus (on 127.0.0.1).")
@click.option("--discovery-port", type=click.IntRange(1, 65535), default=9998, show_default=True,
              help="Admin port of the discovery process (on 127.0.0.1).")
@click.option("--tap-port", type=click.IntRange(1, 65535), default=8088, show_default=True,
              help="Port of the tap server's TapByResource (on 127.0.0.1).")
@click.option("--tap-admin-port", type=click.IntRange(1, 65535), default=9997, show_default=True,
              help="Admin port of the tap server (on 127.0.0.1).")
@click.option("--scrape-interval", default="10s", show_default=True, help="How often Prometheus scrapes.")
@click.option("--timeout", type=click.FloatRange(min=1), default=60, show_default=True,
              help="Seconds to wait for each component to become ready.")
@click.pass_context
def install(ctx: click.Context, platform: str, viz_namespace: str, prometheus_image: str | None, output: str,
            control_plane_ns: str, trust_domain: str, cluster_domain: str, prometheus_url: str | None,
            prometheus_port: int, discovery_port: int, tap_port: int, tap_admin_port: int, scrape_interval: str,
            timeout: float) -> None:
    """Start Prometheus (Linkerd's scrape configuration), its pod discovery and the tap server on the local
    platform; or, with --platform kubernetes, print the manifests of Prometheus, the tap injector and tap (its
    APIService)."""
    try:
        api.window_seconds(scrape_interval)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--scrape-interval") from None
    given = {name for name in ctx.params if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
    wrong = sorted(given & set(_LOCAL_ONLY if platform == "kubernetes" else _KUBERNETES_ONLY))
    if wrong:
        flags = ", ".join("--" + name.replace("_", "-") for name in wrong)
        raise click.UsageError(f"{flags}: not used with --platform {platform}")
    if platform == "kubernetes":
        mesh = api.Mesh(control_plane_ns, trust_domain, cluster_domain)
        _print_manifests(viz_namespace, mesh, prometheus_image, scrape_interval, output)
        return
    if prometheus_url is not None:
        try:
            Prometheus(prometheus_url)
        except PrometheusError as err:
            raise click.BadParameter(str(err), param_hint="--prometheus-url") from None
    from tether.cli.diagnostics_scrape import local_config

    config = local_config()
    settings = local.VizSettings(prometheus_port=prometheus_port, discovery_port=discovery_port,
                                 scrape_interval=scrape_interval, prometheus_url=prometheus_url, tap_port=tap_port,
                                 tap_admin_port=tap_admin_port)
    start_local(config, settings, timeout)


def start_local(config: LocalPlatformConfig, settings: local.VizSettings, timeout: float) -> None:
    """Install (settings, configuration, the tap certificate) and start viz on the local platform, waiting for each
    component; ``viz install`` and ``tether up`` (``--viz``, or viz installed before) call it."""
    from tether.cli.up import tether_argv

    try:
        _ensure_tap_cert(config)
        launcher, specs = local.install(config, settings, tether_argv())
    except (local.VizError, OSError, pem.PemError, pki.PkiError) as err:
        raise CliError(str(err)) from None
    click.echo(f"wrote {local.layout(config).prometheus_yml}")

    def progress(outcome: Any) -> None:
        if outcome.problem is None:
            click.echo(f"{outcome.name:<14} ready ({outcome.seconds:.1f}s)")
        else:
            click.echo(f"{outcome.name:<14} FAILED: {outcome.problem}; log: {outcome.log}", err=True)
            if outcome.log_tail:
                click.echo("\n".join(f"    {line}" for line in outcome.log_tail.splitlines()), err=True)

    outcomes = launcher.wait_ready([s.name for s in specs], timeout, progress)
    if any(o.problem for o in outcomes):
        raise CliError("viz did not start; see above (`tether viz uninstall` stops what did)")
    if settings.prometheus_url:
        click.echo(f"viz uses your Prometheus at {settings.prometheus_url}: give it the jobs of "
                   f"{local.layout(config).prometheus_yml} (file discovery under {local.layout(config).sd})")
    else:
        click.echo(f"Prometheus is up at {settings.url} (loopback only); try `tether viz stat deploy -A`")


@viz.command()
@click.option("--purge", is_flag=True, help="Also remove Prometheus' data and the configuration.")
def uninstall(purge: bool) -> None:
    """Stop Prometheus and the discovery process."""
    state = home.state_dir()
    try:
        config = platform_config.load(state) or LocalPlatformConfig(state_dir=state)
    except PlatformConfigError as err:
        raise CliError(str(err)) from None
    stopped = local.uninstall(config, purge=purge)
    click.echo(f"stopped {', '.join(stopped)}" if stopped else "viz was not running")


def _print_manifests(namespace: str, mesh: api.Mesh, image: str | None, scrape_interval: str, output: str) -> None:
    from tether import __version__
    from tether.naming import check_label, is_dns1123_subdomain
    from tether.viz import manifests

    for value, flag in ((namespace, "--viz-namespace"), (mesh.control_plane_ns, "--control-plane-ns")):
        try:
            check_label("namespace", value)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint=flag) from None
    for value, flag in ((mesh.trust_domain, "--trust-domain"), (mesh.cluster_domain, "--cluster-domain")):
        if not is_dns1123_subdomain(value):
            raise click.BadParameter(f"{value!r} is not a DNS-1123 subdomain such as cluster.local", param_hint=flag)
    from datetime import UTC, datetime

    from tether.cli.install_cmd import webhook_certificate

    now = datetime.now(UTC)
    tls = manifests.WebhookTls(*webhook_certificate(f"tap-injector.{namespace}.svc", mesh.cluster_domain, now))
    tap_tls = manifests.WebhookTls(*webhook_certificate(f"tap.{namespace}.svc", mesh.cluster_domain, now))
    docs = manifests.render(tap_injector_tls=tls, tap_tls=tap_tls, namespace=namespace,
                            control_plane_ns=mesh.control_plane_ns, trust_domain=mesh.trust_domain,
                            cluster_domain=mesh.cluster_domain,
                            prometheus_image=image or manifests.DEFAULT_PROMETHEUS_IMAGE,
                            scrape_interval=scrape_interval, version=__version__)
    _print_docs(docs, output)


def _print_docs(docs: list[dict[str, Any]], output: str) -> None:
    import yaml

    if output == "json":
        click.echo(json.dumps(docs, indent=2))
    else:
        click.echo(yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True), nl=False)


@viz.command("allow-scrapes")
@click.option("-n", "--namespace", required=True, help="The namespace in which to authorize Prometheus scrapes.")
@click.option("--platform", type=click.Choice(["local", "kubernetes"]), default="local", show_default=True,
              help="local: Prometheus scrapes from the host's bridge address; kubernetes: as viz's meshed "
                   "Prometheus (its ServiceAccount).")
@click.option("--viz-namespace", default="linkerd-viz", show_default=True,
              help="(kubernetes) The viz namespace: Prometheus' ServiceAccount and the kubelet authentication.")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="Output format.")
@click.pass_context
def allow_scrapes(ctx: click.Context, namespace: str, platform: str, viz_namespace: str, output: str) -> None:
    """Print the Server, HTTPRoutes and AuthorizationPolicies that let viz's Prometheus scrape the proxies of a
    namespace whose default inbound policy refuses it (e.g. deny): pipe them to `tether apply -f -` (or, with
    --platform kubernetes, `kubectl apply -f -`)."""
    from tether import __version__
    from tether.cli.diagnostics_scrape import local_config
    from tether.naming import check_label
    from tether.viz import allow_scrapes as scrapes

    for value, flag in ((namespace, "--namespace"), (viz_namespace, "--viz-namespace")):
        try:
            check_label("namespace", value)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint=flag) from None
    if platform == "kubernetes":
        _print_docs(scrapes.kubernetes(namespace, viz_namespace, __version__), output)
        return
    if ctx.get_parameter_source("viz_namespace") != click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--viz-namespace: not used with --platform local")
    _print_docs(scrapes.local(namespace, local_config().host_ip, __version__), output)


def _tap_identity(config: LocalPlatformConfig) -> WorkloadIdentity:
    return local.tap_workload(config)


def _ensure_tap_cert(config: LocalPlatformConfig) -> None:
    """The tap identity's certificate, signed by the platform's issuer (as the destination's is)."""
    from tether.cli.up import ensure_serving_cert

    lay = local.layout(config)
    lay.root.mkdir(parents=True, exist_ok=True)
    if ensure_serving_cert(config, _tap_identity(config), lay.tap_cert, lay.tap_key):
        click.echo(f"issued the tap server's certificate ({_tap_identity(config).dns_name})")


def _component_settings(state_dir: Path) -> tuple[LocalPlatformConfig, local.VizSettings]:
    """A viz component process's platform and viz settings; it logs to its launcher's log file."""
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = platform_config.load(state_dir)
        settings = local.load_settings(config) if config is not None else None
    except (PlatformConfigError, local.VizError) as err:
        raise CliError(str(err)) from None
    if config is None:
        raise CliError(f"{state_dir}: no platform settings; run `tether up`")
    if settings is None:
        raise CliError(f"{state_dir}: viz is not installed")
    return config, settings


@viz.command(hidden=True)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
def discovery(state_dir: Path) -> None:
    """Keep Prometheus' file-based discovery targets equal to the store's pods (started by `viz install`)."""
    config, settings = _component_settings(state_dir)
    try:
        store = Store(config.layout.store)
    except StoreError as err:
        raise CliError(str(err)) from None
    try:
        asyncio.run(local.serve_discovery(config, settings, store))
    finally:
        store.close()


@viz.command()
@click.option("--viz-namespace", help="(kubernetes) The viz namespace [default: the one labelled "
              "linkerd.io/extension=viz, else linkerd-viz].")
@click.option("--control-plane-ns", default="linkerd", show_default=True,
              help="(kubernetes) The control plane's namespace.")
@click.option("--wait", default="5m", show_default=True, callback=lambda c, p, v: _wait(c, p, v),
              help="How long to retry checks that may pass by waiting (0: no retries).")
@click.option("-o", "--output", type=click.Choice(["table", "json", "short"]), default="table", show_default=True,
              help="The report's format.")
@click.option("--proxy", is_flag=True, help="Also check that Prometheus holds the data plane's proxy metrics "
              "(linkerd-viz-data-plane; on kubernetes it needs --prometheus-url).")
@click.option("-n", "--namespace", help="With --proxy: only the pods of this namespace [default: all].")
@click.option("--expected-version", metavar="VERSION",
              help="(kubernetes) The latest version, to check that viz's proxies are up-to-date (Tether has no "
                   "release channel to ask; without it that check warns).")
@prometheus_option
@platform_option
@click.pass_context
def check(click_ctx: click.Context, viz_namespace: str | None, control_plane_ns: str, wait: float, output: str,
          proxy: bool, namespace: str | None, expected_version: str | None, prometheus_url: str | None,
          kube: KubeTarget | None) -> None:
    """Check viz with Linkerd's linkerd-viz category (and, with --proxy, linkerd-viz-data-plane): locally, viz's
    settings, the tap server's certificate, its components and Prometheus; on Kubernetes, against the API server.
    Exit 1 if one fails."""
    if kube is not None:
        if namespace is not None and not proxy:
            raise click.UsageError("-n/--namespace selects the data plane: give --proxy too")
        if proxy and prometheus_url is None:
            raise click.UsageError("--proxy asks Prometheus: give --prometheus-url (or TETHER_PROMETHEUS_URL)")
        prometheus = None
        if proxy and prometheus_url:
            try:
                prometheus = Prometheus(prometheus_url)
            except PrometheusError as err:
                raise click.BadParameter(str(err), param_hint="--prometheus-url") from None
        _check_kubernetes(kube, viz_namespace, control_plane_ns, wait, output, prometheus, namespace, expected_version)
        return
    given = [name for name in ("viz_namespace", "control_plane_ns", "expected_version")
             if click_ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise click.UsageError(f"{flags}: not used with --platform local")
    if namespace is not None and not proxy:
        raise click.UsageError("-n/--namespace selects the data plane: give --proxy too")
    _check_local(prometheus_url, namespace, proxy, wait, output)


def _check_local(prometheus_url: str | None, namespace: str | None, proxy: bool, wait: float, output: str) -> None:
    """``linkerd viz check``'s categories as the local platform answers them (tether.diagnose.viz_local)."""
    import sys

    from tether import __version__
    from tether.cli.check import run_categories
    from tether.diagnose.local import LocalChecks
    from tether.diagnose.viz_local import LocalVizChecks

    platform = LocalChecks(home.state_dir(), lambda config: (), __version__, namespace)
    checks = LocalVizChecks(platform, prometheus_url)
    if not run_categories(checks.categories(proxy=proxy), output, wait):
        sys.exit(1)


def _wait(ctx: click.Context, param: click.Parameter, value: str) -> float:
    from tether.cli.check import _seconds  # tether check's --wait rule

    return _seconds(ctx, param, value)


def _scraped(prometheus: Prometheus) -> set[tuple[str, str]]:
    """(namespace, pod) of every proxy Prometheus scrapes successfully."""
    try:
        targets = prometheus.targets()
    except PrometheusError as err:
        from tether.diagnose.checks import Problem

        raise Problem(str(err)) from None
    return {(t["labels"].get("namespace", ""), t["labels"].get("pod", "")) for t in targets
            if (t.get("labels") or {}).get("job") == PROXY_JOB and t.get("health") == "up"}


def _check_kubernetes(kube: KubeTarget, namespace: str | None, control_plane_ns: str, wait: float,
                      output: str, prometheus: Prometheus | None = None, data_namespace: str | None = None,
                      expected_version: str | None = None) -> None:
    """``linkerd viz check``'s categories (tether.diagnose.kube), printed as ``tether check`` prints them."""
    import sys

    from tether import __version__
    from tether.cli.check import run_categories
    from tether.diagnose.kube import Expected, KubeChecks, Options
    from tether.platform.kubernetes.client import ClientSettings

    kube_checks = KubeChecks(ClientSettings(kubeconfig=kube.kubeconfig, context=kube.context), __version__,
                             data_namespace, Expected(control_plane_ns, ()),
                             options=Options(expected_version=expected_version))
    scraped = (lambda: _scraped(prometheus)) if prometheus is not None else None
    categories = kube_checks.viz_categories(namespace, scraped=scraped)
    try:
        success = run_categories(categories, output, wait)
    finally:
        kube_checks.close()
    if not success:
        sys.exit(1)


# -- stat / routes / edges / authz ----------------------------------------------------------------


def _print_or_json(output: str, grid: list[list[str]], doc: Any, empty: str) -> None:
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
    elif len(grid) == 1:
        click.echo(empty, err=True)
    else:
        click.echo(tables.plain(grid))


def _stat_text(results: list[tuple[Target, list[api.Row]]], seconds: float, ns: str | None, wide: bool,
               filtered: bool) -> str:
    """Every kind's table; several kinds are each headed by their kind, as in ``linkerd viz stat``."""
    texts = []
    for target, rows in results:
        if rows:
            grid = tables.stat_table(rows, seconds, all_namespaces=ns is None and target.kind != NAMESPACE, wide=wide)
            texts.append((target.kind, tables.plain(grid)))
    if not texts:
        if ns and filtered:
            return f"No traffic found in {ns} namespace."
        return f"No resources found in {ns} namespace." if ns else "No resources found."
    if len(texts) == 1:
        return texts[0][1]
    return "\n\n".join(f"==> {kind} <==\n{text}" for kind, text in texts)


@viz.command()
@click.argument("resources", nargs=-1, required=True, metavar="RESOURCE [NAME...]")
@click.option("-n", "--namespace", help="The namespace (default: default).")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace.")
@click.option("--to", "to", help="Only traffic to this resource (deploy/NAME, po/NAME, svc/NAME, au/AUTHORITY).")
@click.option("--to-namespace", help="The --to resource's namespace (default: -n).")
@click.option("--from", "from_", help="Only traffic from this resource (deploy/NAME, po/NAME, ns/NAME).")
@click.option("--from-namespace", help="The --from resource's namespace (default: -n).")
@click.option("-t", "--time-window", "window", default="1m", show_default=True, callback=lambda c, p, v: _window(v),
              help="Window of the rates (a Prometheus duration: 30s, 1m, 1h).")
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json"]), default="table", show_default=True,
              help="wide adds byte rates and the share of requests over mTLS.")
@click.option("-w", "--watch", is_flag=True, help="Keep asking, every --interval, until Ctrl-C (redrawn in place "
              "on a terminal, printed one after another otherwise).")
@click.option("--interval", type=click.FloatRange(min=0.5), default=2.0, show_default=True,
              help="Seconds between two answers with --watch.")
@prometheus_option
@platform_option
def stat(resources: tuple[str, ...], namespace: str | None, all_namespaces: bool, to: str | None,
         to_namespace: str | None, from_: str | None, from_namespace: str | None, window: str, output: str,
         watch: bool, interval: float, prometheus_url: str | None, kube: KubeTarget | None) -> None:
    """Success rate, requests per second, latency and connections of each resource, from Prometheus.

    RESOURCE is deploy, po, ns, svc or au, optionally /NAME (or followed by
    names).  Without --to/--from the numbers are what the resource's proxies
    served (inbound); a service's are what its clients sent it.
    """
    if to and from_:
        raise click.UsageError("--to and --from cannot be used together")
    ns = _namespace(namespace, all_namespaces)
    try:
        targets = parse_targets(resources, ns)
    except TargetError as err:
        raise click.BadParameter(str(err), param_hint="RESOURCE") from None
    to_t = _target(to, to_namespace or ns, "--to") if to else None
    from_t = _target(from_, from_namespace or ns, "--from") if from_ else None
    seconds = api.window_seconds(window)
    ctx = Context(prometheus_url, kube)

    def ask() -> list[tuple[Target, list[api.Row]]]:
        return [(t, api.stat_summary(ctx.prometheus, ctx.objects, t, window, to=to_t, from_=from_t, mesh=ctx.mesh))
                for t in targets]

    def show(results: list[tuple[Target, list[api.Row]]]) -> str:
        if output == "json":
            return json.dumps([tables.row_json(r, seconds) for _, rows in results for r in rows],
                              indent=None if watch else 2)
        return _stat_text(results, seconds, ns, output == "wide", bool(to or from_))

    if not watch:
        text = show(ctx.run(ask))
        click.echo(text, err=text.startswith("No "))
        return
    ctx.run(lambda: _watch(ask, show, interval, f"rates over the last {window}, from {ctx.prometheus.url}"))


def _watch(ask: Callable[[], Any], show: Callable[[Any], str], interval: float, caption: str) -> None:
    """Ask every ``interval`` seconds until Ctrl-C: in place on a terminal, one answer after another otherwise."""
    import time
    from datetime import datetime

    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()
    try:
        if not console.is_terminal:
            while True:
                click.echo(f"\n{datetime.now():%H:%M:%S}  {caption}\n{show(ask())}")
                time.sleep(interval)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                body = show(ask())
                live.update(Text(f"{datetime.now():%H:%M:%S}  {caption}   (Ctrl-C to stop)\n\n{body}"), refresh=True)
                time.sleep(interval)
    except (KeyboardInterrupt, BrokenPipeError):
        return


@viz.command()
@click.argument("resource")
@click.option("-n", "--namespace", help="The namespace (default: default).")
@click.option("--to", "to", help="Routes of this destination (deploy/NAME, svc/NAME, au/AUTHORITY), as RESOURCE's client.")
@click.option("--to-namespace", help="The --to resource's namespace (default: -n).")
@click.option("-t", "--time-window", "window", default="1m", show_default=True, callback=lambda c, p, v: _window(v))
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json"]), default="table", show_default=True,
              help="wide, with --to: effective (after retries) and actual (each try) success and rates.")
@prometheus_option
@platform_option
def routes(resource: str, namespace: str | None, to: str | None, to_namespace: str | None, window: str, output: str,
           prometheus_url: str | None, kube: KubeTarget | None) -> None:
    """Per-route metrics of the ServiceProfiles of what RESOURCE serves (or of --to, as RESOURCE's client); with
    --to and no ServiceProfile, of the client policy's routes (HTTPRoute, GRPCRoute) that carried traffic."""
    ns = namespace or DEFAULT_NAMESPACE
    target = _target(resource, ns, "RESOURCE")
    to_t = _target(to, to_namespace or ns, "--to") if to else None
    seconds = api.window_seconds(window)
    ctx = Context(prometheus_url, kube)
    rows = ctx.run(lambda: api.top_routes(ctx.prometheus, ctx.objects, target, window, to=to_t, mesh=ctx.mesh))
    grid = tables.routes_table(rows, seconds, outbound=to_t is not None, wide=output == "wide")
    _print_or_json(output, grid, [tables.row_json(r, seconds) for r in rows], "No routes found.")


@viz.command()
@click.argument("kind", metavar="deploy|po")
@click.option("-n", "--namespace", help="The namespace (default: default).")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace.")
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json"]), default="table", show_default=True,
              help="wide adds both identities and why a connection is not mTLS.")
@prometheus_option
@platform_option
def edges(kind: str, namespace: str | None, all_namespaces: bool, output: str, prometheus_url: str | None, kube: KubeTarget | None) -> None:
    """Who holds open connections to whom, with the identities of both ends (or why not mTLS)."""
    target = _target(kind, None, "KIND")
    if target.name:
        raise click.BadParameter("edges takes a kind (deploy or po), not one object", param_hint="KIND")
    ns = _namespace(namespace, all_namespaces)
    ctx = Context(prometheus_url, kube)
    found = ctx.run(lambda: api.edges(ctx.prometheus, ctx.objects, target.kind, ns, ctx.mesh))
    _print_or_json(output, tables.edges_table(found, wide=output == "wide"), [tables.edge_json(e) for e in found],
                   f"No edges found in {ns} namespace." if ns else "No edges found.")


def _policy_stat(f: Callable) -> Callable:
    """The arguments stat-inbound, stat-outbound and authz share: one RESOURCE, a window, table or JSON."""
    for option in reversed([
        click.argument("resource"),
        click.option("-n", "--namespace", help="The namespace (default: default)."),
        click.option("-t", "--time-window", "window", default="1m", show_default=True,
                     callback=lambda c, p, v: _window(v)),
        click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True),
        prometheus_option,
        platform_option,
    ]):
        f = option(f)
    return f


@viz.command("stat-inbound")
@_policy_stat
def stat_inbound(resource: str, namespace: str | None, window: str, output: str, prometheus_url: str | None,
                 kube: KubeTarget | None) -> None:
    """What RESOURCE's proxies served, per server, port and route of their inbound policy."""
    _policy_rows(resource, namespace, window, output, Context(prometheus_url, kube), api.stat_inbound,
                 tables.stat_inbound_table)


@viz.command("stat-outbound")
@_policy_stat
def stat_outbound(resource: str, namespace: str | None, window: str, output: str, prometheus_url: str | None,
                  kube: KubeTarget | None) -> None:
    """What RESOURCE's proxies sent, per Service port and route of their client policy (HTTPRoute, GRPCRoute or
    the default route) and each backend the route drew: success, RPS, latency, timeouts, retries."""
    _policy_rows(resource, namespace, window, output, Context(prometheus_url, kube), api.stat_outbound,
                 tables.stat_outbound_table)


@viz.command()
@_policy_stat
def authz(resource: str, namespace: str | None, window: str, output: str, prometheus_url: str | None,
          kube: KubeTarget | None) -> None:
    """Requests to RESOURCE per server, route and authorization of its inbound policy."""
    _policy_rows(resource, namespace, window, output, Context(prometheus_url, kube), api.authz, tables.authz_table)


def _policy_rows(resource: str, namespace: str | None, window: str, output: str, ctx: Context,
                 query: Callable[..., Any], table: Callable[..., Any]) -> None:
    """stat-inbound, stat-outbound and authz: one query over RESOURCE's policy metrics, printed as its table or JSON."""
    target = _target(resource, namespace or DEFAULT_NAMESPACE, "RESOURCE")
    seconds = api.window_seconds(window)
    rows = ctx.run(lambda: query(ctx.prometheus, target, window))
    _print_or_json(output, table(rows, seconds), [tables.row_json(r, seconds) for r in rows], "No traffic found.")


@viz.command()
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to serve on (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=50750, show_default=True,
              help="Port to serve on (0: any free one).")
@click.option("--show", type=click.Choice(["browser", "url"]), default="browser", show_default=True,
              help="Open the dashboard in a browser, or only print its URL.")
@click.option("--enforced-host", default=None,
              help="Regular expression the Host header must match [default: localhost, 127.0.0.1, [::1]].")
@click.option("-t", "--time-window", "window", default="1m", show_default=True, callback=lambda c, p, v: _window(v))
@click.option("--tap-server", help="The tap server for the live tap, host:port [default: the one `viz install` started].")
@click.option("--control-plane-ns", help="The control plane's namespace [default: the local platform's].")
@click.option("--trust-domain", help="The mesh's trust domain, for the identities shown [default: the local platform's].")
@click.option("--cluster-domain", help="The cluster's DNS domain [default: the local platform's].")
@prometheus_option
@platform_option
def dashboard(address: str, port: int, show: str, enforced_host: str | None, window: str, tap_server: str | None,
              control_plane_ns: str | None, trust_domain: str | None, cluster_domain: str | None,
              prometheus_url: str | None, kube: KubeTarget | None) -> None:
    """Serve the web dashboard (read-only) until Ctrl-C: namespaces, deployments, edges, routes, live tap, pods."""
    import re
    import webbrowser

    from tether.viz.dashboard.server import DEFAULT_ENFORCED_HOST, Dashboard
    from tether.viz.dashboard.views import Views

    pattern = enforced_host or DEFAULT_ENFORCED_HOST
    try:
        re.compile(pattern)
    except re.error as err:
        raise click.BadParameter(f"not a regular expression: {err}", param_hint="--enforced-host") from None
    if kube is not None and tap_server is not None:
        raise click.UsageError("--tap-server: not used with --platform kubernetes (tap goes through the API server)")
    ctx = Context(prometheus_url, kube)
    # In a cluster the dashboard's own pod has no local platform: the manifests pass the mesh's names.
    ctx.mesh = api.Mesh(control_plane_ns or ctx.mesh.control_plane_ns, trust_domain or ctx.mesh.trust_domain,
                        cluster_domain or ctx.mesh.cluster_domain)
    try:
        if kube is not None:
            from tether.platform.kubernetes.client import ClientSettings

            views = Views(ctx.prometheus, ctx.objects, ctx.mesh, window,
                          tap_api=ClientSettings(kubeconfig=kube.kubeconfig, context=kube.context))
        else:
            tap_address = tap_server or (f"{local.LOOPBACK}:{ctx.settings.tap_port}" if ctx.settings else None)
            views = Views(ctx.prometheus, ctx.objects, ctx.mesh, window, tap_address)
        server = Dashboard(views, address, port, pattern)
    except OSError as err:
        ctx.close()
        raise CliError(f"cannot serve on {address}:{port}: {err.strerror or err}") from None
    click.echo(f"Tether viz dashboard available at:\n{server.url}")
    if show == "browser":
        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        ctx.close()


# -- tap ------------------------------------------------------------------------------------------


@viz.command("tap-server", hidden=True)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
def tap_server(state_dir: Path) -> None:
    """Serve TapByResource on loopback, calling the proxies' Observe as the tap identity (started by `viz install`)."""
    from tether.viz.tap import TapCredentials

    config, settings = _component_settings(state_dir)
    lay = local.layout(config)
    try:
        credentials = TapCredentials(lay.tap_key.read_bytes(), lay.tap_cert.read_bytes(),
                                     config.layout.trust_anchors.read_bytes())
        store = Store(config.layout.store)
    except (OSError, StoreError) as err:
        raise CliError(str(err)) from None
    mesh = api.Mesh(config.control_plane_ns, config.trust_domain, config.cluster_domain)
    try:
        asyncio.run(_serve_tap(StoreObjects(store), mesh, credentials, settings))
    finally:
        store.close()


async def _serve_tap(objects: StoreObjects, mesh: api.Mesh, credentials: Any, settings: local.VizSettings) -> None:
    import signal

    import grpc

    from tether.admin import AdminServer
    from tether.api import viz_tap_pb2_grpc
    from tether.viz.tap import TapController, TapService

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    controller = TapController(objects, mesh, credentials, tap_port=settings.proxy_tap_port)
    server = grpc.aio.server()
    viz_tap_pb2_grpc.add_TapServicer_to_server(TapService(controller), server)
    server.add_insecure_port(f"{local.LOOPBACK}:{settings.tap_port}")  # loopback only: the CLI's
    await server.start()
    admin = AdminServer(lambda: b"", lambda: True)
    await admin.start(local.LOOPBACK, settings.tap_admin_port)
    click.echo(f"tap: TapByResource on {local.LOOPBACK}:{settings.tap_port}")
    try:
        await stop.wait()
    finally:
        await server.stop(1.0)
        await admin.stop()


def _in_cluster_server(what: str, addr: str) -> Callable[[Callable], Callable]:
    """The options viz's servers in the cluster share: their serving TLS, address and the mesh's names."""

    def decorate(f: Callable) -> Callable:
        for option in reversed([
            click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), required=True,
                         help=f"The {what}'s serving certificate (PEM)."),
            click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), required=True,
                         help="Its key (PEM)."),
            click.option("--addr", default=addr, show_default=True, help=f"host:port of the {what}."),
            click.option("--viz-namespace", default="linkerd-viz", show_default=True,
                         help="The viz namespace (tap's identity)."),
            click.option("--control-plane-ns", default="linkerd", show_default=True,
                         help="The control plane's namespace."),
            click.option("--trust-domain", default="cluster.local", show_default=True,
                         help="The mesh's trust domain."),
        ]):
            f = option(f)
        return f

    return decorate


@viz.command("tap-apiserver", hidden=True)
@_in_cluster_server("tap APIService", "0.0.0.0:8089")
@click.option("--cluster-domain", default="cluster.local", show_default=True, help="The cluster's DNS domain.")
@click.option("--identity-addr", help="identity's host:port [default: linkerd-identity-headless.<cp-ns>.svc."
              "<cluster-domain>.:8080].")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              default="/var/run/secrets/tokens/linkerd-identity-token", show_default=True,
              help="The service-account token (audience identity.l5d.io) identity certifies the tap identity with.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path),
              help="kubeconfig file [default: in-cluster, $KUBECONFIG, ~/.kube/config].")
def tap_apiserver(tls_cert: Path, tls_key: Path, addr: str, viz_namespace: str, control_plane_ns: str,
                  trust_domain: str, cluster_domain: str, identity_addr: str | None, token_file: Path,
                  kubeconfig: Path | None) -> None:
    """The tap APIService's server on Kubernetes (Linkerd viz's tap): user taps proxied by the API server,
    authorized with SubjectAccessReviews, fanned out to the pods' proxies as the tap identity."""
    from tether.platform.kubernetes.client import ClientSettings
    from tether.viz.tap_identity import IdentitySource
    from tether.viz.tap_injector import tap_identity

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"{addr!r} is not host:port", param_hint="--addr")
    source = IdentitySource(
        addr=identity_addr or f"linkerd-identity-headless.{control_plane_ns}.svc.{cluster_domain}.:8080",
        server_name=control_plane_identity("identity", control_plane_ns, trust_domain).dns_name,
        anchors_pem=b"",  # read from the cluster at start
        token_file=token_file, name=tap_identity(viz_namespace, control_plane_ns, trust_domain))
    mesh = api.Mesh(control_plane_ns, trust_domain, cluster_domain)
    settings = ClientSettings(kubeconfig=kubeconfig)
    try:
        asyncio.run(_serve_tap_apiservice(settings, source, mesh, tls_cert, tls_key, host, int(port)))
    except KeyboardInterrupt:
        pass


async def _serve_tap_apiservice(settings: Any, source: Any, mesh: api.Mesh, tls_cert: Path, tls_key: Path,
                                host: str, port: int, listening: asyncio.Event | None = None) -> None:
    import dataclasses
    import signal

    from tether.platform.kubernetes.client import KubeClient, KubeError
    from tether.viz import tap_apiservice_server as server
    from tether.viz.kube_objects import KubeObjects
    from tether.viz.tap import TapController
    from tether.viz.tap_identity import IdentityRenewer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    kube = KubeClient(settings)
    roots = f"/api/v1/namespaces/{mesh.control_plane_ns}/configmaps/{TRUST_ROOTS_CONFIGMAP}"
    try:
        anchors = ((await kube.get(roots)).get("data") or {}).get("ca-bundle.crt")
        auth = await server.load_auth(kube)
    except (KubeError, ValueError) as err:
        await kube.close()
        raise CliError(f"cannot start the tap APIService: {err}") from None
    if not anchors:
        await kube.close()
        raise CliError(f"{roots}: no ca-bundle.crt (the mesh's trust anchors)")
    source = dataclasses.replace(source, anchors_pem=anchors.encode())
    controllers: list[TapController] = []

    def install(credentials: Any) -> None:
        for controller in controllers:
            controller.credentials = credentials  # new Observe calls present the renewed certificate

    renewer = IdentityRenewer(source, install)
    renewing = asyncio.create_task(renewer.run())
    runner = None
    try:
        await renewer.ready.wait()
        assert renewer.current is not None
        controller = TapController(KubeObjects(settings), mesh, renewer.current)
        controllers.append(controller)
        tls = server.tls_context(tls_cert, tls_key, auth.client_ca_pem)
        runner = await server.serve(server.TapApiService(kube, auth, controller), tls, host, port)
        click.echo(f"tap-apiserver: on {host}:{port} as {source.name}")
        if listening is not None:
            listening.set()
        await stop.wait()
    finally:
        renewing.cancel()
        if runner is not None:
            await runner.cleanup()
        await kube.close()


@viz.command("tap-injector", hidden=True)
@_in_cluster_server("webhook", "0.0.0.0:8443")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path),
              help="kubeconfig file [default: in-cluster, $KUBECONFIG, ~/.kube/config].")
def tap_injector(tls_cert: Path, tls_key: Path, addr: str, viz_namespace: str, control_plane_ns: str,
                 trust_domain: str, kubeconfig: Path | None) -> None:
    """The tap injector's admission webhook on Kubernetes: gives meshed pods LINKERD2_PROXY_TAP_SVC_NAME."""
    import ssl

    from tether.platform.kubernetes.client import ClientSettings
    from tether.viz import tap_webhook_server
    from tether.viz.tap_injector import tap_identity

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"{addr!r} is not host:port", param_hint="--addr")
    try:
        tls = tap_webhook_server.tls_context(tls_cert, tls_key)
    except (OSError, ssl.SSLError) as err:
        raise CliError(f"--tls-cert/--tls-key: {err}") from None
    identity = tap_identity(viz_namespace, control_plane_ns, trust_domain)
    asyncio.run(_serve_tap_injector(ClientSettings(kubeconfig=kubeconfig), identity, tls, host, int(port)))


async def _serve_tap_injector(settings: Any, identity: str, tls: Any, host: str, port: int) -> None:
    import signal

    from tether.platform.kubernetes.client import KubeClient
    from tether.viz import tap_webhook_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    kube = KubeClient(settings)
    runner = await tap_webhook_server.serve(tap_webhook_server.TapInjectorWebhook(kube, identity), tls, host, port)
    click.echo(f"tap-injector: webhook on {host}:{port} (tap identity {identity})")
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await kube.close()


def _tap_options(f: Callable) -> Callable:
    """The filters ``tap`` and ``top`` share (``linkerd viz tap``'s)."""
    options = [
        click.argument("resource"),
        click.option("-n", "--namespace", help="The namespace (default: default)."),
        click.option("--to", "to", help="Only requests to this resource (deploy/NAME, po/NAME, ns/NAME)."),
        click.option("--to-namespace", help="The --to resource's namespace (default: -n)."),
        click.option("--method", help="Only requests with this HTTP method."),
        click.option("--scheme", help="Only requests with this scheme (http, https)."),
        click.option("--authority", help="Only requests for this :authority."),
        click.option("--path", help="Only requests whose path starts with this."),
        click.option("--max-rps", type=click.FloatRange(min=0, min_open=True), default=100.0, show_default=True,
                     help="At most this many requests per second, over all the pods (more is capped, not refused)."),
        click.option("--tap-server", help="The tap server, host:port [default: the one `tether viz install` started]."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _tap_request(resource: str, namespace: str | None, to: str | None, to_namespace: str | None,
                 method: str | None, scheme: str | None, authority: str | None, path: str | None,
                 max_rps: float) -> Any:
    from tether.api import viz_tap_pb2

    ns = namespace or DEFAULT_NAMESPACE
    target = _target(resource, ns, "RESOURCE")
    request = viz_tap_pb2.TapByResourceRequest(maxRps=max_rps)
    request.target.resource.CopyFrom(viz_tap_pb2.Resource(namespace=ns, type=target.kind, name=target.name))
    VM = viz_tap_pb2.TapByResourceRequest.Match  # noqa: N806 - a message class
    matches = []
    if to:
        dest = _target(to, to_namespace or ns, "--to")
        matches.append(VM(destinations=viz_tap_pb2.ResourceSelection(
            resource=viz_tap_pb2.Resource(namespace=dest.namespace or "", type=dest.kind, name=dest.name))))
    for field, value in (("method", method), ("scheme", scheme), ("authority", authority), ("path", path)):
        if value:
            matches.append(VM(http=VM.Http(**{field: value})))
    request.match.CopyFrom(VM(all=VM.Seq(matches=matches)))
    return request


def _tap_address(tap_server: str | None) -> str:
    if tap_server is not None:
        return tap_server
    state = home.state_dir()
    try:
        config = platform_config.load(state) or LocalPlatformConfig(state_dir=state)
        settings = local.load_settings(config)
    except (PlatformConfigError, local.VizError) as err:
        raise CliError(str(err)) from None
    if settings is None:
        raise CliError("no tap server: run `tether viz install`, or pass --tap-server HOST:PORT")
    return f"{local.LOOPBACK}:{settings.tap_port}"


@viz.command()
@_tap_options
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json"]), default="table", show_default=True,
              help="wide adds each peer's resource (of RESOURCE's kind, else its pod) and namespace, and the "
                   "route's labels; json is each event whole, with the headers and trailers.")
@platform_option
def tap(resource: str, namespace: str | None, to: str | None, to_namespace: str | None, method: str | None,
        scheme: str | None, authority: str | None, path: str | None, max_rps: float, tap_server: str | None,
        output: str, kube: KubeTarget | None) -> None:
    """Stream the requests RESOURCE's proxies see, live, until Ctrl-C (`linkerd viz tap`). On Kubernetes
    (--platform kubernetes) through the API server's tap APIService, as your kubeconfig's user."""
    request = _tap_request(resource, namespace, to, to_namespace, method, scheme, authority, path, max_rps)
    if output == "json":  # as Linkerd's: the JSON carries the requests' and responses' headers
        request.extract.http.headers.SetInParent()
    source = _tap_source(tap_server, kube)
    wide_kind = kind_of(request.target.resource.type) if output == "wide" else None

    def show(event: Any) -> None:
        from google.protobuf.json_format import MessageToDict

        click.echo(json.dumps(MessageToDict(event)) if output == "json" else tables.tap_line(event, wide_kind))

    try:
        asyncio.run(source(request, show))
    except KeyboardInterrupt:
        pass


@viz.command()
@_tap_options
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="Seconds between two redraws.")
@platform_option
def top(resource: str, namespace: str | None, to: str | None, to_namespace: str | None, method: str | None,
        scheme: str | None, authority: str | None, path: str | None, max_rps: float, tap_server: str | None,
        interval: float, kube: KubeTarget | None) -> None:
    """The busiest request paths of RESOURCE, live from tap, until Ctrl-C (`linkerd viz top`); on Kubernetes
    through the tap APIService."""
    import time

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from tether.viz.top import COLUMNS, Top

    request = _tap_request(resource, namespace, to, to_namespace, method, scheme, authority, path, max_rps)
    source = _tap_source(tap_server, kube)
    console = Console()
    state = Top()
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    last = [0.0]

    def show(event: Any) -> None:
        state.add(event)
        now = time.monotonic()
        if now - last[0] < interval:
            return
        last[0] = now
        rows = state.rows(limit=console.height - 5 if live else None)
        if live is None:
            click.echo(tables.plain([list(COLUMNS), *rows]) + "\n")
            return
        table = Table(*COLUMNS, box=None)
        for row in rows:
            table.add_row(*row)
        live.update(table, refresh=True)

    try:
        if live is not None:
            live.start()
        asyncio.run(source(request, show))
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()


class _Enough(Exception):
    """The route limit was reached: stop tapping."""


@viz.command()
@click.argument("service")
@click.option("--tap", "tap_resource", required=True,
              help="Tap this resource (deploy/NAME, po/NAME) and make a route of each request it receives.")
@click.option("-n", "--namespace", default=DEFAULT_NAMESPACE, show_default=True,
              help="The namespace of the service and of the tapped resource.")
@click.option("--tap-duration", default="5s", show_default=True, help="How long to tap (e.g. 5s, 1m).")
@click.option("--tap-route-limit", type=click.IntRange(min=1), default=20, show_default=True,
              help="Stop after this many distinct routes.")
@click.option("--cluster-domain", default="cluster.local", show_default=True)
@click.option("--tap-server", help="The tap server, host:port [default: the one `tether viz install` started].")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@platform_option
def profile(service: str, tap_resource: str, namespace: str, tap_duration: str, tap_route_limit: int,
            cluster_domain: str, tap_server: str | None, output: str, kube: KubeTarget | None) -> None:
    """A ServiceProfile for SERVICE with a route per request tapped from --tap (`linkerd viz profile --tap`)."""
    import yaml

    from tether.cli.profile_cmd import path_regex, service_profile
    from tether.viz.tap import DEFAULT_MAX_RPS
    from tether.viz.tap_profile import TappedRoutes

    try:
        seconds = api.window_seconds(tap_duration)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--tap-duration") from None
    request = _tap_request(tap_resource, namespace, None, None, None, None, None, None, DEFAULT_MAX_RPS)
    source = _tap_source(tap_server, kube)
    seen = TappedRoutes(tap_route_limit)

    def take(event: Any) -> None:
        if seen.add(event):
            raise _Enough

    async def collect() -> None:
        try:
            async with asyncio.timeout(seconds):
                await source(request, take)
        except (TimeoutError, _Enough):
            pass

    asyncio.run(collect())
    routes = [{"name": f"{method} {path}", "condition": {"pathRegex": path_regex(path), "method": method}}
              for method, path in seen.routes()]
    doc = service_profile(service, namespace, cluster_domain, routes)
    click.echo(json.dumps(doc, indent=2) + "\n" if output == "json" else yaml.safe_dump(doc, sort_keys=False),
               nl=False)


@viz.command("list")
@click.option("-n", "--namespace", help="The namespace (default: default).")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace.")
@platform_option
def list_(namespace: str | None, all_namespaces: bool, kube: KubeTarget | None) -> None:
    """The pods tap can watch, and why the others cannot (on Kubernetes, the pods the API server lists)."""
    from tether.viz.tap import why_not_tappable

    ns = _namespace(namespace, all_namespaces)
    if kube is not None:
        from tether.platform.kubernetes.client import ClientSettings
        from tether.viz.kube_objects import KubeObjects, ObjectsUnavailable

        try:
            pods = KubeObjects(ClientSettings(kubeconfig=kube.kubeconfig, context=kube.context)).list("Pod", ns)
        except ObjectsUnavailable as err:
            raise CliError(str(err)) from None
    else:
        pods = _store_pods(ns)
    grid = [["NAMESPACE", "NAME", "TAP"]]
    for pod in sorted(pods, key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"]["name"])):
        reason = why_not_tappable(pod)
        grid.append([pod["metadata"].get("namespace", ""), pod["metadata"]["name"], reason or "enabled"])
    if len(grid) == 1:
        click.echo(f"No pods found in {ns} namespace." if ns else "No pods found.", err=True)
        return
    click.echo(tables.plain(grid))


def _store_pods(ns: str | None) -> list[dict[str, Any]]:
    state = home.state_dir()
    try:
        config = platform_config.load(state) or LocalPlatformConfig(state_dir=state)
    except PlatformConfigError as err:
        raise CliError(str(err)) from None
    path = config.layout.store
    if not path.exists():
        raise CliError(f"{path.parent}: no store here; start the platform with `tether up` (or set TETHER_HOME)")
    try:
        with Store(path) as store:
            return StoreObjects(store).list("Pod", ns)
    except StoreError as err:
        raise CliError(str(err)) from None


TapSource = Callable[[Any, Callable[[Any], None]], Awaitable[None]]


def _tap_source(tap_server: str | None, kube: KubeTarget | None) -> TapSource:
    """Where a tap goes: the local tap server (gRPC), or on Kubernetes the API server's tap APIService."""
    if kube is None:
        address = _tap_address(tap_server)
        return lambda request, show: _stream_tap(address, request, show)
    if tap_server is not None:
        raise click.UsageError("--tap-server: not used with --platform kubernetes (tap goes through the API server)")
    from tether.platform.kubernetes.client import ClientSettings
    from tether.viz import tap_apiclient

    settings = ClientSettings(kubeconfig=kube.kubeconfig, context=kube.context)

    async def through_the_api(request: Any, show: Callable[[Any], None]) -> None:
        try:
            await tap_apiclient.stream(settings, request, show)
        except tap_apiclient.TapApiError as err:
            raise CliError(str(err)) from None

    return through_the_api


async def _stream_tap(address: str, request: Any, show: Callable[[Any], None]) -> None:
    import grpc

    from tether.api import viz_tap_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        try:
            async for event in viz_tap_pb2_grpc.TapStub(channel).TapByResource(request):
                show(event)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise CliError(f"cannot reach the tap server at {address}: {err.details()}") from None
            raise CliError(err.details() or err.code().name) from None
