"""``tether destination serve``: run the destination service (gRPC 8086, admin 9996) over the local store.

A thin shell: it reads flags (Linkerd's destination flags, plus the TLS files
and the store), builds a ``DestinationConfig`` and the local platform's
``ResourceWatcher``, and runs ``DestinationService`` until SIGINT/SIGTERM.
Registered on the root group by ``tether.cli.main``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from tether.cli import home
from tether.cli.controller_opts import (
    FILE, domain, namespace, opaque_ports, run_until_signalled, serving_options, serving_tls,
)
from tether.cli.errors import CliError
from tether.destination import ConfigError, DestinationConfig, DestinationService
from tether.destination.config import DEFAULT_ADDR, DEFAULT_ADMIN_ADDR, DEFAULT_STREAM_QUEUE_CAPACITY
from tether.naming import (
    DEFAULT_CLUSTER_DOMAIN,
    DEFAULT_CONTROL_PLANE_NS,
    DEFAULT_TRUST_DOMAIN,
)
from tether.cli.platform_opts import Platform, kubernetes_watcher, platform_options
from tether.platform.watch import ResourceWatcher
from tether.ports import DEFAULT_OPAQUE_PORTS, PortSet
from tether.store import Store, StoreError


@click.group()
def destination() -> None:
    """The destination service: endpoints (Get) and profiles (GetProfile) for proxies."""


@destination.command()
@click.option("--addr", default=DEFAULT_ADDR, show_default=True, help="gRPC listen address.")
@click.option("--admin-addr", "--metrics-addr", "admin_addr", default=DEFAULT_ADMIN_ADDR, show_default=True,
              help="Admin listen address (/metrics, /ready, /live).")
@click.option("--store", "store_path", type=FILE, help="The resource store [default: $TETHER_HOME/store.db].")
@click.option("--cluster-domain", default=DEFAULT_CLUSTER_DOMAIN, show_default=True, callback=domain,
              help="Kubernetes cluster domain of service names.")
@click.option("--identity-trust-domain", "--trust-domain", "trust_domain", default=DEFAULT_TRUST_DOMAIN,
              show_default=True, callback=domain, help="Trust domain of the identities handed out.")
@click.option("--control-plane-ns", "--controller-namespace", "control_plane_ns", default=DEFAULT_CONTROL_PLANE_NS,
              show_default=True, callback=namespace, help="The control-plane namespace.")
@click.option("--default-opaque-ports", default=str(DEFAULT_OPAQUE_PORTS), show_default=True, callback=opaque_ports,
              help="Ports treated as opaque when no annotation says otherwise (ports and ranges).")
@click.option("--stream-queue-capacity", type=click.IntRange(min=1), default=DEFAULT_STREAM_QUEUE_CAPACITY,
              show_default=True, help="Updates queued per stream before a slow client's stream is ended.")
@click.option("--enable-h2-upgrade/--disable-h2-upgrade", default=True, show_default=True,
              help="Hint meshed endpoints as HTTP/2-capable.")
@click.option("--enable-ipv6/--disable-ipv6", default=True, show_default=True,
              help="Send pods' IPv6 endpoints, preferring them to the same pod's IPv4 one (dual stack); "
                   "disabled, only IPv4 pod endpoints are sent.")
@click.option("--outbound-transport-mode", type=click.Choice(["transparent", "transport-header"]),
              default="transparent", show_default=True,
              help="transport-header gives every meshed endpoint opaque transport.")
@click.option("--ext-endpoint-zone-weights", is_flag=True,
              help="Experimental: weight endpoints in the subscriber's zone 10x (proxies do not read weights).")
@serving_options
@platform_options
def serve(
    addr: str, admin_addr: str, store_path: Path | None, cluster_domain: str, trust_domain: str,
    control_plane_ns: str, default_opaque_ports: PortSet, stream_queue_capacity: int, enable_h2_upgrade: bool,
    enable_ipv6: bool, outbound_transport_mode: str, ext_endpoint_zone_weights: bool, tls_cert: Path | None,
    tls_key: Path | None, trust_anchors: Path | None, insecure: bool, log_level: str, platform: Platform,
) -> None:
    """Serve Get and GetProfile over TLS, fed by the store's resources."""
    tls = serving_tls(tls_cert, tls_key, trust_anchors, insecure, log_level)
    config = DestinationConfig(
        addr=addr,
        admin_addr=admin_addr,
        tls=tls,
        cluster_domain=cluster_domain,
        identity_trust_domain=trust_domain,
        control_plane_ns=control_plane_ns,
        default_opaque_ports=default_opaque_ports,
        stream_queue_capacity=stream_queue_capacity,
        enable_h2_upgrade=enable_h2_upgrade,
        enable_ipv6=enable_ipv6,
        force_opaque_transport=outbound_transport_mode == "transport-header",
        ext_endpoint_zone_weights=ext_endpoint_zone_weights,
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
    kubernetes = kubernetes_watcher(watcher)
    if kubernetes is None:  # the local platform's process runs its own
        await run_until_signalled(service)
        return
    import socket
    import uuid

    from tether.platform.kubernetes.endpointslices import LEASE_NAME, external_workload_controller
    from tether.platform.kubernetes.lease import LeaseElector

    # As Linkerd's destination does: EndpointSlices for Services that select ExternalWorkloads,
    # written by the one replica that holds the Lease (every replica serves discovery).
    counter = service.metrics.externalworkload_rejected

    def rejected(namespace: str, reason: str) -> None:
        counter.labels(namespace, reason).inc()

    elector = LeaseElector(kubernetes.client, config.control_plane_ns, LEASE_NAME,
                           f"{socket.gethostname()}_{uuid.uuid4()}")
    tasks = [asyncio.create_task(elector.run()),
             asyncio.create_task(external_workload_controller(kubernetes, elector.leading, rejected).run())]
    try:
        await run_until_signalled(service)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
