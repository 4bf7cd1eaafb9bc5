"""``DestinationProfile`` messages to the proxy's profile model (``core.profiles``), once per profile update.

What linkerd2-proxy's ``service-profiles/src/proto.rs`` does, with the same
leniency: a route whose condition cannot be used (no condition, a regex that
does not compile, a method that is not one) is dropped; a response class
without a usable condition is dropped (an ``all``/``any`` with nothing usable
in it is unusable); a retry budget outside Linkerd's bounds (ratio 0..1000,
ttl 1..60 s) is no budget, so no route retries; ``dst_overrides`` with weight
0 or an authority that is not ``name:port`` are dropped.

A profile with no routes and no traffic split is None: the request path then
costs nothing (``routes`` checks one attribute).

Callers: ``io.discovery`` (``ProfileWatch`` on each update).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from tether.api import destination_pb2 as pb
from tether.api import http_types_pb2
from tether.proxy.core import profiles
from tether.proxy.core.profiles import Backend, Profile, RequestMatch, ResponseClass, ResponseMatch, Route, Split
from tether.proxy.core.retries import MAX_RETRIES_PER_SECOND, RetryBudget

log = logging.getLogger(__name__)

_METHODS = {value: name.encode() for name, value in http_types_pb2.HttpMethod.Registered.items()}


def translate(message: pb.DestinationProfile, dst: str, clock: Callable[[], float],
              balancer_for: Callable[[str], object]) -> Profile | None:
    """The profile of service ``dst`` (``name:port``); ``balancer_for(authority)`` gives a split backend's balancer.

    ``balancer_for`` is only called for the backends kept, so the caller holds
    exactly the service watches the profile uses.
    """
    budget = retry_budget(message.retry_budget, clock) if message.HasField("retry_budget") else None
    routes = [r for r in (route(m, budget) for m in message.routes) if r is not None]
    backends = []
    for override in message.dst_overrides:
        if override.weight == 0 or not _is_name_addr(override.authority):
            continue
        backends.append(Backend(override.authority, override.weight, balancer_for(override.authority)))
    if not routes and not backends:
        return None
    return Profile(dst, routes, Split(backends), budget)


def route(message: pb.Route, budget: RetryBudget | None) -> Route | None:
    condition = request_match(message.condition) if message.HasField("condition") else None
    if condition is None:
        return None
    classes = []
    for response_class in message.response_classes:
        match = response_match(response_class.condition) if response_class.HasField("condition") else None
        if match is not None:
            classes.append(ResponseClass(match, response_class.is_failure))
    timeout = None
    if message.HasField("timeout"):
        seconds = message.timeout.seconds + message.timeout.nanos / 1e9
        if seconds >= 0:
            timeout = seconds
        else:
            log.warning("profile route timeout is negative: ignored")
    return Route(condition, tuple(classes), profiles.route_labels(dict(message.metrics_labels)), timeout,
                 budget if message.is_retryable else None)


def request_match(message: pb.RequestMatch) -> RequestMatch | None:
    kind = message.WhichOneof("match")
    if kind == "all":
        return profiles.All([m for m in map(request_match, message.all.matches) if m is not None])
    if kind == "any":
        return profiles.Any_([m for m in map(request_match, message.any.matches) if m is not None])
    if kind == "not":
        inner = request_match(getattr(message, "not"))
        return profiles.Not(inner) if inner is not None else None
    if kind == "path":
        try:
            return profiles.PathRegex(message.path.regex)
        except re.error as exc:  # the condition is unusable, and so the route (as in Linkerd)
            log.warning("profile route regex %r does not compile: %s", message.path.regex, exc)
            return None
    if kind == "method":
        method = message.method
        which = method.WhichOneof("type")
        if which == "registered":
            name = _METHODS.get(method.registered)
            return profiles.Method(name) if name is not None else None
        if which == "unregistered" and method.unregistered:
            return profiles.Method(method.unregistered.encode("latin-1", "replace"))
        return None
    return None


def response_match(message: pb.ResponseMatch) -> ResponseMatch | None:
    kind = message.WhichOneof("match")
    if kind in ("all", "any"):
        seq = message.all if kind == "all" else message.any
        parts = [m for m in map(response_match, seq.matches) if m is not None]
        if not parts:
            return None
        return profiles.AllStatus(parts) if kind == "all" else profiles.AnyStatus(parts)
    if kind == "not":
        inner = response_match(getattr(message, "not"))
        return profiles.NotStatus(inner) if inner is not None else None
    if kind == "status":
        low, high = message.status.min, message.status.max
        if not (low or high) or max(low, high) > 999:
            return None
        return profiles.StatusRange(low, high)
    return None


def retry_budget(message: pb.RetryBudget, clock: Callable[[], float]) -> RetryBudget | None:
    if not message.HasField("ttl"):
        log.warning("profile retry budget has no ttl: no retries")
        return None
    ttl = message.ttl.seconds + message.ttl.nanos / 1e9
    ratio = message.retry_ratio
    if not 1.0 <= ttl <= 60.0 or not 0.0 <= ratio <= 1000.0 or message.min_retries_per_second >= MAX_RETRIES_PER_SECOND:
        log.warning("profile retry budget out of bounds (ratio %s, ttl %ss): no retries", ratio, ttl)
        return None
    return RetryBudget(ttl=ttl, min_per_second=message.min_retries_per_second, ratio=ratio, clock=clock)


def _is_name_addr(authority: str) -> bool:
    """``name:port`` with a numeric port (Linkerd's ``NameAddr``)."""
    host, sep, port = authority.rpartition(":")
    return bool(host and sep and port.isdigit() and 0 < int(port) < 65536)
