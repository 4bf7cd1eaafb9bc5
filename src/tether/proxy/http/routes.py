"""Where each HTTP request goes: the routers the HTTP layer asks once per request.

- ``outbound_router``: discovery's answer for the original destination. With a
  balancer (a service), every request draws its endpoint by P2C on peak-EWMA
  latency x (requests in flight + 1): the endpoint set as it is *now*, so a new
  endpoint takes traffic from the next request and a removed one gets no more.
  No endpoint for the failfast timeout is a 504. Without one, the profile's
  single endpoint or the original destination.
- ``inbound_router``: the app, at the target address, in plaintext.

Each answer (``layer.Pick``) carries the ``Connect`` for the pool, the
transport header, and the request metric labels (proxy.md §9.2): outbound
``direction, [authority], target_*, client TLS, dst_*``; inbound ``direction,
target_*, server TLS, srv_*`` and the default route and authorization.

Pure: routers yield ``Wait`` (discovery) and nothing else. Callers:
``outbound.layer``, ``inbound.layer``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from tether.proxy import labels
from tether.proxy.addrs import IpAddress, SocketAddr
from tether.proxy.commands import Command, Connect, Wait
from tether.proxy.http import errors
from tether.proxy.http.errors import ProxyError
from tether.proxy.http.layer import Pick, Router
from tether.proxy.outbound.discovery import Resolution
from tether.proxy.outbound.endpoint import Endpoint, Plan, plan
from tether.proxy.protocol.http1 import RequestHead
from tether.proxy.protocol.transport_header import SessionProtocol


def request_labels(connect_labels: str) -> str:
    """A connected side's TCP labels, less ``peer``: the HTTP endpoint labels (same order as Linkerd's)."""
    return connect_labels.replace(',peer="dst"', "", 1)


def outbound_router(orig_dst: SocketAddr, resolution: Resolution, *, local_ips: frozenset[IpAddress],
                    connect_timeout: float, failfast: float, loop_addrs: frozenset[SocketAddr]) -> Router:
    balancer = resolution.balancer
    authority = (resolution.authority or str(orig_dst)).encode()

    plans: dict[Endpoint, tuple[Plan, str]] = {}  # per endpoint: its connection and labels, made once

    def pick_endpoint(endpoint: Endpoint) -> Pick | ProxyError:
        known = plans.get(endpoint)
        if known is None:
            route = plan(endpoint, local_ips=local_ips, protocol=SessionProtocol.HTTP1, timeout=connect_timeout,
                         authority=resolution.authority)
            if len(plans) > 1024:
                plans.clear()
            known = plans[endpoint] = (route, request_labels(route.connect.labels))
        route, metric_labels = known
        if route.connect.addr in loop_addrs:
            return ProxyError(502, f"endpoint {endpoint.addr}: loop", metric="i/o")
        return Pick(route.connect, route.header, metric_labels, authority)

    def route(request: RequestHead) -> Generator[Command, Any, Pick | ProxyError]:
        if balancer is None:
            return pick_endpoint(resolution.endpoint or Endpoint.forward(orig_dst))
        slot = balancer.pick()  # pure: no driver round trip when there are endpoints
        if slot is None:
            slot = yield Wait(balancer, failfast)
        if slot is None:
            return errors.failfast(resolution.authority or str(orig_dst))
        picked = pick_endpoint(slot.endpoint)
        if isinstance(picked, ProxyError):
            return picked
        slot.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                slot.in_flight -= 1

        picked.observe = lambda rtt: balancer.connected(slot, rtt)
        picked.failed = lambda: balancer.failed(slot)
        picked.release = release
        return picked

    return route


def inbound_router(target: SocketAddr, connect_timeout: float, metric_labels: str) -> Router:
    connect = Connect(target, None, connect_timeout, labels.connect_inbound(target))
    pick = Pick(connect, None, metric_labels, str(target).encode())

    def route(request: RequestHead) -> Generator[Command, Any, Pick | ProxyError]:
        return pick
        yield  # a generator, like every router

    return route
