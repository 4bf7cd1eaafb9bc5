"""Go duration parsing, case by case against what Go's time.ParseDuration returns."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.resources.durations import parse_duration
from tether.resources.model import parse_duration as reexported


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("+0", 0.0),
        ("-0", 0.0),
        ("300ms", 0.3),
        ("10s", 10.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("-5s", -5.0),
        ("+5s", 5.0),
        ("5.s", 5.0),
        (".5s", 0.5),
        ("1.004s", 1.004),
        ("10ns", 10e-9),
        ("11us", 11e-6),
        ("12\u00b5s", 12e-6),
        ("12\u03bcs", 12e-6),
        ("3h30m", 12600.0),
        ("10.5s4m", 250.5),
        ("1h2m3s4ms5us6ns", 3723.004005006),
        ("0.3333333333333333333h", 1200.0),
        ("9007199254740993ns", 9007199.254740993),
        ("0.100000000000000000000h", 360.0),  # more fraction digits than an int64 holds
    ],
)
def test_parses_like_go(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid duration ''"),
        ("-", "invalid duration '-'"),
        ("3", "missing unit in duration '3'"),
        ("1s3", "missing unit in duration '1s3'"),
        ("10d", "unknown unit 'd' in duration '10d'"),
        ("s", "invalid duration 's'"),
        (".s", "invalid duration '.s'"),
        ("1.2.3s", "missing unit in duration '1.2.3s'"),
        ("1 s", "unknown unit ' s' in duration '1 s'"),
        ("9223372036854775808ns", "invalid duration '9223372036854775808ns': out of range"),
        ("1" * 5000 + "s", f"invalid duration '{'1' * 5000}s': out of range"),
    ],
)
def test_rejects_what_go_rejects(text, message):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value) == message


@settings(deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 59), st.integers(0, 999))
def test_components_add_up(minutes, seconds, millis):
    assert parse_duration(f"{minutes}m{seconds}s{millis}ms") == pytest.approx(minutes * 60 + seconds + millis / 1000)


def test_model_reexports_the_one_parser():
    assert reexported is parse_duration
