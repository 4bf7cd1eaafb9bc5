"""tether.proxy.ports: single ports and Linkerd's port-set syntax."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.proxy.ports import PortSet, is_port, parse_port


@pytest.mark.parametrize(
    ("text", "allow_zero", "expected"),
    [("80", False, 80), ("1", False, 1), ("65535", False, 65535), ("0080", False, 80), ("0", True, 0)],
)
def test_parse_port(text: str, allow_zero: bool, expected: int) -> None:
    assert parse_port(text, allow_zero=allow_zero) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "outside 1-65535"),
        ("65536", "outside 1-65535"),
        ("9" * 30, "outside 1-65535"),
        ("", "not a decimal number"),
        ("+80", "not a decimal number"),
        (" 80", "not a decimal number"),
        ("8_0", "not a decimal number"),
        ("http", "not a decimal number"),
        ("٨٠", "not a decimal number"),  # Arabic-Indic digits: isdigit() but not ASCII
    ],
)
def test_parse_port_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_port(text)


def test_is_port_bounds() -> None:
    assert [is_port(p) for p in (0, 1, 65535, 65536, -1)] == [False, True, True, False, False]


@pytest.mark.parametrize(
    ("text", "ranges"),
    [
        ("", ()),
        (" , ,", ()),
        ("25", ((25, 25),)),
        ("25,587,3306,4444,5432,6379,9300,11211", ((25, 25), (587, 587), (3306, 3306), (4444, 4444),
                                                  (5432, 5432), (6379, 6379), (9300, 9300), (11211, 11211))),
        ("1000-2000", ((1000, 2000),)),
        (" 1000 - 2000 , 80 ", ((80, 80), (1000, 2000))),
        ("5-5", ((5, 5),)),
        ("1-3,2-6,8", ((1, 6), (8, 8))),
        ("1-2,3-4", ((1, 4),)),  # adjacent ranges merge
        ("9,8,7", ((7, 9),)),
    ],
)
def test_port_set_parse(text: str, ranges: tuple[tuple[int, int], ...]) -> None:
    assert PortSet.parse(text).ranges == ranges


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2000-1000", "ends before it starts"),
        ("1-2-3", "not a decimal number"),
        ("80,http", "'http' is not a decimal number"),
        ("0", "outside 1-65535"),
        ("1-70000", "'70000' is outside"),
        ("-5", "'' is not a decimal number"),
    ],
)
def test_port_set_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PortSet.parse(text)


def test_port_set_membership_and_spelling() -> None:
    ports = PortSet.parse("4191,25,1000-1002")
    assert 25 in ports and 1001 in ports and 4191 in ports
    assert 24 not in ports and 1003 not in ports and 0 not in ports and "25" not in ports
    assert list(ports) == [25, 1000, 1001, 1002, 4191]
    assert str(ports) == "25,1000-1002,4191"
    assert PortSet.parse("1000,1001,1002,25,4191") == ports
    assert not PortSet() and ports


def test_with_port() -> None:
    assert PortSet.parse("80").with_port(81) == PortSet.parse("80-81")
    assert PortSet().with_port(4191) == PortSet.parse("4191")
    with pytest.raises(ValueError, match="outside"):
        PortSet().with_port(0)


port = st.integers(1, 65535)
spans = st.lists(st.tuples(port, port).map(sorted), max_size=8)


@given(spans, st.integers(-2, 65537))
def test_membership_matches_a_plain_set(spans: list[list[int]], probe: int) -> None:
    text = ",".join(f"{lo}-{hi}" for lo, hi in spans)
    expected = any(lo <= probe <= hi for lo, hi in spans)
    assert (probe in PortSet.parse(text)) is expected


@given(spans)
def test_canonical_spelling_round_trips(spans: list[list[int]]) -> None:
    ports = PortSet.parse(",".join(f"{lo}-{hi}" for lo, hi in spans))
    assert PortSet.parse(str(ports)) == ports


@given(st.text(max_size=40))
def test_parse_never_raises_anything_but_value_error(text: str) -> None:
    try:
        PortSet.parse(text)
    except ValueError:
        pass
