"""Failure accrual on one endpoint: Linkerd's consecutive-failures and unified breakers (proxy.md §7.4).

A ``Breaker`` is **open** (the endpoint takes requests) until ``max_failures``
responses in a row are failures -- or, with a ``success_rate`` (the unified
breaker), until the share of successes among the answers of the last
``window`` seconds (ten buckets) falls below it once ``min_requests`` answers
are in; there, and for probes, a 429 or ``RESOURCE_EXHAUSTED`` is a failure
too. Then it is **shut** for a backoff (``core.config.Backoff``, Linkerd's
exponential backoff as for reconnects: the minimum, doubled on each shutting
in a row, capped at the maximum, plus up to ``jitter`` of itself at random,
never past the maximum). When the backoff has passed it admits
exactly **one** probe request (**probation**): a success opens it again and
forgets the backoff, a failure shuts it for the next, longer backoff.
Responses that arrive while it is shut are ignored (they were sent before).

The balancer (``core.balancer``) skips endpoints whose breaker does not admit
a request, so a failing endpoint is taken out and tried again; with every
endpoint shut, the balancer has nothing to offer and requests fail fast
(504), as in Linkerd.

Pure: the caller passes the time and the random draw.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import timedelta

from tether.proxy.core.client_policy import Accrual
from tether.proxy.core.config import Backoff


# gRPC codes that are failures (Linkerd's classify.rs): UNKNOWN, DEADLINE_EXCEEDED, PERMISSION_DENIED, INTERNAL,
# UNAVAILABLE, DATA_LOSS.
GRPC_FAILURES = frozenset({2, 4, 7, 13, 14, 15})


GRPC_RESOURCE_EXHAUSTED = 8
BUCKETS = 10  # of the success-rate window


def failed(status: int, grpc_status: int | None) -> bool:
    """Linkerd's classification of an attempt for failure accrual: no response (0), a 5xx, or a gRPC
    failure code."""
    if grpc_status is not None:
        return grpc_status in GRPC_FAILURES
    return status == 0 or status >= 500


def shed(status: int, grpc_status: int | None) -> bool:
    """An overloaded endpoint's answer (429, ``RESOURCE_EXHAUSTED``): a failure for the success rate and probes."""
    return grpc_status == GRPC_RESOURCE_EXHAUSTED if grpc_status is not None else status == 429


class State(enum.Enum):
    OPEN = "open"
    SHUT = "shut"
    PROBATION = "probation"


class Breaker:
    __slots__ = ("config", "state", "failures", "shut_count", "until", "probing", "_draw", "_buckets", "_kept")

    def __init__(self, config: Accrual, draw: Callable[[], float],
                 kept: Callable[[], bool] | None = None) -> None:
        self.config = config
        # Whether the endpoint must stay in although it trips (its balancer is at ``min_ready`` un-ejected).
        self._kept = kept
        self.state = State.OPEN
        self.failures = 0  # consecutive, while open
        self.shut_count = 0  # times shut in a row (the backoff's exponent)
        self.until = 0.0  # shut until then
        self.probing = False  # in probation, the probe is out
        self._draw = draw
        self._buckets: list[list[float]] = []  # [start, successes, answers], oldest first (success rate)

    def admits(self, now: float) -> bool:
        """Whether the endpoint may take a request now (moving a shut breaker past its backoff to probation)."""
        if self.state is State.OPEN:
            return True
        if self.state is State.SHUT:
            if now < self.until:
                return False
            self.state = State.PROBATION
            self.probing = False
        return not self.probing

    def ready(self, now: float) -> bool:
        """Whether ``admits`` would say yes, without moving the state (for metrics)."""
        if self.state is State.OPEN:
            return True
        if self.state is State.SHUT:
            return now >= self.until
        return not self.probing

    def admitted(self) -> None:
        """A request was sent to the endpoint: in probation, it is the probe (no other until it answers)."""
        if self.state is State.PROBATION:
            self.probing = True

    def record(self, success: bool, now: float, overloaded: bool = False) -> None:
        """A response (or a transport error: a failure) from the endpoint; ``overloaded``: a 429 or
        ``RESOURCE_EXHAUSTED`` (a success by count, a failure for the success rate and for a probe)."""
        state = self.state
        if state is State.SHUT:
            return
        if state is State.PROBATION:
            if not self.probing:
                return  # an answer to a request sent before the breaker shut
            if success and not overloaded:
                self._open()
            else:
                self._shut(now)
            return
        config = self.config
        if config.success_rate is not None and self._rate_low(success and not overloaded, now):
            self._trip(now)
            return
        if success:
            self.failures = 0
            return
        self.failures += 1
        if config.max_failures and self.failures >= config.max_failures:
            self._trip(now)

    def _trip(self, now: float) -> None:
        """An open endpoint failed enough to be ejected: shut, unless its balancer must keep it (then it starts
        counting again, as if just back in)."""
        if self._kept is not None and self._kept():
            self.failures = 0
            self._buckets.clear()
            return
        self._shut(now)

    def _rate_low(self, ok: bool, now: float) -> bool:
        """Count the answer in the window; whether the success rate is now under the threshold."""
        config = self.config
        width = config.window / BUCKETS
        buckets = self._buckets
        while buckets and buckets[0][0] <= now - config.window:
            buckets.pop(0)
        if not buckets or now - buckets[-1][0] >= width:
            buckets.append([now, 0.0, 0.0])
        bucket = buckets[-1]
        bucket[1] += ok
        bucket[2] += 1
        answers = sum(b[2] for b in buckets)
        assert config.success_rate is not None
        return answers >= config.min_requests and sum(b[1] for b in buckets) / answers < config.success_rate

    def backoff(self) -> float:
        """The backoff of the next shutting (the first is the minimum's)."""
        c = self.config
        backoff = Backoff(timedelta(seconds=c.min_backoff), timedelta(seconds=c.max_backoff), c.jitter)
        return backoff.delay(self.shut_count + 1, self._draw())

    def _open(self) -> None:
        self.state = State.OPEN
        self.failures = 0
        self.shut_count = 0
        self.probing = False

    def _shut(self, now: float) -> None:
        self.until = now + self.backoff()
        self.shut_count += 1
        self.state = State.SHUT
        self.probing = False
        self.failures = 0
        self._buckets.clear()  # back in, the endpoint starts a new window
