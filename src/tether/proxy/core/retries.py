"""The ServiceProfile retry budget: Finagle's (and tower's) ``TpsBudget`` (proxy.md §7.5).

Every request on a retryable route that ends without a retry deposits into
the budget; every retry withdraws from it. A retry is allowed while the
balance -- a fixed reserve plus what was deposited minus what was withdrawn
within the last ``ttl`` -- covers one withdrawal:

- ``retry_ratio`` r: retries allowed per request. Tokens are integers, so a
  deposit is 1 and a withdrawal ``1/r`` (r <= 1), or a deposit 1000 and a
  withdrawal ``1000/r`` (r > 1: several retries per request); r = 0 deposits
  nothing, leaving only the reserve.
- ``min_retries_per_second`` m: the reserve, ``m * ttl`` withdrawals, always
  there, so a client sending little traffic can still retry.
- ``ttl``: deposits and withdrawals count for ``ttl`` seconds, in ten
  windows of ``ttl/10`` (the current one and the nine before it); older ones
  expire a window at a time.

So under a storm (every response a failure) retries stay at ``m*ttl + r*requests``
per ``ttl``: the budget, not the failure rate, bounds the extra load.

The token arithmetic follows tower's ``retry::budget::TpsBudget`` exactly (the
``retry_ratio`` arrives as a protobuf float32, and ``1/r`` is truncated the way
Rust truncates an ``f32``). The window rotation keeps Finagle's intent rather
than tower's code: tower advances two slots whenever a little more than one
window has passed (nearly always, on a real clock), which halves the memory
to about ``ttl/2`` and leaves a stale slot counted; here exactly the windows
that passed are cleared, so what is counted is the last ``ttl``.

``settle`` is the decision after each attempt of a request on a profile
route, the one both HTTP layers (``core.http1_proxy``, ``core.http2_proxy``) take.

Pure: the clock is injected. Callers: ``core.profile_translation`` (one
budget per profile update, shared by its retryable routes) and the HTTP layers.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any, Protocol

WINDOWS = 10
MAX_RETRIES_PER_SECOND = 2**31 - 1


def _f32(value: float) -> float:
    """``value`` rounded to an IEEE float32, as the proxy's Rust arithmetic sees it."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


class RetryBudget:
    """A token bucket over a sliding ``ttl`` window; ``withdraw`` says whether one more retry may go."""

    __slots__ = ("ttl", "min_per_second", "ratio", "deposit_amount", "withdraw_amount", "reserve", "_slots",
                 "_writer", "_index", "_stamp", "_window", "_clock")

    def __init__(self, *, ttl: float, min_per_second: int, ratio: float, clock: Callable[[], float]) -> None:
        # Linkerd refuses (drops the budget of) a profile outside these bounds; the translation checks them first.
        if not 1.0 <= ttl <= 60.0:
            raise ValueError(f"retry budget ttl {ttl}s is outside 1s..60s")
        if not 0.0 <= ratio <= 1000.0:
            raise ValueError(f"retry budget ratio {ratio} is outside 0..1000")
        if not 0 <= min_per_second < MAX_RETRIES_PER_SECOND:
            raise ValueError(f"retry budget min_retries_per_second {min_per_second} is out of range")
        self.ttl = ttl
        self.min_per_second = min_per_second
        self.ratio = ratio
        ratio32 = _f32(ratio)
        if ratio32 == 0.0:
            self.deposit_amount, self.withdraw_amount = 0, 1
        elif ratio32 <= 1.0:
            self.deposit_amount, self.withdraw_amount = 1, int(_f32(1.0 / ratio32))
        else:
            self.deposit_amount, self.withdraw_amount = 1000, int(_f32(1000.0 / ratio32))
        self.reserve = min_per_second * int(ttl) * self.withdraw_amount
        self._slots = [0] * WINDOWS
        self._writer = 0  # the current window's net tokens, committed to a slot when the window ends
        self._index = 0
        self._clock = clock
        self._stamp = clock()
        self._window = ttl / WINDOWS

    def deposit(self) -> None:
        """A request finished without a retry: it earns ``retry_ratio`` retries."""
        self._expire()
        self._writer += self.deposit_amount

    def withdraw(self) -> bool:
        """Take one retry if the balance covers it."""
        self._expire()
        if self.balance() >= self.withdraw_amount:
            self._writer -= self.withdraw_amount
            return True
        return False

    def balance(self) -> int:
        return self._writer + sum(self._slots) + self.reserve

    def _expire(self) -> None:
        passed = int((self._clock() - self._stamp) // self._window)
        if passed <= 0:
            return
        slots = self._slots
        slots[self._index] = self._writer  # the window that ended
        self._writer = 0
        index = self._index
        for _ in range(min(passed, WINDOWS)):  # the windows after it, the new current one included, start empty
            index = (index + 1) % WINDOWS
            slots[index] = 0
        self._index = (self._index + passed) % WINDOWS
        self._stamp += passed * self._window


class Budget(Protocol):
    """What ``settle`` asks of a route's retries: a ``RetryBudget`` (a profile's, shared by its routes) or a
    policy rule's per-request limit (``policy_routes.Attempts``)."""

    def deposit(self) -> None: ...

    def withdraw(self) -> bool: ...


class Settled(enum.Enum):
    """What follows an attempt of a request on a profile route."""

    FINAL = "final"  # this attempt's answer is the request's
    RETRY = "retry"  # the budget allowed another attempt (a new pick)
    EXPIRED = "expired"  # the route's timeout has passed: the request ends with the timeout error


def settle(budget: Budget | None, retryable: bool, expired: bool, routes: Any, labels: str, status: int,
           grpc_status: int | None = None) -> Settled:
    """After an attempt: ``retryable`` when it failed (by the route's classes) and the request can be sent
    again; ``expired`` when the route's timeout has passed; ``routes``: the route metrics
    (``metrics.RouteMetrics``) or None.

    As Linkerd: without a budget nothing happens; an attempt that is not
    retryable deposits (the request ends without a retry); a retryable one
    withdraws, counted in ``route_retryable_total`` (``skipped="no_budget"``
    when refused: no deposit then), and its response is an actual response.
    """
    if budget is None:
        return Settled.FINAL
    if not retryable:
        budget.deposit()
        return Settled.FINAL
    withdrew = not expired and budget.withdraw()
    if routes is not None:
        if not expired:
            routes.retryable(labels, withdrew)
        if withdrew or expired:
            routes.actual_response(labels, status, False, grpc_status=grpc_status)
    if withdrew:
        return Settled.RETRY
    return Settled.EXPIRED if expired else Settled.FINAL
