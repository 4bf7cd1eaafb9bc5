"""The inbound connection layer: from a client (meshed or not) to the app (proxy.md §3, §4.2, §5.4, §6.2, §8).

For each connection accepted on the inbound listener:

- the original destination must be one of the pod's IPs (when configured);
- to the inbound port itself: the *direct* stack -- mesh TLS with a client
  identity, ALPN ``transport.l5d.io/v1``, then a transport header naming the
  app's port; anything else is refused;
- to an opaque port: no detection at all (TLS status ``port_skipped``);
- otherwise TLS detection on the first bytes: a ClientHello for our own name is
  terminated (the client identity is its certificate's first SAN); one for
  another name passes through untouched; anything else is plaintext.

Then the port's policy (``InboundSettings.policies``: the policy controller's,
else the default policy; ``core.server_policy``) decides: an opaque connection
once (``core.authz``; denied: closed without a byte; re-checked on every
policy change while open, ``core.inbound_authz.TcpAuthzWatch``), HTTP per request
(``core.inbound_authz``: 404 without a route, 403 without an authorization).
The layer for the detected protocol carries the connection to the app at the
original destination IP and the target port -- never to the inbound port. As outbound,
``PROTOCOL_LAYERS`` is the seam for the request-level proxy: ``Http1`` goes
to ``tether.proxy.core.http1_proxy`` (requests to the app over pooled keep-alive
connections), ``Http2`` to its per-stream HTTP/2 layer; the rest is
forwarded per connection. An HTTP/2 connection's requests wait for an app port that
refused an HTTP/2 connect until it is reconnected (``core.inbound_queue``).

The layer yields ``tether.proxy.core.commands``; it does no I/O. Caller:
``tether.proxy.io.driver`` (via ``tether.proxy.app``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from itertools import repeat

from tether.ports import PortSet
from tether.proxy.core import labels
from tether.proxy.codec.addrs import IpAddress, IpNetwork, SocketAddr
from tether.proxy.core.commands import (
    AcceptTls,
    Connect,
    Count,
    Detect,
    Failed,
    Forward,
    Layer,
    ReadHeader,
    Refuse,
    SetLabels,
    Sniff,
    TlsAccepted,
)
from tether.proxy.core.config import DefaultPolicy
from tether.proxy.core.http2_proxy import http2
from tether.proxy.core.http import HttpSettings, RequestPolicy, Router
from tether.proxy.core.http1_proxy import http1
from tether.proxy.core.inbound_profile_routes import InboundProfileRoutes
from tether.proxy.core.inbound_queue import AppPorts, InboundQueue
from tether.proxy.core.balancer_queue import Queue
from tether.proxy.core.inbound_route_metrics import InboundRouteMetrics, routed
from tether.proxy.core.routes import inbound_router
from tether.proxy.core.authz import Meta
from tether.proxy.core.inbound_authz import (
    ConnectionFacts,
    InboundRequestPolicy,
    PolicyChanges,
    TcpAuthzWatch,
    log_connection,
    server_labels,
)
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_metrics import DetectMetrics
from tether.proxy.core.server_policy import ServerPolicy, default_policy
from tether.proxy.codec import detect
from tether.proxy.codec.transport_header import ALPN_PROTOCOL, HeaderReceived, NoHeader

TRANSPORT_ALPN = ALPN_PROTOCOL.decode()


@dataclass(frozen=True, slots=True)
class InboundSettings:
    """The parts of ``ProxyConfig`` the inbound layer uses."""

    local_name: str  # our identity: the SNI we terminate
    inbound_port: int  # connections to it are direct (transport header)
    detect_timeout: float
    connect_timeout: float
    opaque_ports: PortSet
    ips: frozenset[IpAddress]  # empty: any destination IP
    default_policy: DefaultPolicy
    cluster_networks: tuple[IpNetwork, ...]
    http: HttpSettings | None = None  # the request-level HTTP/1 layer; None: HTTP/1 is forwarded per connection
    # The port's current policy (io.policy_client); None: the default policy, always.
    policies: Callable[[int], ServerPolicy] | None = None
    registry: Registry | None = None  # where the per-request authorization metrics go
    # Subscribe to a port's policy changes (io.policy_client): forwarded connections are re-checked on each.
    policy_changes: PolicyChanges | None = None
    detect_metrics: DetectMetrics | None = None  # inbound_tcp_detect_http_*
    # Each request's ServiceProfile route (core.inbound_profile_routes over io.inbound_profiles); None: none.
    profiles: InboundProfileRoutes | None = None
    route_metrics: InboundRouteMetrics | None = None  # inbound_{http,grpc}_requests_total ... of routed requests
    # LINKERD2_PROXY_INBOUND_METRICS_AUTHORITY_LABELS=unsafe: request_total... carry the request's logical name
    # as ``authority`` (named by ``profiles``).
    authority_labels: bool = False
    # The app's ports an HTTP/2 connect failed to, reconnected with backoff (io.inbound_ports); None: an HTTP/2
    # request's failed connect is answered at once, as an HTTP/1 one's always is (core.inbound_queue).
    app_ports: AppPorts | None = None
    # LINKERD2_PROXY_INBOUND_HTTP_QUEUE_CAPACITY and _FAILFAST_TIMEOUT: HTTP/2 requests waiting for an app port.
    http_queue: Queue = Queue(10_000, 1.0)

    def policy(self, port: int) -> ServerPolicy:
        if self.policies is not None:
            return self.policies(port)
        return default_policy(self.default_policy, self.cluster_networks, opaque=port in self.opaque_ports,
                              detect_timeout=self.detect_timeout)

    def current_policy(self, port: int) -> Callable[[], ServerPolicy]:
        """What gives ``port``'s current policy, asked per HTTP request: the policy client (one Python call),
        else the default policy, which never changes (a C callable: none)."""
        if self.policies is not None:
            return partial(self.policies, port)
        return repeat(self.policy(port)).__next__


@dataclass(frozen=True, slots=True)
class Session:
    """What is known of an accepted connection once its TLS is settled."""

    target: SocketAddr  # where the app is: the original destination (direct: its IP and the header's port)
    tls_labels: str
    mesh_tls: bool
    client_id: str | None
    authz: Meta | None = None  # the authorization that allowed it, once decided (metric labels)
    policy: RequestPolicy | None = None  # HTTP: each request's route and authorization (core.inbound_authz)
    authz_watch: TcpAuthzWatch | None = None  # forwarded: re-checked when the port's policy changes


def inbound(orig_dst: SocketAddr, client: SocketAddr, settings: InboundSettings) -> Layer:
    if settings.ips and orig_dst.ip not in settings.ips:
        yield Refuse("ip not allowed", _accept_labels(orig_dst, labels.no_tls(labels.NO_TLS_FROM_REMOTE), settings))
        return
    if orig_dst.port == settings.inbound_port:
        yield from _direct(orig_dst, client, settings)
        return
    if orig_dst.port in settings.opaque_ports:
        session = Session(orig_dst, labels.no_tls(labels.PORT_SKIPPED), False, None)
        yield from _authorized(session, client, settings, detect.Opaque())
        return
    began = _now(settings)
    verdict = yield Detect(tls=True, timeout=settings.detect_timeout)
    plaintext = labels.no_tls(labels.NO_TLS_FROM_REMOTE)
    if isinstance(verdict, detect.Closed):
        yield Refuse("closed before detection", _accept_labels(orig_dst, plaintext, settings))
    elif isinstance(verdict, detect.TlsTimeout):
        yield Refuse("tls detection timeout", _accept_labels(orig_dst, plaintext, settings))
    elif isinstance(verdict, detect.Tls) and verdict.client_hello.server_name == settings.local_name:
        accepted = yield AcceptTls(alpn=False, timeout=settings.detect_timeout)
        if isinstance(accepted, Failed):
            yield Refuse(accepted.error, _accept_labels(orig_dst, plaintext, settings))
            return
        assert isinstance(accepted, TlsAccepted)
        session = Session(orig_dst, labels.tls_accepted(accepted.client_id), True, accepted.client_id)
        began = _now(settings)
        inner = yield Sniff(settings.detect_timeout)
        _detected(settings, orig_dst.port, inner, began)
        if isinstance(inner, detect.Closed):
            yield Refuse("closed before detection", _accept_labels(orig_dst, session.tls_labels, settings))
            return
        if isinstance(inner, detect.ReadTimeout):
            inner = detect.Opaque()
        yield from _authorized(session, client, settings, inner)
    elif isinstance(verdict, detect.Tls):
        # TLS for some other name: the app's own TLS, forwarded untouched.
        sni = verdict.client_hello.server_name or ""
        yield from _authorized(Session(orig_dst, labels.tls_passthrough(sni), False, None), client, settings,
                               detect.Opaque())
    else:
        # Plaintext: one read told it is not TLS and what HTTP it is, so the duration counted is that read's.
        _detected(settings, orig_dst.port, verdict, began)
        yield from _authorized(Session(orig_dst, plaintext, False, None), client, settings, verdict)


def _now(settings: InboundSettings) -> float:
    return settings.detect_metrics.clock() if settings.detect_metrics is not None else 0.0


def _detected(settings: InboundSettings, port: int, verdict: detect.Verdict, began: float) -> None:
    """``inbound_tcp_detect_http_*`` for a connection to ``port`` whose HTTP detection ended with ``verdict``
    (not for a server whose policy is opaque: Linkerd does not detect there)."""
    metrics = settings.detect_metrics
    if metrics is None:
        return
    policy = settings.policy(port)
    if not policy.opaque:
        metrics.detected(server_labels(policy, port), verdict, metrics.clock() - began)


def _direct(orig_dst: SocketAddr, client: SocketAddr, settings: InboundSettings) -> Layer:
    """The inbound port's own stack: mTLS with a client identity, ALPN, a transport header (proxy.md §6.2)."""
    refused = _accept_labels(orig_dst, labels.no_tls(labels.NO_TLS_FROM_REMOTE), settings)
    verdict = yield Detect(tls=True, timeout=settings.detect_timeout)
    if isinstance(verdict, detect.TlsTimeout):
        yield Refuse("tls detection timeout", refused)
        return
    if not (isinstance(verdict, detect.Tls) and verdict.client_hello.server_name == settings.local_name):
        yield Refuse("direct connections must be mutually authenticated", refused)
        return
    accepted = yield AcceptTls(alpn=True, timeout=settings.detect_timeout)
    if isinstance(accepted, Failed):
        yield Refuse(accepted.error, refused)
        return
    assert isinstance(accepted, TlsAccepted)
    tls_labels = labels.tls_accepted(accepted.client_id)
    if accepted.client_id is None:
        yield Refuse("direct connections must be mutually authenticated", _accept_labels(orig_dst, tls_labels, settings))
        return
    if accepted.alpn != TRANSPORT_ALPN:
        yield Refuse("direct connections require transport header negotiation",
                     _accept_labels(orig_dst, tls_labels, settings))
        return
    header = yield ReadHeader(settings.detect_timeout)
    if isinstance(header, Failed):
        yield Refuse(header.error, _accept_labels(orig_dst, tls_labels, settings))
        return
    if isinstance(header, NoHeader):
        yield Refuse("connection did not include a transport header", _accept_labels(orig_dst, tls_labels, settings))
        return
    assert isinstance(header, HeaderReceived)
    if header.header.name is not None:
        yield Refuse("gateway connections are not supported", _accept_labels(orig_dst, tls_labels, settings))
        return
    target = SocketAddr(orig_dst.ip, header.header.port)
    if target.port == settings.inbound_port:
        yield Refuse("loop", _accept_labels(orig_dst, tls_labels, settings))
        return
    protocol = header.header.protocol
    yield Count(
        "inbound_tcp_transport_header_connections_total",
        labels.render(("session_protocol", protocol.value if protocol else ""), ("target_port", str(target.port)),
                      ("target_name", ""), ("client_id", accepted.client_id)),
    )
    # The header names the protocol, so there is nothing to detect (Linkerd goes straight to that stack).
    verdict_for = {None: detect.Opaque(), "http1": detect.Http1(), "http2": detect.Http2()}
    session = Session(target, tls_labels, True, accepted.client_id)
    yield from _authorized(session, client, settings, verdict_for[protocol.value if protocol else None])


def _authorized(session: Session, client: SocketAddr, settings: InboundSettings, verdict: detect.Verdict) -> Layer:
    port = session.target.port
    policy = settings.policy(port)
    if policy.opaque:
        verdict = detect.Opaque()  # the port's policy says opaque: its bytes are not HTTP to the proxy
    accept = labels.accept_inbound(session.target, session.tls_labels, server_labels(policy, port))
    facts = ConnectionFacts(port=port, client_ip=client.ip, mesh_tls=session.mesh_tls, client_id=session.client_id,
                            target_labels=labels.target(session.target), tls_labels=session.tls_labels,
                            registry=settings.registry)
    decision = facts.admitting(policy.authorizations)
    if settings.http is not None and isinstance(verdict, (detect.Http1, detect.Http2)):
        # HTTP is authorized per request (core.inbound_authz), never refused here (proxy.md §8.3).
        yield SetLabels(accept)
        carry = PROTOCOL_LAYERS[type(verdict)]
        policy_check = InboundRequestPolicy(settings.current_policy(port), facts, clock=settings.http.clock,
                                            changes=settings.policy_changes)
        yield from carry(replace(session, authz=decision.meta if decision else None, policy=policy_check), settings)
        return
    server = server_labels(policy, port)
    log_connection(policy, decision.meta if decision else None, facts)
    if decision is None:
        yield Count("inbound_tcp_authz_deny_total", labels.join(facts.target_labels, server, session.tls_labels))
        yield Refuse("unauthorized", accept)
        return
    yield Count("inbound_tcp_authz_allow_total", labels.join(facts.target_labels, server,
                                                             decision.meta.labels("authz"), session.tls_labels))
    yield SetLabels(accept)
    watch = None
    if settings.policy_changes is not None:
        watch = TcpAuthzWatch(settings.current_policy(port), settings.policy_changes, facts)
    yield from tcp_forward(replace(session, authz=decision.meta, authz_watch=watch), settings)


def tcp_forward(session: Session, settings: InboundSettings) -> Layer:
    """Forward the connection's bytes to the app, at the target address."""
    app = session.target
    reply = yield Connect(app, None, settings.connect_timeout, labels.connect_inbound(app), inbound=True)
    if isinstance(reply, Failed):
        yield Refuse(reply.error)
        return
    yield Forward(session.authz_watch)


def _accept_labels(target: SocketAddr, tls_labels: str, settings: InboundSettings) -> str:
    return labels.accept_inbound(target, tls_labels, server_labels(settings.policy(target.port), target.port))


# -- HTTP/1 per request (tether.proxy.http) ------------------------------------------------------------------


def http1_requests(session: Session, settings: InboundSettings) -> Layer:
    """HTTP/1 requests to the app, with keep-alive to it, when an HTTP layer is configured; else per connection."""
    if settings.http is None:
        yield from tcp_forward(session, settings)
        return
    yield from http1(*_request_level(session, settings, settings.http, h2=False))


def http2_requests(session: Session, settings: InboundSettings) -> Layer:
    """HTTP/2 streams to the app (one HTTP/2 connection to it per client connection), downgrading those a
    linkerd2-proxy upgraded (``l5d-orig-proto``) to HTTP/1 on pooled connections; else per connection."""
    if settings.http is None:
        yield from tcp_forward(session, settings)
        return
    yield from http2(*_request_level(session, settings, settings.http, h2=True), downgrade=True)


def _request_level(session: Session, settings: InboundSettings, http: HttpSettings,
                   h2: bool) -> tuple[Router, HttpSettings]:
    """The router to the app and the HTTP settings of this connection (its client's identity, its labels).
    ``h2``: an HTTP/2 connection, whose requests wait for an unreachable app port (``core.inbound_queue``)."""
    target = session.target
    # Request metrics are labelled per request with the server, route and authorization that let it through
    # (the policy check's permit), as linkerd2-proxy does; what the proxy answers itself before a request is
    # authorized (a 403, a 404...) keeps the connection's: the server's, the default route and the authorization
    # the connection would have had as TCP.
    endpoint = labels.join('direction="inbound"', labels.target(target), session.tls_labels)
    server = server_labels(settings.policy(target.port), target.port)
    metric_labels = labels.join(endpoint, server, Meta.default("default").labels("route"),
                                session.authz.labels("authz") if session.authz else labels.authz_labels(""))
    policy = session.policy
    meshed = session.mesh_tls and session.client_id is not None
    # Informational headers (l5d-proxy-error...) only to meshed clients, as linkerd2-proxy's inbound does.
    http = replace(http, meshed_client=meshed, informational=meshed,
                   client_id=session.client_id if session.mesh_tls else None, error_labels=metric_labels,
                   error_scope=labels.join(labels.target(target), server),
                   policy=session.policy)
    waits = InboundQueue(settings.app_ports, settings.http_queue) if h2 and settings.app_ports is not None else None
    if isinstance(policy, InboundRequestPolicy):
        # The permit read per request by a C call (partial of getattr), not a lambda.
        router = inbound_router(target, settings.connect_timeout, endpoint, partial(getattr, policy, "permit"),
                                waits)
        authorized: InboundRequestPolicy | None = policy
    else:
        router, authorized = inbound_router(target, settings.connect_timeout, metric_labels, waits=waits), None
    if settings.profiles is None and settings.route_metrics is None:
        return router, http
    return routed(router, authorized=authorized, profiles=settings.profiles, metrics=settings.route_metrics,
                  authority_labels=settings.authority_labels), http


# The seam between detection and the request-level proxy: the layer that carries each detected protocol.
PROTOCOL_LAYERS: dict[type[detect.Verdict], Callable[[Session, InboundSettings], Layer]] = {
    detect.Opaque: tcp_forward,
    detect.Http1: http1_requests,
    detect.Http2: http2_requests,
}
