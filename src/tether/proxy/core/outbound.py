"""The outbound connection layer: from an app's connection to a peer (proxy.md §3, §4.2, §5.2, §6.2, §7.10).

For each connection accepted on the outbound listener: refuse loops; ask
discovery about the original destination (only inside the profile networks);
detect the protocol unless discovery says opaque; then hand the connection to
the layer for that protocol (``PROTOCOL_LAYERS``): ``Http1`` goes to the
request-level layer (``tether.proxy.core.http1_proxy``, via ``http1_requests``), ``Http2``
to the per-stream HTTP/2 layer (``http2_requests``); opaque is carried per
connection by ``tcp_forward``, under the client policy's opaque route when it
has one, and a target whose policy is ``tls`` is detected as TLS and routed by
its SNI (both in ``core.connection_routes``).

``tcp_forward`` picks an endpoint (P2C, failing fast when the service has had
none for the failfast timeout), connects with mTLS when the endpoint has an
identity, sends the transport header when ALPN agreed to it, and forwards.
A failed connect puts the endpoint in backoff and tries another, a few times.

The layer yields ``tether.proxy.core.commands``; it does no I/O. Caller:
``tether.proxy.io.driver`` (via ``tether.proxy.app``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator
from functools import partial
from dataclasses import dataclass, replace
from typing import Any

from tether.proxy.core import labels
from tether.proxy.codec.addrs import IpAddress, IpNetwork, SocketAddr
from tether.proxy.core.commands import Command, Connected, Detect, Failed, Forward, Layer, Refuse, Send, SetLabels, Wait
from tether.proxy.core.http2_proxy import http2
from tether.proxy.core.http import HttpSettings, Router
from tether.proxy.core.http1_proxy import http1
from tether.proxy.core.routes import outbound_router
from tether.proxy.core.balancer_queue import DEFAULT_CAPACITY, Queue, queued
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.connection_routes import RouteContext, opaque_connection, tls_connection
from tether.proxy.core.policy_metrics import PolicyMetrics
from tether.proxy.core.resolution import FORWARD, DiscoverySource, PolicySource, ProfileSource, Resolution
from tether.proxy.core.server_policy import Protocol
from tether.proxy.core.endpoint import Endpoint, plan
from tether.proxy.codec import detect
from tether.proxy.codec.transport_header import ALPN_PROTOCOL, SessionProtocol

CONNECT_ATTEMPTS = 3
TRANSPORT_ALPN = ALPN_PROTOCOL.decode()


@dataclass(frozen=True, slots=True)
class OutboundSettings:
    """The parts of ``ProxyConfig`` the outbound layer uses."""

    detect_timeout: float
    connect_timeout: float
    failfast: float  # LINKERD2_PROXY_OUTBOUND_TCP_FAILFAST_TIMEOUT: discovery's first answer, and tcp_queue's
    profile_networks: tuple[IpNetwork, ...]
    local_ips: frozenset[IpAddress]  # LINKERD2_PROXY_INBOUND_IPS: our own pod
    own_addrs: frozenset[SocketAddr]  # the proxy's own listeners: a connection to one is a loop
    refuse_loopback: bool  # Linkerd refuses loopback targets; not when running without iptables
    # Extra outbound listeners (no iptables): they stand for a destination, but connecting there is a loop too.
    direct_addrs: frozenset[SocketAddr] = frozenset()
    http: HttpSettings | None = None  # the request-level HTTP/1 layer; None: HTTP/1 is forwarded per connection
    # Ingress mode (LINKERD2_PROXY_INGRESS_MODE): a lease on the profile watch of a name:port, for l5d-dst-override.
    named_profiles: Callable[[str, int], ProfileSource] | None = None
    # OutboundPolicies.Watch (a lease on the client policy watch of ip:port); None: no policy controller.
    client_policies: Callable[[SocketAddr], PolicySource] | None = None
    policy_metrics: PolicyMetrics | None = None  # outbound_{http,grpc}_route_* (proxy.md §9.5)
    draw: Callable[[], float] = random.random  # uniform in [0, 1): a connection route's weighted backend
    clock: Callable[[], float] = time.monotonic  # seconds: how long protocol detection took
    # Waiting for an endpoint (core.balancer_queue): connections (_OUTBOUND_TCP_QUEUE_CAPACITY, with ``failfast``)
    # and HTTP requests (_OUTBOUND_HTTP_QUEUE_CAPACITY, _OUTBOUND_HTTP_FAILFAST_TIMEOUT).
    tcp_queue_capacity: int = DEFAULT_CAPACITY
    http_queue: Queue = Queue()


def outbound(orig_dst: SocketAddr, settings: OutboundSettings, discovery: DiscoverySource | None) -> Layer:
    accept_labels = labels.accept_outbound(orig_dst)
    yield SetLabels(accept_labels)
    if orig_dst in settings.own_addrs or (settings.refuse_loopback and orig_dst.ip.is_loopback):
        yield Refuse("loop")
        return
    watch = policy = None
    if discovery is not None and any(orig_dst.ip in net for net in settings.profile_networks):
        watch = discovery.profile(orig_dst)
    if settings.client_policies is not None:
        # Asked for every target beside the profile (proxy.md §7.1): outside the cluster, EgressNetworks decide.
        policy = settings.client_policies(orig_dst)
    try:
        resolution: Resolution = FORWARD
        if watch is not None:
            answer = yield Wait(watch, settings.failfast)
            if isinstance(answer, Failed):
                yield Refuse(answer.error)
                return
            resolution = answer
        if policy is not None:
            # Linkerd blocks on the first policy answer (proxy.md §7.1): none within the failfast timeout, or
            # a lookup the controller refused, and the connection is refused.
            failed = policy.failed
            if not policy.ready:
                answer = yield Wait(policy, settings.failfast)
                failed = answer if isinstance(answer, Failed) else None
            if failed is not None:
                yield Refuse(failed.error)
                return
            resolution = replace(resolution, policy=policy)
        current = policy.policy if policy is not None else None
        if current is not None and settings.policy_metrics is not None:
            settings.policy_metrics.connection(_PROTOCOL_NAMES[current.protocol], current.parent_labels)
        if current is not None and current.protocol is Protocol.TLS:
            hello = yield Detect(tls=True, timeout=settings.detect_timeout)  # the SNI, not terminated
            yield from tls_connection(current, hello, _route_context(orig_dst, resolution, settings))
            return
        verdict: detect.Verdict = detect.Opaque()
        if not (resolution.opaque or current is not None and current.protocol is Protocol.OPAQUE):
            began = settings.clock()
            verdict = yield Detect(tls=False, timeout=settings.detect_timeout)
            if current is not None and settings.policy_metrics is not None:
                settings.policy_metrics.detection.detected(current.parent_labels, verdict, settings.clock() - began)
            if isinstance(verdict, detect.Closed):
                yield Refuse("closed before detection")
                return
            if isinstance(verdict, detect.ReadTimeout):
                verdict = detect.Opaque()  # Linkerd: "Continuing after timeout", as opaque
        carry = PROTOCOL_LAYERS[type(verdict)]
        if isinstance(verdict, detect.Opaque) and current is not None and current.opaque:
            yield from opaque_connection(current, _route_context(orig_dst, resolution, settings))
            return
        yield from carry(orig_dst, resolution, settings)
    finally:
        if watch is not None:
            watch.release()
        if policy is not None:
            policy.release()


# The protocol label of outbound_tcp_protocol_connections_total (Linkerd's names).
_PROTOCOL_NAMES = {Protocol.DETECT: "detect", Protocol.OPAQUE: "opaq", Protocol.TLS: "tls", Protocol.HTTP1: "http/1",
                   Protocol.HTTP2: "http/2", Protocol.GRPC: "http/2"}


def _route_context(orig_dst: SocketAddr, resolution: Resolution, settings: OutboundSettings) -> RouteContext:
    carry = PROTOCOL_LAYERS[detect.Opaque]
    return RouteContext(orig_dst, resolution, lambda dst, res: carry(dst, res, settings), settings.draw,
                        settings.policy_metrics)


def tcp_forward(session: SessionProtocol | None) -> Callable[[SocketAddr, Resolution, OutboundSettings], Layer]:
    """The per-connection carrier; ``session`` is what the transport header announces (None: opaque)."""

    def carry(orig_dst: SocketAddr, resolution: Resolution, settings: OutboundSettings) -> Layer:
        balancer = resolution.balancer
        if balancer is None:
            endpoint = resolution.endpoint or Endpoint.forward(orig_dst)
            failed = yield from _connect_and_forward(endpoint, session, resolution.authority, settings)
            if failed is not None:
                yield Refuse(failed.error)
            return
        failed = None
        queue = Queue(settings.tcp_queue_capacity, settings.failfast)
        for _ in range(CONNECT_ATTEMPTS):
            slot = yield from queued(balancer, queue, resolution.authority)
            if isinstance(slot, ProxyError):
                yield Refuse(slot.metric)  # failfast, loadshed
                return
            slot.in_flight += 1
            try:
                failed = yield from _connect_and_forward(slot.endpoint, session, resolution.authority, settings,
                                                         on_connect=partial(balancer.connected, slot))
            finally:
                slot.in_flight -= 1
            if failed is None:
                return
            balancer.failed(slot)
        assert failed is not None
        yield Refuse(failed.error)

    return carry


def _connect_and_forward(
    endpoint: Endpoint,
    session: SessionProtocol | None,
    authority: str,
    settings: OutboundSettings,
    on_connect: Callable[[float], None] | None = None,
) -> Generator[Command, Any, Failed | None]:
    """Connect and forward; returns the ``Failed`` reply when the connection could not be made."""
    route = plan(endpoint, local_ips=settings.local_ips, protocol=session, timeout=settings.connect_timeout,
                 authority=authority)
    if route.connect.addr in settings.own_addrs or route.connect.addr in settings.direct_addrs:
        return Failed("loop")
    reply = yield route.connect
    if isinstance(reply, Failed):
        return reply
    assert isinstance(reply, Connected)
    if on_connect is not None:
        on_connect(reply.elapsed)
    if route.header is not None and reply.alpn == TRANSPORT_ALPN:
        yield Send(route.header)
    yield Forward()
    return None


# -- HTTP per request (tether.proxy.http): HTTP/1 requests, HTTP/2 streams --------------------------------------


def http1_requests(orig_dst: SocketAddr, resolution: Resolution, settings: OutboundSettings) -> Layer:
    """HTTP/1 routed per request when the proxy has an HTTP layer configured; else carried per connection."""
    if settings.http is None:
        yield from _HTTP1_TCP(orig_dst, resolution, settings)
        return
    yield from _per_request(http1, orig_dst, resolution, settings, SessionProtocol.HTTP1)


def http2_requests(orig_dst: SocketAddr, resolution: Resolution, settings: OutboundSettings) -> Layer:
    """HTTP/2 routed per stream when the proxy has an HTTP layer configured; else carried per connection.

    The hop to a meshed endpoint stays HTTP/2, announced as ``http2`` in the
    transport header. (HTTP/1 is not upgraded to HTTP/2 between proxies: the
    HTTP/1 layer keeps HTTP/1.)
    """
    if settings.http is None:
        yield from _HTTP2_TCP(orig_dst, resolution, settings)
        return
    yield from _per_request(http2, orig_dst, resolution, settings, SessionProtocol.HTTP2)


def _per_request(layer: Callable[[Router, HttpSettings], Layer], orig_dst: SocketAddr, resolution: Resolution,
                 settings: OutboundSettings, protocol: SessionProtocol) -> Layer:
    """Run ``layer`` with the connection's router; in ingress mode, the profile watches it leased for
    ``l5d-dst-override`` targets are released when the connection ends."""
    assert settings.http is not None
    leases: dict[str, ProfileSource] = {}
    named = settings.named_profiles

    def lease(authority: str, port: int) -> ProfileSource:
        watch = leases.get(authority)
        if watch is None:
            assert named is not None
            watch = leases[authority] = named(authority, port)
        return watch

    router = outbound_router(orig_dst, resolution, local_ips=settings.local_ips,
                             connect_timeout=settings.connect_timeout, queue=settings.http_queue,
                             loop_addrs=settings.own_addrs | settings.direct_addrs, protocol=protocol,
                             named=lease if named is not None else None, policies=resolution.policy,
                             policy_metrics=settings.policy_metrics)
    error_labels = labels.join('direction="outbound"', labels.render(("authority", resolution.authority))
                               if resolution.authority else "", labels.target(orig_dst))
    try:
        yield from layer(router, replace(settings.http, error_labels=error_labels))
    finally:
        for watch in leases.values():
            watch.release()


_HTTP1_TCP = tcp_forward(SessionProtocol.HTTP1)
_HTTP2_TCP = tcp_forward(SessionProtocol.HTTP2)

# The seam between detection and the request-level proxy: the layer that carries each detected protocol.
PROTOCOL_LAYERS: dict[type[detect.Verdict], Callable[[SocketAddr, Resolution, OutboundSettings], Layer]] = {
    detect.Opaque: tcp_forward(None),
    detect.Http1: http1_requests,
    detect.Http2: http2_requests,
}
