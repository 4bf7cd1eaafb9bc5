"""The proxy's configuration, read once from Linkerd's ``LINKERD2_PROXY_*`` environment contract.

The proxy's entry point calls ``ProxyConfig.from_env(os.environ)``; on
``ConfigError`` it prints the message and exits with ``EX_CONFIG`` (64), as
linkerd2-proxy does. Every other part of the proxy is handed the frozen
``ProxyConfig`` (or the piece it needs) and never reads the environment.

Read here: the variables of proxy.md §2 that a transparent mTLS proxy with
Linkerd identity uses, with Linkerd's defaults; each field names its variable.
Value formats live in one place each: ``durations``, ``ports``, ``addrs``.
Identity comes from Linkerd's identity service (`IdentityConfig`) or, with
``LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS``, from a SPIRE agent
(`SpireIdentityConfig`). Variables for features Tether lacks are not read. Three ``TETHER_PROXY_*`` variables are Tether's own,
for running without iptables (``OrigDstFallback``, ``extra_listen_addrs``), and
``TETHER_PROXY_CONTROL_LOOPBACK_TLS`` (``ControlAddr``).
"""

from __future__ import annotations

import base64
import enum
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TypeVar

from tether.naming import is_spiffe_id
from tether.ports import PortSet
from tether.proxy.codec.addrs import (
    IpAddress,
    IpNetwork,
    NameAddr,
    SocketAddr,
    parse_addr,
    parse_dns_name,
    parse_ip,
    parse_network,
    parse_socket_addr,
)
from tether.proxy.codec.http2 import DEFAULT_PARAMS, MAX_FRAME_SIZE_LIMIT, Http2Params
from tether.proxy.core.access_log import Format as AccessLogFormat
from tether.proxy.core.config_unread import unread_warnings
from tether.proxy.core.durations import parse_duration
from tether.proxy.core.http import H2_MAX_PENDING_RESETS

# sysexits.h EX_CONFIG: linkerd2-proxy's exit status for any invalid variable.
EX_CONFIG = 64

T = TypeVar("T")


class ConfigError(Exception):
    """A ``LINKERD2_PROXY_*`` variable is missing or has a value the proxy cannot use."""

    def __init__(self, variable: str, value: str | None, reason: str) -> None:
        self.variable = variable
        self.value = value
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.value is None:
            return f"{self.variable}: {self.reason}"
        # A trust-anchor bundle is kilobytes long; the start is enough to recognise it.
        shown = self.value if len(self.value) <= 80 else self.value[:77] + "..."
        return f"invalid {self.variable}={shown!r}: {self.reason}"


class DefaultPolicy(enum.Enum):
    """``LINKERD2_PROXY_INBOUND_DEFAULT_POLICY``: what a port allows until the policy controller answers."""

    DENY = "deny"
    ALL_AUTHENTICATED = "all-authenticated"
    ALL_UNAUTHENTICATED = "all-unauthenticated"
    AUDIT = "audit"
    CLUSTER_AUTHENTICATED = "cluster-authenticated"
    CLUSTER_UNAUTHENTICATED = "cluster-unauthenticated"


class LogFormat(enum.Enum):
    """``LINKERD2_PROXY_LOG_FORMAT``."""

    PLAIN = "PLAIN"
    JSON = "JSON"


@dataclass(frozen=True, slots=True)
class ControlAddr:
    """A control-plane service: where to connect and which identity it must present.

    ``identity`` is the expected server identity and the SNI; None means plaintext.
    As in Linkerd, a loopback address is plaintext and its ``_SVC_NAME`` ignored
    (Linkerd's control-plane pods sit behind their own proxy). Tether's control-plane
    services terminate TLS themselves, so ``TETHER_PROXY_CONTROL_LOOPBACK_TLS=true``
    keeps a given ``_SVC_NAME`` for a loopback address too (tests on 127.0.0.1).
    """

    addr: SocketAddr | NameAddr
    identity: str | None


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential reconnect backoff: attempt n waits min·2ⁿ capped at max, plus up to jitter times that."""

    min: timedelta
    max: timedelta
    jitter: float

    def delay(self, failures: int, random_fraction: float) -> float:
        """Seconds to wait after ``failures`` consecutive failures (1 for the first); ``random_fraction`` in [0, 1)."""
        base: float = min(self.min.total_seconds() * 2 ** min(failures - 1, 32), self.max.total_seconds())
        return min(base + base * self.jitter * random_fraction, self.max.total_seconds())


@dataclass(frozen=True, slots=True)
class TcpOptions:
    """Socket options of one kind of connection: ``<prefix>_KEEPALIVE`` and ``<prefix>_USER_TIMEOUT``."""

    keepalive: timedelta | None = None  # SO_KEEPALIVE, the first probe after this long idle (TCP_KEEPIDLE)
    user_timeout: timedelta | None = None  # TCP_USER_TIMEOUT: unacknowledged data this long ends the connection


@dataclass(frozen=True, slots=True)
class ControlStreamLimits:
    """Limits on control-plane gRPC streams (non-loopback only); None = no limit."""

    initial_timeout: timedelta | None  # LINKERD2_PROXY_CONTROL_STREAM_INITIAL_TIMEOUT
    idle_timeout: timedelta | None  # LINKERD2_PROXY_CONTROL_STREAM_IDLE_TIMEOUT
    lifetime: timedelta | None  # LINKERD2_PROXY_CONTROL_STREAM_LIFETIME


@dataclass(frozen=True, slots=True)
class IdentityConfig:
    """Linkerd identity: what the identity client needs to obtain and refresh the certificate."""

    dir: str  # LINKERD2_PROXY_IDENTITY_DIR: holds csr.der and key.p8
    token_file: str  # LINKERD2_PROXY_IDENTITY_TOKEN_FILE: re-read on every Certify
    trust_anchors_pem: str  # LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS: inline PEM, ≥ 1 certificate
    local_name: str  # LINKERD2_PROXY_IDENTITY_LOCAL_NAME (or SERVER_ID = SERVER_NAME)
    svc: ControlAddr  # LINKERD2_PROXY_IDENTITY_SVC_ADDR / _NAME
    min_refresh: timedelta  # LINKERD2_PROXY_IDENTITY_MIN_REFRESH, default 10s
    max_refresh: timedelta  # LINKERD2_PROXY_IDENTITY_MAX_REFRESH, default 24h


@dataclass(frozen=True, slots=True)
class SpireIdentityConfig:
    """Identity from a SPIRE agent: X.509-SVIDs from its SPIFFE Workload API (``io.spire_client``)."""

    # LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS (deprecated: _SPIRE_SOCKET): unix:/path
    workload_api_addr: str
    local_name: str  # LINKERD2_PROXY_IDENTITY_SERVER_ID (or _LOCAL_NAME): a spiffe:// ID, the SVID to use
    server_name: str  # LINKERD2_PROXY_IDENTITY_SERVER_NAME (or _LOCAL_NAME): the SNI it answers to, a DNS name
    trust_anchors_pem: str  # LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS: inline PEM, ≥ 1 certificate
    backoff: Backoff  # LINKERD2_PROXY_IDENTITY_SPIRE_EXP_BACKOFF_{MIN,MAX,JITTER}, default 100ms, 1s, 0.1


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """HTTP/2 server keep-alive: a PING after ``interval`` without a byte from the client; no answer within
    ``timeout`` ends the connection (LINKERD2_PROXY_{INBOUND,OUTBOUND}_SERVER_HTTP2_KEEP_ALIVE_*)."""

    interval: timedelta
    timeout: timedelta


@dataclass(frozen=True, slots=True)
class Http2Server:
    """An HTTP/2 server's settings, ``LINKERD2_PROXY_{INBOUND,OUTBOUND}_SERVER_HTTP2_*`` (proxy.md §2.7):
    ``_INITIAL_STREAM_WINDOW_SIZE`` with ``_INITIAL_CONNECTION_WINDOW_SIZE`` (both, or neither),
    ``_MAX_CONCURRENT_STREAMS``, ``_MAX_FRAME_SIZE``, ``_MAX_HEADER_LIST_SIZE`` (``params``) and
    ``_MAX_PENDING_ACCEPT_RESET_STREAMS``. Read and checked, but not applied (``unapplied``: each is warned
    about by name at start): ``_ADAPTIVE_FLOW_CONTROL=true`` (the windows stay fixed) and ``_MAX_SEND_BUF_SIZE``
    (what the proxy holds per stream is bounded by the windows it advertised, not by this)."""

    params: Http2Params = DEFAULT_PARAMS
    max_pending_accept_reset_streams: int = H2_MAX_PENDING_RESETS
    unapplied: tuple[str, ...] = ()  # warnings, one per variable set that does not take effect


@dataclass(frozen=True, slots=True)
class InboundConfig:
    """The inbound proxy (traffic to this pod)."""

    listen_addr: SocketAddr  # LINKERD2_PROXY_INBOUND_LISTEN_ADDR, default 0.0.0.0:4143
    # LINKERD2_PROXY_INBOUND_PORTS plus the admin port: policies watched from startup, never expired.
    ports: PortSet
    # LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION: their *default* policy is opaque.
    opaque_ports: PortSet
    ips: frozenset[IpAddress]  # LINKERD2_PROXY_INBOUND_IPS; empty = any destination IP allowed
    default_policy: DefaultPolicy  # LINKERD2_PROXY_INBOUND_DEFAULT_POLICY, default all-unauthenticated
    detect_timeout: timedelta  # LINKERD2_PROXY_INBOUND_DETECT_TIMEOUT, default 10s
    connect_timeout: timedelta  # LINKERD2_PROXY_INBOUND_CONNECT_TIMEOUT, default 300ms
    connect_backoff: Backoff  # LINKERD2_PROXY_INBOUND_CONNECT_EXP_BACKOFF_*, default 100ms/10s/0.1
    discovery_idle_timeout: timedelta  # LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT, default 90s
    # LINKERD2_PROXY_INBOUND_MAX_IN_FLIGHT, default 100000: requests awaiting their response head; more are shed (503).
    max_in_flight: int = 100_000
    # LINKERD2_PROXY_INBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT, default 3s: idle HTTP/1 connections to the app.
    http1_pool_idle_timeout: timedelta = timedelta(seconds=3)
    # LINKERD2_PROXY_MAX_IDLE_CONNS_PER_ENDPOINT (no INBOUND_ in its name), default 10000: idle HTTP/1 connections
    # kept per endpoint (0: none, each closed after its request).
    max_idle_conns_per_endpoint: int = 10_000
    # LINKERD2_PROXY_INBOUND_SERVER_HTTP2_KEEP_ALIVE_INTERVAL and _TIMEOUT (both, or neither: none).
    server_h2_keep_alive: KeepAlive | None = None
    server_h2: Http2Server = Http2Server()  # LINKERD2_PROXY_INBOUND_SERVER_HTTP2_*
    accept: TcpOptions = TcpOptions()  # LINKERD2_PROXY_INBOUND_ACCEPT_{KEEPALIVE,USER_TIMEOUT}: accepted sockets
    connect: TcpOptions = TcpOptions()  # LINKERD2_PROXY_INBOUND_CONNECT_{KEEPALIVE,USER_TIMEOUT}: to the app
    listen_backlog: int = 1024  # LINKERD2_PROXY_INBOUND_TCP_LISTEN_BACKLOG (tokio's default, as Linkerd's)
    # LINKERD2_PROXY_INBOUND_METRICS_AUTHORITY_LABELS: "unsafe" (any case) labels inbound request_total,
    # response_total and response_latency_ms with the request's logical authority; empty (the default): not.
    metrics_authority_labels: bool = False
    # LINKERD2_PROXY_INBOUND_HTTP_QUEUE_CAPACITY, default 10000: HTTP/2 requests waiting at once for a connection
    # to one app port that could not be connected; one more is answered 503 (core.inbound_queue).
    http_queue_capacity: int = 10_000
    # LINKERD2_PROXY_INBOUND_HTTP_FAILFAST_TIMEOUT, default 1s: how long an app port stays unreachable before
    # the requests waiting for it are answered 504 (core.inbound_queue).
    http_failfast_timeout: timedelta = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class OutboundConfig:
    """The outbound proxy (traffic from this pod)."""

    # LINKERD2_PROXY_OUTBOUND_LISTEN_ADDRS (1 or 2), else _OUTBOUND_LISTEN_ADDR, default 127.0.0.1:4140.
    listen_addrs: tuple[SocketAddr, ...]
    detect_timeout: timedelta  # LINKERD2_PROXY_OUTBOUND_DETECT_TIMEOUT, default 10s
    connect_timeout: timedelta  # LINKERD2_PROXY_OUTBOUND_CONNECT_TIMEOUT, default 1s
    connect_backoff: Backoff  # LINKERD2_PROXY_OUTBOUND_CONNECT_EXP_BACKOFF_*, default 100ms/60s/0.1
    discovery_idle_timeout: timedelta  # LINKERD2_PROXY_OUTBOUND_DISCOVERY_IDLE_TIMEOUT, default 5s
    # LINKERD2_PROXY_OUTBOUND_TCP_FAILFAST_TIMEOUT, default 3s: how long a connection waits for an endpoint.
    tcp_failfast_timeout: timedelta = timedelta(seconds=3)
    # LINKERD2_PROXY_OUTBOUND_TCP_QUEUE_CAPACITY, default 10000: connections waiting for an endpoint of one
    # balancer at once; one more is refused (core.balancer_queue).
    tcp_queue_capacity: int = 10_000
    # LINKERD2_PROXY_OUTBOUND_HTTP_FAILFAST_TIMEOUT, default 3s: how long an HTTP request waits for an endpoint.
    http_failfast_timeout: timedelta = timedelta(seconds=3)
    # LINKERD2_PROXY_OUTBOUND_HTTP_QUEUE_CAPACITY, default 10000: HTTP requests waiting for an endpoint of one
    # balancer at once; one more is answered 503 (core.balancer_queue).
    http_queue_capacity: int = 10_000
    # LINKERD2_PROXY_OUTBOUND_MAX_IN_FLIGHT, default 100000: requests awaiting their response head; more are shed.
    max_in_flight: int = 100_000
    # LINKERD2_PROXY_OUTBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT, default 3s: idle HTTP/1 connections to endpoints.
    http1_pool_idle_timeout: timedelta = timedelta(seconds=3)
    # LINKERD2_PROXY_OUTBOUND_MAX_IDLE_CONNS_PER_ENDPOINT, default 10000: idle HTTP/1 connections kept per endpoint.
    max_idle_conns_per_endpoint: int = 10_000
    # LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_KEEP_ALIVE_INTERVAL and _TIMEOUT (both, or neither: none).
    server_h2_keep_alive: KeepAlive | None = None
    server_h2: Http2Server = Http2Server()  # LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_*
    # TETHER_PROXY_OUTBOUND_EXTRA_LISTEN_ADDRS (Tether only): more outbound listeners, for running without
    # iptables. An app connecting to one of them is taken to mean that very address (see OrigDstFallback).
    extra_listen_addrs: tuple[SocketAddr, ...] = ()
    # LINKERD2_PROXY_INGRESS_MODE, default false: an ingress's proxy, where an HTTP request's
    # l5d-dst-override header names its target (docs/proxy.md, Service profiles).
    ingress_mode: bool = False
    # LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS, default false: the request's host (a TLS route's SNI)
    # as the hostname label of the outbound route metrics (core.policy_metrics).
    metrics_hostname_labels: bool = False
    # LINKERD2_PROXY_OUTBOUND_DISABLE_INFORMATIONAL_HEADERS, default = ingress mode: the proxy's own answers to the
    # app carry no l5d-proxy-error, l5d-proxy-connection nor grpc-message.
    disable_informational_headers: bool = False
    accept: TcpOptions = TcpOptions()  # LINKERD2_PROXY_OUTBOUND_ACCEPT_{KEEPALIVE,USER_TIMEOUT}: from the app
    connect: TcpOptions = TcpOptions()  # LINKERD2_PROXY_OUTBOUND_CONNECT_{KEEPALIVE,USER_TIMEOUT}: to endpoints
    listen_backlog: int = 1024  # LINKERD2_PROXY_OUTBOUND_TCP_LISTEN_BACKLOG


class OrigDstFallback(enum.Enum):
    """``TETHER_PROXY_ORIG_DST_FALLBACK`` (Tether only): what a connection that was not redirected is for.

    ``NONE`` is Linkerd's behaviour: without a ``SO_ORIGINAL_DST`` record the
    connection is refused. ``LOCAL_ADDR`` takes the address the client connected
    to as the original destination ("direct addressing"), so the proxy runs
    without iptables on loopback: tests and benchmarks address its listeners
    directly. Redirected connections are unaffected.
    """

    NONE = "none"
    LOCAL_ADDR = "local-addr"


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Everything the proxy reads from its environment, parsed and checked."""

    inbound: InboundConfig
    outbound: OutboundConfig
    admin_listen_addr: SocketAddr  # LINKERD2_PROXY_ADMIN_LISTEN_ADDR, default 127.0.0.1:4191
    # LINKERD2_PROXY_CONTROL_LISTEN_ADDR, default 0.0.0.0:4190: the tap server, bound only with a tap client.
    control_listen_addr: SocketAddr
    tap_svc_name: str | None  # LINKERD2_PROXY_TAP_SVC_NAME: the one identity allowed to tap; None = no tap
    destination: ControlAddr  # LINKERD2_PROXY_DESTINATION_SVC_ADDR / _NAME
    destination_context: str  # LINKERD2_PROXY_DESTINATION_CONTEXT: context_token sent as is
    # LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES, default svc.cluster.local.; "." = every name.
    profile_suffixes: tuple[str, ...]
    profile_networks: tuple[IpNetwork, ...]  # LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS
    policy: ControlAddr  # LINKERD2_PROXY_POLICY_SVC_ADDR / _NAME
    policy_workload: str  # LINKERD2_PROXY_POLICY_WORKLOAD: sent as is
    cluster_networks: tuple[IpNetwork, ...]  # LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS
    control_streams: ControlStreamLimits
    identity: IdentityConfig | SpireIdentityConfig
    log_filter: str  # LINKERD2_PROXY_LOG, default warn,linkerd=info,hickory=error
    log_format: LogFormat  # LINKERD2_PROXY_LOG_FORMAT, default PLAIN
    shutdown_grace_period: timedelta  # LINKERD2_PROXY_SHUTDOWN_GRACE_PERIOD, default 2m
    shutdown_endpoint_enabled: bool  # LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED, default false
    metrics_retain_idle: timedelta = timedelta(minutes=10)  # LINKERD2_PROXY_METRICS_RETAIN_IDLE, default 10m
    # LINKERD2_PROXY_HTTP2_INITIAL_STREAM_WINDOW_SIZE and _CONNECTION_WINDOW_SIZE: the proxy's HTTP/2 clients.
    http2_client: Http2Params = DEFAULT_PARAMS
    orig_dst_fallback: OrigDstFallback = OrigDstFallback.NONE  # TETHER_PROXY_ORIG_DST_FALLBACK
    # LINKERD2_PROXY_DESTINATION_PROFILE_INITIAL_TIMEOUT, default 500ms: how long an inbound request waits for
    # the first profile answer of the service it names (io.inbound_profiles).
    profile_initial_timeout: timedelta = timedelta(milliseconds=500)
    # LINKERD2_PROXY_ACCESS_LOG: apache or json, the inbound HTTP access log on standard error; None: none.
    access_log: AccessLogFormat | None = None
    # Proxy variables in the environment that nothing read (core.config_unread), and values refused without
    # stopping the proxy (as linkerd2-proxy: a bad LINKERD2_PROXY_ACCESS_LOG): each a warning naming it.
    unread: tuple[str, ...] = ()

    @property
    def unapplied(self) -> tuple[str, ...]:
        """Variables set that do not take effect, each as a warning naming it (logged at start)."""
        return self.inbound.server_h2.unapplied + self.outbound.server_h2.unapplied + self.unread

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProxyConfig:
        """Build the configuration from ``env``; raises ``ConfigError`` naming the first bad variable."""
        e = _Env(env)
        admin = e.get("LINKERD2_PROXY_ADMIN_LISTEN_ADDR", parse_socket_addr, "127.0.0.1:4191")
        cluster_networks = e.get("LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS", _list(parse_network), "")
        config = cls(
            inbound=_inbound(e, admin, cluster_networks),
            outbound=_outbound(e),
            admin_listen_addr=admin,
            control_listen_addr=e.get("LINKERD2_PROXY_CONTROL_LISTEN_ADDR", parse_socket_addr, "0.0.0.0:4190"),
            tap_svc_name=e.optional("LINKERD2_PROXY_TAP_SVC_NAME", parse_dns_name),
            destination=_control_addr(e, "LINKERD2_PROXY_DESTINATION"),
            destination_context=e.get("LINKERD2_PROXY_DESTINATION_CONTEXT", str, ""),
            profile_suffixes=e.get(
                "LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES", _list(_parse_suffix), "svc.cluster.local."
            ),
            profile_networks=e.get("LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS", _list(parse_network), ""),
            policy=_control_addr(e, "LINKERD2_PROXY_POLICY"),
            policy_workload=e.required("LINKERD2_PROXY_POLICY_WORKLOAD", _non_empty),
            cluster_networks=cluster_networks,
            control_streams=_control_streams(e),
            identity=_identity(e),
            log_filter=e.get("LINKERD2_PROXY_LOG", str, "warn,linkerd=info,hickory=error"),
            log_format=e.get("LINKERD2_PROXY_LOG_FORMAT", _parse_log_format, "PLAIN"),
            shutdown_grace_period=e.get("LINKERD2_PROXY_SHUTDOWN_GRACE_PERIOD", parse_duration, "2m"),
            shutdown_endpoint_enabled=e.get("LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED", _parse_bool, "false"),
            metrics_retain_idle=e.get("LINKERD2_PROXY_METRICS_RETAIN_IDLE", parse_duration, "10m"),
            http2_client=Http2Params(
                stream_window=e.get("LINKERD2_PROXY_HTTP2_INITIAL_STREAM_WINDOW_SIZE", _parse_window,
                                    str(DEFAULT_PARAMS.stream_window)),
                connection_window=e.get("LINKERD2_PROXY_HTTP2_INITIAL_CONNECTION_WINDOW_SIZE",
                                        _parse_connection_window, str(DEFAULT_PARAMS.connection_window))),
            orig_dst_fallback=e.get("TETHER_PROXY_ORIG_DST_FALLBACK", _parse_orig_dst_fallback, "none"),
            profile_initial_timeout=e.get("LINKERD2_PROXY_DESTINATION_PROFILE_INITIAL_TIMEOUT", parse_duration,
                                          "500ms"),
        )
        access_log, refused = _access_log(e)
        return replace(config, access_log=access_log, unread=refused + unread_warnings(env, e.read))


class _Env:
    """Reads variables; a parser's ``ValueError`` becomes a ``ConfigError`` naming the variable."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self.read: set[str] = set()  # every variable asked for, set or not

    def get(self, var: str, parse: Callable[[str], T], default: str) -> T:
        """The parsed value, or the parsed ``default``: defaults are spelled as Linkerd documents them."""
        self.read.add(var)
        return self._parse(var, self._env.get(var, default), parse)

    def optional(self, var: str, parse: Callable[[str], T]) -> T | None:
        self.read.add(var)
        raw = self._env.get(var)
        return None if raw is None else self._parse(var, raw, parse)

    def raw(self, var: str) -> str | None:
        """The unparsed value, for errors that involve two variables."""
        self.read.add(var)
        return self._env.get(var)

    def required(self, var: str, parse: Callable[[str], T]) -> T:
        self.read.add(var)
        raw = self._env.get(var)
        if raw is None:
            raise ConfigError(var, None, "must be set")
        return self._parse(var, raw, parse)

    @staticmethod
    def _parse(var: str, raw: str, parse: Callable[[str], T]) -> T:
        try:
            return parse(raw)
        except ValueError as err:
            raise ConfigError(var, raw, str(err)) from None


def _inbound(e: _Env, admin: SocketAddr, cluster_networks: tuple[IpNetwork, ...]) -> InboundConfig:
    policy_var = "LINKERD2_PROXY_INBOUND_DEFAULT_POLICY"
    policy = e.get(policy_var, _parse_default_policy, "all-unauthenticated")
    if policy in (DefaultPolicy.CLUSTER_AUTHENTICATED, DefaultPolicy.CLUSTER_UNAUTHENTICATED) and not cluster_networks:
        raise ConfigError(policy_var, policy.value, "needs LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS to be set")
    ports = e.get("LINKERD2_PROXY_INBOUND_PORTS", PortSet.parse, "")
    return InboundConfig(
        listen_addr=e.get("LINKERD2_PROXY_INBOUND_LISTEN_ADDR", parse_socket_addr, "0.0.0.0:4143"),
        # Linkerd always watches the admin port's policy too (port 0 is "any free port": nothing to watch).
        ports=ports.with_port(admin.port) if admin.port else ports,
        opaque_ports=e.get("LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION", PortSet.parse, ""),
        ips=e.get("LINKERD2_PROXY_INBOUND_IPS", lambda s: frozenset(_list(parse_ip)(s)), ""),
        default_policy=policy,
        detect_timeout=e.get("LINKERD2_PROXY_INBOUND_DETECT_TIMEOUT", parse_duration, "10s"),
        connect_timeout=e.get("LINKERD2_PROXY_INBOUND_CONNECT_TIMEOUT", parse_duration, "300ms"),
        connect_backoff=_backoff(e, "LINKERD2_PROXY_INBOUND_CONNECT_EXP_BACKOFF", ("100ms", "10s", 0.1)),
        discovery_idle_timeout=e.get("LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT", parse_duration, "90s"),
        max_in_flight=e.get("LINKERD2_PROXY_INBOUND_MAX_IN_FLIGHT", _parse_positive_int, "100000"),
        http1_pool_idle_timeout=e.get("LINKERD2_PROXY_INBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT", parse_duration,
                                      "3s"),
        max_idle_conns_per_endpoint=e.get("LINKERD2_PROXY_MAX_IDLE_CONNS_PER_ENDPOINT", _parse_count, "10000"),
        server_h2_keep_alive=_keep_alive(e, "LINKERD2_PROXY_INBOUND_SERVER_HTTP2_KEEP_ALIVE"),
        server_h2=_http2_server(e, "LINKERD2_PROXY_INBOUND_SERVER_HTTP2"),
        accept=_tcp_options(e, "LINKERD2_PROXY_INBOUND_ACCEPT"),
        connect=_tcp_options(e, "LINKERD2_PROXY_INBOUND_CONNECT"),
        listen_backlog=e.get("LINKERD2_PROXY_INBOUND_TCP_LISTEN_BACKLOG", _parse_positive_int, "1024"),
        metrics_authority_labels=e.get("LINKERD2_PROXY_INBOUND_METRICS_AUTHORITY_LABELS", _parse_authority_labels,
                                       ""),
        http_queue_capacity=e.get("LINKERD2_PROXY_INBOUND_HTTP_QUEUE_CAPACITY", _parse_positive_int, "10000"),
        http_failfast_timeout=e.get("LINKERD2_PROXY_INBOUND_HTTP_FAILFAST_TIMEOUT", parse_duration, "1s"),
    )


def _outbound(e: _Env) -> OutboundConfig:
    addrs = e.optional("LINKERD2_PROXY_OUTBOUND_LISTEN_ADDRS", _parse_outbound_addrs)
    # The chart sets both; _ADDRS wins, and _ADDR is checked all the same.
    single = e.get("LINKERD2_PROXY_OUTBOUND_LISTEN_ADDR", parse_socket_addr, "127.0.0.1:4140")
    if addrs is None:
        addrs = (single,)
    ingress_mode = e.get("LINKERD2_PROXY_INGRESS_MODE", _parse_bool, "false")
    return OutboundConfig(
        listen_addrs=addrs,
        detect_timeout=e.get("LINKERD2_PROXY_OUTBOUND_DETECT_TIMEOUT", parse_duration, "10s"),
        connect_timeout=e.get("LINKERD2_PROXY_OUTBOUND_CONNECT_TIMEOUT", parse_duration, "1s"),
        connect_backoff=_backoff(e, "LINKERD2_PROXY_OUTBOUND_CONNECT_EXP_BACKOFF", ("100ms", "60s", 0.1)),
        discovery_idle_timeout=e.get("LINKERD2_PROXY_OUTBOUND_DISCOVERY_IDLE_TIMEOUT", parse_duration, "5s"),
        tcp_failfast_timeout=e.get("LINKERD2_PROXY_OUTBOUND_TCP_FAILFAST_TIMEOUT", parse_duration, "3s"),
        tcp_queue_capacity=e.get("LINKERD2_PROXY_OUTBOUND_TCP_QUEUE_CAPACITY", _parse_positive_int, "10000"),
        http_failfast_timeout=e.get("LINKERD2_PROXY_OUTBOUND_HTTP_FAILFAST_TIMEOUT", parse_duration, "3s"),
        http_queue_capacity=e.get("LINKERD2_PROXY_OUTBOUND_HTTP_QUEUE_CAPACITY", _parse_positive_int, "10000"),
        max_in_flight=e.get("LINKERD2_PROXY_OUTBOUND_MAX_IN_FLIGHT", _parse_positive_int, "100000"),
        http1_pool_idle_timeout=e.get("LINKERD2_PROXY_OUTBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT", parse_duration,
                                      "3s"),
        max_idle_conns_per_endpoint=e.get("LINKERD2_PROXY_OUTBOUND_MAX_IDLE_CONNS_PER_ENDPOINT", _parse_count,
                                          "10000"),
        server_h2_keep_alive=_keep_alive(e, "LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_KEEP_ALIVE"),
        server_h2=_http2_server(e, "LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2"),
        extra_listen_addrs=e.get("TETHER_PROXY_OUTBOUND_EXTRA_LISTEN_ADDRS", _list(parse_socket_addr), ""),
        ingress_mode=ingress_mode,
        disable_informational_headers=e.get("LINKERD2_PROXY_OUTBOUND_DISABLE_INFORMATIONAL_HEADERS", _parse_bool,
                                            str(ingress_mode).lower()),
        metrics_hostname_labels=e.get("LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS", _parse_bool, "false"),
        accept=_tcp_options(e, "LINKERD2_PROXY_OUTBOUND_ACCEPT"),
        connect=_tcp_options(e, "LINKERD2_PROXY_OUTBOUND_CONNECT"),
        listen_backlog=e.get("LINKERD2_PROXY_OUTBOUND_TCP_LISTEN_BACKLOG", _parse_positive_int, "1024"),
    )


def _access_log(e: _Env) -> tuple[AccessLogFormat | None, tuple[str, ...]]:
    """The format, and a warning for a value that names none: linkerd2-proxy then logs no access and goes on."""
    var = "LINKERD2_PROXY_ACCESS_LOG"
    raw = e.optional(var, str)
    if raw is None:
        return None, ()
    try:
        return AccessLogFormat.parse(raw), ()
    except ValueError as exc:
        return None, (f"invalid {var}={raw!r}: {exc}; no access log",)


def _tcp_options(e: _Env, prefix: str) -> TcpOptions:
    return TcpOptions(e.optional(f"{prefix}_KEEPALIVE", _parse_positive_duration),
                      e.optional(f"{prefix}_USER_TIMEOUT", _parse_positive_duration))


def _keep_alive(e: _Env, prefix: str) -> KeepAlive | None:
    """``prefix``_INTERVAL and ``prefix``_TIMEOUT: both set, or neither (as Linkerd needs both)."""
    interval = e.optional(f"{prefix}_INTERVAL", parse_duration)
    timeout = e.optional(f"{prefix}_TIMEOUT", parse_duration)
    if interval is None and timeout is None:
        return None
    if interval is None or timeout is None:
        missing, given = (f"{prefix}_INTERVAL", f"{prefix}_TIMEOUT") if interval is None else \
            (f"{prefix}_TIMEOUT", f"{prefix}_INTERVAL")
        raise ConfigError(missing, None, f"must be set with {given}")
    if interval <= timedelta(0) or timeout <= timedelta(0):
        raise ConfigError(f"{prefix}_INTERVAL", e.raw(f"{prefix}_INTERVAL"), "keep-alive durations must be > 0")
    return KeepAlive(interval, timeout)


def _http2_server(e: _Env, prefix: str) -> Http2Server:
    """``prefix``_*: see ``Http2Server``; the two windows both set, or neither (as Linkerd needs both)."""
    stream_var, conn_var = f"{prefix}_INITIAL_STREAM_WINDOW_SIZE", f"{prefix}_INITIAL_CONNECTION_WINDOW_SIZE"
    stream = e.optional(stream_var, _parse_window)
    conn = e.optional(conn_var, _parse_connection_window)
    if (stream is None) != (conn is None):
        missing, given = (stream_var, conn_var) if stream is None else (conn_var, stream_var)
        raise ConfigError(missing, None, f"must be set with {given}")
    d = DEFAULT_PARAMS
    params = Http2Params(
        stream_window=d.stream_window if stream is None else stream,
        connection_window=d.connection_window if conn is None else conn,
        max_concurrent_streams=e.get(f"{prefix}_MAX_CONCURRENT_STREAMS", _parse_positive_int,
                                     str(d.max_concurrent_streams)),
        max_frame_size=e.get(f"{prefix}_MAX_FRAME_SIZE", _parse_frame_size, str(d.max_frame_size)),
        max_header_list_size=e.get(f"{prefix}_MAX_HEADER_LIST_SIZE", _parse_positive_int,
                                   str(d.max_header_list_size)))
    resets = e.get(f"{prefix}_MAX_PENDING_ACCEPT_RESET_STREAMS", _parse_positive_int, str(H2_MAX_PENDING_RESETS))
    unapplied: list[str] = []
    if e.optional(f"{prefix}_ADAPTIVE_FLOW_CONTROL", _parse_bool):
        unapplied.append(f"{prefix}_ADAPTIVE_FLOW_CONTROL=true is not applied: adaptive (BDP) flow control is not "
                         f"implemented; the fixed windows ({params.stream_window} per stream, "
                         f"{params.connection_window} per connection) are advertised")
    send_buf = e.optional(f"{prefix}_MAX_SEND_BUF_SIZE", _parse_positive_int)
    if send_buf is not None:
        unapplied.append(f"{prefix}_MAX_SEND_BUF_SIZE={send_buf} is not applied: what the proxy holds for a stream "
                         f"is bounded by the windows it advertised to the stream's source instead")
    return Http2Server(params, resets, tuple(unapplied))


def _control_addr(e: _Env, base: str) -> ControlAddr:
    addr_var, name_var = f"{base}_SVC_ADDR", f"{base}_SVC_NAME"
    addr = e.required(addr_var, parse_addr)
    name = e.optional(name_var, parse_dns_name)  # checked even when loopback ignores it
    if addr.is_loopback:
        loopback_tls = e.get("TETHER_PROXY_CONTROL_LOOPBACK_TLS", _parse_bool, "false")
        return ControlAddr(addr, name if loopback_tls else None)
    if name is None:
        raise ConfigError(name_var, None, f"must be set because {addr_var}={addr} is not a loopback address")
    return ControlAddr(addr, name)


def _control_streams(e: _Env) -> ControlStreamLimits:
    # For these three only, an empty value means unset.
    names = ("INITIAL_TIMEOUT", "IDLE_TIMEOUT", "LIFETIME")
    values = [
        e.get(f"LINKERD2_PROXY_CONTROL_STREAM_{n}", lambda s: parse_duration(s) if s.strip() else None, "")
        for n in names
    ]
    # Each limit that is set must not exceed the next one that is set: initial <= idle <= lifetime.
    set_ = [(f"LINKERD2_PROXY_CONTROL_STREAM_{n}", v) for n, v in zip(names, values) if v is not None]
    for (short_var, short), (long_var, long) in zip(set_, set_[1:]):
        if short > long:
            raise ConfigError(short_var, e.raw(short_var), f"must not exceed {long_var}={e.raw(long_var)}")
    return ControlStreamLimits(*values)


def _identity(e: _Env) -> IdentityConfig | SpireIdentityConfig:
    e.optional("LINKERD2_PROXY_IDENTITY_DISABLED", _refuse_non_empty("identity cannot be disabled"))
    spire = _spire_identity(e)
    if spire is not None:
        return spire
    min_var, max_var = "LINKERD2_PROXY_IDENTITY_MIN_REFRESH", "LINKERD2_PROXY_IDENTITY_MAX_REFRESH"
    min_refresh = e.get(min_var, parse_duration, "10s")
    max_refresh = e.get(max_var, parse_duration, "24h")
    if min_refresh > max_refresh:
        # At least one was set, or the defaults would be in order.
        var = min_var if e.raw(min_var) is not None else max_var
        raise ConfigError(var, e.raw(var), f"must keep {min_var} <= {max_var} ({min_refresh} > {max_refresh})")
    return IdentityConfig(
        dir=e.required("LINKERD2_PROXY_IDENTITY_DIR", _non_empty),
        token_file=e.required("LINKERD2_PROXY_IDENTITY_TOKEN_FILE", _non_empty),
        trust_anchors_pem=e.required("LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS", _parse_trust_anchors),
        local_name=_local_name(e),
        svc=_control_addr(e, "LINKERD2_PROXY_IDENTITY"),
        min_refresh=min_refresh,
        max_refresh=max_refresh,
    )


SPIRE_ADDR = "LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS"
SPIRE_SOCKET = "LINKERD2_PROXY_IDENTITY_SPIRE_SOCKET"  # the deprecated spelling


def _spire_identity(e: _Env) -> SpireIdentityConfig | None:
    """SPIRE's identity when its address is set (as linkerd2-proxy: the id must be a spiffe:// URI)."""
    addr = e.optional(SPIRE_ADDR, _parse_unix_target)
    if addr is None:
        addr = e.optional(SPIRE_SOCKET, _parse_unix_target)
    if addr is None:
        return None
    local = e.optional("LINKERD2_PROXY_IDENTITY_LOCAL_NAME", str)
    id_var, name_var = (("LINKERD2_PROXY_IDENTITY_LOCAL_NAME",) * 2 if local is not None else
                        ("LINKERD2_PROXY_IDENTITY_SERVER_ID", "LINKERD2_PROXY_IDENTITY_SERVER_NAME"))
    server_id = e.required(id_var, _parse_spiffe_id)
    return SpireIdentityConfig(
        workload_api_addr=addr,
        local_name=server_id,
        server_name=e.required(name_var, parse_dns_name),
        trust_anchors_pem=e.required("LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS", _parse_trust_anchors),
        backoff=_backoff(e, "LINKERD2_PROXY_IDENTITY_SPIRE_EXP_BACKOFF", ("100ms", "1s", 0.1)),
    )


def _parse_unix_target(text: str) -> str:
    """A Workload API address: ``unix:/path`` or ``unix:///path`` (a bare absolute path is taken as one)."""
    path = text[len("unix://"):] if text.startswith("unix://") else text[len("unix:"):] if text.startswith(
        "unix:") else text
    if not path.startswith("/"):
        raise ValueError("must be unix:///absolute/path (the SPIRE agent's Workload API socket)")
    return f"unix://{path}"


def _parse_spiffe_id(text: str) -> str:
    if not is_spiffe_id(text):
        raise ValueError("must be a spiffe:// ID (SPIRE identity requires a SPIFFE TLS id)")
    return text


def _local_name(e: _Env) -> str:
    name = e.optional("LINKERD2_PROXY_IDENTITY_LOCAL_NAME", parse_dns_name)
    if name is not None:
        return name
    # The alternative spelling: a server id and a server name, which Linkerd identity needs equal.
    server_id = e.optional("LINKERD2_PROXY_IDENTITY_SERVER_ID", parse_dns_name)
    server_name = e.optional("LINKERD2_PROXY_IDENTITY_SERVER_NAME", parse_dns_name)
    if server_id is None or server_name is None:
        raise ConfigError(
            "LINKERD2_PROXY_IDENTITY_LOCAL_NAME",
            None,
            "must be set (or both LINKERD2_PROXY_IDENTITY_SERVER_ID and _SERVER_NAME)",
        )
    if server_id != server_name:
        raise ConfigError(
            "LINKERD2_PROXY_IDENTITY_SERVER_NAME",
            server_name,
            f"must equal LINKERD2_PROXY_IDENTITY_SERVER_ID ({server_id}) for Linkerd identity",
        )
    return server_id


def _backoff(e: _Env, base: str, default: tuple[str, str, float]) -> Backoff:
    min_var, max_var, jitter_var = f"{base}_MIN", f"{base}_MAX", f"{base}_JITTER"
    low = e.optional(min_var, parse_duration)
    high = e.optional(max_var, parse_duration)
    jitter = e.optional(jitter_var, _parse_jitter)
    if low is None and high is None and jitter is None:
        return Backoff(parse_duration(default[0]), parse_duration(default[1]), default[2])
    if low is None or high is None:
        missing, other = (min_var, max_var) if low is None else (max_var, min_var)
        raise ConfigError(missing, None, f"must be set together with {other} (and {jitter_var}, optional)")
    if low > high:
        raise ConfigError(min_var, e.raw(min_var), f"must not exceed {max_var}={e.raw(max_var)}")
    return Backoff(low, high, 0.0 if jitter is None else jitter)


def _list(parse: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    """A comma-separated list of ``parse``-able items; blank items are ignored."""

    def parse_list(text: str) -> tuple[T, ...]:
        return tuple(parse(item.strip()) for item in text.split(",") if item.strip())

    return parse_list


def _parse_outbound_addrs(text: str) -> tuple[SocketAddr, ...]:
    addrs = _list(parse_socket_addr)(text)
    if not 1 <= len(addrs) <= 2:
        raise ValueError(f"needs 1 or 2 addresses (e.g. an IPv4 and an IPv6 one), not {len(addrs)}")
    return addrs


def _parse_suffix(text: str) -> str:
    # "." is the root: every name is eligible for profile lookups.
    return "." if text == "." else parse_dns_name(text)


def _parse_default_policy(text: str) -> DefaultPolicy:
    try:
        return DefaultPolicy(text)
    except ValueError:
        choices = ", ".join(p.value for p in DefaultPolicy)
        raise ValueError(f"{text!r} is not a default policy (one of {choices})") from None


def _parse_log_format(text: str) -> LogFormat:
    try:
        return LogFormat(text.upper())
    except ValueError:
        raise ValueError(f"{text!r} is not a log format (PLAIN or JSON)") from None


def _parse_orig_dst_fallback(text: str) -> OrigDstFallback:
    try:
        return OrigDstFallback(text)
    except ValueError:
        raise ValueError(f"{text!r} is not one of none, local-addr") from None


def _parse_bool(text: str) -> bool:
    # Exactly Rust's bool parsing: no "1", "yes" or "True".
    if text not in ("true", "false"):
        raise ValueError(f"{text!r} is not a boolean (true or false)")
    return text == "true"


def _parse_authority_labels(text: str) -> bool:
    # As linkerd2-proxy: empty is off, "unsafe" in any case is on, and anything else stops the proxy.
    if not text:
        return False
    if text.lower() != "unsafe":
        raise ValueError(f"{text!r} is not an authority labels setting (unsafe, or empty)")
    return True


def _parse_count(text: str, least: int = 0) -> int:
    # As Rust's usize parsing: digits only, no sign, no underscores, no spaces.
    if not text.isascii() or not text.isdigit() or int(text) < least:
        raise ValueError(f"{text!r} is not {'a positive integer' if least else 'a whole number'}")
    return int(text)


def _parse_positive_int(text: str) -> int:
    return _parse_count(text, least=1)


def _parse_positive_duration(text: str) -> timedelta:
    value = parse_duration(text)
    if value <= timedelta(0):
        raise ValueError(f"{text!r} is not a duration above zero")
    return value


def _parse_window(text: str) -> int:
    value = _parse_positive_int(text)
    if value > 2**31 - 1:
        raise ValueError(f"{text} is over 2147483647, HTTP/2's largest window")
    return value


def _parse_connection_window(text: str) -> int:
    value = _parse_window(text)
    if value < DEFAULT_PARAMS.stream_window:
        raise ValueError(f"{text} is under 65535: an HTTP/2 connection window starts there and can only grow")
    return value


def _parse_frame_size(text: str) -> int:
    value = _parse_positive_int(text)
    if not DEFAULT_PARAMS.max_frame_size <= value <= MAX_FRAME_SIZE_LIMIT:
        raise ValueError(f"{text} is not between 16384 and {MAX_FRAME_SIZE_LIMIT} (RFC 9113 §6.5.2)")
    return value


def _parse_jitter(text: str) -> float:
    # float() would also take " 1", "1_0", "inf" and "nan".
    try:
        value = float(text) if text == text.strip() and "_" not in text else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{text!r} is not a non-negative number")
    return value


_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----([A-Za-z0-9+/=\s]*?)-----END CERTIFICATE-----")


def _parse_trust_anchors(text: str) -> str:
    # Checked here so a bad bundle stops the proxy at startup with exit code 64: PEM certificate blocks whose
    # base64 is a DER SEQUENCE. (The X.509 parse is ssl's when the contexts load them, and tether.proxy.certify's
    # when it checks a certificate: the serving proxy loads no X.509 library of its own, see core.certified.)
    blocks = _PEM_CERTIFICATE.findall(text)
    if not blocks:
        raise ValueError("trust anchors: no readable PEM certificate")
    for block in blocks:
        try:
            der = base64.b64decode("".join(block.split()), validate=True)
        except ValueError:
            raise ValueError("trust anchors: no readable PEM certificate (its base64 does not decode)") from None
        if der[:1] != b"\x30":
            raise ValueError("trust anchors: no readable PEM certificate (one is not DER)")
    return text


def _non_empty(text: str) -> str:
    if not text:
        raise ValueError("must not be empty")
    return text


def _refuse_non_empty(reason: str) -> Callable[[str], None]:
    def refuse(text: str) -> None:
        if text:
            raise ValueError(reason)

    return refuse
