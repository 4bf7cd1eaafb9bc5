"""The ServiceProfile (``linkerd.io/v1alpha2``) spec: routes, response classes, retry budget, traffic split.

`model.parse` calls `parse_service_profile`; the destination's profile
translator turns `ServiceProfileSpec` into ``DestinationProfile``. Checks follow
Linkerd's sp-validator: every route named and conditioned, every condition node
setting at least one field, status ranges within 100-599, durations that parse.
``opaquePorts`` is not read: Linkerd fills it from the Service, not from users.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tether.resources import formats
from tether.resources.fields import Fields
from tether.resources.meta import ObjectMeta
from tether.resources.quantities import Quantity

M = TypeVar("M")

MIN_STATUS = 100
MAX_STATUS = 599


@dataclass(frozen=True, slots=True)
class RequestMatch:
    """A node of a route's condition tree; the fields that are set must all hold.

    ``all``/``any`` are None when absent and ``()`` when given empty.
    """

    all: tuple["RequestMatch", ...] | None = None
    any: tuple["RequestMatch", ...] | None = None
    not_: "RequestMatch | None" = None
    method: str | None = None
    path_regex: str | None = None


@dataclass(frozen=True, slots=True)
class StatusRange:
    """Inclusive HTTP status bounds; None where the manifest leaves a bound unset (or 0)."""

    min: int | None = None
    max: int | None = None


@dataclass(frozen=True, slots=True)
class ResponseMatch:
    all: tuple["ResponseMatch", ...] | None = None
    any: tuple["ResponseMatch", ...] | None = None
    not_: "ResponseMatch | None" = None
    status: StatusRange | None = None


@dataclass(frozen=True, slots=True)
class ResponseClass:
    condition: ResponseMatch
    is_failure: bool = False


@dataclass(frozen=True, slots=True)
class ProfileRoute:
    name: str
    condition: RequestMatch
    response_classes: tuple[ResponseClass, ...] = ()
    is_retryable: bool = False
    timeout: float | None = None  # seconds; None leaves the proxy's default


@dataclass(frozen=True, slots=True)
class RetryBudget:
    retry_ratio: float
    min_retries_per_second: int
    ttl: float  # seconds


@dataclass(frozen=True, slots=True)
class WeightedDst:
    authority: str
    weight: Quantity


@dataclass(frozen=True, slots=True)
class ServiceProfileSpec:
    routes: tuple[ProfileRoute, ...] = ()
    retry_budget: RetryBudget | None = None
    dst_overrides: tuple[WeightedDst, ...] = ()


def parse_service_profile(doc: Fields, meta: ObjectMeta) -> tuple[ServiceProfileSpec, None]:
    spec = doc.child("spec")
    # v1alpha1's schema requires routes; v1alpha2 made them optional.
    routes_required = doc.string("apiVersion").endswith("/v1alpha1")
    budget = spec.child("retryBudget", None)
    return (
        ServiceProfileSpec(
            routes=tuple(_route(node) for node in spec.children("routes", required=routes_required)),
            retry_budget=None
            if budget is None
            else RetryBudget(
                retry_ratio=budget.number("retryRatio", minimum=0),
                min_retries_per_second=budget.integer("minRetriesPerSecond", minimum=0),
                ttl=budget.duration("ttl"),
            ),
            dst_overrides=tuple(_weighted_dst(node) for node in spec.children("dstOverrides")),
        ),
        None,
    )


def _route(node: Fields) -> ProfileRoute:
    return ProfileRoute(
        name=node.string("name", check=formats.non_empty),
        condition=_request_match(node.child("condition")),
        response_classes=tuple(
            ResponseClass(condition=_response_match(rc.child("condition")), is_failure=rc.boolean("isFailure", False))
            for rc in node.children("responseClasses")
        ),
        is_retryable=node.boolean("isRetryable", False),
        timeout=node.duration("timeout", None),
    )


def _request_match(node: Fields) -> RequestMatch:
    match = RequestMatch(
        all=_sequence(node, "all", _request_match),
        any=_sequence(node, "any", _request_match),
        not_=_request_match(node.child("not")) if node.has("not") else None,
        # Go reads an empty string as unset.
        method=node.string("method", None) or None,
        path_regex=node.string("pathRegex", None) or None,
    )
    if match == RequestMatch():
        raise node.error(None, "must set at least one of all, any, not, method, pathRegex")
    return match


def _response_match(node: Fields) -> ResponseMatch:
    match = ResponseMatch(
        all=_sequence(node, "all", _response_match),
        any=_sequence(node, "any", _response_match),
        not_=_response_match(node.child("not")) if node.has("not") else None,
        status=_status_range(node.child("status")) if node.has("status") else None,
    )
    if match == ResponseMatch():
        raise node.error(None, "must set at least one of all, any, not, status")
    return match


def _sequence(node: Fields, key: str, parse_one: Callable[[Fields], M]) -> tuple[M, ...] | None:
    if not node.has(key):
        return None
    return tuple(parse_one(child) for child in node.children(key))


def _status_range(node: Fields) -> StatusRange:
    # Linkerd stores bounds as integers where 0 means unset.
    low = node.integer("min", 0) or None
    high = node.integer("max", 0) or None
    for key, bound in (("min", low), ("max", high)):
        if bound is not None and not MIN_STATUS <= bound <= MAX_STATUS:
            raise node.error(key, f"must be between {MIN_STATUS} and {MAX_STATUS}")
    if low is not None and high is not None and high < low:
        raise node.error("max", "must not be less than min")
    return StatusRange(low, high)


def _weighted_dst(node: Fields) -> WeightedDst:
    return WeightedDst(authority=node.string("authority", check=formats.non_empty), weight=node.quantity("weight"))
