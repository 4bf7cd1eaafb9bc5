"""Endpoint choice per connection: power of two choices on peak-EWMA load (proxy.md §7.3), with failfast.

The load of an endpoint is its peak-EWMA connect latency times (connections in
flight + 1). The estimate starts at ``default_rtt``, jumps to any larger
sample, decays towards smaller samples with weight ``exp(-elapsed/decay)``,
and decays towards zero when read. ``pick`` draws two distinct endpoints at
random and takes the less loaded one (endpoints in connect backoff only when
nothing else is left).

Failure accrual (``configure_accrual``, from the client policy): each
endpoint's ``core.breaker.Breaker`` hears every attempt's outcome
(``outcome``, ``failed``); ``pick`` passes over endpoints it has shut, and
answers None when it has shut them all.

Failfast: once the set has been empty for ``failfast`` seconds, waiting for an
endpoint (``io.discovery.WaitingBalancer.wait``) answers None at once, until an
endpoint appears again. This module is the arithmetic only (pure, no asyncio).

Callers: ``io.discovery`` (updates from ``Destination.Get``), ``core.routes``
and ``core.outbound`` (the choice per request or connection).
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections.abc import Callable, Iterable
from datetime import timedelta

from mypy_extensions import mypyc_attr

from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.core.breaker import Breaker, State, failed, shed
from tether.proxy.core.client_policy import Accrual
from tether.proxy.core.config import Backoff
from tether.proxy.core.endpoint import Endpoint

DEFAULT_RTT = 0.030  # seconds, Linkerd's default_rtt
DECAY = 10.0  # seconds, Linkerd's decay


class Slot:
    """An endpoint in a balancer: its metadata, peak-EWMA latency estimate, connections in flight and backoff.

    The estimate lives in the slot itself and is updated inline (``connected``, ``load``): these run on every
    request, where a separate estimate object cost a call more each time."""

    __slots__ = ("endpoint", "estimate", "stamp", "in_flight", "failures", "retry_at", "breaker", "clock")

    def __init__(self, endpoint: Endpoint, now: float, clock: Callable[[], float]) -> None:
        self.endpoint = endpoint
        self.estimate = DEFAULT_RTT  # seconds
        self.stamp = now  # when the estimate was last decayed
        self.in_flight = 0
        self.failures = 0
        self.retry_at = 0.0
        self.breaker: Breaker | None = None  # failure accrual, when the client policy configures it
        self.clock = clock  # the balancer's

    def load(self, now: float) -> float:
        """The estimate decayed to ``now`` (towards zero) times (in flight + 1)."""
        self.estimate *= math.exp(-max(now - self.stamp, 0.0) / DECAY)
        self.stamp = now
        return self.estimate * (self.in_flight + 1)

    def connected(self, rtt: float) -> None:
        """A latency sample (a connect's, or a request's time to its response head): the estimate jumps to a
        larger one and decays towards a smaller one with weight ``exp(-elapsed/decay)``; the endpoint's connect
        backoff ends. A method of the slot, not of the balancer, so that a request's ``Pick.observe`` is this
        bound method: one call per sample (``core.routes``)."""
        now = self.clock()
        if rtt > self.estimate:
            self.estimate = rtt
        else:
            w = math.exp(-max(now - self.stamp, 0.0) / DECAY)
            self.estimate = self.estimate * w + rtt * (1.0 - w)
        self.stamp = now
        self.failures = 0
        self.retry_at = 0.0


def _two(rand: Callable[[], float], slots: list[Slot]) -> tuple[Slot, Slot]:
    """Two distinct slots drawn uniformly, with the generator's C-level ``random()`` (``random.sample`` costs a
    handful of Python calls per request). Drawing from every slot and narrowing to the ready ones only when a
    drawn one is in backoff picks uniformly among the ready pairs all the same."""
    n = len(slots)
    i = int(rand() * n)
    j = int(rand() * (n - 1))
    return slots[i], slots[j + (j >= i)]


# A connect failure's backoff where the caller gives none: Linkerd's outbound default without its jitter.
RECONNECT_BACKOFF = Backoff(timedelta(milliseconds=100), timedelta(seconds=60), 0.0)


QUEUE_BUCKETS = (0.0005, 0.005, 0.05, 0.5, 1.0, 3.0)  # outbound_*_balancer_queue_latency_seconds


class QueueStats:
    """What ``outbound_*_balancer_queue_*`` report of a balancer (proxy.md §9.5). Linkerd puts a queue in front
    of each balancer; here a request takes its endpoint at once and waits only while there is none
    (``io.discovery.WaitingBalancer.wait``), so: ``requests`` asked for an endpoint (a request or connection
    that waited counts once), ``waiting`` now, the wait of those that waited (the others' is 0), and the
    failfast gate: shut once the balancer has been empty for the failfast timeout, open again when an
    endpoint comes (``shut_at``/``opened_at`` on the balancer's clock)."""

    __slots__ = ("requests", "missed", "waiting", "waited", "shut", "shuts", "opens", "shut_at", "opened_at")

    def __init__(self) -> None:
        self.requests = 0
        self.missed = 0  # requests counted by a pick that found nothing: their wait is not counted again
        self.waiting = 0
        self.waited = [0.0] * (len(QUEUE_BUCKETS) + 3)  # per bucket (+Inf last), then the sum and the count
        self.shut = False
        self.shuts = 0
        self.opens = 0
        self.shut_at: float | None = None
        self.opened_at: float | None = None

    def observe_wait(self, seconds: float) -> None:
        waited = self.waited
        waited[bisect_left(QUEUE_BUCKETS, seconds)] += 1
        waited[-2] += seconds
        waited[-1] += 1

    def latency(self) -> list[float]:
        """The histogram of every request's time in the queue: those that did not wait in the first bucket."""
        hist = list(self.waited)
        at_once = max(self.requests - self.waiting - int(hist[-1]), 0)
        hist[0] += at_once
        hist[-1] += at_once
        return hist


class Full:
    """``Balancer.wait``'s answer when its queue is full (``FULL``, the one instance)."""

    __slots__ = ()


FULL = Full()


# io.discovery.WaitingBalancer adds the waiting for endpoints to it: an interpreted subclass of this class when
# it is compiled (tether.proxy.native).
@mypyc_attr(allow_interpreted_subclasses=True)
class Balancer:
    """The endpoints of one service and the P2C choice among them."""

    def __init__(
        self,
        *,
        failfast: float,
        clock: Callable[[], float],
        rng: random.Random | None = None,
        backoff: Callable[[int], float] = lambda n: RECONNECT_BACKOFF.delay(n, 0.0),
    ) -> None:
        self._failfast = failfast
        self._clock = clock
        self._rng = rng or random.Random()
        self._backoff = backoff
        self._slots: dict[SocketAddr, Slot] = {}
        self._list: list[Slot] = []
        self._empty_since: float | None = clock()
        self.updates = {"Reset": 0, "Add": 0, "Remove": 0}  # balancer_p2c_updates_total{op}
        self.queue = QueueStats()  # balancer_queue_*
        self.accrual: Accrual | None = None  # failure accrual per endpoint (``configure_accrual``)

    # -- updates from discovery -------------------------------------------------------------------------

    def add(self, endpoints: Iterable[Endpoint]) -> None:
        now = self._clock()
        for endpoint in endpoints:
            slot = self._slots.get(endpoint.addr)
            if slot is None:
                self._slots[endpoint.addr] = Slot(endpoint, now, self._clock)
            else:
                slot.endpoint = endpoint  # insert-or-replace: new metadata, same statistics
        self.updates["Add"] += 1
        self._changed_now()

    def remove(self, addrs: Iterable[SocketAddr]) -> None:
        for addr in addrs:
            self._slots.pop(addr, None)
        self.updates["Remove"] += 1
        self._changed_now()

    def reset(self, endpoints: Iterable[Endpoint] = ()) -> None:
        """Replace the whole set (``no_endpoints``, or the first message of a new stream)."""
        old = self._slots
        self._slots = {}
        now = self._clock()
        for endpoint in endpoints:
            slot = old.get(endpoint.addr) or Slot(endpoint, now, self._clock)
            slot.endpoint = endpoint
            self._slots[endpoint.addr] = slot
        self.updates["Reset"] += 1
        self._changed_now()

    def _changed_now(self) -> None:
        self.gate()
        self._list = list(self._slots.values())
        if self._list:
            self._empty_since = None
            queue = self.queue
            if queue.shut:
                queue.shut = False
                queue.opens += 1
                queue.opened_at = self._clock()
        elif self._empty_since is None:
            self._empty_since = self._clock()
        self.notify()

    def gate(self, failfast: float | None = None) -> QueueStats:
        """The queue's figures, the failfast gate brought up to date: shut at the moment the balancer had been
        empty for the failfast timeout (``failfast``: that of the family reporting it, else the balancer's)."""
        queue = self.queue
        empty_since = self._empty_since
        if failfast is None:
            failfast = self._failfast
        if empty_since is not None and not queue.shut and self._clock() - empty_since >= failfast:
            queue.shut = True
            queue.shuts += 1
            queue.shut_at = empty_since + failfast
        return queue

    def notify(self) -> None:
        """Called after every update from discovery; ``io.discovery.WaitingBalancer`` wakes its waiters."""

    def failfast_left(self, failfast: float) -> float | None:
        """Seconds until an empty set goes into failfast after ``failfast`` seconds (0 or less: it is); None while
        there are endpoints."""
        if self._empty_since is None:
            return None
        return self._empty_since + failfast - self._clock()

    # -- choice ---------------------------------------------------------------------------------------------

    @property
    def endpoints(self) -> list[Endpoint]:
        return [slot.endpoint for slot in self._list]

    @property
    def has_endpoints(self) -> bool:
        return bool(self._list)

    def pick(self, count: bool = True) -> Slot | None:
        """P2C among the endpoints not in backoff (all of them if every one is); None if there are none, or
        if failure accrual has shut every one (the caller waits, then fails fast). ``count``: a request asking
        (the queue's figures), not a waiting one asking again."""
        if count:
            self.queue.requests += 1
        slots = self._list
        if not slots:
            if count:
                self.queue.missed += 1
            return None
        now = self._clock()
        if self.accrual is not None:
            # An open breaker (the usual state) admits with no call to ``Breaker.admits``: one call fewer per
            # endpoint per request; only shut and probing ones are asked.
            slots = [s for s in slots if s.breaker is None or s.breaker.state is State.OPEN or s.breaker.admits(now)]
            if not slots:
                if count:
                    self.queue.missed += 1
                return None
        chosen = slots[0]  # one endpoint is the one, in backoff or not
        if len(slots) > 1:
            a, b = _two(self._rng.random, slots)
            if a.retry_at > now or b.retry_at > now:  # P2C among the endpoints not in backoff, if any
                ready = [s for s in slots if s.retry_at <= now] or slots
                a, b = _two(self._rng.random, ready) if len(ready) > 1 else (ready[0], ready[0])
            chosen = a if a.load(now) <= b.load(now) else b
        if chosen.breaker is not None and chosen.breaker.state is not State.OPEN:  # admitted() does nothing when open
            chosen.breaker.admitted()
        return chosen

    async def wait(self, timeout: float, capacity: int | None = None) -> Slot | Full | None:
        """An endpoint, waiting for one until the set has been empty for ``timeout`` (the waiter's failfast);
        ``FULL`` at once when ``capacity`` others wait already (``core.balancer_queue``). Waiting is I/O: the
        balancers discovery makes are ``io.discovery.WaitingBalancer``s, which implement it."""
        raise NotImplementedError("waiting for endpoints needs io.discovery.WaitingBalancer")

    def in_failfast(self) -> bool:
        return self._empty_since is not None and self._clock() - self._empty_since >= self._failfast

    # -- results of connecting -----------------------------------------------------------------------------

    def connected(self, slot: Slot, rtt: float) -> None:
        """A connect's latency (``core.outbound``'s per-connection choice): ``Slot.connected``."""
        slot.connected(rtt)

    def failed(self, slot: Slot) -> None:
        slot.failures += 1
        slot.retry_at = self._clock() + self._backoff(slot.failures)
        self.outcome(slot, 0)

    def endpoint_states(self) -> tuple[int, int]:
        """(ready, pending) endpoints, for ``outbound_http_balancer_endpoints``: pending ones are in connect
        backoff or shut by their breaker. Reading changes nothing."""
        now = self._clock()
        ready = sum(1 for s in self._list if s.retry_at <= now and (s.breaker is None or s.breaker.ready(now)))
        return ready, len(self._list) - ready

    # -- failure accrual (proxy.md §7.4) ---------------------------------------------------------------------

    def configure_accrual(self, accrual: Accrual | None) -> None:
        """Each endpoint gets a breaker (``core.breaker``) from now on; None: no failure accrual."""
        if accrual == self.accrual:
            return
        self.accrual = accrual
        for slot in self._slots.values():
            slot.breaker = None

    def _at_minimum(self) -> bool:
        """Whether ejecting one more endpoint would leave fewer than ``min_ready`` in (``ejection``)."""
        accrual = self.accrual
        assert accrual is not None
        ready = sum(1 for s in self._slots.values() if s.breaker is None or s.breaker.state is State.OPEN)
        return ready <= accrual.min_ready

    def outcome(self, slot: Slot, status: int, grpc_status: int | None = None) -> None:
        """An attempt on ``slot``'s endpoint ended with ``status`` (0: no response; ``grpc_status`` for gRPC),
        for its breaker: classified as Linkerd classifies it (``breaker.failed``, ``breaker.shed``)."""
        accrual = self.accrual
        if accrual is None:
            return
        breaker = slot.breaker
        if breaker is None:
            breaker = slot.breaker = Breaker(accrual, self._rng.random, self._at_minimum if accrual.min_ready else None)
        breaker.record(not failed(status, grpc_status), self._clock(), shed(status, grpc_status))
