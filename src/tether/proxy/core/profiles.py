"""ServiceProfile routing, as the proxy applies it per request (proxy.md §7.2, §7.5, §7.6, §9.2).

A ``Profile`` is what one ``DestinationProfile`` update says about a service,
already translated (``core.profile_translation``, once per update) so that
no protobuf is touched per request:

- ``routes``: ordered; a request takes the first whose ``RequestMatch`` holds,
  and a catch-all default route (no labels, no timeout, no retries) comes last,
  as in Linkerd. Conditions are trees of ``All`` / ``Any`` / ``Not`` over a
  path regex and a method.
- per route: ``ResponseClass``es (the first class matching the status decides
  failure; none matching falls back to the default rule, 5xx is a failure),
  ``timeout`` (for the response head, across every attempt), retries (a
  ``retries.RetryBudget`` shared by the profile's retryable routes; None when
  the route is not retryable or the profile has no usable budget), and its
  metric labels (``rt_<key>`` for each ``metrics_labels`` entry, sorted).
- ``split``: the ``dst_overrides`` with a weight, each a backend (a service's
  balancer); empty means the service itself. A backend with no endpoint gives
  its share to the others while it has none (Linkerd's ``RandomAvailable``).

Path regexes are anchored as Linkerd anchors them: ``^`` and ``$`` are added
where missing, without a group -- so a top-level alternation ``/a|/b`` reads
``^/a|/b$`` there and here alike.

Pure. Callers: ``core.profile_translation`` (building), ``core.routes``
(matching and the traffic split) and ``core.http1_proxy`` / ``core.http2_proxy`` (timeouts,
retries, classification, route metrics).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tether.proxy.codec.addrs import is_dns_name
from tether.proxy.core.retries import Budget, RetryBudget
from tether.proxy.core.labels import escape

# -- request matching -----------------------------------------------------------------------------------------


class RequestMatch:
    """A node of a route condition."""

    __slots__ = ()

    def matches(self, method: bytes, path: str) -> bool:
        raise NotImplementedError


class All(RequestMatch):
    """Every part holds (an empty ``All`` matches everything: the default route's condition)."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[RequestMatch]) -> None:
        self.parts = tuple(parts)

    def matches(self, method: bytes, path: str) -> bool:
        return all(p.matches(method, path) for p in self.parts)

    def __repr__(self) -> str:
        return f"All({list(self.parts)!r})"


class Any_(RequestMatch):
    """At least one part holds (``Any`` is a typing name; hence the underscore)."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[RequestMatch]) -> None:
        self.parts = tuple(parts)

    def matches(self, method: bytes, path: str) -> bool:
        return any(p.matches(method, path) for p in self.parts)

    def __repr__(self) -> str:
        return f"Any({list(self.parts)!r})"


class Not(RequestMatch):
    __slots__ = ("inner",)

    def __init__(self, inner: RequestMatch) -> None:
        self.inner = inner

    def matches(self, method: bytes, path: str) -> bool:
        return not self.inner.matches(method, path)

    def __repr__(self) -> str:
        return f"Not({self.inner!r})"


class PathRegex(RequestMatch):
    """The request's path (no query) against a regex anchored at both ends."""

    __slots__ = ("regex",)

    def __init__(self, pattern: str) -> None:
        self.regex = re.compile(anchored(pattern))  # re.error: the caller drops the condition, as Linkerd does

    def matches(self, method: bytes, path: str) -> bool:
        return self.regex.search(path) is not None

    def __repr__(self) -> str:
        return f"PathRegex({self.regex.pattern!r})"


class Method(RequestMatch):
    __slots__ = ("method",)

    def __init__(self, method: bytes) -> None:
        self.method = method

    def matches(self, method: bytes, path: str) -> bool:
        return method == self.method

    def __repr__(self) -> str:
        return f"Method({self.method!r})"


MATCH_ALL = All(())


def anchored(pattern: str) -> str:
    """Linkerd's anchoring: trimmed, then ``^`` and ``$`` added where missing (no group around the pattern)."""
    pattern = pattern.strip()
    if not pattern.startswith("^"):
        pattern = "^" + pattern
    if not pattern.endswith("$"):
        pattern += "$"
    return pattern


def request_path(target: bytes) -> str:
    """The path of a request target (what ``http::Uri::path`` gives): no query, no scheme or authority."""
    if target[:1] != b"/":
        scheme = target.find(b"://")
        if scheme < 0:
            return "*" if target == b"*" else ""  # asterisk-form; authority-form (CONNECT) has no path
        slash = target.find(b"/", scheme + 3)
        if slash < 0:
            return "/"
        target = target[slash:]
    end = target.find(b"?")
    if end >= 0:
        target = target[:end]
    return target.decode("latin-1")


# -- response classification ----------------------------------------------------------------------------------


class ResponseMatch:
    __slots__ = ()

    def matches(self, status: int) -> bool:
        raise NotImplementedError


class StatusRange(ResponseMatch):
    """Inclusive; one bound given (the other 0) is that single status (proxy-api.md ``HttpStatusRange``)."""

    __slots__ = ("low", "high")

    def __init__(self, low: int, high: int) -> None:
        if low == 0:
            low = high
        if high == 0:
            high = low
        self.low = low
        self.high = high

    def matches(self, status: int) -> bool:
        return self.low <= status <= self.high

    def __repr__(self) -> str:
        return f"StatusRange({self.low}, {self.high})"


class AllStatus(ResponseMatch):
    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[ResponseMatch]) -> None:
        self.parts = tuple(parts)

    def matches(self, status: int) -> bool:
        return all(p.matches(status) for p in self.parts)


class AnyStatus(ResponseMatch):
    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[ResponseMatch]) -> None:
        self.parts = tuple(parts)

    def matches(self, status: int) -> bool:
        return any(p.matches(status) for p in self.parts)


class NotStatus(ResponseMatch):
    __slots__ = ("inner",)

    def __init__(self, inner: ResponseMatch) -> None:
        self.inner = inner

    def matches(self, status: int) -> bool:
        return not self.inner.matches(status)


@dataclass(frozen=True, slots=True)
class ResponseClass:
    condition: ResponseMatch
    is_failure: bool


# -- routes ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """One profile route: how its requests are matched, classified, timed out, retried and counted."""

    condition: RequestMatch
    classes: tuple[ResponseClass, ...] = ()
    labels: str = ""  # rendered rt_* labels ("" for the default route)
    timeout: float | None = None  # seconds, for the response head across all attempts
    budget: Budget | None = None  # retries allowed (is_retryable with a usable budget; a policy rule's limit)
    metric_labels: str = ""  # the route metrics' series: direction, dst, rt_* (set by the Profile)
    dst: bytes = b""  # the profile's service, name:port (l5d-dst-canonical; set by the Profile)

    def is_failure(self, status: int, grpc_status: int | None = None) -> bool:
        """The first class matching ``status`` decides; otherwise, for a gRPC response (``grpc_status``, from its
        headers or trailers), any code but OK is a failure; otherwise Linkerd's default (5xx is a failure)."""
        for response_class in self.classes:
            if response_class.condition.matches(status):
                return response_class.is_failure
        if grpc_status is not None:
            return grpc_status != 0
        return status >= 500


def route_labels(metrics_labels: dict[str, str]) -> str:
    """``rt_<key>="<value>"`` for each label, sorted by key; keys made into valid label names."""
    return ",".join(f'rt_{_label_name(k)}="{escape(v)}"' for k, v in sorted(metrics_labels.items()))


def _label_name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


# -- the traffic split ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Backend:
    """One ``dst_overrides`` entry: a service (``name:port``) and its share; ``balancer`` is discovery's."""

    authority: str
    weight: int
    balancer: Any = field(default=None, compare=False)


class Split:
    """A weighted random choice among backends (Linkerd's ``RandomAvailable`` distribution)."""

    __slots__ = ("backends", "_cumulative", "_total")

    def __init__(self, backends: Sequence[Backend]) -> None:
        self.backends = tuple(b for b in backends if b.weight > 0)  # weight 0: never chosen (Linkerd drops it)
        total = 0
        cumulative = []
        for backend in self.backends:
            total += backend.weight
            cumulative.append(total)
        self._cumulative = cumulative
        self._total = total

    def __bool__(self) -> bool:
        return bool(self.backends)

    def choose(self, draw: float) -> Backend:
        """The backend for a uniform ``draw`` in [0, 1)."""
        return self.backends[min(bisect_right(self._cumulative, draw * self._total), len(self.backends) - 1)]

    def choose_among(self, draw: float, ready: Sequence[Backend]) -> Backend:
        """As ``choose``, among ``ready`` only (Linkerd skips a backend that is not ready, e.g. in fail-fast)."""
        total = sum(b.weight for b in ready)
        point = draw * total
        for backend in ready:
            point -= backend.weight
            if point < 0:
                return backend
        return ready[-1]


# -- the profile ----------------------------------------------------------------------------------------------


class Profile:
    """A service's profile routes and traffic split, for one profile update."""

    __slots__ = ("dst", "routes", "split", "default", "budget")

    def __init__(self, dst: str, routes: Sequence[Route], split: Split, budget: RetryBudget | None = None,
                 direction: str = "outbound") -> None:
        self.dst = dst  # the logical name:port (the route metrics' dst label)
        base = f'direction="{direction}",dst="{escape(dst)}"'
        self.default = Route(MATCH_ALL, metric_labels=base, dst=dst.encode())
        self.routes = tuple(_with_series(r, base, dst) for r in routes) + (self.default,)
        self.split = split
        self.budget = budget

    def route_for(self, method: bytes, target: bytes) -> Route:
        """The first route whose condition holds (the default route when none does)."""
        routes = self.routes
        if len(routes) == 1:
            return routes[0]
        path = request_path(target)
        for route in routes:
            if route.condition.matches(method, path):
                return route
        return self.default  # pragma: no cover - the default route matches everything

    def __repr__(self) -> str:
        backends = [b.authority for b in self.split.backends]
        return f"Profile({self.dst!r}, routes={len(self.routes) - 1}, split={backends})"


def inbound_profile(profile: Profile) -> Profile:
    """``profile``'s routes as the inbound proxy applies them (proxy.md §8.4): matched, classified, timed out and
    counted under ``direction="inbound"``; never retried nor split (linkerd2-proxy's inbound does neither)."""
    routes = [replace(r, budget=None) for r in profile.routes[:-1]]  # the default route is made again
    return Profile(profile.dst, routes, Split(()), None, direction="inbound")


def canonical_name(value: bytes, suffixes: Sequence[str]) -> tuple[str, int] | None:
    """The profile to look up for an inbound request's ``l5d-dst-canonical`` (``name:port``, lower case, no
    trailing dot) and its port; None unless the name is a DNS name under one of ``suffixes``
    (``LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES``; ``.``: every name)."""
    parsed = name_addr(value)
    if parsed is None or not discoverable(parsed[0], suffixes):
        return None
    name, port = parsed
    return f"{name}:{port}", port


def name_addr(value: bytes, default_port: int | None = None) -> tuple[str, int] | None:
    """``value`` (``host:port``, or ``host`` alone when there is a ``default_port``) as a DNS name in lower case
    without its trailing dot, and its port; None when the host is not a DNS name (an IP literal...) or the port
    is missing or invalid (linkerd2-proxy's ``NameAddr``)."""
    text = value.decode("latin-1").strip()
    host, sep, port_text = text.rpartition(":")
    if not sep and default_port is not None:
        host, port_text = text, str(default_port)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    host = host.lower().rstrip(".")
    if not is_dns_name(host):
        return None
    return host, int(port_text)


def discoverable(name: str, suffixes: Sequence[str]) -> bool:
    """Whether profiles are looked up for ``name``: it is under one of ``suffixes``
    (``LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES``; ``.``: every name)."""
    dotted = f".{name}."
    return any(s == "." or dotted.endswith(f".{s.strip('.')}.") for s in suffixes)


def _with_series(route: Route, base: str, dst: str) -> Route:
    labels = f"{base},{route.labels}" if route.labels else base
    return Route(route.condition, route.classes, route.labels, route.timeout, route.budget, labels, dst.encode())
