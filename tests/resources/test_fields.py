"""Fields: typed reads with field paths, the one place type and range errors are worded."""

from fractions import Fraction

import pytest

from tether.resources.errors import ValidationError
from tether.resources.fields import REQUIRED, Fields


def read(data, method, key, *args, **kwargs):
    return getattr(Fields(data, "spec"), method)(key, *args, **kwargs)


def error(data, method, key, *args, **kwargs):
    with pytest.raises(ValidationError) as info:
        read(data, method, key, *args, **kwargs)
    return f"{info.value.path}: {info.value.message}"


@pytest.mark.parametrize(
    ("method", "value", "args", "kwargs", "expected"),
    [
        ("string", "web", (), {}, "web"),
        ("integer", 3, (), {"maximum": 5}, 3),
        ("number", 1, (), {}, 1.0),
        ("number", 0.5, (), {"minimum": 0}, 0.5),
        ("boolean", False, (), {}, False),
        ("choice", "Deny", (("Allow", "Deny"),), {}, "Deny"),
        ("port", 443, (), {}, 443),
        ("duration", "1m30s", (), {}, 90.0),
        ("int_or_string", "http", (), {"check": lambda v: None}, "http"),
    ],
)
def test_reads_a_present_value(method, value, args, kwargs, expected):
    assert read({"x": value}, method, "x", *args, **kwargs) == expected


@pytest.mark.parametrize("method", ["string", "integer", "number", "boolean", "port", "duration", "quantity", "child"])
def test_absent_or_null_gives_the_default_or_required(method):
    assert read({}, method, "x", "default") == "default"
    assert read({"x": None}, method, "x", None) is None
    assert error({}, method, "x") == "spec.x: required"
    assert error({"x": None}, method, "x", REQUIRED) == "spec.x: required"


@pytest.mark.parametrize(
    ("method", "value", "kwargs", "expected"),
    [
        ("string", 1, {}, "spec.x: expected a string"),
        ("integer", "1", {}, "spec.x: expected an integer"),
        ("integer", True, {}, "spec.x: expected an integer"),
        ("integer", 1.0, {}, "spec.x: expected an integer"),
        ("integer", 6, {"maximum": 5}, "spec.x: must be at most 5"),
        ("integer", -1, {"minimum": 0}, "spec.x: must be at least 0"),
        ("integer", 0, {"minimum": 1, "maximum": 2}, "spec.x: must be between 1 and 2"),
        ("number", "0.5", {}, "spec.x: expected a number"),
        ("number", False, {}, "spec.x: expected a number"),
        ("boolean", "yes", {}, "spec.x: expected a boolean"),
        ("port", 65536, {}, "spec.x: must be between 1 and 65535"),
        ("duration", "1y", {}, "spec.x: unknown unit 'y' in duration '1y'"),
        ("duration", "-1ms", {}, "spec.x: must not be negative"),
        ("quantity", "-1", {}, "spec.x: must not be negative"),
        ("quantity", [], {}, "spec.x: expected a quantity such as 1, 500m or 2Ki"),
        ("child", [], {}, "spec.x: expected a mapping"),
        ("int_or_string", 1.5, {"check": lambda v: None}, "spec.x: expected an integer or a string"),
        ("int_or_string", 0, {"check": lambda v: None}, "spec.x: must be between 1 and 65535"),
        ("int_or_string", "", {"check": lambda v: v or "must not be empty"}, "spec.x: must not be empty"),
    ],
)
def test_type_and_range_errors(method, value, kwargs, expected):
    assert error({"x": value}, method, "x", **kwargs) == expected


def test_quantities_and_nested_paths():
    assert read({"w": "250m"}, "quantity", "w").value == Fraction(1, 4)
    node = Fields({"routes": [{"name": "a"}, {"name": 2}]}, "spec")
    first, second = node.children("routes")
    assert (first.path, first.string("name")) == ("spec.routes[0]", "a")
    with pytest.raises(ValidationError) as info:
        second.string("name")
    assert info.value.path == "spec.routes[1].name"


def test_lists():
    node = Fields({"ids": ["a", "b"], "empty": [], "bad": "a", "mixed": ["a", 1], "maps": [{}, "x"]}, "spec")
    assert node.strings("ids") == ("a", "b")
    assert node.strings("absent") == ()
    assert node.children("absent") == []
    for call, expected in [
        (lambda: node.strings("absent", required=True), "spec.absent: required"),
        (lambda: node.strings("empty", non_empty=True), "spec.empty: must not be empty"),
        (lambda: node.strings("bad"), "spec.bad: expected a list"),
        (lambda: node.strings("mixed"), "spec.mixed[1]: expected a string"),
        (lambda: node.children("maps"), "spec.maps[1]: expected a mapping"),
    ]:
        with pytest.raises(ValidationError) as info:
            call()
        assert f"{info.value.path}: {info.value.message}" == expected


def test_string_maps_check_keys_and_values():
    node = Fields({"labels": {"app": "web", "bad key": "x"}, "plain": {"a": 1}}, "metadata")
    assert node.string_map("absent") == {}
    assert node.string_map("labels") == {"app": "web", "bad key": "x"}
    with pytest.raises(ValidationError) as info:
        node.string_map("labels", key_check=lambda k: "has a space" if " " in k else None)
    assert (info.value.path, info.value.message) == ("metadata.labels[bad key]", "'bad key' has a space")
    with pytest.raises(ValidationError) as info:
        node.string_map("plain")
    assert (info.value.path, info.value.message) == ("metadata.plain[a]", "expected a string")


def test_choice_lists_the_supported_values():
    assert error({"x": "udp"}, "choice", "x", ("TCP", "UDP")) == "spec.x: unsupported value 'udp' (supported: TCP, UDP)"
    assert read({}, "choice", "x", ("TCP", "UDP"), "TCP") == "TCP"
