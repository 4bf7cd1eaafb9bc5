"""Where each HTTP request goes: the routers the HTTP layer asks once per request.

- ``outbound_router``: discovery's answer for the original destination (its
  latest, when the profile changed since the connection was opened). With a
  balancer (a service), every request draws its endpoint by P2C on peak-EWMA
  latency x (requests in flight + 1): the endpoint set as it is *now*, so a new
  endpoint takes traffic from the next request and a removed one gets no more.
  None to pick: the request waits in the balancer's bounded queue
  (``core.balancer_queue``: a 503 when it is full, a 504 at the failfast timeout). Without one, the profile's
  single endpoint or the original destination. When the service has profile
  routes or a traffic split (``core.profiles``), the request's route is
  matched first (``Pick.route``, also on a ``ProxyError``: the layer applies
  its timeout, retries and route metrics), and a split draws the backend
  service by weight before P2C picks the endpoint within it. In ingress mode
  (``named`` given), a request with ``l5d-dst-override: name[:port]`` goes to
  that target instead, resolved by name (its own profile, routes and all);
  the header is removed before the request goes on (``Pick.strip_override``).
- ``inbound_router``: the app, at the target address, in plaintext; an HTTP/2
  connection's requests wait while the app port is unreachable (``core.inbound_queue``).

Each answer (``layer.Pick``) carries the ``Connect`` for the pool, the
transport header, and the request metric labels (proxy.md §9.2): outbound
``direction, [authority], target_*, client TLS, dst_*``; inbound ``direction,
target_*, server TLS, srv_*`` and the default route and authorization.

Pure: routers yield ``Wait`` (discovery) and nothing else. Callers:
``core.outbound``, ``core.inbound``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from dataclasses import replace
from functools import partial
from typing import Any

from tether.proxy.core import labels
from tether.proxy.codec.addrs import IpAddress, SocketAddr, is_dns_name, parse_ip
from tether.proxy.core.commands import Command, Connect, Failed, Wait
from tether.proxy.core import errors
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import L5D_DST_OVERRIDE, Pick, Router, no_outcome, nothing
from tether.proxy.core.inbound_queue import InboundQueue, wait_for_app
from tether.proxy.core.profiles import MATCH_ALL, Route
from tether.proxy.core.balancer import Balancer, Slot
from tether.proxy.core.balancer_queue import Queue, queued
from tether.proxy.core.client_policy import ClientPolicy
from tether.proxy.core.policy_metrics import FRAME_BUCKETS, PolicyMetrics, histogram
from tether.proxy.core.policy_routes import decide
from tether.proxy.core.resolution import PolicySource, ProfileSource, Resolution
from tether.proxy.core.endpoint import Endpoint, Plan, plan, upgrade_plan
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.codec.transport_header import SessionProtocol


DEFAULT_OVERRIDE_PORT = 80

# The route of an overridden request to a target without profile routes: no timeout, no retries, and no route
# metrics (no metric labels); it takes the layer's routed path only so the header is removed.
OVERRIDE_ROUTE = Route(MATCH_ALL)


def request_labels(connect_labels: str) -> str:
    """A connected side's TCP labels, less ``peer``: the HTTP endpoint labels (same order as Linkerd's)."""
    return connect_labels.replace(',peer="dst"', "", 1)


def outbound_router(orig_dst: SocketAddr, resolution: Resolution, *, local_ips: frozenset[IpAddress],
                    connect_timeout: float, queue: Queue, loop_addrs: frozenset[SocketAddr],
                    draw: Callable[[], float] = random.random,
                    protocol: SessionProtocol = SessionProtocol.HTTP1,
                    named: Callable[[str, int], ProfileSource] | None = None,
                    policies: PolicySource | None = None, policy_metrics: PolicyMetrics | None = None) -> Router:
    """``queue``: how requests wait for an endpoint when their balancer has none (``core.balancer_queue``);
    ``draw``: uniform in [0, 1), for the traffic split's weighted choice; ``protocol``: the session protocol
    new connections announce in the transport header (``HTTP2`` for the HTTP/2 layer's connections);
    ``named``: ingress mode, a lease on the profile watch of a ``name:port`` (the caller releases its leases
    when the connection ends); ``policies``: the target's client policy watch (``core.policy_routes``
    decides each request under its latest policy, unless a ServiceProfile with routes applies), counted in
    ``policy_metrics``."""
    return _OutboundRouter(orig_dst, resolution, local_ips, connect_timeout, queue, loop_addrs, draw, protocol,
                           named, policies, policy_metrics).route


class _OutboundRouter:
    """One connection's outbound routing (``outbound_router``), as methods rather than closures that call one
    another: compiled by mypyc, such closures share an environment that refers to them, a reference cycle per
    connection that only the cyclic collector frees -- and the serving proxy runs it rarely, so a proxy under
    connection churn grew (tests/proxy/test_http1_garbage.py)."""

    def __init__(self, orig_dst: SocketAddr, resolution: Resolution, local_ips: frozenset[IpAddress],
                 connect_timeout: float, queue: Queue, loop_addrs: frozenset[SocketAddr], draw: Callable[[], float],
                 protocol: SessionProtocol, named: Callable[[str, int], ProfileSource] | None,
                 policies: PolicySource | None, policy_metrics: PolicyMetrics | None) -> None:
        self.orig_dst = orig_dst
        self.resolution = resolution
        self.local_ips = local_ips
        self.connect_timeout = connect_timeout
        self.queue = queue
        self.loop_addrs = loop_addrs
        self.draw = draw
        self.protocol = protocol
        self.named = named
        self.policies = policies
        self.policy_metrics = policy_metrics
        self.watch = resolution.watch
        self.h2 = protocol is SessionProtocol.HTTP2
        # Per (endpoint, authority label): its connection and labels, its l5d-orig-proto upgrade, and whether it
        # loops back, made once. Keyed by the endpoint's identity (the entry holds the endpoint, so its id is not
        # reused meanwhile): hashing an Endpoint would run Python code (its dataclass __hash__, its address's) on
        # every request.
        self.plans: dict[tuple[int, str], tuple[Endpoint, Plan, str, bool, tuple[Any, bytes | None] | None]] = {}
        self.seen = resolution
        self.host = (resolution.authority or str(orig_dst)).encode()  # Host for a request without one

    def pick_endpoint(self, endpoint: Endpoint, authority: str, host: bytes, balancer: Balancer | None = None,
                      slot: Slot | None = None) -> Pick | ProxyError:
        """The request goes to ``endpoint``; when ``balancer`` chose it (``slot``), it is counted in flight
        until the layer releases it, and its latency and outcome go back to the balancer."""
        key = (id(endpoint), authority)
        known = self.plans.get(key)
        if known is None or known[0] is not endpoint:
            route = plan(endpoint, local_ips=self.local_ips, protocol=self.protocol, timeout=self.connect_timeout,
                         authority=authority)
            upgrade = None
            if self.protocol is SessionProtocol.HTTP1:
                h2_route = upgrade_plan(endpoint, local_ips=self.local_ips, timeout=self.connect_timeout,
                                        authority=authority)
                if h2_route is not None:
                    upgrade = (h2_route.connect, h2_route.header)
            if len(self.plans) > 1024:
                self.plans.clear()
            known = self.plans[key] = (endpoint, route, request_labels(route.connect.labels),
                                       route.connect.addr in self.loop_addrs, upgrade)
        _, route, metric_labels, loops, upgrade = known
        if loops:
            return errors.loop(endpoint.addr)
        if slot is None:
            return Pick(route.connect, route.header, metric_labels, host, upgrade=upgrade)
        assert balancer is not None
        slot.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                slot.in_flight -= 1

        # The latency sample goes straight to the slot (one call, not three through lambda and balancer), and
        # an attempt's outcome is only reported when failure accrual listens: ``no_outcome`` is not called by
        # the cores (two calls fewer per request).
        outcome = no_outcome if balancer.accrual is None else \
            lambda status, grpc, elapsed: balancer.outcome(slot, status, grpc)
        return Pick(route.connect, route.header, metric_labels, host, observe=slot.connected,
                    failed=lambda: balancer.failed(slot), release=release, outcome=outcome, upgrade=upgrade)

    def profiled(self, current: Resolution, request: RequestHead, host: bytes) -> Generator[Command, Any,
                                                                                      Pick | ProxyError]:
        profile = current.profile
        assert profile is not None
        route: Route = profile.route_for(request.method, request.target)
        balancer, authority = current.balancer, current.authority
        split = profile.split
        if split:
            backend = split.choose(self.draw())
            if not backend.balancer.has_endpoints and len(split.backends) > 1:
                # Not ready: the share goes to the backends that have endpoints (if any has).
                ready = [b for b in split.backends if b.balancer.has_endpoints]
                if ready:
                    backend = split.choose_among(self.draw(), ready)
            balancer, authority = backend.balancer, backend.authority
        assert balancer is not None  # a profile comes with its service
        slot = balancer.pick()
        if slot is None:  # none to pick: the request waits (checked only here, no call on the usual path)
            waited = yield from queued(balancer, self.queue, authority)
            if isinstance(waited, ProxyError):
                return replace(waited, route=route)
            slot = waited
        picked = self.pick_endpoint(slot.endpoint, authority, host, balancer, slot)
        if isinstance(picked, ProxyError):
            return replace(picked, route=route)
        picked.route = route
        return picked

    def policied(self, policy: ClientPolicy, request: RequestHead, host: bytes) -> Generator[Command, Any,
                                                                                       Pick | ProxyError]:
        decision = decide(policy, request, self.h2, self.draw, self.policy_metrics)
        if isinstance(decision, ProxyError):
            return decision
        backend, route = decision.backend, decision.request_route
        picked: Pick | ProxyError
        if backend.endpoint is not None:
            picked = self.pick_endpoint(backend.endpoint, backend.authority, host)
        else:
            balancer = backend.balancer
            slot = balancer.pick()
            if slot is None:  # none to pick: the request waits (checked only here, no call on the usual path)
                waited = yield from queued(balancer, self.queue, backend.authority)
                if isinstance(waited, ProxyError):
                    return replace(waited, route=route)
                slot = waited
            picked = self.pick_endpoint(slot.endpoint, backend.authority, host, balancer, slot)
        if isinstance(picked, ProxyError):
            return replace(picked, route=route)
        picked.route = route
        picked.rewrite = decision.rewrite
        picked.respond = decision.respond
        report = decision.report
        if report is not None:  # outbound_*_route_backend_response_*: the backend's series observe the attempt
            series = report.family.backends.get(report.key) or report.series()
            inner, response = picked.outcome, series.ended
            if inner is no_outcome:  # no failure accrual: the metrics alone hear the outcome, with no call between
                picked.outcome = response
            else:
                def outcome(status: int, grpc: int | None, elapsed: float) -> None:
                    inner(status, grpc, elapsed)
                    response(status, grpc, elapsed)

                picked.outcome = outcome
            if series.frames is None:  # the backend's first response to relay
                series.frames = histogram(FRAME_BUCKETS)
            picked.frames = series.frame
        return picked

    def overridden(self, request: RequestHead, value: bytes) -> Generator[Command, Any, Pick | ProxyError]:
        assert self.named is not None
        target = parse_override(value)
        if target is None:
            return errors.bad_override(value)
        authority, port = target
        watch = self.named(authority, port)
        if not watch.ready:
            answer = yield Wait(watch, self.queue.failfast)
            if isinstance(answer, Failed):
                return errors.failfast(authority)
        current = watch.resolution
        host = authority.encode()
        picked: Pick | ProxyError
        if current.profile is not None:
            picked = yield from self.profiled(current, request, host)
        elif current.balancer is not None:
            slot = current.balancer.pick()
            if slot is None:
                waited = yield from queued(current.balancer, self.queue, authority)
                if isinstance(waited, ProxyError):
                    return waited
                slot = waited
            picked = self.pick_endpoint(slot.endpoint, authority, host, current.balancer, slot)
        elif current.endpoint is not None:
            picked = self.pick_endpoint(current.endpoint, authority, host)
        else:
            return errors.unknown_override(authority)
        if isinstance(picked, ProxyError):
            return picked
        picked.strip_override = True
        if picked.route is None:
            picked.route = OVERRIDE_ROUTE
        return picked


    def route(self, request: RequestHead) -> Generator[Command, Any, Pick | ProxyError]:
        if self.named is not None:  # ingress mode only: the header is not looked at otherwise
            override = _header(request, L5D_DST_OVERRIDE)
            if override is not None:
                return (yield from self.overridden(request, override))
        watch = self.watch
        current = watch.resolution if watch is not None else self.resolution  # the latest profile, per request
        if current is not self.seen:
            self.seen = current
            self.host = (current.authority or str(self.orig_dst)).encode()
        host = self.host
        if current.profile is not None:  # a ServiceProfile with routes or a split wins (never both)
            return (yield from self.profiled(current, request, host))
        policies = self.policies
        if policies is not None:
            policy = policies.policy
            if policy is not None:
                return (yield from self.policied(policy, request, host))
        balancer = current.balancer
        if balancer is None:
            return self.pick_endpoint(current.endpoint or Endpoint.forward(self.orig_dst), current.authority, host)
        slot = balancer.pick()  # pure: no driver round trip when there are endpoints
        if slot is None:
            waited = yield from queued(balancer, self.queue, current.authority or str(self.orig_dst))
            if isinstance(waited, ProxyError):
                return waited
            slot = waited
        return self.pick_endpoint(slot.endpoint, current.authority, host, balancer, slot)


def _header(request: RequestHead, name: bytes) -> bytes | None:
    for key, value in request.headers:
        if len(key) == len(name) and key.lower() == name:
            return value
    return None


def parse_override(value: bytes) -> tuple[str, int] | None:
    """``l5d-dst-override``'s ``host[:port]`` (port 80 by default) as (``host:port``, port); None if invalid."""
    try:
        text = value.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep or host.count(":") and not host.startswith("["):
        host, port_text = text, str(DEFAULT_OVERRIDE_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    port = int(port_text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ip = parse_ip(host)
    except ValueError:
        if not is_dns_name(host):
            return None
        return f"{host.lower().rstrip('.')}:{port}", port
    return str(SocketAddr(ip, port)), port


def inbound_router(target: SocketAddr, connect_timeout: float, metric_labels: str,
                   permit: Callable[[], str] | None = None, waits: InboundQueue | None = None) -> Router:
    """Every request to the app at ``target``. ``permit``: the inbound policy's labels of the request just
    authorized (``srv_*``, ``route_*``, ``authz_*``; ``core.inbound_authz``), appended to ``metric_labels``
    for its request metrics, as linkerd2-proxy labels them; read when the request is routed, which is right
    after its check. (Its ServiceProfile route: ``core.inbound_route_metrics.routed``.) ``waits`` (an HTTP/2
    connection's): while ``target`` is unreachable, its requests wait for it (``core.inbound_queue``)."""
    connect = Connect(target, None, connect_timeout, labels.connect_inbound(target), inbound=True)
    authority = str(target).encode()
    unreachable = partial(waits.ports.unreachable, target) if waits is not None else nothing
    pick = Pick(connect, None, metric_labels, authority, unreachable=unreachable)
    down = waits.ports.unreachable_ports if waits is not None else {}
    if permit is None:
        def route(request: RequestHead) -> Generator[Command, Any, Pick | ProxyError]:
            # Nothing unreachable (the usual path): no lookup. ``target`` is an interpreted dataclass over an
            # ``ipaddress`` address: hashing it is two Python calls per request.
            balancer = down.get(target) if down else None
            if balancer is not None:
                assert waits is not None
                error = yield from wait_for_app(balancer, waits, target, request)
                if error is not None:
                    return error
            return pick

        return route
    picks: dict[str, Pick] = {}  # per permit: a connection's requests share a few routes and authorizations

    def route_permitted(request: RequestHead) -> Generator[Command, Any, Pick | ProxyError]:
        key = permit()
        balancer = down.get(target) if down else None  # (no lookup, two Python calls, while none is unreachable)
        if balancer is not None:
            assert waits is not None
            error = yield from wait_for_app(balancer, waits, target, request)
            if error is not None:
                return error
        chosen = picks.get(key)
        if chosen is None:
            if len(picks) >= MAX_PERMITS:
                picks.clear()
            chosen = picks[key] = Pick(connect, None, f"{metric_labels},{key}", authority, unreachable=unreachable)
        return chosen

    return route_permitted


MAX_PERMITS = 64  # label sets of one connection's picks kept at once
