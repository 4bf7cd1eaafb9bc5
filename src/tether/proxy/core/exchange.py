"""What every HTTP exchange goes through, whatever its version: written once, called by both cores.

An exchange is one request and its response: an HTTP/1 request
(``core.http1_proxy``) or an HTTP/2 stream (``core.http2_proxy``). Each core
keeps its own per-exchange state (its phase enum, its codec's events) and
calls these for the decisions and the accounting they share:

- ``admit``: the direction's in-flight limit (``*_MAX_IN_FLIGHT``, load
  shedding: 503) and the per-request policy hook (``HttpSettings.policy``:
  inbound authorization, route filters and rate limits), before the request
  is routed (the edit a route's header modifier makes is the core's to apply);
  ``leave`` gives the in-flight place back;
- ``route_timeout``: the answer when a route's timeout passed;
- ``route_begun``: the exchange's first pick named a route: a ServiceProfile
  route's ``route_request_total``; a client policy route's request frame
  observer (``core.policy_metrics``) and idle timeout;
- ``settle_attempt``: after an attempt on a profile route, retry, final, or
  the route's timeout passed (the classes, the budget: ``core.retries.settle``);
- ``record`` / ``record_route``: ``response_total`` and ``route_response_*``
  (latency from the exchange's start);
- ``count_error``: ``<direction>_http_errors_total{error}`` for an error the
  proxy answers.

Pure functions over ``HttpSettings``: no I/O, no state of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core import errors
from tether.proxy.core.errors import ErrorKind, ProxyError, RouteError
from tether.proxy.core.http import HeaderEdit, HttpSettings
from tether.proxy.core.policy_metrics import FRAME_BUCKETS, histogram
from tether.proxy.core.policy_routes import Attempts, PolicyRoute
from tether.proxy.core.retries import Settled, settle

if TYPE_CHECKING:
    from tether.proxy.core.http_metrics import _Series
    from tether.proxy.core.profiles import Route


def admit(settings: HttpSettings, request: RequestHead) -> tuple[bool, ProxyError | None, HeaderEdit | None]:
    """(whether the exchange took an in-flight place, the answer if it is refused, the edit the policy makes
    to the request's headers). A shed request takes no place; a request the policy refuses has taken one
    (``leave`` it when it ends)."""
    in_flight = settings.in_flight
    placed = False
    if in_flight is not None:
        if in_flight.count >= in_flight.limit:
            return False, errors.load_shed(), None
        in_flight.count += 1
        placed = True
    policy = settings.policy
    if policy is not None:
        answer = policy.check(request)
        if answer is not None:
            if isinstance(answer, ProxyError):
                return placed, answer, None
            return placed, None, answer
    return placed, None, None


def leave(settings: HttpSettings) -> None:
    """An exchange that ``admit`` placed is over."""
    in_flight = settings.in_flight
    assert in_flight is not None
    in_flight.count -= 1


def route_begun(settings: HttpSettings, route: Route) -> tuple[str, Callable[[float], None] | None, float | None]:
    """The exchange's first pick named ``route``, asked once per exchange, one call for what the cores need:

    - its ServiceProfile route metric series, counted (``route_request_total``; "" : not counted);
    - on a client policy route, where its request body frames are counted, once each (the route's
      ``outbound_*_route_request_frame_size_bytes``; None: not counted), the exchange counted on the route's
      series (their expiry watches that), found inline (a dict lookup, no call, when known);
    - how long it may go without a byte either way (a client policy rule's idle timeout; None: no limit)."""
    labels: str = route.metric_labels  # empty for an l5d-dst-override target without routes
    metrics = settings.metrics
    if metrics is not None and labels:
        metrics.routes.request(labels, route.budget is not None)
    if not isinstance(route, PolicyRoute):
        return labels, None, None
    report = route.report
    if report is None:
        return labels, None, route.idle
    series = report.family.routes.get(report.key) or report.series()
    series.requests += 1
    if series.frames is None:
        series.frames = histogram(FRAME_BUCKETS)
    return labels, series.frame, route.idle


def settle_attempt(settings: HttpSettings, route: Route, route_labels: str, start: float, status: int,
                   grpc_status: int | None, error: ProxyError | None, replayable: bool) -> Settled:
    """An attempt on ``route`` ended with ``status`` (``grpc_status`` for gRPC; ``error`` if the proxy answers
    for the endpoint): RETRY it (a failure by the route's classes, the request ``replayable``, an endpoint
    error of a retryable kind, the budget allows), FINAL, or EXPIRED (the route's timeout passed meanwhile)."""
    budget = route.budget
    if budget is None:  # a route without retries (most): final (as ``settle`` says), without classifying the
        return Settled.FINAL  # attempt or calling ``settle``: two calls fewer per request
    # A per-attempt timeout is retried whatever the conditions say (Linkerd's response-headers timeout); so is a
    # fail-fast on a client policy route: linkerd2-proxy's policy retries take it as retryable, as the next attempt
    # may draw another backend (its ServiceProfile routes and everyone's load shedding do not).
    kind = error.kind if error is not None else None
    forced = kind is ErrorKind.ATTEMPT_TIMEOUT or kind is ErrorKind.FAILFAST and isinstance(route, PolicyRoute)
    failure = forced or route.is_failure(status, grpc_status)
    retryable = failure and replayable and (kind is None or forced or kind.retryable)
    expired = (retryable and route.timeout is not None
               and settings.clock() >= start + route.timeout)
    metrics = settings.metrics
    routes = metrics.routes if metrics is not None and route_labels else None
    return settle(budget, retryable, expired, routes, route_labels, status, grpc_status)


def attempt_timeout(route: Route | None) -> float | None:
    """The per-attempt timeout of the attempt about to go out on ``route`` (a client policy rule's), if any. A
    rule without one (most) is known by its retry, with no call to ask the route."""
    if isinstance(route, PolicyRoute) and route.retry is not None and route.retry.timeout is not None:
        return route.attempt_timeout()
    return None


def route_timeout(route: Route) -> ProxyError:
    """The answer when ``route``'s timeout passed before the response head: 504, the connection kept on a client
    policy route (Linkerd's non-fatal timeout), closed on a ServiceProfile route (proxy.md §7.9)."""
    if isinstance(route, PolicyRoute):
        return errors.request_timeout(route.timeout or 0.0)
    return errors.response_timeout(route.timeout or 0.0)


def retry_delay(route: Route) -> float:
    """Seconds before the retry ``settle_attempt`` just allowed (a client policy rule's backoff; else none)."""
    return route.retry_delay() if isinstance(route, PolicyRoute) else 0.0


def record(settings: HttpSettings, labels: str, status: int, success: bool, start: float, error: str = "",
           grpc_status: int | None = None, series: _Series | None = None) -> None:
    """``response_total`` and ``response_latency_ms`` under ``labels`` (an endpoint's, or the error labels);
    ``series``: what ``HttpMetrics.request`` returned for them, if the caller kept it."""
    metrics = settings.metrics
    if metrics is not None and labels:
        metrics.response(labels, status, success, int((settings.clock() - start) * 1000), error,
                         grpc_status=grpc_status, series=series)


def timeout_spans_response(route: Route | None) -> bool:
    """Whether ``route``'s timeout still runs once the response head came: a client policy rule's request and
    response timeouts bound the whole stream, to the response's end (linkerd2-proxy's stream deadline and
    response-end timeout); a ServiceProfile route's bounds the response head."""
    return isinstance(route, PolicyRoute)


def timeout_error(route: Route | None) -> RouteError:
    """The route error of ``route``'s timeout passing (a client policy rule's request or response timeout)."""
    return route.timeout_error if isinstance(route, PolicyRoute) else RouteError.REQUEST_TIMEOUT


def record_route(settings: HttpSettings, route_labels: str, status: int, success: bool, start: float,
                 error: str = "", grpc_status: int | None = None, route: Route | None = None,
                 answered: ProxyError | None = None, route_error: RouteError | None = None) -> None:
    """``route_response_total`` and its latency for the exchange as the client saw it (a timeout is not an
    actual response); on a client policy route (``route``), its ``outbound_*_route_*`` metrics.

    ``error``: the ServiceProfile classification's label (``timeout``, ``h2(<CODE>)``, ``unclassified``);
    ``route_error``: what a client policy route's metrics call it (unsaid with an ``error``: ``UNKNOWN``);
    ``answered``: the error the proxy answered the request with, if any -- those of ``errors.ROUTE_ERRORS``
    are errors to the route, not statuses."""
    policy_status, policy_grpc = status, grpc_status
    if answered is not None:
        kind = answered.kind
        if kind in errors.UNSTATUSED:
            status, success, error, grpc_status = 0, False, "unclassified", None
        answered_error = errors.ROUTE_ERRORS.get(kind)
        if answered_error is not None:
            route_error, policy_status, policy_grpc = route_error or answered_error, 0, None
    if isinstance(route, PolicyRoute):
        report = route.report
        if report is not None:  # the route's series, found inline (no call when known), and its retry's success
            if route_error is None and error:
                route_error = RouteError.UNKNOWN
            policy_error = route_error.value if route_error is not None else ""
            (report.family.routes.get(report.key) or report.series()).ended(
                policy_status, policy_grpc, settings.clock() - start, policy_error)
            budget = route.budget
            if isinstance(budget, Attempts) and budget.retried and not policy_error \
                    and not route.is_failure(status, grpc_status):
                report.retry("successes")
    metrics = settings.metrics
    if metrics is not None and route_labels:
        metrics.routes.response(route_labels, status, success, int((settings.clock() - start) * 1000), error,
                                actual=error != "timeout", grpc_status=grpc_status)


def count_error(settings: HttpSettings, error: ProxyError, count: Callable[[str, str], None]) -> None:
    """``<direction>_http_errors_total{error}`` for an error the proxy answers (kinds without a label: none)."""
    if error.metric:
        count(f"{settings.direction}_http_errors_total", error_labels(settings, error.metric))


def error_labels(settings: HttpSettings, error: str) -> str:
    """The labels of ``<direction>_http_errors_total`` for ``error``."""
    scope = settings.error_scope
    return f'error="{error}",{scope}' if scope else f'error="{error}"'
