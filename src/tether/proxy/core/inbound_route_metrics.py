"""Linkerd 2.20's inbound route families (proxy.md §9.5), per request on a route the inbound policy chose.

- ``inbound_{http,grpc}_requests_total``: one per request routed to the app once
  its route authorized it;
- ``inbound_{http,grpc}_statuses_total`` (+ ``status``: the HTTP status, or for
  gRPC the numeric ``grpc-status``), when the app's response ended -- a response
  that never came (a reset, an I/O error) has no status and is not counted;
- ``inbound_{http,grpc}_request_frame_size_bytes`` (128, 1024, 10240): each
  request body chunk (an HTTP/1 chunk or read) or DATA frame (HTTP/2) the client
  sent, those that came before the request was routed too, and
  ``..._response_frame_size_bytes``: each one of the app's response relayed to
  the client.

Labels are ``parent_group``, ``parent_kind``, ``parent_name``, ``parent_port``
(the Server) and ``route_group``, ``route_kind``, ``route_name`` -- no namespace,
as linkerd2-proxy's inbound. A request is gRPC when its ``content-type`` starts
with ``application/grpc``. The frame series is bound once per request (no label
rendering per chunk), on the connection's pick its requests on the route share.

Caller: ``core.inbound`` wraps the inbound router with ``routed``; the labels
come from ``core.inbound_authz`` (``InboundRequestPolicy.route``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any

from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.commands import Command
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import Pick, Router
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_metrics import FRAME_BUCKETS, _Histogram


class _Family:
    """The families of one protocol (``http`` or ``grpc``)."""

    def __init__(self, registry: Registry, proto: str) -> None:
        prefix = f"inbound_{proto}"
        self.requests = registry.counter(f"{prefix}_requests_total", f"The number of {proto} requests on a route.")
        self.statuses = registry.counter(f"{prefix}_statuses_total", f"Completed {proto} responses on a route.")
        self.request_frames = _Histogram(f"{prefix}_request_frame_size_bytes",
                                         f"The size of request body frames on a route ({proto}).",
                                         registry.clock, registry.retain_idle, FRAME_BUCKETS)
        self.response_frames = _Histogram(f"{prefix}_response_frame_size_bytes",
                                          f"The size of response body frames on a route ({proto}).",
                                          registry.clock, registry.retain_idle, FRAME_BUCKETS)


class InboundRouteMetrics:
    """The inbound route families, registered in the proxy's registry."""

    def __init__(self, registry: Registry) -> None:
        self.http = _Family(registry, "http")
        self.grpc = _Family(registry, "grpc")
        registry.add_collector(self._render)

    def routed(self, router: Router, route_labels: Callable[[], str]) -> Router:
        """``router``, counting each request it routes under ``route_labels()`` (the route the policy check
        just authorized: read right after the check, as ``core.routes.inbound_router`` reads its permit)."""

        # Per pick's labels, profile route (an identity: kept alive here) and protocol: this connection's.
        copies: dict[tuple[str, object, bool], Pick] = {}

        def route(request: RequestHead) -> Generator[Command, Any, Pick | ProxyError]:
            picked = yield from router(request)
            labels_ = route_labels()
            if not isinstance(picked, Pick) or not labels_:
                return picked
            grpc = _is_grpc(request)
            family = self.grpc if grpc else self.http
            family.requests.inc(labels_)
            key = (picked.labels, picked.route, grpc)  # picked.labels: its server, route and authorization
            counted = copies.get(key)
            if counted is None:
                if len(copies) >= MAX_COPIES:
                    copies.clear()
                counted = copies[key] = replace(picked, outcome=_outcome(family, labels_, grpc))
            # Rebound per request: a series expired while the connection was idle comes back.
            counted.frames = family.response_frames.bind(labels_)
            counted.request_frames = family.request_frames.bind(labels_)
            return counted

        return route

    def _render(self, out: list[str]) -> None:
        for family in (self.http, self.grpc):
            family.request_frames.render(out)
            family.response_frames.render(out)


def _outcome(family: _Family, labels_: str, grpc: bool) -> Callable[[int, int | None, float], None]:
    """How a request's response ended: its status counted (none: not counted)."""
    statuses = family.statuses
    rendered: dict[int, str] = {}  # status -> its series' labels, rendered once (a route answers a few statuses)

    def outcome(status: int, grpc_status: int | None, _elapsed: float) -> None:
        code = grpc_status if grpc else (status or None)
        if code is not None:
            series = rendered.get(code)
            if series is None:
                series = rendered[code] = f'{labels_},status="{code}"'
            statuses.inc(series)

    return outcome


MAX_COPIES = 64  # as core.routes.MAX_PERMITS: a connection's requests share a few routes


def _is_grpc(request: RequestHead) -> bool:
    for name, value in request.headers:
        if name.lower() == b"content-type":
            return value.startswith(b"application/grpc")
    return False
