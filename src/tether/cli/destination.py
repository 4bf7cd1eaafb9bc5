"""``tether destination serve``: run the destination service (gRPC 8086, admin 9996) over the local store.

A thin shell: it reads flags (Linkerd's destination flags, plus the TLS files
and the store), builds a ``DestinationConfig`` and the local platform's
``ResourceWatcher``, and runs ``DestinationService`` until SIGINT/SIGTERM.
Registered on the root group by ``tether.cli.main``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click

from tether.cli import home
from tether.cli.controller_opts import domain, namespace, run_until_signalled
from tether.cli.errors import CliError
from tether.destination import ConfigError, DestinationConfig, DestinationService, TlsFiles
from tether.destination.config import DEFAULT_ADDR, DEFAULT_ADMIN_ADDR, DEFAULT_STREAM_QUEUE_CAPACITY
from tether.naming import (
    DEFAULT_CLUSTER_DOMAIN,
    DEFAULT_CONTROL_PLANE_NS,
    DEFAULT_TRUST_DOMAIN,
)
from tether.cli.platform_opts import Platform, platform_options
from tether.platform.watch import ResourceWatcher
from tether.ports import DEFAULT_OPAQUE_PORTS, parse_port_set
from tether.store import Store, StoreError

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.group()
def destination() -> None:
    """The destination service: endpoints (Get) and profiles (GetProfile) for proxies."""


@destination.command()
@click.option("--addr", default=DEFAULT_ADDR, show_default=True, help="gRPC listen address.")
@click.option("--admin-addr", "--metrics-addr", "admin_addr", default=DEFAULT_ADMIN_ADDR, show_default=True,
              help="Admin listen address (/metrics, /ready, /live).")
@click.option("--store", "store_path", type=_FILE, help="The resource store [default: $TETHER_HOME/store.db].")
@click.option("--cluster-domain", default=DEFAULT_CLUSTER_DOMAIN, show_default=True, callback=domain,
              help="Kubernetes cluster domain of service names.")
@click.option("--identity-trust-domain", "--trust-domain", "trust_domain", default=DEFAULT_TRUST_DOMAIN,
              show_default=True, callback=domain, help="Trust domain of the identities handed out.")
@click.option("--control-plane-ns", "--controller-namespace", "control_plane_ns", default=DEFAULT_CONTROL_PLANE_NS,
              show_default=True, callback=namespace, help="The control-plane namespace.")
@click.option("--default-opaque-ports", default=str(DEFAULT_OPAQUE_PORTS), show_default=True,
              help="Ports treated as opaque when no annotation says otherwise (ports and ranges).")
@click.option("--stream-queue-capacity", type=click.IntRange(min=1), default=DEFAULT_STREAM_QUEUE_CAPACITY,
              show_default=True, help="Updates queued per stream before a slow client's stream is ended.")
@click.option("--enable-h2-upgrade/--disable-h2-upgrade", default=True, show_default=True,
              help="Hint meshed endpoints as HTTP/2-capable.")
@click.option("--outbound-transport-mode", type=click.Choice(["transparent", "transport-header"]),
              default="transparent", show_default=True,
              help="transport-header gives every meshed endpoint opaque transport.")
@click.option("--tls-cert", type=_FILE, help="The gRPC port's certificate chain (PEM).")
@click.option("--tls-key", type=_FILE, help="The gRPC port's private key (PEM).")
@click.option("--trust-anchors", type=_FILE, help="Require client certificates issued under these roots (PEM).")
@click.option("--insecure", is_flag=True, help="Serve plaintext gRPC (no TLS files); for debugging only.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@platform_options
def serve(
    addr: str, admin_addr: str, store_path: Path | None, cluster_domain: str, trust_domain: str,
    control_plane_ns: str, default_opaque_ports: str, stream_queue_capacity: int, enable_h2_upgrade: bool,
    outbound_transport_mode: str, tls_cert: Path | None, tls_key: Path | None, trust_anchors: Path | None,
    insecure: bool, log_level: str, platform: Platform,
) -> None:
    """Serve Get and GetProfile over TLS, fed by the store's resources."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if insecure and (tls_cert or tls_key or trust_anchors):
        raise click.UsageError("--insecure cannot be combined with --tls-cert, --tls-key or --trust-anchors")
    if not insecure and (tls_cert is None or tls_key is None):
        raise click.UsageError("give --tls-cert and --tls-key (or --insecure to serve plaintext)")
    opaque, skipped = parse_port_set(default_opaque_ports)
    if skipped:
        raise click.BadParameter(f"not ports or ranges: {', '.join(skipped)}", param_hint="--default-opaque-ports")
    config = DestinationConfig(
        addr=addr,
        admin_addr=admin_addr,
        tls=None if insecure else TlsFiles(tls_cert, tls_key, trust_anchors),  # type: ignore[arg-type]
        cluster_domain=cluster_domain,
        identity_trust_domain=trust_domain,
        control_plane_ns=control_plane_ns,
        default_opaque_ports=opaque,
        stream_queue_capacity=stream_queue_capacity,
        enable_h2_upgrade=enable_h2_upgrade,
        force_opaque_transport=outbound_transport_mode == "transport-header",
    )
    try:
        store = None if platform.kubernetes else Store(store_path or home.store_path())
    except StoreError as exc:
        raise CliError(str(exc)) from None
    try:
        asyncio.run(_serve(config, platform.resource_watcher(store)))
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    finally:
        if store is not None:
            store.close()


async def _serve(config: DestinationConfig, watcher: ResourceWatcher) -> None:
    service = DestinationService(config, watcher)
    Platform.export_metrics(watcher, service.metrics.registry)
    from tether.platform.kubernetes.watch import KubernetesResourceWatcher

    if not isinstance(watcher, KubernetesResourceWatcher):  # the local platform's process runs its own
        await run_until_signalled(service)
        return
    import socket
    import uuid

    from tether.platform.kubernetes.endpointslices import LEASE_NAME, external_workload_controller
    from tether.platform.kubernetes.lease import LeaseElector

    # As Linkerd's destination does: EndpointSlices for Services that select ExternalWorkloads,
    # written by the one replica that holds the Lease (every replica serves discovery).
    elector = LeaseElector(watcher.client, config.control_plane_ns, LEASE_NAME,
                           f"{socket.gethostname()}_{uuid.uuid4()}")
    tasks = [asyncio.create_task(elector.run()),
             asyncio.create_task(external_workload_controller(watcher, elector.leading).run())]
    try:
        await run_until_signalled(service)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
