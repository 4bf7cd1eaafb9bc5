"""``tether policy serve``: run the policy controller (gRPC 8090, admin 9990) over the platform's resources.

A thin shell: it reads flags (Linkerd's policy-controller flags, plus the TLS
files and the store), builds a ``PolicyConfig`` and the platform's
``ResourceWatcher``, and runs ``PolicyService`` until SIGINT/SIGTERM.
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
from tether.cli.platform_opts import Platform, kubernetes_watcher, platform_options
from tether.naming import DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN
from tether.platform.watch import ResourceWatcher
from tether.policy import PolicyConfig, PolicyService
from tether.policy.config import (
    DEFAULT_ADDR,
    DEFAULT_ADMIN_ADDR,
    DEFAULT_CLUSTER_NETWORKS,
    DEFAULT_EGRESS_NAMESPACE,
    DEFAULT_PATCH_TIMEOUT_MS,
    DEFAULT_PROBE_NETWORKS,
    DEFAULT_STREAM_QUEUE_CAPACITY,
    DEFAULT_WEBHOOK_ADDR,
    InvalidNetworks,
    WebhookSettings,
    parse_networks,
)
from tether.policy.defaults import DefaultPolicy
from tether.policy.status import LocalStatusWriter
from tether.ports import DEFAULT_OPAQUE_PORTS, PortSet
from tether.resources.policy import DEFAULT_POLICIES
from tether.serving.grpc_server import ConfigError
from tether.store import Store, StoreError


def _networks(ctx: click.Context, param: click.Parameter, value: str) -> object:
    try:
        return parse_networks(value)
    except InvalidNetworks as exc:
        raise click.BadParameter(str(exc)) from None


@click.group()
def policy() -> None:
    """The policy controller: inbound (and outbound) policy for proxies."""


@policy.command()
@click.option("--addr", "--grpc-addr", "addr", default=DEFAULT_ADDR, show_default=True, help="gRPC listen address.")
@click.option("--admin-addr", default=DEFAULT_ADMIN_ADDR, show_default=True,
              help="Admin listen address (/metrics, /ready, /live).")
@click.option("--store", "store_path", type=FILE, help="The resource store [default: $TETHER_HOME/store.db].")
@click.option("--cluster-networks", default=DEFAULT_CLUSTER_NETWORKS, show_default=True, callback=_networks,
              help="The cluster's pod and service networks (CIDRs, comma-separated).")
@click.option("--default-policy", type=click.Choice(DEFAULT_POLICIES), default="all-unauthenticated",
              show_default=True, help="Inbound policy of ports no Server selects, unless annotated.")
@click.option("--probe-networks", default=DEFAULT_PROBE_NETWORKS, show_default=True, callback=_networks,
              help="Networks kubelet probes come from (authorized on the probe paths); empty for none.")
@click.option("--identity-domain", "--trust-domain", "identity_domain", default=DEFAULT_TRUST_DOMAIN,
              show_default=True, callback=domain, help="Trust domain of the mesh identities.")
@click.option("--cluster-domain", default=DEFAULT_CLUSTER_DOMAIN, show_default=True, callback=domain,
              help="Kubernetes cluster domain of service names.")
@click.option("--control-plane-namespace", "--control-plane-ns", "control_plane_ns",
              default=DEFAULT_CONTROL_PLANE_NS, show_default=True, callback=namespace,
              help="The control-plane namespace (part of every identity).")
@click.option("--default-opaque-ports", default=str(DEFAULT_OPAQUE_PORTS), show_default=True, callback=opaque_ports,
              help="Ports opaque when no annotation says otherwise (ports and ranges).")
@click.option("--global-egress-network-namespace", default=DEFAULT_EGRESS_NAMESPACE, show_default=True,
              callback=namespace, help="Namespace of the EgressNetworks that apply to every client.")
@click.option("--allow-l5d-request-headers", is_flag=True,
              help="Let clients' l5d-* request headers tune outbound retries and timeouts.")
@click.option("--stream-queue-capacity", type=click.IntRange(min=1), default=DEFAULT_STREAM_QUEUE_CAPACITY,
              show_default=True, help="Updates queued per stream before a slow client's stream is ended.")
@click.option("--server-addr", default=DEFAULT_WEBHOOK_ADDR, show_default=True,
              help="The validating admission webhook's listen address (with --server-tls-cert/--server-tls-key).")
@click.option("--server-tls-cert", "--server-tls-certs", "server_tls_cert", type=FILE,
              help="The webhook's certificate chain (PEM); without it no webhook is served.")
@click.option("--server-tls-key", type=FILE, help="The webhook's private key (PEM).")
@click.option("--admission-controller-disabled", is_flag=True, help="Serve no admission webhook.")
@click.option("--patch-timeout-ms", type=click.IntRange(min=1), default=DEFAULT_PATCH_TIMEOUT_MS, show_default=True,
              help="How long one status write may take before it is given up (counted in "
                   "resource_status_patch_timeouts_total; the next round retries).")
@serving_options
@platform_options
def serve(
    addr: str, admin_addr: str, store_path: Path | None, cluster_networks: tuple, default_policy: str,
    probe_networks: tuple, identity_domain: str, cluster_domain: str, control_plane_ns: str,
    default_opaque_ports: PortSet, global_egress_network_namespace: str, allow_l5d_request_headers: bool,
    stream_queue_capacity: int, server_addr: str, server_tls_cert: Path | None, server_tls_key: Path | None,
    admission_controller_disabled: bool, patch_timeout_ms: int, tls_cert: Path | None, tls_key: Path | None, trust_anchors: Path | None,
    insecure: bool, log_level: str, platform: Platform,
) -> None:
    """Serve InboundServerPolicies and OutboundPolicies over TLS, fed by the platform's policy resources."""
    tls = serving_tls(tls_cert, tls_key, trust_anchors, insecure, log_level)
    if (server_tls_cert is None) != (server_tls_key is None):
        raise click.UsageError("give both --server-tls-cert and --server-tls-key, or neither")
    webhook = None
    if server_tls_cert is not None and server_tls_key is not None and not admission_controller_disabled:
        webhook = WebhookSettings(server_addr, server_tls_cert, server_tls_key)
    config = PolicyConfig(
        addr=addr,
        admin_addr=admin_addr,
        tls=tls,
        cluster_networks=cluster_networks,
        default_policy=DefaultPolicy.parse(default_policy),
        probe_networks=probe_networks,
        identity_domain=identity_domain,
        cluster_domain=cluster_domain,
        control_plane_ns=control_plane_ns,
        default_opaque_ports=default_opaque_ports,
        global_egress_network_namespace=global_egress_network_namespace,
        allow_l5d_request_headers=allow_l5d_request_headers,
        stream_queue_capacity=stream_queue_capacity,
        patch_timeout=patch_timeout_ms / 1000,
        webhook=webhook,
    )
    store: Store | None = None
    writer: LocalStatusWriter | None = None
    try:
        if not platform.kubernetes:
            # The local platform has one policy controller, which writes status into the store.
            store = Store(store_path or home.store_path())
            # The store's own wait for its write lock ends with the patch timeout, so a write given up on
            # does not linger in its thread.
            writer = LocalStatusWriter(store.path, busy_timeout=config.patch_timeout)
        asyncio.run(_serve(config, platform.resource_watcher(store), writer))
    except StoreError as exc:
        raise CliError(str(exc)) from None
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    finally:
        if writer is not None:
            writer.close()  # again if the service closed it: closing twice is harmless
        if store is not None:
            store.close()


async def _serve(config: PolicyConfig, watcher: ResourceWatcher, writer: LocalStatusWriter | None) -> None:
    kubernetes = kubernetes_watcher(watcher)
    if kubernetes is None:
        service = PolicyService(config, watcher, writer)
        Platform.export_metrics(watcher, service.metrics.registry)
        await run_until_signalled(service)
        return
    import socket
    import uuid

    from tether.platform.kubernetes.lease import LeaseElector
    from tether.policy.kubernetes_status import LEASE_NAME, KubeStatusWriter

    # As Linkerd's: every replica serves; the one holding the Lease writes status (the status subresource).
    elector = LeaseElector(kubernetes.client, config.control_plane_ns, LEASE_NAME,
                           f"{socket.gethostname()}_{uuid.uuid4()}")
    service = PolicyService(config, kubernetes, KubeStatusWriter(kubernetes.client), leading=elector.leading)
    Platform.export_metrics(kubernetes, service.metrics.registry)
    lease = asyncio.create_task(elector.run(), name="status lease")
    try:
        await run_until_signalled(service)
    finally:
        lease.cancel()
        await asyncio.gather(lease, return_exceptions=True)
