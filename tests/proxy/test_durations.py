"""tether.proxy.core.durations: Linkerd's duration syntax (proxy.md §2.1)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.proxy.core.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),  # seconds as floats: every case here is exact in binary
    [
        ("0", 0.0),
        ("000", 0.0),
        (" 0 ", 0.0),
        ("0ms", 0.0),
        ("100ms", 0.1),
        ("300ms", 0.3),
        ("10000ms", 10.0),
        ("10s", 10.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("365d", 365 * 86400.0),
        ("\t3s\n", 3.0),
        ("24h", 86400.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not a duration"),
        ("10", "has no unit"),
        ("1.5s", "not a duration"),
        ("10 s", "not a duration"),
        ("-1s", "not a duration"),
        ("+1s", "not a duration"),
        ("10us", "not a duration"),
        ("10sec", "not a duration"),
        ("1m30s", "not a duration"),
        ("10S", "not a duration"),
        ("ms", "not a duration"),
        ("１０s", "not a duration"),  # full-width digits
        ("18446744073709551616s", "too large"),
        ("86400000000d", "too large"),  # beyond what a timedelta holds
        ("9" * 5000 + "s", "too large"),
    ],
)
def test_parse_duration_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


units = st.sampled_from(
    [("ms", timedelta(milliseconds=1)), ("s", timedelta(seconds=1)), ("m", timedelta(minutes=1)),
     ("h", timedelta(hours=1)), ("d", timedelta(days=1))]
)


@given(st.integers(0, 10**8), units)
def test_magnitude_times_unit(n: int, unit: tuple[str, timedelta]) -> None:
    suffix, scale = unit
    assert parse_duration(f"{n}{suffix}") == n * scale


@given(st.text(max_size=30))
def test_never_raises_anything_but_value_error(text: str) -> None:
    try:
        assert parse_duration(text) >= timedelta(0)
    except ValueError:
        pass
