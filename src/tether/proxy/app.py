"""The proxy process, assembled from its parts: identity, TLS state, discovery, listeners, driver, admin.

``Proxy(config, env)`` binds every listener at ``start`` (so the ports exist
from the first moment, and ``/ready`` can answer 503), starts the identity
client, and only once the first certificate is in installs the TLS contexts,
opens the destination channel and begins accepting on the inbound and
outbound listeners -- until then connections wait in the backlog, as in
Linkerd. Every certificate refresh installs new contexts (for new
connections) and, for a TLS destination, a new channel (for new streams).

``run(config, env)`` is the whole process: uvloop, signals, graceful drain.

Callers: ``tether.proxy.main`` (the process) and tests (in-process proxies).
"""

from __future__ import annotations

import asyncio
import logging
import random
import resource
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any
from pathlib import Path

from tether.proxy import native
from tether.proxy.core.certified import RefreshPolicy
from tether.proxy.codec.addrs import NameAddr, SocketAddr
from tether.proxy.core.balancer_queue import Queue
from tether.proxy.core.config import ControlAddr, KeepAlive, OrigDstFallback, ProxyConfig, SpireIdentityConfig
from tether.proxy.io.driver import HTTP1_CLIENT_IDLE_TIMEOUT, Driver
from tether.proxy.core.http import HttpSettings, InFlight
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.io.identity_client import IdentityClient, IdentityClientConfig, TlsMaterial
from tether.proxy.core.inbound import InboundSettings, inbound
from tether.proxy.core.inbound_profile_routes import InboundProfileRoutes
from tether.proxy.core.inbound_route_metrics import InboundRouteMetrics
from tether.proxy.io.listeners import Listener, bind, local_addr, original_dst, peer_addr
from tether.proxy.core.logs import LogFilter
from tether.proxy.core.metrics import Registry, gauge, process_collector, samples
from tether.proxy.io.grpc_client import Channel
from tether.proxy.io.discovery import Discovery
from tether.proxy.io.inbound_profiles import InboundProfiles
from tether.proxy.io.inbound_ports import AppPorts
from tether.proxy.io.policy_client import PolicyClient
from tether.proxy.core.server_policy import default_policy
from tether.proxy.core.outbound import OutboundSettings, outbound
from tether.proxy.core.policy_metrics import DetectMetrics, PolicyMetrics
from tether.proxy.core.profiles import canonical_name
from tether.proxy.core.resolution import NOT_LOOKED_UP, ProfileSource
from tether.proxy.core.access_log import AccessLog
from tether.proxy.core.observers import combined
from tether.proxy.io.tls import TlsState

if TYPE_CHECKING:
    # Imported where used, and only when configured: a proxy without SPIRE or tap never loads their modules (tap:
    # its protobuf messages and server, ~0.3 MB resident; docs/proxy.md, "Memory").
    from tether.proxy.io.admin import AdminServer
    from tether.proxy.io.proxy_tap import ProxyTap
    from tether.proxy.io.spire_client import SpireClient

log = logging.getLogger(__name__)

FD_RESERVE = 256  # descriptors kept back from the accepted connections' bound
NOT_READY_WARNING_INTERVAL = 15.0  # seconds between "still waiting for a certificate" warnings


class Proxy:
    def __init__(
        self,
        config: ProxyConfig,
        env: Mapping[str, str],
        *,
        log_filter: LogFilter | None = None,
        rng: random.Random | None = None,
        max_connections: int | None = None,
        client_idle_timeout: float = HTTP1_CLIENT_IDLE_TIMEOUT,
        on_serving: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self._on_serving = on_serving  # called once the listeners accept (the process entry tunes the collector)
        self._env = env
        self.log_filter = log_filter or LogFilter(config.log_filter, apply=False)
        self.metrics = Registry(retain_idle=config.metrics_retain_idle.total_seconds())
        ident = config.identity
        self.identity: IdentityClient | SpireClient
        if isinstance(ident, SpireIdentityConfig):
            from tether.proxy.io.spire_client import SpireClient

            self.identity = SpireClient(ident)  # a SPIRE agent's Workload API (io.spire_client)
        else:
            self.identity = IdentityClient(
                IdentityClientConfig(
                    local_name=ident.local_name,
                    trust_anchors_pem=ident.trust_anchors_pem.encode(),
                    token_path=Path(ident.token_file),
                    svc_addr=_target(ident.svc.addr),
                    svc_name=ident.svc.identity,
                    refresh=RefreshPolicy(min_refresh=ident.min_refresh, max_refresh=ident.max_refresh),
                )
            )
        self.tls = TlsState(self.identity.contexts_for)
        source = None
        if config.orig_dst_fallback is OrigDstFallback.LOCAL_ADDR and config.inbound.ips:
            source = str(min(config.inbound.ips, key=lambda ip: (ip.version, ip)))
        self.driver = Driver(self.metrics, self.tls, source_ip=source, pool_idle_timeouts={
            "inbound": config.inbound.http1_pool_idle_timeout.total_seconds(),
            "outbound": config.outbound.http1_pool_idle_timeout.total_seconds(),
        }, pool_max_idle={
            "inbound": config.inbound.max_idle_conns_per_endpoint,
            "outbound": config.outbound.max_idle_conns_per_endpoint,
        }, client_idle_timeout=client_idle_timeout, connect_options={
            "inbound": config.inbound.connect, "outbound": config.outbound.connect})
        self.driver.upgrades.params = config.http2_client  # the l5d-orig-proto upgrade's HTTP/2 connections
        # Accepted connections open at once (both directions); at the bound, accepting waits (the backlog
        # holds new ones) and /ready says 503, so the pod leaves its services' endpoints until there is room.
        self.max_connections = max_connections if max_connections is not None else _connection_bound()
        self._room = asyncio.Event()
        # The request-level HTTP/1 layer (tether.proxy.http) and its metrics.
        self.http_metrics = HttpMetrics(time.monotonic, config.metrics_retain_idle.total_seconds())
        self.metrics.add_collector(self.http_metrics.render, before_tcp=True)
        out = config.outbound
        self.discovery = Discovery(
            context_token=config.destination_context,
            idle_timeout=out.discovery_idle_timeout.total_seconds(),
            backoff=out.connect_backoff,
            failfast=out.tcp_failfast_timeout.total_seconds(),
            clock=time.monotonic,
            rng=rng,
            http_failfast=out.http_failfast_timeout.total_seconds(),
        )
        in_cfg = config.inbound
        self.app_ports = AppPorts(failfast=in_cfg.http_failfast_timeout.total_seconds(),
                                  backoff=in_cfg.connect_backoff,
                                  connect_timeout=in_cfg.connect_timeout.total_seconds(),
                                  idle_timeout=in_cfg.discovery_idle_timeout.total_seconds(), clock=time.monotonic,
                                  rng=rng)
        self.inbound_profiles = InboundProfiles(self.discovery, in_cfg.discovery_idle_timeout.total_seconds(),
                                                config.profile_initial_timeout.total_seconds(), time.monotonic)
        self.policies = PolicyClient(
            workload=config.policy_workload,
            default=lambda port: default_policy(in_cfg.default_policy, config.cluster_networks,
                                                opaque=port in in_cfg.opaque_ports,
                                                detect_timeout=in_cfg.detect_timeout.total_seconds()),
            idle_timeout=in_cfg.discovery_idle_timeout.total_seconds(),
            backoff_delay=self.discovery.backoff_delay,
            clock=time.monotonic,
        )
        self.stopping = asyncio.Event()
        self._listeners: dict[str, list[Listener]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[asyncio.Task[None]] = set()
        self._admin: AdminServer | None = None
        self._inbound_settings: InboundSettings | None = None
        self._outbound_settings: OutboundSettings | None = None
        # Tap (LINKERD2_PROXY_TAP_SVC_NAME): observers for both HttpSettings, a server once certified.
        self.tap: ProxyTap | None = None
        if config.tap_svc_name:
            from tether.proxy.io.proxy_tap import ProxyTap

            self.tap = ProxyTap(config.tap_svc_name, config.control_listen_addr, rng=rng,
                                h2=config.inbound.server_h2.params, backlog=config.inbound.listen_backlog,
                                accept=config.inbound.accept)
        self.metrics.add_collector(self._identity_collector)
        self.metrics.add_collector(process_collector)
        self.metrics.add_collector(_build_info)

    # -- addresses, for tests and logs --------------------------------------------------------------------------

    @property
    def inbound_addr(self) -> SocketAddr:
        return self._listeners["inbound"][0].addr

    @property
    def outbound_addrs(self) -> list[SocketAddr]:
        return [listener.addr for listener in self._listeners["outbound"]]

    @property
    def admin_addr(self) -> SocketAddr:
        return self._listeners["admin"][0].addr

    @property
    def admin(self) -> AdminServer:
        assert self._admin is not None, "the admin server starts with the proxy"
        return self._admin

    @property
    def ready(self) -> bool:
        """A certificate, room for more connections, and every listener accepting."""
        return (self.tls.current is not None and len(self._connections) < self.max_connections
                and not any(listener.failing for listeners in self._listeners.values() for listener in listeners))

    async def _accepting(self) -> None:
        """Return once there is room for one more accepted connection."""
        while len(self._connections) >= self.max_connections:
            self._room.clear()
            await self._room.wait()

    async def idle(self) -> None:
        """Wait until every connection open now has finished (tests use it to read settled metrics)."""
        if self._connections:
            await asyncio.wait(set(self._connections))
        self.driver.close_idle()  # pooled upstream connections: a peer's connections can then finish too

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind everything and start the admin server and identity; serving traffic follows the certificate."""
        from tether.proxy.io.admin import AdminPolicy, AdminServer  # keeps the admin's imports off the data path's

        config = self.config
        try:
            # The admin listener takes the inbound socket options and backlog, as linkerd2-proxy's (the tap too).
            in_backlog, in_accept = config.inbound.listen_backlog, config.inbound.accept
            self._listeners["admin"] = [Listener("admin", bind(config.admin_listen_addr, in_backlog), in_accept)]
            self._listeners["inbound"] = [Listener("inbound", bind(config.inbound.listen_addr, in_backlog), in_accept)]
            outbound_addrs = (*config.outbound.listen_addrs, *config.outbound.extra_listen_addrs)
            self._listeners["outbound"] = [
                Listener("outbound", bind(a, config.outbound.listen_backlog), config.outbound.accept)
                for a in outbound_addrs]
        except OSError:
            self._close_listeners()
            raise
        # The SNI the proxy terminates: with SPIRE the server name, not the SPIFFE ID.
        local_name = (config.identity.server_name if isinstance(config.identity, SpireIdentityConfig)
                      else config.identity.local_name)
        detect_metrics = DetectMetrics(self.metrics, "inbound")  # the inbound servers' and the admin port's
        admin = AdminServer(
            registry=self.metrics,
            ready=lambda: self.ready,
            env=self._env,
            log_filter=self.log_filter,
            shutdown_enabled=config.shutdown_endpoint_enabled,
            on_shutdown=self.stopping.set,
            h2=config.inbound.server_h2.params,
            policy=AdminPolicy(self.policies.policy, self.metrics, self.http_metrics, detect_metrics, self.tls,
                               local_name, time.monotonic),
        )
        self._spawn(self._listeners["admin"][0].serve(admin.accept), "accept admin")
        self._admin = admin
        # The extra outbound listeners stand for their own address, the destination: not a loop.
        extra = len(config.outbound.extra_listen_addrs)
        main_outbound = self._listeners["outbound"][: len(self._listeners["outbound"]) - extra]
        own = frozenset(listener.addr for listener in (*self._listeners["admin"], *self._listeners["inbound"],
                                                       *main_outbound))
        in_cfg, out_cfg = config.inbound, config.outbound
        self._inbound_settings = InboundSettings(
            local_name=local_name,
            inbound_port=self.inbound_addr.port,
            detect_timeout=in_cfg.detect_timeout.total_seconds(),
            connect_timeout=in_cfg.connect_timeout.total_seconds(),
            opaque_ports=in_cfg.opaque_ports,
            ips=in_cfg.ips,
            default_policy=in_cfg.default_policy,
            cluster_networks=config.cluster_networks,
            http=HttpSettings("inbound", time.monotonic, self.http_metrics,
                              in_flight=InFlight(config.inbound.max_in_flight),
                              h2_keep_alive=_seconds(in_cfg.server_h2_keep_alive),
                              h2_server=in_cfg.server_h2.params, h2_client=config.http2_client,
                              h2_max_pending_resets=in_cfg.server_h2.max_pending_accept_reset_streams,
                              observer=combined(self.tap.inbound if self.tap else None, self._access_log())),
            policies=self.policies.policy,
            registry=self.metrics,
            policy_changes=self.policies.subscribe,
            detect_metrics=detect_metrics,
            profiles=InboundProfileRoutes(self.inbound_profiles, config.profile_suffixes),
            route_metrics=InboundRouteMetrics(self.metrics),
            authority_labels=in_cfg.metrics_authority_labels,
            app_ports=self.app_ports,
            http_queue=Queue(in_cfg.http_queue_capacity, in_cfg.http_failfast_timeout.total_seconds()),
        )
        self._outbound_settings = OutboundSettings(
            detect_timeout=out_cfg.detect_timeout.total_seconds(),
            connect_timeout=out_cfg.connect_timeout.total_seconds(),
            failfast=out_cfg.tcp_failfast_timeout.total_seconds(),
            tcp_queue_capacity=out_cfg.tcp_queue_capacity,
            http_queue=Queue(out_cfg.http_queue_capacity, out_cfg.http_failfast_timeout.total_seconds()),
            profile_networks=config.profile_networks,
            local_ips=in_cfg.ips,
            own_addrs=own,
            direct_addrs=frozenset(listener.addr for listener in self._listeners["outbound"][len(main_outbound):]),
            refuse_loopback=config.orig_dst_fallback is OrigDstFallback.NONE,
            http=HttpSettings("outbound", time.monotonic, self.http_metrics, strip_proxy_errors=True,
                              informational=not out_cfg.disable_informational_headers,
                              in_flight=InFlight(out_cfg.max_in_flight),
                              h2_keep_alive=_seconds(out_cfg.server_h2_keep_alive),
                              h2_server=out_cfg.server_h2.params, h2_client=config.http2_client,
                              h2_max_pending_resets=out_cfg.server_h2.max_pending_accept_reset_streams,
                              observer=self.tap.outbound if self.tap else None),
            named_profiles=self._named_profile if out_cfg.ingress_mode else None,
            client_policies=self.discovery.client_policy,
            policy_metrics=PolicyMetrics(self.metrics, hostname_labels=out_cfg.metrics_hostname_labels),
        )
        self.metrics.add_collector(self.discovery.collect_balancers)
        self.discovery.enable_client_policy(config.policy_workload, lambda: self.policies.channel)
        # The admin port's policy is watched from startup and kept, as linkerd2-proxy does (proxy.md §8.1).
        self.policies.start(in_cfg.ports.with_port(self.admin_addr.port))
        self.identity.add_listener(self._rotated)
        self._spawn(self.identity.run(), "identity")
        self._spawn(self._serve_when_ready(), "serve")

    async def _serve_when_ready(self) -> None:
        ready = asyncio.ensure_future(self.identity.ready())
        try:
            while True:
                done, _ = await asyncio.wait({ready}, timeout=NOT_READY_WARNING_INTERVAL)
                if done:
                    break
                log.warning("waiting for an identity certificate from %s", self.identity.source)
        finally:
            ready.cancel()
        if self.tap is not None:
            await self._start_tap(self.tap)
            if self.stopping.is_set():
                return
        for listener in self._listeners["inbound"]:
            self._spawn(listener.serve(self._accept_inbound, self._accepting), f"accept {listener.addr}")
        for listener in self._listeners["outbound"]:
            self._spawn(listener.serve(self._accept_outbound, self._accepting), f"accept {listener.addr}")
        log.info("proxy ready: inbound %s, outbound %s, admin %s; hot modules %s", self.inbound_addr,
                 ", ".join(map(str, self.outbound_addrs)), self.admin_addr, native.status)
        if self._on_serving is not None:
            self._on_serving()

    async def _start_tap(self, tap: ProxyTap) -> None:
        """The tap server, with the current certificate; a proxy that cannot serve tap stops (as linkerd2-proxy
        fails to start), naming the address, rather than run with tap silently missing."""
        identity = self.identity
        try:
            await tap.start(lambda: identity.material, identity.contexts_for)
        except OSError as err:
            log.error("%s", err)
            self.stopping.set()

    def _access_log(self) -> AccessLog | None:
        """LINKERD2_PROXY_ACCESS_LOG: the inbound access log, on standard error as linkerd2-proxy writes it."""
        fmt = self.config.access_log
        if fmt is None:
            return None
        return AccessLog(fmt, lambda line: print(line, file=sys.stderr, flush=True), time.monotonic, time.time)

    def _named_profile(self, authority: str, port: int) -> ProfileSource:
        """Ingress mode's ``l5d-dst-override`` target: looked up only when its name is under
        ``LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES`` (proxy.md §2), else no known service."""
        if canonical_name(authority.encode(), self.config.profile_suffixes) is None:  # authority: name:port
            return NOT_LOOKED_UP
        return self.discovery.profile_named(authority, port)

    def _rotated(self, material: TlsMaterial) -> None:
        self.tls.install(material)
        destination, policy = self.config.destination, self.config.policy
        if destination.identity is not None or self.discovery.channel is None:
            self.discovery.set_channel(self._control_channel(destination, material))
        if policy.identity is not None or self.policies.channel is None:
            self.policies.set_channel(self._control_channel(policy, material))

    def _control_channel(self, control: ControlAddr, material: TlsMaterial) -> Channel:
        """A channel to a controller: mTLS when it has an identity (a new one per certificate), else plaintext.
        Its streams carry the ``CONTROL_STREAM_*`` limits unless the controller is on loopback (as linkerd2-proxy)."""
        limits = None if control.addr.is_loopback else self.config.control_streams
        if control.identity is None:
            return Channel(_target(control.addr), limits=limits)
        return Channel(_target(control.addr), ssl_context=self.identity.control_context(material),
                       server_name=control.identity, limits=limits)

    async def run(self) -> None:
        """Serve until ``stopping`` is set, then drain (bounded by the shutdown grace period) and stop."""
        await self.start()
        try:
            await self.stopping.wait()
        finally:
            await self.stop(self.config.shutdown_grace_period.total_seconds())

    async def stop(self, grace: float = 0.0) -> None:
        """Stop accepting and drain, as linkerd2-proxy does: every HTTP connection is told to finish and close
        (``Driver.drain``) and the open connections get up to ``grace`` seconds to end; the proxy stops as soon
        as they have. What is left then is cut (HTTP/2 streams reset) and everything closed."""
        self.stopping.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._close_listeners()
        if self._admin is not None:  # its accept loop ended with the tasks: /ready goes unanswered; close the rest
            await self._admin.close()
        if self._connections and grace > 0:
            log.info("draining %d connections for up to %ss", len(self._connections), grace)
            self.driver.drain()
            _, left = await asyncio.wait(self._connections, timeout=grace)
            if left:
                log.warning("graceful shutdown did not complete in %ss: closing %d connections", grace, len(left))
        self.driver.cut()
        self.driver.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self.inbound_profiles.close()
        self.app_ports.close()
        await self.discovery.close()
        await self.policies.close()
        if self.tap is not None:
            await self.tap.stop()

    def _close_listeners(self) -> None:
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.close()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- connections ---------------------------------------------------------------------------------------------

    def _accept_inbound(self, sock: socket.socket) -> None:
        settings = self._inbound_settings
        assert settings is not None
        admitted = self._admit("inbound", sock)
        if admitted is not None:
            target, client = admitted
            self._connection("inbound", sock, target, inbound(target, client, settings))

    def _accept_outbound(self, sock: socket.socket) -> None:
        settings = self._outbound_settings
        assert settings is not None
        admitted = self._admit("outbound", sock)
        if admitted is not None:
            self._connection("outbound", sock, admitted[0], outbound(admitted[0], settings, self.discovery))

    def _admit(self, direction: str, sock: socket.socket) -> tuple[SocketAddr, SocketAddr] | None:
        """(original destination, client) of an accepted socket, or None when it was closed or refused."""
        target = self._orig_dst(sock)
        client = peer_addr(sock)
        if target is None or client is None:
            sock.close()
            return None
        if self.driver.is_own_connection(client, target):
            self.driver.refuse_loop(direction, sock, target)
            return None
        return target, client

    def _orig_dst(self, sock: socket.socket) -> SocketAddr | None:
        try:
            target = original_dst(sock)
        except OSError as exc:
            log.debug("no original destination: %s", exc)
            return None
        if target is None and self.config.orig_dst_fallback is OrigDstFallback.LOCAL_ADDR:
            target = local_addr(sock)
        if target is None:
            log.debug("refusing a connection that was not redirected (no SO_ORIGINAL_DST)")
        return target

    def _connection(self, direction: str, sock: socket.socket, target: SocketAddr, layer: object) -> None:
        task = asyncio.get_running_loop().create_task(self.driver.run(direction, sock, target, layer))  # type: ignore[arg-type]
        self._connections.add(task)
        task.add_done_callback(self._connection_ended)

    def _connection_ended(self, task: asyncio.Task[None]) -> None:
        self._connections.discard(task)
        self._room.set()

    # -- metrics -------------------------------------------------------------------------------------------------

    def _identity_collector(self, out: list[str]) -> None:
        current = self.tls.current
        gauge(out, "control_identity_cert_expiration_timestamp_seconds",
              "Time when the this proxy's current mTLS identity certificate will expire (in seconds since the "
              "UNIX epoch)", current.expires_at.timestamp() if current else None)
        last = self.identity.last_refresh
        gauge(out, "control_identity_cert_refresh_timestamp_seconds",
              "Time when the this proxy's current mTLS identity certificate were last updated",
              last.timestamp() if last else None)
        samples(out, "control_identity_cert_refreshes_total", "counter",
                "The total number of times this proxy's mTLS identity certificate has been refreshed by the "
                "Identity provider.", [(f'result="{k}"', v) for k, v in self.identity.refreshes.items()])


def _seconds(keep_alive: KeepAlive | None) -> tuple[float, float] | None:
    if keep_alive is None:
        return None
    return keep_alive.interval.total_seconds(), keep_alive.timeout.total_seconds()


def _connection_bound() -> int:
    """Accepted connections the descriptor limit allows: each takes two (its own and the upstream one), and
    ``FD_RESERVE`` stay for listeners, pooled connections, control-plane channels and files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1_000_000
    return max(16, (soft - FD_RESERVE) // 2)


def _build_info(out: list[str]) -> None:
    from tether import __version__

    gauge(out, "proxy_build_info", "Proxy build info", 1, f'vendor="tether",version="{__version__}"')


def _target(addr: SocketAddr | NameAddr) -> str:
    """A gRPC target for a control-plane address."""
    return str(addr)


async def serve(config: ProxyConfig, env: Mapping[str, str], log_filter: LogFilter,
                on_serving: Callable[[], None] | None = None) -> None:
    """The proxy as a process: serve until SIGTERM/SIGINT (or ``/shutdown``), then drain."""
    proxy = Proxy(config, env, log_filter=log_filter, on_serving=on_serving)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, proxy.stopping.set)
    await proxy.run()
