"""The ServiceProfile retry budget (tower's TpsBudget, proxy.md §7.5) under a fake clock."""

from __future__ import annotations

import pytest

from tether.proxy.core.retries import RetryBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def budget(clock: Clock, *, ttl: float = 10.0, min_per_second: int = 0, ratio: float = 0.2) -> RetryBudget:
    return RetryBudget(ttl=ttl, min_per_second=min_per_second, ratio=ratio, clock=clock)


def test_token_amounts_follow_tower() -> None:
    clock = Clock()
    assert (budget(clock, ratio=0.2).deposit_amount, budget(clock, ratio=0.2).withdraw_amount) == (1, 5)
    assert (budget(clock, ratio=1.0).deposit_amount, budget(clock, ratio=1.0).withdraw_amount) == (1, 1)
    assert (budget(clock, ratio=2.0).deposit_amount, budget(clock, ratio=2.0).withdraw_amount) == (1000, 500)
    assert (budget(clock, ratio=0.0).deposit_amount, budget(clock, ratio=0.0).withdraw_amount) == (0, 1)
    # The ratio is a protobuf float32: 0.1 is 0.100000001..., and 1/that rounds back to 10 in f32.
    assert budget(clock, ratio=0.1).withdraw_amount == 10
    # Linkerd's default budget: 10 retries/s over 10 s of reserve.
    default = budget(clock, min_per_second=10, ratio=0.2)
    assert default.reserve == 10 * 10 * 5


def test_empty_budget_allows_nothing() -> None:
    clock = Clock()
    b = budget(clock)
    assert not b.withdraw()


def test_deposits_earn_retries_at_the_ratio() -> None:
    clock = Clock()
    b = budget(clock, ratio=0.2)
    for _ in range(10):
        b.deposit()
    assert b.withdraw()
    assert b.withdraw()
    assert not b.withdraw()  # 10 requests x 0.2 = 2 retries


def test_reserve_is_min_retries_per_second_times_ttl() -> None:
    clock = Clock()
    b = budget(clock, ttl=2.0, min_per_second=3, ratio=0.0)
    assert sum(b.withdraw() for _ in range(100)) == 6


def test_withdrawals_expire_after_the_ttl() -> None:
    clock = Clock()
    b = budget(clock, ttl=1.0, min_per_second=2, ratio=0.0)
    assert [b.withdraw() for _ in range(3)] == [True, True, False]
    clock.now += 0.5  # still inside the window: nothing expired
    assert not b.withdraw()
    clock.now += 0.61  # the withdrawals are older than the ttl now
    assert [b.withdraw() for _ in range(3)] == [True, True, False]


def test_deposits_expire_too() -> None:
    clock = Clock()
    b = budget(clock, ttl=1.0, ratio=1.0)
    for _ in range(5):
        b.deposit()
    clock.now += 1.5
    assert not b.withdraw()


def test_a_long_idle_time_clears_every_window() -> None:
    clock = Clock()
    b = budget(clock, ttl=1.0, ratio=1.0)
    for _ in range(5):
        b.deposit()
    clock.now += 86400.0  # a day: the expiry does not walk 864,000 windows
    assert b.balance() == 5  # not expired until touched...
    assert not b.withdraw()  # ...and then all gone


def test_the_budget_stops_a_retry_storm() -> None:
    """Every response fails and is retryable: retries stay within reserve + ratio x requests per ttl."""
    clock = Clock()
    b = budget(clock, ttl=10.0, min_per_second=1, ratio=0.2)
    requests = retries = 0
    for _ in range(2000):  # 2,000 requests over 10 s, each retried for as long as the budget allows
        requests += 1
        while b.withdraw():
            retries += 1
            if retries > 10_000:
                pytest.fail("unbounded retries")
        # A request whose retry was refused makes no deposit (Linkerd returns before depositing)...
        clock.now += 0.005
    # ...so the storm gets the reserve only: 1/s x 10 s.
    assert retries == 10
    assert requests == 2000


def test_successes_pay_for_a_bounded_share_of_retries() -> None:
    clock = Clock()
    b = budget(clock, ttl=10.0, min_per_second=0, ratio=0.2)
    retries = 0
    for i in range(1000):
        if i % 2:  # every other request fails and asks for one retry
            if b.withdraw():
                retries += 1
            else:
                continue
        b.deposit()  # the request ended without (another) retry
        clock.now += 0.001
    # At most 20% extra load (fewer: a failure the budget refused deposits nothing), never none.
    assert 100 <= retries <= 200


@pytest.mark.parametrize("kwargs", [{"ttl": 0.5}, {"ttl": 61.0}, {"ratio": -0.1}, {"ratio": 1000.5},
                                    {"min_per_second": 2**31}])
def test_out_of_bounds_budgets_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        budget(Clock(), **kwargs)


def test_windows_expire_one_at_a_time() -> None:
    clock = Clock()
    b = budget(clock, ttl=1.0, ratio=1.0)  # windows of 0.1 s
    b.deposit()
    clock.now += 0.55
    b.deposit()
    clock.now += 0.47  # 1.02 s after the first deposit, 0.47 s after the second
    assert b.withdraw()
    assert not b.withdraw()
