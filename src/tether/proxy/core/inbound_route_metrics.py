"""Linkerd 2.20's inbound route families (proxy.md §9.5), per request on a route the inbound policy chose.

- ``inbound_{http,grpc}_requests_total``: one per request routed to the app once
  its route authorized it;
- ``inbound_{http,grpc}_statuses_total`` (+ ``status``: the HTTP status, or for
  gRPC the numeric ``grpc-status``), when the app's response ended -- a response
  that never came (a reset, an I/O error) has no status and is not counted; a
  request the proxy answered before it went to the app (its port in fail-fast,
  its queue full: ``core.inbound_queue``) counts with ``status=""``, as
  linkerd2-proxy's route metrics, above that queue, count the error;
- ``inbound_{http,grpc}_request_duration_seconds`` (0.025, 0.05, 0.1, 0.25, 0.5,
  1, 10): from the request's authorization (before it waits for its profile)
  to the end of its response -- or to its failure, a reset or the client's
  going away; a protocol switch (101) ends it at the response head, as
  linkerd2-proxy's ends with the empty body of that response;
- ``inbound_{http,grpc}_response_duration_seconds`` (0.05, 0.5, 1, 10): from the
  request's end -- its last body chunk or DATA frame from the client, or its
  routing when it had no body or that came first -- to the same end.
  linkerd2-proxy starts it when the app's client has sent the request's end
  and counts 0 when the response ends first; here a response that ends while
  the request is still coming counts from the request's last chunk so far;
- ``inbound_{http,grpc}_request_frame_size_bytes`` (128, 1024, 10240): each
  request body chunk (an HTTP/1 chunk or read) or DATA frame (HTTP/2) the client
  sent, those that came before the request was routed too, and
  ``..._response_frame_size_bytes``: each one of the app's response relayed to
  the client.

Labels are ``parent_group``, ``parent_kind``, ``parent_name``, ``parent_port``
(the Server) and ``route_group``, ``route_kind``, ``route_name`` -- no
namespace, as linkerd2-proxy's inbound. A request is counted in the ``grpc``
families when its Server's protocol is gRPC (its routes are GRPCRoutes), in
the ``http`` ones otherwise, as linkerd2-proxy's ``PermitVariant`` says: the
policy check decides it once per route (``core.inbound_authz``).

The per-request path makes no label rendering and no call into a counter:
the series of one route are one ``_RouteSeries`` that its requests bump in
place, and a request's observers are closures over its two times. A
series is touched at a scrape when its requests moved since the previous one,
and dropped when untouched for ``retain_idle`` (or, past ``MAX_SERIES``
routes, the least recently touched tenth), as the proxy's other families.

Caller: ``core.inbound`` wraps the inbound router with ``routed``, which also
gives each request its profile route (``core.inbound_profile_routes``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any, Protocol

from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.commands import Command, Wait
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import Pick, Router
from tether.proxy.core.http_metrics import render_histogram
from tether.proxy.core.inbound_profile_routes import InboundProfileRoutes
from tether.proxy.core.labels import with_authority
from tether.proxy.core.metrics import MAX_SERIES, Registry, stale_series
from tether.proxy.core.policy_metrics import DURATION_BUCKETS, FRAME_BUCKETS

REQUEST_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0)  # linkerd2-proxy's finer ones for the inbound side
RESPONSE_BUCKETS = DURATION_BUCKETS  # 0.05, 0.5, 1, 10


class Authorized(Protocol):
    """What the policy check (``core.inbound_authz.InboundRequestPolicy``) says of the request it just let
    through: its route's labels ("" when none) and whether its Server speaks gRPC."""

    route: str
    grpc: bool


def _histogram(buckets: tuple[float, ...]) -> list[float]:
    return [0.0] * (len(buckets) + 3)  # the count per bucket, +Inf, then the sum and the count


class _RouteSeries:
    """Every series of one route (in one protocol's families)."""

    __slots__ = ("grpc", "requests", "statuses", "request_duration", "response_duration", "request_frames",
                 "response_frames", "seen", "touched")

    def __init__(self, grpc: bool, now: float) -> None:
        self.grpc = grpc  # statuses are grpc-status codes
        self.requests = 0
        self.statuses: dict[int, int] = {}
        self.request_duration = _histogram(REQUEST_BUCKETS)
        self.response_duration = _histogram(RESPONSE_BUCKETS)
        self.request_frames = _histogram(FRAME_BUCKETS)
        self.response_frames = _histogram(FRAME_BUCKETS)
        self.seen = 0  # ``requests`` at the last scrape
        self.touched = now

    def response_frame(self, size: float) -> None:
        frames = self.response_frames
        frames[bisect_left(FRAME_BUCKETS, size)] += 1
        frames[-2] += size
        frames[-1] += 1


class _Family:
    """The families of one protocol (``http`` or ``grpc``): their series by route labels."""

    def __init__(self, proto: str) -> None:
        self.proto = proto
        self.grpc = proto == "grpc"
        self.routes: dict[str, _RouteSeries] = {}

    def series(self, labels: str, now: float, retain_idle: float) -> _RouteSeries:
        """The series of the route ``labels`` names, made now (the first request on it, or since it expired)."""
        if len(self.routes) >= MAX_SERIES:
            self.expire(now, retain_idle, force=True)
        series = self.routes[labels] = _RouteSeries(self.grpc, now)
        return series

    def expire(self, now: float, retain_idle: float, *, force: bool) -> None:
        touched = {}
        for labels, series in self.routes.items():
            if series.requests != series.seen:  # moved since the last look: in use
                series.seen = series.requests
                series.touched = now
            touched[labels] = series.touched
        for labels in stale_series(touched, now, retain_idle, force=force):
            del self.routes[labels]

    def render(self, out: list[str]) -> None:
        prefix = f"inbound_{self.proto}"
        routes = self.routes.items()
        _header(out, f"{prefix}_requests_total", "counter", f"The number of {self.proto} requests on a route.")
        out.extend(f"{prefix}_requests_total{{{labels}}} {series.requests}" for labels, series in routes)
        _header(out, f"{prefix}_statuses_total", "counter", f"Completed {self.proto} responses on a route.")
        out.extend(f'{prefix}_statuses_total{{{labels},status="{"" if code == NO_STATUS else code}"}} {count}'
                   for labels, series in routes for code, count in series.statuses.items())
        for name, help_, buckets, attr in _HISTOGRAMS:
            _header(out, f"{prefix}_{name}", "histogram", help_)
            for labels, series in routes:
                render_histogram(out, f"{prefix}_{name}", labels, getattr(series, attr), buckets)


_HISTOGRAMS = (
    ("request_duration_seconds", "The time between request initialization and response completion.",
     REQUEST_BUCKETS, "request_duration"),
    ("response_duration_seconds", "The time between request completion and response completion.",
     RESPONSE_BUCKETS, "response_duration"),
    ("request_frame_size_bytes", "The size of request body frames on a route.", FRAME_BUCKETS, "request_frames"),
    ("response_frame_size_bytes", "The size of response body frames on a route.", FRAME_BUCKETS,
     "response_frames"),
)


def _header(out: list[str], name: str, kind: str, help_: str) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")


class InboundRouteMetrics:
    """The inbound route families, rendered in the proxy's registry."""

    def __init__(self, registry: Registry) -> None:
        self.clock = registry.clock
        self.retain_idle = registry.retain_idle
        self.http = _Family("http")
        self.grpc = _Family("grpc")
        registry.add_collector(self._render)

    def _render(self, out: list[str]) -> None:
        now = self.clock()
        for family in (self.http, self.grpc):
            family.expire(now, self.retain_idle, force=False)
            family.render(out)


def routed(router: Router, *, authorized: Authorized | None, profiles: InboundProfileRoutes | None,
           metrics: InboundRouteMetrics | None, authority_labels: bool = False) -> Router:
    """``router`` (the app's, ``core.routes.inbound_router``) giving each request its profile route
    (``profiles``; waiting for it once when ``InboundProfileRoutes.route`` says so) and, when ``authorized``
    (the connection's policy check) let it through on a route, counting it on that route (``metrics``).
    ``authority_labels``: the request metrics' labels get the ``authority`` the profile lookup named."""
    if metrics is None:
        authorized = None
    clock = metrics.clock if metrics is not None else _no_clock
    labelled: dict[tuple[str, str], str] = {}  # (request labels, authority) -> both: rendered once each

    def route(request: RequestHead) -> Generator[Command, Any, Pick | ProxyError]:
        began = clock()
        picked = yield from router(request)
        if isinstance(picked, ProxyError):
            if authorized is not None and authorized.route:
                assert metrics is not None
                _answered(metrics, authorized, began, clock)
            return picked
        profile_route = None
        if profiles is not None:
            found = profiles.route(request)
            if isinstance(found, Wait):
                yield found
                found = profiles.route(request, waited=True)
            assert not isinstance(found, Wait)
            profile_route = found
            if authority_labels and profiles.logical_authority:  # opt-in: the usual path makes no call here
                picked = _authority_labelled(labelled, picked, profiles.logical_authority)
        if authorized is None or not authorized.route:
            return picked if profile_route is None else replace(picked, route=profile_route)
        assert metrics is not None
        labels_ = authorized.route
        family = metrics.grpc if authorized.grpc else metrics.http
        series = family.routes.get(labels_)
        if series is None:
            series = family.series(labels_, began, metrics.retain_idle)
        series.requests += 1
        # The request's observers: closures (made without a call) over its times, given to the HTTP core in a
        # Pick of its own (the router's is shared by the connection's requests).
        times = [began, clock()]  # when it began; when it ended: routed, unless a body chunk comes later

        def request_frame(size: float) -> None:
            frames = series.request_frames
            frames[bisect_left(FRAME_BUCKETS, size)] += 1  # as response_frame observes (inline: no call)
            frames[-2] += size
            frames[-1] += 1
            times[1] = clock()

        def outcome(status: int, grpc_status: int | None, _elapsed: float) -> None:
            """The response's status (``Pick.outcome``: HTTP/1 at its head, HTTP/2 at its end); none: not
            counted."""
            code = grpc_status if series.grpc else (status or None)
            if code is not None:
                series.statuses[code] = series.statuses.get(code, 0) + 1
            if status == 101:  # the connection switched protocols: the exchange ends with this head
                _release(series, times, clock)

        # No closure here calls another: compiled by mypyc, closures that refer to one another share an environment
        # that refers to them, a reference cycle per request that only the cyclic collector frees, and the serving
        # proxy runs it rarely (tests/proxy/test_http1_garbage.py).
        def release() -> None:
            """The exchange is over (``Pick.release``): its two durations, once."""
            _release(series, times, clock)

        # Made directly, not by dataclasses.replace (a call saved): the app's router answers picks of these five
        # fields alone (core.routes.inbound_router; test_inbound_route_metrics checks it).
        return Pick(picked.connect, picked.header, picked.labels, picked.authority, outcome=outcome,
                    release=release, route=profile_route, frames=series.response_frame,
                    request_frames=request_frame, unreachable=picked.unreachable)

    return route


MAX_AUTHORITIES = 1024  # label sets with an authority kept per connection


def _authority_labelled(labelled: dict[tuple[str, str], str], picked: Pick, authority: str) -> Pick:
    """``picked`` with ``authority`` in its labels; ``labelled`` keeps each connection's renderings (a module
    function, not a closure beside ``route``: compiled, closures that call one another are a reference cycle,
    here one per connection)."""
    key = (picked.labels, authority)
    both = labelled.get(key)
    if both is None:
        if len(labelled) >= MAX_AUTHORITIES:  # a client chooses its names: bounded
            labelled.clear()
        both = labelled[key] = with_authority(picked.labels, authority)
    return replace(picked, labels=both)
NO_STATUS = -1  # the ``statuses`` key of a request that ended in an error, without a status (``status=""``)


def _answered(metrics: InboundRouteMetrics, authorized: Authorized, began: float,
              clock: Callable[[], float]) -> None:
    """A request on an authorized route that the proxy answered before it went to the app (the app port in
    fail-fast, or its queue full: ``core.inbound_queue``). linkerd2-proxy's route metrics sit above that queue
    and see the error: the request counted, its status none (``status=""``), its request duration to the
    error, and a response duration of 0 (no request went up)."""
    family = metrics.grpc if authorized.grpc else metrics.http
    series = family.routes.get(authorized.route)
    if series is None:
        series = family.series(authorized.route, began, metrics.retain_idle)
    series.requests += 1
    series.statuses[NO_STATUS] = series.statuses.get(NO_STATUS, 0) + 1
    _release(series, [began, clock()], clock)


def _release(series: _RouteSeries, times: list[float], clock: Callable[[], float]) -> None:
    """A routed exchange is over: its request and response durations (``times``: when it began, when the
    request ended), once."""
    if not times:
        return
    now = clock()
    for hist, buckets, seconds in ((series.request_duration, REQUEST_BUCKETS, now - times[0]),
                                   (series.response_duration, RESPONSE_BUCKETS, now - times[1])):
        hist[bisect_left(buckets, seconds)] += 1  # as response_frame observes (inline: no call)
        hist[-2] += seconds
        hist[-1] += 1
    times.clear()


def _no_clock() -> float:
    return 0.0
