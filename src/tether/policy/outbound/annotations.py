"""The outbound annotations on Services, EgressNetworks and routes, read as Linkerd's policy controller reads them.

* ``retry.linkerd.io/http`` (``5xx``, ``gateway-error`` = 502-504, a code, or
  a ``low-high`` range; comma-separated), ``retry.linkerd.io/grpc``
  (``cancelled``, ``deadline-exceeded``, ``resource-exhausted``, ``internal``,
  ``unavailable``), ``retry.linkerd.io/limit`` (default 1, 0 = unset),
  ``retry.linkerd.io/timeout`` (per attempt, 0 = unset);
* ``timeout.linkerd.io/request``, ``/response``, ``/idle``;
* ``balancer.linkerd.io/failure-accrual`` (``consecutive`` or ``unified``) with
  ``balancer.linkerd.io/failure-accrual-consecutive-{max-failures,min-penalty,
  max-penalty,jitter-ratio}`` (defaults 7, 1s, 60s, 0.5) and, for ``unified``,
  ``balancer.alpha.linkerd.io/failure-accrual-success-rate-{threshold,window,
  min-requests}`` (defaults 0.8, 10s, 5) and
  ``balancer.alpha.linkerd.io/failure-accrual-honor-retry-after``;
* ``balancer.alpha.linkerd.io/penalize-failures`` with ``load-biaser-penalty``
  (5s) and ``load-biaser-max-retry-after`` (300s).

Durations are Linkerd's annotation grammar, not Go's: a whole number and one
unit of ms, s, m, h or d (``0`` alone is allowed); fractions are refused.  Each
group is read on its own: a bad value raises ``AnnotationError`` naming the
annotation, and the caller (``facts``) drops that group only, logs it and
counts it, as Linkerd does.  Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

RETRY_HTTP = "retry.linkerd.io/http"
RETRY_GRPC = "retry.linkerd.io/grpc"
RETRY_LIMIT = "retry.linkerd.io/limit"
RETRY_TIMEOUT = "retry.linkerd.io/timeout"
TIMEOUT_REQUEST = "timeout.linkerd.io/request"
TIMEOUT_RESPONSE = "timeout.linkerd.io/response"
TIMEOUT_IDLE = "timeout.linkerd.io/idle"
ACCRUAL = "balancer.linkerd.io/failure-accrual"
_CONSECUTIVE = "balancer.linkerd.io/failure-accrual-consecutive-"
_SUCCESS_RATE = "balancer.alpha.linkerd.io/failure-accrual-success-rate-"
HONOR_RETRY_AFTER = "balancer.alpha.linkerd.io/failure-accrual-honor-retry-after"
PENALIZE_FAILURES = "balancer.alpha.linkerd.io/penalize-failures"
LOAD_BIASER_PENALTY = "balancer.alpha.linkerd.io/load-biaser-penalty"
LOAD_BIASER_MAX_RETRY_AFTER = "balancer.alpha.linkerd.io/load-biaser-max-retry-after"

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
GRPC_RETRY_CONDITIONS = ("cancelled", "deadline-exceeded", "resource-exhausted", "internal", "unavailable")
_MAX_U32 = 2**32 - 1


class AnnotationError(ValueError):
    """An annotation's value cannot be read; ``key`` names the annotation."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"annotation {key}: {message}")
        self.key = key


def parse_duration(text: str) -> float:
    """Seconds in ``<whole number><ms|s|m|h|d>`` (or ``0``); ValueError otherwise."""
    value = text.strip()
    if value.startswith("-"):
        raise ValueError(f"duration cannot be negative: {value!r}")
    digits = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(digits):]
    if "." in digits:
        raise ValueError(f"fractional values are not supported: {value!r}")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 15:
        raise ValueError(f"{value!r} is not a duration such as 500ms or 10s")
    magnitude = int(digits)
    if not unit:
        if magnitude == 0:
            return 0.0
        raise ValueError(f"missing duration unit; did you mean '{magnitude}s' or '{magnitude}ms'?")
    if unit not in _UNITS_MS:
        raise ValueError(f"invalid duration unit {unit!r} (expected one of ms, s, m, h, d)")
    return magnitude * _UNITS_MS[unit] / 1000


def _duration(annotations: Mapping[str, str], key: str, default: float | None = None) -> float | None:
    text = annotations.get(key)
    if text is None:
        return default
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise AnnotationError(key, str(exc)) from None


def _integer(annotations: Mapping[str, str], key: str, default: int, maximum: int) -> int:
    text = annotations.get(key)
    if text is None:
        return default
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or int(value) > maximum:
        raise AnnotationError(key, f"{text!r} is not a whole number from 0 to {maximum}")
    return int(value)


def _number(annotations: Mapping[str, str], key: str, default: float) -> float:
    text = annotations.get(key)
    if text is None:
        return default
    try:
        return float(text.strip())
    except ValueError:
        raise AnnotationError(key, f"{text!r} is not a number") from None


def _boolean(annotations: Mapping[str, str], key: str) -> bool:
    # Go's strconv.ParseBool tokens, as Linkerd accepts them.
    text = annotations.get(key)
    if text is None or text.strip() in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    if text.strip() in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    raise AnnotationError(key, f"{text!r} is not a boolean such as true or false")


# -- timeouts ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds; None when unset."""

    request: float | None = None
    response: float | None = None
    idle: float | None = None


def parse_timeouts(annotations: Mapping[str, str]) -> Timeouts:
    return Timeouts(
        request=_duration(annotations, TIMEOUT_REQUEST),
        response=_duration(annotations, TIMEOUT_RESPONSE),
        idle=_duration(annotations, TIMEOUT_IDLE),
    )


# -- retries -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Retry:
    """``conditions`` None: the annotation is absent (the proxy's defaults apply); else status ranges or gRPC names."""

    limit: int = 1
    timeout: float | None = None
    conditions: tuple[tuple[int, int], ...] | tuple[str, ...] | None = None


def _retry_common(annotations: Mapping[str, str]) -> tuple[int | None, float | None]:
    limit = _integer(annotations, RETRY_LIMIT, 0, 65535) or None
    timeout = _duration(annotations, RETRY_TIMEOUT) or None
    return limit, timeout


def _status_code(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and 100 <= int(text) < 600 else None


def _http_condition(item: str) -> tuple[int, int] | None:
    if item.lower() == "5xx":
        return 500, 599
    if item.lower() == "gateway-error":
        return 502, 504
    code = _status_code(item)
    if code is not None:
        return code, code
    low, sep, high = item.partition("-")
    start, end = _status_code(low), _status_code(high)
    if sep and start is not None and end is not None and start <= end:
        return start, end
    return None


def parse_http_retry(annotations: Mapping[str, str]) -> Retry | None:
    limit, timeout = _retry_common(annotations)
    conditions: tuple[tuple[int, int], ...] | None = None
    text = annotations.get(RETRY_HTTP)
    if text is not None:
        ranges = []
        for item in text.split(","):
            condition = _http_condition(item.strip())
            if condition is None:
                raise AnnotationError(RETRY_HTTP, f"invalid retry condition {item.strip()!r} "
                                                  "(expected 5xx, gateway-error, a status code or a range)")
            ranges.append(condition)
        conditions = tuple(ranges)
    if limit is None and timeout is None and conditions is None:
        return None
    return Retry(limit=limit or 1, timeout=timeout, conditions=conditions)


def parse_grpc_retry(annotations: Mapping[str, str]) -> Retry | None:
    limit, timeout = _retry_common(annotations)
    conditions: tuple[str, ...] | None = None
    text = annotations.get(RETRY_GRPC)
    if text is not None:
        names = []
        for item in text.split(","):
            name = item.strip().lower()
            if name not in GRPC_RETRY_CONDITIONS:
                raise AnnotationError(RETRY_GRPC, f"invalid retry condition {item.strip()!r} "
                                                  f"(expected one of {', '.join(GRPC_RETRY_CONDITIONS)})")
            names.append(name)
        conditions = tuple(names)
    if limit is None and timeout is None and conditions is None:
        return None
    return Retry(limit=limit or 1, timeout=timeout, conditions=conditions)


# -- failure accrual and load biasing ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backoff:
    min_penalty: float = 1.0
    max_penalty: float = 60.0
    jitter: float = 0.5


@dataclass(frozen=True, slots=True)
class SuccessRate:
    threshold: float = 0.8
    window: float = 10.0
    min_requests: int = 5


@dataclass(frozen=True, slots=True)
class FailureAccrual:
    """``success_rate`` None: ``consecutive`` mode; set: ``unified``."""

    max_failures: int = 7
    backoff: Backoff = Backoff()
    success_rate: SuccessRate | None = None
    honor_retry_after: bool = False


def _consecutive(annotations: Mapping[str, str]) -> tuple[int, Backoff]:
    max_failures = _integer(annotations, _CONSECUTIVE + "max-failures", 7, _MAX_U32)
    max_penalty = _duration(annotations, _CONSECUTIVE + "max-penalty", 60.0)
    min_penalty = _duration(annotations, _CONSECUTIVE + "min-penalty", 1.0)
    jitter = _number(annotations, _CONSECUTIVE + "jitter-ratio", 0.5)
    assert max_penalty is not None and min_penalty is not None
    if min_penalty > max_penalty:
        raise AnnotationError(_CONSECUTIVE + "min-penalty", f"{min_penalty}s exceeds max-penalty {max_penalty}s")
    if max_penalty <= 0:
        raise AnnotationError(_CONSECUTIVE + "max-penalty", "cannot be zero")
    if not 0.0 <= jitter <= 100.0:
        raise AnnotationError(_CONSECUTIVE + "jitter-ratio", f"{jitter} is outside 0-100")
    return max_failures, Backoff(min_penalty, max_penalty, jitter)


def _success_rate(annotations: Mapping[str, str]) -> SuccessRate:
    threshold = _number(annotations, _SUCCESS_RATE + "threshold", 0.8)
    if not 0.0 <= threshold <= 1.0:
        raise AnnotationError(_SUCCESS_RATE + "threshold", f"{threshold} is outside 0.0-1.0")
    window = _duration(annotations, _SUCCESS_RATE + "window", 10.0)
    assert window is not None
    if window <= 0:
        raise AnnotationError(_SUCCESS_RATE + "window", "must be greater than zero")
    min_requests = _integer(annotations, _SUCCESS_RATE + "min-requests", 5, _MAX_U32)
    # The proxy refuses (and so drops the whole policy) a window under 10ms or more than 1,000,000
    # minimum requests while the success-rate rule is on.
    if threshold != 0.0 and window < 0.010:
        raise AnnotationError(_SUCCESS_RATE + "window", "must be at least 10ms")
    if threshold != 0.0 and min_requests > 1_000_000:
        raise AnnotationError(_SUCCESS_RATE + "min-requests", "cannot exceed 1000000")
    return SuccessRate(threshold, window, min_requests)


def parse_failure_accrual(annotations: Mapping[str, str]) -> FailureAccrual | None:
    mode = annotations.get(ACCRUAL)
    honor = _boolean(annotations, HONOR_RETRY_AFTER)
    if mode is None:
        return None
    if mode == "consecutive":
        max_failures, backoff = _consecutive(annotations)
        return FailureAccrual(max_failures, backoff)
    if mode == "unified":
        max_failures, backoff = _consecutive(annotations)
        return FailureAccrual(max_failures, backoff, _success_rate(annotations), honor_retry_after=honor)
    raise AnnotationError(ACCRUAL, f"unsupported failure accrual mode {mode!r} (expected consecutive or unified)")


@dataclass(frozen=True, slots=True)
class LoadBiaser:
    penalty: float = 5.0
    max_retry_after: float = 300.0


def parse_load_biaser(annotations: Mapping[str, str]) -> LoadBiaser | None:
    if not _boolean(annotations, PENALIZE_FAILURES):
        return None
    penalty = _duration(annotations, LOAD_BIASER_PENALTY, 5.0)
    max_retry_after = _duration(annotations, LOAD_BIASER_MAX_RETRY_AFTER, 300.0)
    assert penalty is not None and max_retry_after is not None
    if penalty * 1000 > _MAX_U32:
        raise AnnotationError(LOAD_BIASER_PENALTY, "exceeds the maximum supported value (~49.7 days)")
    return LoadBiaser(penalty, max_retry_after)
