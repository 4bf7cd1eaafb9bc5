"""The destination's configuration: one typed object, built by ``tether.cli.destination`` from flags.

Mirrors the flags of Linkerd's destination controller that Tether implements
(``-addr``, ``-metrics-addr``, ``-controller-namespace``, ``-cluster-domain``,
``-identity-trust-domain``, ``-default-opaque-ports``, ``-stream-queue-capacity``,
``-enable-h2-upgrade``, ``-enable-ipv6``, ``-outbound-transport-mode``,
``-ext-endpoint-zone-weights``) plus the TLS files the gRPC port serves with.  Nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tether.naming import DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN
from tether.ports import DEFAULT_OPAQUE_PORTS, PortSet
from tether.serving.grpc_server import TlsFiles
from tether.serving.stream import DEFAULT_MAX_BYTES

DEFAULT_ADDR = "0.0.0.0:8086"
DEFAULT_ADMIN_ADDR = "0.0.0.0:9996"
DEFAULT_STREAM_QUEUE_CAPACITY = 100


@dataclass(frozen=True, slots=True)
class Http2ClientParams:
    """HTTP/2 settings handed to proxies for meshed endpoints (Linkerd's chart defaults)."""

    keep_alive_interval: float = 10.0
    keep_alive_timeout: float = 3.0
    keep_alive_while_idle: bool = True


@dataclass(frozen=True, slots=True)
class DestinationConfig:
    addr: str = DEFAULT_ADDR
    admin_addr: str = DEFAULT_ADMIN_ADDR
    # None serves plaintext gRPC: only for tests and local debugging.
    tls: TlsFiles | None = None
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    identity_trust_domain: str = DEFAULT_TRUST_DOMAIN
    control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS
    default_opaque_ports: PortSet = DEFAULT_OPAQUE_PORTS
    stream_queue_capacity: int = DEFAULT_STREAM_QUEUE_CAPACITY
    stream_queue_bytes: int = DEFAULT_MAX_BYTES
    enable_h2_upgrade: bool = True
    # Linkerd's ``-enable-ipv6`` (true, as its binary's default; its chart passes false unless ``disableIPv6: false``):
    # IPv6 pod endpoints are sent, and preferred to the same pod's IPv4 one.
    enable_ipv6: bool = True
    # Linkerd's ``-outbound-transport-mode=transport-header``: every meshed endpoint gets opaque transport.
    force_opaque_transport: bool = False
    # Linkerd's experimental ``-ext-endpoint-zone-weights``: zone-local endpoints get 10x the weight in ``Get``
    # streams (for balancers built on the API; linkerd2-proxy, like Tether's proxy, does not read weights).
    ext_endpoint_zone_weights: bool = False
    http2: Http2ClientParams = field(default_factory=Http2ClientParams)
    # How long ``stop`` lets streams finish their last write before the gRPC server cancels them.
    shutdown_grace: float = 2.0

    def __post_init__(self) -> None:
        if self.stream_queue_capacity < 1:
            raise ValueError(f"stream queue capacity must be at least 1, not {self.stream_queue_capacity}")
        if self.stream_queue_bytes < 1:
            raise ValueError(f"stream queue bytes must be at least 1, not {self.stream_queue_bytes}")
