"""Failure accrual (core.breaker, core.balancer): the consecutive-failures breaker as a state machine under a fake
clock, and the balancer taking a failing endpoint out and back (proxy.md §7.4). No sockets, no sleeps."""

from __future__ import annotations

import random

from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.core.balancer_queue import Queue
from tether.proxy.core.balancer import Balancer
from tether.proxy.core.breaker import Breaker, State
from tether.proxy.core.client_policy import Accrual
from tether.proxy.core.endpoint import Endpoint

CONFIG = Accrual(max_failures=3, min_backoff=1.0, max_backoff=4.0, jitter=0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_shuts_after_max_consecutive_failures_and_a_success_resets_the_count() -> None:
    b = Breaker(CONFIG, lambda: 0.0)
    for success in (False, False, True, False, False):
        assert b.admits(0.0)
        b.record(success, 0.0)
    assert b.state is State.OPEN  # two in a row since the success
    b.record(False, 0.0)
    assert b.state is State.SHUT and not b.admits(0.5)


def test_after_the_backoff_one_probe_then_open_or_a_longer_backoff() -> None:
    b = Breaker(CONFIG, lambda: 0.0)
    for _ in range(3):
        b.record(False, 10.0)
    assert not b.admits(10.9)
    assert b.admits(11.0) and b.state is State.PROBATION
    b.admitted()  # the probe goes out
    assert not b.admits(11.0)  # exactly one
    b.record(False, 11.2)  # the probe failed: shut for twice as long
    assert b.state is State.SHUT and b.until == 13.2
    assert b.admits(13.2)
    b.admitted()
    b.record(False, 13.3)
    assert b.until == 17.3  # 4 s: the maximum
    assert b.admits(17.3)
    b.admitted()
    b.record(False, 17.3)
    assert b.until == 21.3  # capped
    assert b.admits(21.3)
    b.admitted()
    b.record(True, 21.4)  # the probe succeeded: open, and the backoff starts over
    assert b.state is State.OPEN and b.shut_count == 0
    for _ in range(3):
        b.record(False, 30.0)
    assert b.until == 31.0


def test_answers_while_shut_and_stale_answers_in_probation_are_ignored() -> None:
    b = Breaker(CONFIG, lambda: 0.0)
    for _ in range(3):
        b.record(False, 0.0)
    b.record(True, 0.5)  # sent before it shut
    assert b.state is State.SHUT
    assert b.admits(1.0)
    b.record(True, 1.0)  # not the probe (none sent yet)
    assert b.state is State.PROBATION


def test_jitter_adds_up_to_its_share_of_the_backoff() -> None:
    b = Breaker(Accrual(1, 2.0, 60.0, 0.5), lambda: 1.0)
    b.record(False, 0.0)
    assert b.until == 3.0  # 2 s + 50 % of it


def test_jitter_never_takes_the_backoff_past_its_maximum() -> None:
    # Linkerd's ExponentialBackoff (the same for failure accrual as for reconnects): jitter <= max - base.
    b = Breaker(Accrual(1, 2.0, 2.5, 0.5), lambda: 1.0)
    b.record(False, 0.0)
    assert b.until == 2.5


def endpoint(last: int) -> Endpoint:
    return Endpoint(SocketAddr(parse_ip(f"10.1.0.{last}"), 8080))


def test_the_balancer_takes_a_failing_endpoint_out_and_back() -> None:
    clock = Clock()
    balancer = Balancer(failfast=3.0, clock=clock, rng=random.Random(7))
    balancer.reset([endpoint(1), endpoint(2)])
    balancer.configure_accrual(CONFIG)
    bad = SocketAddr(parse_ip("10.1.0.1"), 8080)

    def send(failing: bool) -> SocketAddr:
        slot = balancer.pick()
        assert slot is not None
        balancer.outcome(slot, 500 if failing and slot.endpoint.addr == bad else 200)
        return slot.endpoint.addr

    seen = [send(True) for _ in range(40)]
    first_out = [i for i in range(len(seen)) if seen[i:].count(bad) == 0][0]
    assert seen[:first_out].count(bad) == 3  # three failures in a row, then out
    assert seen[first_out:] == [SocketAddr(parse_ip("10.1.0.2"), 8080)] * (40 - first_out)
    clock.now = 1.0  # the backoff passed: one probe, which fails: out again
    probes = [send(True) for _ in range(20)].count(bad)
    assert probes == 1
    clock.now = 3.0  # the next backoff (2 s) passed: the endpoint has recovered, the probe succeeds
    back = [send(False) for _ in range(40)]
    assert back.count(bad) > 1  # open again: it takes its share


def test_min_ready_endpoints_keeps_the_last_ones_in() -> None:
    clock = Clock()
    balancer = Balancer(failfast=3.0, clock=clock, rng=random.Random(7))
    balancer.reset([endpoint(1), endpoint(2), endpoint(3)])
    balancer.configure_accrual(Accrual(1, 1.0, 1.0, min_ready=2))  # one failure ejects, but two stay in
    for _ in range(60):  # every endpoint fails every request
        slot = balancer.pick()
        assert slot is not None  # never all out
        balancer.outcome(slot, 500)
    states = sorted(s.breaker.state.value if s.breaker else "open" for s in balancer._slots.values())
    assert states == ["open", "open", "shut"]  # the first to fail went out; the other two are kept in
    balancer.configure_accrual(Accrual(1, 1.0, 1.0))  # no minimum: the next failures eject them too
    for _ in range(60):
        slot = balancer.pick()
        if slot is None:
            break
        balancer.outcome(slot, 500)
    assert balancer.pick() is None


def test_ejection_min_ready_endpoints_reaches_the_breaker() -> None:
    from tether.api import outbound_pb2 as pb
    from tether.proxy.core.client_policy_translation import translate

    message = pb.OutboundPolicy()
    message.metadata.default = "x"
    accrual = message.protocol.http1.failure_accrual
    accrual.consecutive_failures.max_failures = 7
    accrual.ejection.min_ready_endpoints = 2
    policy = translate(message, lambda path: None)
    assert policy.accrual is not None and policy.accrual.min_ready == 2 and policy.unapplied == ()


def test_with_every_endpoint_shut_the_balancer_has_nothing_to_offer() -> None:
    clock = Clock()
    balancer = Balancer(failfast=3.0, clock=clock)
    balancer.reset([endpoint(1)])
    balancer.configure_accrual(Accrual(1, 1.0, 1.0))
    slot = balancer.pick()
    assert slot is not None
    balancer.failed(slot)  # a transport error is a failure too
    assert balancer.pick() is None and balancer.has_endpoints
    clock.now = 1.0
    assert balancer.pick() is slot
    balancer.configure_accrual(None)  # the policy no longer asks for it: every endpoint takes requests
    assert balancer.pick() is slot and balancer.pick() is slot


def test_linkerds_failure_classification() -> None:
    from tether.proxy.core.breaker import failed

    assert failed(500, None) and failed(503, None) and failed(0, None)  # 0: no response at all
    assert not failed(200, None) and not failed(404, None) and not failed(429, None)
    assert failed(200, 14) and failed(200, 2) and failed(200, 4)  # UNAVAILABLE, UNKNOWN, DEADLINE_EXCEEDED
    assert not failed(200, 0) and not failed(200, 5) and not failed(200, 8)  # OK, NOT_FOUND, RESOURCE_EXHAUSTED


RATE = Accrual(max_failures=0, min_backoff=5.0, max_backoff=5.0, success_rate=0.8, window=10.0, min_requests=10)


def test_the_unified_breaker_shuts_on_a_low_success_rate_once_enough_answers_are_in() -> None:
    b = Breaker(RATE, lambda: 0.0)
    for i in range(9):  # 3 failures in 9: under 80 %, but fewer answers than min_requests
        b.record(i % 3 != 0, float(i) * 0.1)
    assert b.state is State.OPEN
    b.record(False, 0.95)  # the tenth answer: 6 of 10 succeeded
    assert b.state is State.SHUT and b.until == 5.95


def test_old_answers_leave_the_window_and_overload_counts_as_failure_for_the_rate_only() -> None:
    b = Breaker(RATE, lambda: 0.0)
    for i in range(5):
        b.record(False, float(i) * 0.01)  # failures long ago...
    for i in range(10):
        b.record(True, 20.0 + i * 0.01)  # ...are out of the window by now
    assert b.state is State.OPEN
    for i in range(3):
        b.record(True, 21.0 + i * 0.01, overloaded=True)  # 429s: 10 of 13 successes: under 80 %
    assert b.state is State.SHUT
    # Counting consecutive failures is off (max_failures 0), and a 429 never counts there.
    counted = Breaker(Accrual(max_failures=2, min_backoff=1.0, max_backoff=1.0), lambda: 0.0)
    for _ in range(5):
        counted.record(True, 0.0, overloaded=True)
    assert counted.state is State.OPEN


def test_a_429_fails_a_probe() -> None:
    b = Breaker(Accrual(max_failures=1, min_backoff=1.0, max_backoff=1.0), lambda: 0.0)
    b.record(False, 0.0)
    assert b.admits(1.0)
    b.admitted()
    b.record(True, 1.0, overloaded=True)
    assert b.state is State.SHUT


def test_the_unified_policy_reaches_the_breaker() -> None:
    from tether.api import outbound_pb2 as pb
    from tether.proxy.core.client_policy_translation import translate

    message = pb.OutboundPolicy()
    message.metadata.default = "x"
    accrual = message.protocol.http1.failure_accrual.unified
    accrual.success_rate_threshold = 0.9
    accrual.min_requests = 20
    accrual.decay.FromSeconds(30)
    accrual.backoff.min_backoff.FromSeconds(1)
    accrual.backoff.max_backoff.FromSeconds(60)
    policy = translate(message, lambda path: None)
    assert policy.accrual == Accrual(0, 1.0, 60.0, 0.0, 0.9, 30.0, 20)


def test_the_routers_picks_report_their_outcomes_to_the_breaker() -> None:
    from tether.proxy.codec.http1 import RequestHead
    from tether.proxy.core.http import Pick
    from tether.proxy.core.resolution import Resolution
    from tether.proxy.core.routes import outbound_router

    balancer = Balancer(failfast=3.0, clock=Clock(), rng=random.Random(7))
    balancer.reset([endpoint(1)])
    balancer.configure_accrual(Accrual(max_failures=2, min_backoff=1.0, max_backoff=1.0))
    route = outbound_router(SocketAddr(parse_ip("10.96.0.1"), 80), Resolution(balancer=balancer, authority="web:80"),
                            local_ips=frozenset(), connect_timeout=1.0, queue=Queue(), loop_addrs=frozenset())
    for _ in range(2):  # two failed attempts in a row shut the only endpoint
        routing = route(RequestHead(b"GET", b"/"))
        try:
            routing.send(None)
        except StopIteration as answered:
            pick = answered.value
        assert isinstance(pick, Pick)
        pick.outcome(503, None, 0.01)
        pick.release()
    assert balancer.pick() is None
