"""Kubernetes quantities, as ServiceProfile dstOverrides weights use them."""

from fractions import Fraction

import pytest

from tether.resources.quantities import parse_quantity


@pytest.mark.parametrize(
    ("raw", "value", "milli"),
    [
        ("1", Fraction(1), 1000),
        (1, Fraction(1), 1000),
        ("500m", Fraction(1, 2), 500),
        ("0.5", Fraction(1, 2), 500),
        (0.25, Fraction(1, 4), 250),
        ("100m", Fraction(1, 10), 100),
        ("1k", Fraction(1000), 1_000_000),
        ("2Ki", Fraction(2048), 2_048_000),
        ("1e3", Fraction(1000), 1_000_000),
        ("1E-3", Fraction(1, 1000), 1),
        ("+.5", Fraction(1, 2), 500),
        ("1n", Fraction(1, 10**9), 1),  # MilliValue rounds up
        ("-1", Fraction(-1), -1000),
    ],
)
def test_values_and_milli_values(raw, value, milli):
    quantity = parse_quantity(raw)
    assert quantity.value == value
    assert quantity.milli_value() == milli
    assert quantity.text == (raw if isinstance(raw, str) else repr(raw))


@pytest.mark.parametrize("raw", ["", "m", "1.2.3", "1 m", "1mi", "1KiB", "ten", "1e", "1e400"])
def test_rejects_malformed_text(raw):
    with pytest.raises(ValueError):
        parse_quantity(raw)


@pytest.mark.parametrize("raw", [True, None, [1]])
def test_rejects_non_numbers(raw):
    with pytest.raises(ValueError) as info:
        parse_quantity(raw)
    assert str(info.value) == "expected a quantity such as 1, 500m or 2Ki"
