"""A request's decision under outbound client policy (proxy.md §7.2, §7.5, §7.6, §7.9): one implementation for
HTTP/1 and HTTP/2, asked by the router (``core.routes``) before it picks an endpoint.

``decide`` takes the ``ClientPolicy`` and a request head and answers either
a ``ProxyError`` the proxy answers itself -- no route (404), a redirect (3xx
with ``Location``), an injected failure, an invalid policy (500), no backend
(502) -- or a ``Decision``: the backend drawn by weight, the request header
rewrite (the rule's then the backend's ``RequestHeaderModifier``s, in order),
the response header rewrite, and the request's ``PolicyRoute``.

``PolicyRoute`` is what the HTTP layers already apply to a route
(``core.profiles.Route``): ``timeout`` (the rule's request timeout, or its
response timeout when shorter: a 504 before the response head, across every
attempt; ``timeout_error`` names which in the route's metrics), ``budget``
(the rule's retry limit, counted down per request: ``Attempts``, with the
rule's backoff before each retry: ``retry_delay``), ``attempt_timeout`` (the
rule's per-attempt timeout: a retryable 504) and ``is_failure`` (the rule's
retry conditions: HTTP status ranges or gRPC codes). It has no
``metric_labels``: the ServiceProfile ``route_*`` series are not for policy
routes.

Pure: ``draw`` is a uniform random in [0, 1). Callers: ``core.routes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tether.proxy.codec.http1 import Headers, RequestHead
from tether.proxy.core import errors, route_headers
from tether.proxy.core.client_policy import ClientPolicy, OutboundRoute, OutboundRule, Retry, RouteBackend, Timeouts
from tether.proxy.core.errors import ProxyError, RouteError
from tether.proxy.core.route_filters import (
    FailureInjector,
    HeaderModifier,
    Invalid,
    InvalidRedirect,
    Redirect,
    RequestFilter,
    chain,
)
from tether.proxy.core.policy_metrics import BackendSeries, PolicyMetrics, RouteFamily, RouteSeries, route_key
from tether.proxy.core.profiles import MATCH_ALL, Route
from tether.proxy.core.server_policy import select_route

Rewrite = Callable[[Headers], Headers]


class Attempts:
    """A request's retries under a policy rule: ``limit`` withdrawals, then none (``retries.Budget``);
    ``report`` hears each retry and each refusal (``outbound_*_route_retry_*``)."""

    __slots__ = ("left", "retried", "report", "backoff", "draw", "done")

    def __init__(self, limit: int, report: RouteReport | None = None, backoff: tuple[float, float] | None = None,
                 draw: Callable[[], float] = lambda: 0.0) -> None:
        self.left = limit
        self.retried = False
        self.report = report
        self.backoff = backoff  # (min, max) seconds before each retry; jitter: up to as much again
        self.draw = draw
        self.done = 0  # retries sent

    def delay(self) -> float:
        """Seconds to wait before the retry just withdrawn: min x 2^(retries before it), capped at max, with
        Linkerd's full jitter (the controller sends a ratio of 1)."""
        if self.backoff is None:
            return 0.0
        low, high = self.backoff
        base = min(low * (1 << min(self.done - 1, 32)), high)
        return min(base + base * self.draw(), high)

    def deposit(self) -> None:
        """A request that ends without a retry earns nothing (no shared budget)."""

    def withdraw(self) -> bool:
        report = self.report
        if self.left <= 0:
            if report is not None:
                report.retry("limit_exceeded")
            return False
        self.left -= 1
        self.done += 1
        self.retried = True
        if report is not None:
            report.retry("requests")
        return True


@dataclass(frozen=True, slots=True)
class RouteReport:
    """Where a policy route's request is counted: the metrics, the protocol, the parent and route labels and
    the request's ``hostname`` label (``PolicyMetrics.hostname``)."""

    metrics: PolicyMetrics
    grpc: bool
    labels: str
    hostname: str = ""
    # Where its series are: the protocol's families, and the key of the route's series there, rendered once per
    # report. A request finds its series with ``family.routes.get(key)`` inline (no call; ``series`` makes it).
    family: RouteFamily = field(init=False, repr=False, compare=False)
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", self.metrics.family(self.grpc))
        object.__setattr__(self, "key", route_key(self.labels, self.hostname))

    def series(self) -> RouteSeries:
        return self.family.route(self.key)

    def retry(self, what: str) -> None:
        self.series().retry(what)

    def of_backend(self, backend: RouteBackend) -> BackendReport:
        return BackendReport(self.family, f"{self.labels},{backend.labels}")


@dataclass(frozen=True, slots=True)
class BackendReport:
    """A route's metrics of one of its backends: made once per rule and backend (nothing in it depends on the
    request); a request finds the series with ``family.backends.get(key)`` inline (``series`` makes it)."""

    family: RouteFamily
    key: str  # the parent, route and backend labels

    def series(self) -> BackendSeries:
        return self.family.backend(self.key)


@dataclass(frozen=True, slots=True, eq=False)
class PolicyRoute(Route):
    """A request's policy route, as the HTTP layers apply a route (see the module docstring)."""

    retry: Retry | None = None
    route: OutboundRoute | None = None
    report: RouteReport | None = None
    idle: float | None = None  # the rule's idle timeout: no byte either way for that long ends the request
    timeout_error: RouteError = RouteError.REQUEST_TIMEOUT  # what ``timeout`` passing is called (its metrics)

    def attempt_timeout(self) -> float | None:
        """The per-attempt timeout of the attempt about to be sent: none on the last one Linkerd would send
        (no retry left), as Linkerd removes it there."""
        retry = self.retry
        budget = self.budget
        if retry is None or retry.timeout is None or not isinstance(budget, Attempts) or budget.left <= 0:
            return None
        return retry.timeout

    def retry_delay(self) -> float:
        budget = self.budget
        return budget.delay() if isinstance(budget, Attempts) else 0.0

    def is_failure(self, status: int, grpc_status: int | None = None) -> bool:
        if self.retry is not None:
            return self.retry.retryable(status, grpc_status)
        if grpc_status is not None:
            return grpc_status != 0
        return status >= 500


@dataclass(frozen=True, slots=True)
class Decision:
    route: OutboundRoute
    rule: OutboundRule
    backend: RouteBackend
    request_route: PolicyRoute
    rewrite: Rewrite | None = None
    respond: Rewrite | None = None
    report: BackendReport | None = None  # the route's metrics of this backend (None: no metrics)


@dataclass(slots=True)
class _Prepared:
    """A rule's per-request constants, made on its first request (``ClientPolicy.prepared``)."""

    report: RouteReport | None
    shared: PolicyRoute | None  # the request's route, when the rule has no retries (nothing per request)
    deadline: tuple[float | None, RouteError]  # the rule's timeout and its name (``_deadline``)
    checks: tuple[RequestFilter, ...]  # redirects, failure injectors, invalid: in order
    modifiers: tuple[HeaderModifier, ...]
    rewrite: Rewrite | None
    respond: Rewrite | None
    # The decision of every request, when nothing in it depends on the request: the shared route, no filter
    # that looks at the request, one backend (drawn alike for all) without filters, no l5d-* overrides. Such a
    # rule (a Service's default route among them) then costs a dict lookup per request instead of the dozen
    # calls of deciding (choosing the backend, the decision, its bound metrics).
    decision: Decision | None = None


def decide(policy: ClientPolicy, request: RequestHead, h2: bool, draw: Callable[[], float],
           metrics: PolicyMetrics | None = None) -> Decision | ProxyError:
    chosen = policy.only[h2] or select_route(policy.routes(h2), request)  # ``only``: a single catch-all rule
    if chosen is None:
        return errors.no_route()
    route, rule = chosen
    assert isinstance(rule, OutboundRule)
    prepared = policy.prepared.get(id(rule))
    if prepared is None or prepared.report is not None and prepared.report.metrics is not metrics:
        prepared = policy.prepared[id(rule)] = _prepare(policy, route, rule, metrics)
    report = prepared.report
    if report is not None and report.metrics.hostname_labels:
        hostname = report.metrics.hostname(request)
        if hostname:  # the request's own report, and so its own route (not the rule's shared one)
            report = replace(report, hostname=hostname)
    decided = prepared.decision if report is prepared.report else None
    if decided is None:
        decision = _decide(route, rule, prepared, report, request, draw)
        if isinstance(decision, ProxyError):
            return decision
        decided = decision
    backend = decided.backend
    backend_report = decided.report
    if backend_report is not None:  # outbound_*_route_backend_requests_total, one per attempt (no call when known)
        (backend_report.family.backends.get(backend_report.key) or backend_report.series()).requests += 1
    if backend.balancer is None and backend.endpoint is None:
        return _with(errors.no_backend(backend.meta.name), decided.request_route)
    return decided


def _decide(route: OutboundRoute, rule: OutboundRule, prepared: _Prepared, report: RouteReport | None,
            request: RequestHead, draw: Callable[[], float]) -> Decision | ProxyError:
    """The decision for ``request`` made afresh: its route (its own when it has retries, l5d-* overrides or its
    own hostname label), its filters, the backend drawn, its rewrites; or what the proxy answers instead."""
    request_route = prepared.shared if prepared.shared is not None and report is prepared.report \
        else _request_route(route, rule.retry, prepared.deadline, rule.timeouts.idle, report, draw)
    consumed = False
    if rule.allow_l5d_request_headers:  # the client's l5d-retry-*/l5d-*-timeout headers (core.route_headers)
        asked = route_headers.overrides(request, rule.retry, rule.timeouts)
        if asked is not None:
            consumed = True
            request_route = _request_route(route, asked.retry, _deadline(asked.timeouts), asked.timeouts.idle,
                                           report, draw)
    if prepared.checks:
        refused = _filters(prepared.checks, rule, request, [], draw)
        if refused is not None:
            return _with(refused, request_route)
    backend = rule.choose(draw())
    if backend is None:
        return _with(errors.no_backend(route.meta.name), request_route)
    rewrite = prepared.rewrite
    if backend.filters:
        modifiers = list(prepared.modifiers)
        refused = _filters(backend.filters, rule, request, modifiers, draw)
        if refused is not None:
            return _with(refused, request_route)
        rewrite = chain(modifiers)
    if consumed:
        rewrite = route_headers.strip if rewrite is None else _then(rewrite, route_headers.strip)
    return Decision(route, rule, backend, request_route, rewrite, prepared.respond,
                    report.of_backend(backend) if report is not None else None)


def _prepare(policy: ClientPolicy, route: OutboundRoute, rule: OutboundRule,
             metrics: PolicyMetrics | None) -> _Prepared:
    report = RouteReport(metrics, route.grpc, f"{policy.parent_labels},{route.labels}") if metrics is not None \
        else None
    modifiers = tuple(f for f in rule.filters if isinstance(f, HeaderModifier))
    prepared = _Prepared(report, None, _deadline(rule.timeouts),
                         tuple(f for f in rule.filters if not isinstance(f, HeaderModifier)), modifiers,
                         chain(modifiers), chain(rule.response_filters))
    if rule.retry is None or rule.retry.limit == 0:
        timeout, error = prepared.deadline
        prepared.shared = PolicyRoute(MATCH_ALL, timeout=timeout, retry=rule.retry, route=route, report=report,
                                      idle=rule.timeouts.idle, timeout_error=error)
        if not prepared.checks and not rule.allow_l5d_request_headers and len(rule.backends) == 1 \
                and not rule.backends[0].filters:
            backend = rule.choose(0.0)  # with one backend, the same for every draw and every readiness
            if backend is not None:
                prepared.decision = Decision(route, rule, backend, prepared.shared, prepared.rewrite, prepared.respond,
                                             None if report is None else report.of_backend(backend))
    return prepared


def _request_route(route: OutboundRoute, retry: Retry | None, deadline: tuple[float | None, RouteError],
                   idle: float | None, report: RouteReport | None, draw: Callable[[], float]) -> PolicyRoute:
    """A request's own route: its retries are counted per request."""
    budget = Attempts(retry.limit, report, retry.backoff, draw) if retry is not None and retry.limit > 0 else None
    timeout, error = deadline
    return PolicyRoute(MATCH_ALL, timeout=timeout, budget=budget, retry=retry, route=route, report=report, idle=idle,
                       timeout_error=error)


def _deadline(t: Timeouts) -> tuple[float | None, RouteError]:
    """The route's timeout and what its passing is called: the request timeout, or the response timeout when
    shorter (either runs from the request's start to the response's end here; see the module docstring)."""
    if t.response and (not t.request or t.response < t.request):
        return t.response, RouteError.RESPONSE_STREAM_TIMEOUT
    return t.request or None, RouteError.REQUEST_TIMEOUT


def _then(first: Rewrite, second: Rewrite) -> Rewrite:
    return lambda headers: second(first(headers))


def _with(error: ProxyError, route: PolicyRoute) -> ProxyError:
    return replace(error, route=route)


def _filters(filters: tuple[RequestFilter, ...], rule: OutboundRule, request: RequestHead,
             modifiers: list[HeaderModifier], draw: Callable[[], float]) -> ProxyError | None:
    for f in filters:
        if isinstance(f, HeaderModifier):
            modifiers.append(f)
        elif isinstance(f, Redirect):
            try:
                location = f.location_of(request, rule.match.matched_prefix(request))
            except InvalidRedirect as exc:
                return errors.invalid_policy(f"invalid redirect: {exc}")
            if location is not None:  # else the request is where the redirect would send it: no redirect
                return errors.redirect(f.status, location)
        elif isinstance(f, FailureInjector):
            if f.hits(draw()):
                return errors.injected(f.status, f.grpc_code, f.message)
        elif isinstance(f, Invalid):
            return errors.invalid_policy(f.message)
    return None
