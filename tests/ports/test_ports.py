"""tether.ports: single ports, Linkerd's port-list syntax, and the port set every component shares."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.ports import (
    DEFAULT_OPAQUE_PORTS,
    PortListError,
    PortSet,
    format_span,
    is_port,
    parse_port,
    parse_port_ranges,
    parse_port_set,
    port_of_address,
    read_port_list,
)

# --- single ports ----------------------------------------------------------------------------------


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


def test_parse_port_allowing_zero_says_so() -> None:
    with pytest.raises(ValueError, match="port '65536' is outside 0-65535"):
        parse_port("65536", allow_zero=True)


def test_is_port_bounds() -> None:
    assert [is_port(p) for p in (0, 1, 65535, 65536, -1)] == [False, True, True, False, False]


@pytest.mark.parametrize(
    ("addr", "port"),
    [("0.0.0.0:4143", 4143), ("[::]:4191", 4191), (" 127.0.0.1:80 ", 80), ("nonsense", None),
     ("127.0.0.1:0", None), ("127.0.0.1:http", None), ("127.0.0.1:", None), ("[::1]:70000", None)],
)
def test_port_of_address(addr: str, port: int | None) -> None:
    assert port_of_address(addr) == port


# --- port lists: the shared parser ---------------------------------------------------------------


def test_ranges_keep_the_written_order_and_repeats() -> None:
    # proxy-init's rules and the injected annotations follow the order the user wrote.
    assert parse_port_ranges("4190,4191, 9000 - 9010,25,25") == [(4190, 4190), (4191, 4191), (9000, 9010), (25, 25), (25, 25)]
    assert parse_port_ranges(" , ,") == []


def test_names_resolve_to_their_ports() -> None:
    names = {"http": 8080, "db": (5432, 5433), "http-alt": 8081}
    assert parse_port_ranges("http,db,http-alt,25", names=names) == [(8080, 8080), (5432, 5432), (5433, 5433), (8081, 8081), (25, 25)]
    assert PortSet.parse("db,1-3", names=names).ranges == ((1, 3), (5432, 5433))


@pytest.mark.parametrize(
    ("text", "names", "message"),
    [
        ("80,https", None, "'https' is not a port or a range like 4000-4010: 'https' is not a decimal number"),
        ("9-1", None, "'9-1' is not a range: it ends before it starts"),
        ("1-70000", None, "'1-70000' is not a port or a range like 4000-4010: '70000' is outside 1-65535"),
        ("-5", None, "'-5' is not a port or a range like 4000-4010: '' is not a decimal number"),
        ("0", None, "'0' is not a port or a range like 4000-4010: '0' is outside 1-65535"),
        ("web", {"http": 80}, "'web' is not a port, a range like 4000-4010 or a known port name: 'web' is not a decimal number"),
    ],
)
def test_errors_name_the_item_and_say_why(text: str, names: dict[str, int] | None, message: str) -> None:
    with pytest.raises(PortListError) as err:
        parse_port_ranges(text, names=names)
    assert str(err.value) == message
    assert err.value.item in text and isinstance(err.value, ValueError)


def test_reading_skips_bad_items_and_reports_each() -> None:
    spans, errors = read_port_list("80,x,0,90-95,5-1,http", names={"http": 8080})
    assert spans == [(80, 80), (90, 95), (8080, 8080)]
    assert [err.item for err in errors] == ["x", "0", "5-1"]


@pytest.mark.parametrize(
    ("text", "ports", "skipped"),
    [
        ("25,587,3306-3310", [25, 587, 3306, 3310], []),
        ("http,9000", [8080, 9000], []),
        ("0,65536,abc,10-5,x-y", [], ["0", "65536", "abc", "10-5", "x-y"]),
    ],
)
def test_parse_port_set_is_lenient(text: str, ports: list[int], skipped: list[str]) -> None:
    parsed, bad = parse_port_set(text, {"http": (8080,)})
    assert all(p in parsed for p in ports) and (bool(parsed) is bool(ports))
    assert bad == skipped


def test_format_span() -> None:
    assert [format_span(s) for s in [(25, 25), (4000, 4010)]] == ["25", "4000-4010"]


# --- port sets ------------------------------------------------------------------------------------


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


def test_of_merges_ports_and_ranges() -> None:
    assert PortSet.of([1, 2, 3, (5, 9), 4]) == PortSet.of([(1, 9)])
    assert PortSet.parse("1-65535").ranges == ((1, 65535),)


def test_with_port() -> None:
    assert PortSet.parse("80").with_port(81) == PortSet.parse("80-81")
    assert PortSet().with_port(4191) == PortSet.parse("4191")
    with pytest.raises(ValueError, match="outside"):
        PortSet().with_port(0)


def test_default_opaque_ports_are_linkerds() -> None:
    assert str(DEFAULT_OPAQUE_PORTS) == "25,587,3306,4444,5432,6379,9300,11211"


# --- properties -----------------------------------------------------------------------------------

port = st.integers(1, 65535)
spans = st.lists(st.tuples(port, port).map(sorted), max_size=8)
blank = st.sampled_from(["", " ", "  "])


@given(spans, st.integers(-2, 65537))
def test_membership_matches_a_plain_set(spans: list[list[int]], probe: int) -> None:
    text = ",".join(f"{lo}-{hi}" for lo, hi in spans)
    expected = any(lo <= probe <= hi for lo, hi in spans)
    assert (probe in PortSet.parse(text)) is expected


@given(spans)
def test_canonical_spelling_round_trips(spans: list[list[int]]) -> None:
    ports = PortSet.parse(",".join(f"{lo}-{hi}" for lo, hi in spans))
    assert PortSet.parse(str(ports)) == ports


@given(st.lists(st.tuples(port, port).map(lambda s: (min(s), max(s))), max_size=10), blank, blank)
def test_written_ranges_round_trip(written: list[tuple[int, int]], before: str, after: str) -> None:
    """Formatting ranges and parsing them back gives the same ranges, in order, whatever the blanks."""
    text = ",".join(f"{before}{format_span(span)}{after}" for span in written)
    assert parse_port_ranges(text) == written
    assert read_port_list(text) == (written, [])
    assert PortSet.parse(text) == PortSet.of(written)


@given(st.lists(st.one_of(st.text(alphabet="0123456789- abc", max_size=8), st.just("")), max_size=6))
def test_lenient_and_strict_readings_agree(items: list[str]) -> None:
    """The lenient reader skips exactly the items the strict parser would reject."""
    text = ",".join(items)
    spans, errors = read_port_list(text)
    if errors:
        with pytest.raises(PortListError) as err:
            parse_port_ranges(text)
        assert err.value.item == errors[0].item
    else:
        assert parse_port_ranges(text) == spans
    good = ",".join(item for item in items if item.strip() not in {e.item for e in errors})
    assert read_port_list(good) == (spans, [])


@given(st.text(max_size=40))
def test_parse_never_raises_anything_but_value_error(text: str) -> None:
    try:
        PortSet.parse(text)
    except ValueError:
        pass
