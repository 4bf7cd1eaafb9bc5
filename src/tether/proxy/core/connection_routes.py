"""Connections under a client policy's opaque and TLS routes (proxy.md §7.10): which route, which backend.

- **Opaque** (``opaque_connection``): the policy's opaque route -- a TCPRoute,
  the Service's default ``opaq`` route, an EgressNetwork's allow or deny route,
  the undefined-port route. **TLS** (``tls_connection``, policy protocol
  ``tls``): the SNI of the client's ClientHello, read without terminating
  (``codec.client_hello`` through a TLS ``Detect``), picks the TlsRoute
  (``client_policy.select_tls_route``). As linkerd2-proxy: no SNI within the
  detect timeout, or no route for it, and the connection is closed.
- A route that forbids (``Forbidden``, ``Invalid``) refuses the connection.
  Otherwise one backend is drawn per connection from the route's distribution
  (weights, for a TCPRoute's or TLSRoute's split); one with an ``Invalid``
  filter (a missing Service) or without a dispatcher refuses the connection
  (``invalid_backend``); else the connection goes to that backend's balancer
  or forward endpoint, the bytes (the ClientHello included) unchanged.
  The parent's own default routes name the parent itself, which the profile's
  resolution already holds (the same Service balancer, or the original
  destination), so those connections keep it.
- Counted in ``outbound_tcp_route_{open,close}_total`` or
  ``outbound_tls_route_{open,close}_total`` under the parent's and route's
  names, ``error`` on close as Linkerd's: ``forbidden``, ``invalid_backend``,
  ``invalid_policy``, ``unexpected`` (a connect that failed), or empty; the
  TLS ones' ``hostname`` is the SNI when ``OUTBOUND_METRICS_HOSTNAME_LABELS``
  is true, else empty (``PolicyMetrics.sni_hostname``).

Pure: yields ``core.commands``. Caller: ``core.outbound``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tether.proxy.codec import detect
from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.core import labels
from tether.proxy.core.client_policy import ClientPolicy, OpaqueRoute, RouteBackend, select_tls_route
from tether.proxy.core.commands import Layer, Refuse
from tether.proxy.core.policy_metrics import PolicyMetrics
from tether.proxy.core.resolution import Resolution
from tether.proxy.core.route_filters import Invalid

# What carries a connection once its resolution is known (``core.outbound.tcp_forward(None)``).
Carry = Callable[[SocketAddr, Resolution], Layer]


@dataclass(frozen=True, slots=True)
class RouteContext:
    """What the connection layer hands over: the target, its resolution, the carrier and the metrics."""

    orig_dst: SocketAddr
    resolution: Resolution
    carry: Carry
    draw: Callable[[], float]
    metrics: PolicyMetrics | None


def opaque_connection(policy: ClientPolicy, ctx: RouteContext) -> Layer:
    """An opaque connection under the policy's (first) opaque route."""
    route = policy.opaque[0]
    target = labels.render(("target_ip", str(ctx.orig_dst.ip)), ("target_port", str(ctx.orig_dst.port)))
    yield from _routed(policy, route, ctx, target, tls=False)


def tls_connection(policy: ClientPolicy, verdict: detect.Verdict, ctx: RouteContext) -> Layer:
    """A connection to a target whose policy is ``tls``, given its TLS detection's verdict."""
    if isinstance(verdict, detect.TlsTimeout):
        yield Refuse("SNI detection timed out")
        return
    if isinstance(verdict, detect.Closed):
        yield Refuse("closed before detection")
        return
    if not isinstance(verdict, detect.Tls) or verdict.client_hello.server_name is None:
        yield Refuse("Could not find SNI")  # not TLS, or a ClientHello without a (DNS) name
        return
    route = select_tls_route(policy.tls, verdict.client_hello.server_name)
    if route is None:
        yield Refuse("no route")
        return
    hostname = ctx.metrics.sni_hostname(verdict.client_hello.server_name) if ctx.metrics is not None else ""
    yield from _routed(policy, route, ctx, labels.render(("hostname", hostname)), tls=True)


def _routed(policy: ClientPolicy, route: OpaqueRoute, ctx: RouteContext, extra: str, *, tls: bool) -> Layer:
    metrics = ctx.metrics
    route_labels = labels.join(policy.parent_labels, route.meta.route_labels(), extra)
    if metrics is not None:
        metrics.tcp_opened(route_labels, tls=tls)
    error = ""
    try:
        if route.forbidden:
            invalid = policy.parent.is_default and policy.parent.name == "invalid"
            error = "invalid_policy" if invalid else "forbidden"
            yield Refuse("forbidden")
            return
        resolution: Resolution | None = ctx.resolution
        if not route.meta.is_default:
            backend = route.choose(ctx.draw())
            resolution = None if backend is None else _backend_resolution(backend, ctx.resolution)
        if resolution is None:
            error = "invalid_backend"
            yield Refuse("invalid backend")
            return
        error = yield from _carried(ctx.carry(ctx.orig_dst, resolution))
    finally:
        if metrics is not None:
            metrics.tcp_closed(route_labels, error, tls=tls)


def _backend_resolution(backend: RouteBackend, resolution: Resolution) -> Resolution | None:
    """Where a route's backend sends the connection; None when it cannot take it (Invalid, no dispatcher)."""
    if any(isinstance(f, Invalid) for f in backend.filters):
        return None
    if backend.balancer is not None:
        return replace(resolution, balancer=backend.balancer, endpoint=None, authority=backend.authority)
    if backend.endpoint is not None:
        return replace(resolution, balancer=None, endpoint=backend.endpoint, authority="")
    return None


def _carried(inner: Layer) -> Any:
    """Run the carrier, passing its commands through; returns ``unexpected`` when it refused, else ""."""
    error = ""
    reply: Any = None
    try:
        while True:
            try:
                command = inner.send(reply)
            except StopIteration:
                break
            if isinstance(command, Refuse):
                error = "unexpected"
            reply = yield command
    finally:
        inner.close()
    return error
