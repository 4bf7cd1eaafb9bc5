"""A client's own retry and timeout settings in ``l5d-*`` request headers, on routes that allow them
(``allow_l5d_request_headers``, the policy controller's ``--allow-l5d-request-headers``; proxy.md §7.5, §7.6).

- ``l5d-retry-http``: statuses to retry, comma-separated: ``5xx``,
  ``gateway-error`` (502-504), a code, or a ``low-high`` range;
- ``l5d-retry-grpc``: ``cancelled``, ``deadline-exceeded``,
  ``resource-exhausted``, ``internal``, ``unavailable``;
- ``l5d-retry-limit``: retries per request; ``l5d-retry-timeout``: per attempt;
- ``l5d-timeout`` / ``l5d-request-timeout``: the request's timeout;
  ``l5d-response-timeout``: the response's.

They override the rule's settings (a retry policy made from the headers alone
starts from Linkerd's defaults: one retry, 64 KiB of body, 25-250 ms backoff)
and are removed before the request goes on. A value that does not parse is
ignored, as linkerd2-proxy ignores it. On a route that does not allow them,
they pass through untouched.

Durations use the proxy's grammar (``core.durations``). Pure. Callers:
``core.policy_routes``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tether.proxy.codec.http1 import Headers, RequestHead
from tether.proxy.core.client_policy import Retry, Timeouts
from tether.proxy.core.durations import parse_duration

RETRY_HTTP = b"l5d-retry-http"
RETRY_GRPC = b"l5d-retry-grpc"
RETRY_LIMIT = b"l5d-retry-limit"
RETRY_TIMEOUT = b"l5d-retry-timeout"
TIMEOUT = b"l5d-timeout"
REQUEST_TIMEOUT = b"l5d-request-timeout"
RESPONSE_TIMEOUT = b"l5d-response-timeout"
NAMES = frozenset({RETRY_HTTP, RETRY_GRPC, RETRY_LIMIT, RETRY_TIMEOUT, TIMEOUT, REQUEST_TIMEOUT, RESPONSE_TIMEOUT})

DEFAULT_RETRY = Retry(limit=1, max_request_bytes=64 * 1024, backoff=(0.025, 0.25))
_GRPC_CODES = {"cancelled": 1, "deadline-exceeded": 4, "resource-exhausted": 8, "internal": 13, "unavailable": 14}


@dataclass(frozen=True, slots=True)
class Overrides:
    retry: Retry | None
    timeouts: Timeouts


def overrides(request: RequestHead, retry: Retry | None, timeouts: Timeouts) -> Overrides | None:
    """The rule's ``retry`` and ``timeouts`` as the request's headers change them; None when it has none."""
    values: dict[bytes, str] = {}
    for name, value in request.headers:
        low = name.lower()
        if low in NAMES:
            values[low] = value.decode("latin-1").strip()
    if not values:
        return None
    if values.keys() & {RETRY_HTTP, RETRY_GRPC, RETRY_LIMIT, RETRY_TIMEOUT}:
        retry = retry or DEFAULT_RETRY
        statuses = _statuses(values.get(RETRY_HTTP))
        if statuses is not None:
            retry = replace(retry, statuses=statuses)
        codes = _codes(values.get(RETRY_GRPC))
        if codes is not None:
            retry = replace(retry, grpc_codes=codes)
        limit = values.get(RETRY_LIMIT, "")
        if limit.isdigit() and len(limit) < 10:
            retry = replace(retry, limit=int(limit))
        attempt = _seconds(values.get(RETRY_TIMEOUT))
        if attempt is not None:
            retry = replace(retry, timeout=attempt or None)
    request_timeout = _seconds(values.get(TIMEOUT) or values.get(REQUEST_TIMEOUT))
    if request_timeout is not None:
        timeouts = replace(timeouts, request=request_timeout or None)
    response_timeout = _seconds(values.get(RESPONSE_TIMEOUT))
    if response_timeout is not None:
        timeouts = replace(timeouts, response=response_timeout or None)
    return Overrides(retry, timeouts)


def strip(headers: Headers) -> Headers:
    """The headers without the ``l5d-*`` settings (consumed by this proxy)."""
    return tuple((n, v) for n, v in headers if n.lower() not in NAMES)


def _statuses(text: str | None) -> tuple[tuple[int, int], ...] | None:
    if text is None:
        return None
    out = []
    for part in (p.strip().lower() for p in text.split(",")):
        if part == "5xx":
            out.append((500, 599))
        elif part == "gateway-error":
            out.append((502, 504))
        else:
            low, sep, high = part.partition("-")
            if not low.isdigit() or len(low) != 3 or sep and (not high.isdigit() or len(high) != 3):
                return None
            lo, hi = int(low), int(high) if sep else int(low)
            if not 100 <= lo <= hi <= 599:
                return None
            out.append((lo, hi))
    return tuple(out)


def _codes(text: str | None) -> frozenset[int] | None:
    if text is None:
        return None
    codes = [_GRPC_CODES.get(p.strip().lower()) for p in text.split(",")]
    if any(c is None for c in codes):
        return None
    return frozenset(c for c in codes if c is not None)


def _seconds(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text).total_seconds()
    except ValueError:
        return None
