"""``tether injector serve``: the proxy-injector mutating admission webhook, as its own process.

A thin shell over ``tether.injector.server``: flags to a `ServeConfig`, the mesh configuration
from files (`ConfigFiles`, re-read when they change), then serve until SIGINT/SIGTERM. With
``--platform kubernetes`` (what ``tether install`` runs) namespace annotations come from a
Namespace watch on the API server and the webhook listens once it has synced; pods' owners are
looked up and Events recorded on them. Otherwise namespace annotations come from Namespace
manifests (``--namespaces``). Defaults are the paths Linkerd's injector Deployment mounts.
Registered by ``tether.cli.main``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import click

from tether.cli.errors import CliError
from tether.injector.admission import FAILURE_POLICIES, Admission
from tether.injector.config_files import ConfigFiles
from tether.injector.metrics import InjectorMetrics
from tether.cli.platform_opts import Platform, platform_options
from tether.injector.namespaces import NamespaceAnnotations, NamespaceFile, StaticNamespaces, WatchedNamespaces
from tether.injector.server import DEFAULT_ADDR, DEFAULT_ADMIN_ADDR, InjectorServer, ServeConfig, run, tls_context
from tether.resources.errors import ValidationError


def _addr(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


@click.group()
def injector() -> None:
    """The proxy injector (a Kubernetes mutating admission webhook)."""


@injector.command()
@platform_options
@click.option("--addr", default=f"{DEFAULT_ADDR[0]}:{DEFAULT_ADDR[1]}", show_default=True, callback=_addr,
              help="HTTPS address of the webhook.")
@click.option("--admin-addr", default=f"{DEFAULT_ADMIN_ADDR[0]}:{DEFAULT_ADMIN_ADDR[1]}", show_default=True,
              callback=_addr, help="Address of /metrics, /ready and /live.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path),
              default="/var/run/linkerd/tls/tls.crt", show_default=True, help="Serving certificate (PEM).")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path),
              default="/var/run/linkerd/tls/tls.key", show_default=True, help="Serving key (PEM).")
@click.option("--values", "values", type=click.Path(dir_okay=False, path_type=Path),
              help="Helm values of the control plane, as in linkerd-config (e.g. /var/run/linkerd/config/values).")
@click.option("--identity-trust-anchors-file", type=click.Path(dir_okay=False, path_type=Path),
              help="PEM trust anchors (e.g. /var/run/linkerd/identity/trust-roots/ca-bundle.crt).")
@click.option("--namespaces", type=click.Path(exists=True, path_type=Path),
              help="Namespace manifests (file or directory) whose annotations pods inherit; re-read on change. "
                   "Not with --platform kubernetes, which watches the Namespaces.")
@click.option("--failure-policy", type=click.Choice(FAILURE_POLICIES), default="Ignore", show_default=True,
              help="When the injector cannot handle a pod: admit it without the proxy (Ignore) or deny it (Fail).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=8.0, show_default=True,
              help="Seconds to handle one request before answering per the failure policy.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def serve(
    platform: Platform,
    addr: tuple[str, int],
    admin_addr: tuple[str, int],
    tls_cert: Path,
    tls_key: Path,
    values: Path | None,
    identity_trust_anchors_file: Path | None,
    namespaces: Path | None,
    failure_policy: str,
    timeout: float,
    log_level: str,
) -> None:
    """Serve the mutating admission webhook that injects the proxy into pods."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("tether.injector")
    if values is None and identity_trust_anchors_file is None:
        raise CliError("needs the trust anchors: --identity-trust-anchors-file FILE, or --values with identityTrustAnchorsPEM")
    try:
        tls = tls_context(tls_cert, tls_key)
    except FileNotFoundError as err:
        raise CliError(f"cannot load the TLS certificate: {err.filename}: no such file") from None
    except ssl.SSLError:
        raise CliError(f"cannot load the TLS certificate {tls_cert} and key {tls_key}: not a PEM pair that matches") from None
    except OSError as err:
        raise CliError(f"cannot load the TLS certificate: {err}") from None
    if platform.kubernetes and namespaces is not None:
        raise CliError("--namespaces is for manifests on disk; with --platform kubernetes the Namespaces are watched")
    try:
        config = ConfigFiles(values=values, trust_anchors=identity_trust_anchors_file)
        ns_source: NamespaceAnnotations = NamespaceFile(namespaces) if namespaces else StaticNamespaces()
    except ValidationError as err:
        raise CliError(str(err)) from None
    if namespaces is None and not platform.kubernetes:
        log.warning("no --namespaces: namespace annotations (linkerd.io/inject, config.linkerd.io/*) are not inherited")
    serve_config = ServeConfig(tls_cert=tls_cert, tls_key=tls_key, addr=addr, admin_addr=admin_addr,
                               handler_timeout=timeout)  # fmt: skip

    async def main() -> None:
        if platform.kubernetes:
            await _serve_on_kubernetes(platform, config, serve_config, tls, failure_policy, log)
            return
        admission = Admission(config, ns_source, metrics=InjectorMetrics(), failure_policy=failure_policy, logger=log)
        await _serve(InjectorServer(serve_config, admission, tls=tls, logger=log), log)

    try:
        asyncio.run(main())
    except OSError as err:
        raise CliError(f"cannot listen: {err}") from None


async def _serve_on_kubernetes(
    platform: Platform, config: ConfigFiles, serve_config: ServeConfig, tls: ssl.SSLContext, failure_policy: str,
    log: logging.Logger,
) -> None:
    from tether.platform.kubernetes.client import ConfigError
    from tether.platform.kubernetes.objects import EventWriter, OwnerReader
    from tether.platform.kubernetes.watch import KubernetesResourceWatcher

    watcher = platform.resource_watcher()
    assert isinstance(watcher, KubernetesResourceWatcher)
    loop = asyncio.get_running_loop()
    namespaces = WatchedNamespaces(watcher, logger=log)
    admission = Admission(
        config, namespaces, metrics=InjectorMetrics(), failure_policy=failure_policy, logger=log,
        owners=OwnerReader(watcher.client, loop), events=EventWriter(watcher.client, loop, component="linkerd-proxy-injector"),
    )
    feeding = asyncio.create_task(namespaces.run())

    async def synced() -> None:
        waiting = asyncio.create_task(namespaces.wait_synced())
        await asyncio.wait([waiting, feeding], return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
            feeding.result()  # the watch ended before it synced: say why
            raise CliError("the namespace watch ended before it listed the Namespaces")

    try:
        await _serve(InjectorServer(serve_config, admission, tls=tls, logger=log), log, synced)
    except ConfigError as err:
        raise CliError(str(err)) from None
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)


async def _serve(
    server: InjectorServer, log: logging.Logger, synced: Callable[[], Awaitable[None]] | None = None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await run(server, stop, logger=log, synced=synced)
