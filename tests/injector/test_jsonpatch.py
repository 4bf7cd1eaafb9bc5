"""RFC 6902 patches: ``apply(a, diff(a, b)) == b`` for any JSON, RFC examples, pointer escaping, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.injector.jsonpatch import JsonPatchError, apply, diff

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "a", "b", "a/b", "~x"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["a", "b", "c/d", "e~f", ""]), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(json_values, json_values)
def test_diff_then_apply_gives_the_target(old: Any, new: Any) -> None:
    ops = diff(old, new)
    assert apply(old, ops) == new
    # JSON's true is not 1: equality must hold by type too.
    assert json.dumps(apply(old, ops), sort_keys=True) == json.dumps(new, sort_keys=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(json_values, max_size=5), st.data())
def test_insertions_are_adds(items: list[Any], data: st.DataObject) -> None:
    new = list(items)
    inserted = data.draw(st.lists(st.tuples(st.integers(0, 10), st.just({"new": True})), max_size=3))
    for index, value in inserted:
        new.insert(min(index, len(new)), value)
    ops = diff(items, new)
    assert all(op["op"] == "add" for op in ops)
    assert len(ops) == len(inserted)
    assert apply(items, ops) == new


def test_pointer_escaping() -> None:
    ops = diff({"metadata": {}}, {"metadata": {"annotations": {"linkerd.io/inject": "enabled", "a~b": "c"}}})
    assert ops == [{"op": "add", "path": "/metadata/annotations", "value": {"linkerd.io/inject": "enabled", "a~b": "c"}}]
    ops = diff({"a": {"linkerd.io/inject": "x", "a~b": "y"}}, {"a": {"linkerd.io/inject": "z", "a~b": "w"}})
    assert ops == [
        {"op": "replace", "path": "/a/linkerd.io~1inject", "value": "z"},
        {"op": "replace", "path": "/a/a~0b", "value": "w"},
    ]


def test_webhook_style_patch() -> None:
    pod = {"spec": {"containers": [{"name": "app"}]}}
    patched = {"spec": {"containers": [{"name": "linkerd-proxy"}, {"name": "app"}], "initContainers": [{"name": "i"}]}}
    assert diff(pod, patched) == [
        {"op": "add", "path": "/spec/containers/0", "value": {"name": "linkerd-proxy"}},
        {"op": "add", "path": "/spec/initContainers", "value": [{"name": "i"}]},
    ]


# RFC 6902 appendix A, a few of its examples.
@pytest.mark.parametrize(
    ("doc", "ops", "expected"),
    [
        ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux"}], {"baz": "qux", "foo": "bar"}),
        ({"foo": ["bar", "baz"]}, [{"op": "add", "path": "/foo/1", "value": "qux"}], {"foo": ["bar", "qux", "baz"]}),
        ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
        ({"foo": ["bar", "qux", "baz"]}, [{"op": "remove", "path": "/foo/1"}], {"foo": ["bar", "baz"]}),
        ({"baz": "qux", "foo": "bar"}, [{"op": "replace", "path": "/baz", "value": "boo"}], {"baz": "boo", "foo": "bar"}),
        (
            {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
            [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
            {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
        ),
        ({"foo": ["bar"]}, [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}], {"foo": ["bar", ["abc", "def"]]}),
        ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": 10}], {"/": 9, "~1": 10}),
        ({"foo": "bar"}, [{"op": "copy", "from": "/foo", "path": "/baz"}], {"foo": "bar", "baz": "bar"}),
    ],
)
def test_rfc_examples(doc: Any, ops: list[dict[str, Any]], expected: Any) -> None:
    assert apply(doc, ops) == expected


@pytest.mark.parametrize(
    ("doc", "ops"),
    [
        ({"foo": "bar"}, [{"op": "add", "path": "/baz/bat", "value": "qux"}]),
        ({"foo": ["bar"]}, [{"op": "add", "path": "/foo/5", "value": 1}]),
        ({"foo": ["bar"]}, [{"op": "add", "path": "/foo/01", "value": 1}]),
        ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": "10"}]),
        ({"foo": 1}, [{"op": "remove", "path": "/bar"}]),
        ({"foo": 1}, [{"op": "frobnicate", "path": "/foo"}]),
        ({"foo": 1}, [{"op": "add", "path": "foo", "value": 1}]),
    ],
)
def test_errors(doc: Any, ops: list[dict[str, Any]]) -> None:
    with pytest.raises(JsonPatchError):
        apply(doc, ops)


def test_apply_leaves_the_input_alone() -> None:
    doc = {"a": [1]}
    apply(doc, [{"op": "add", "path": "/a/-", "value": 2}])
    assert doc == {"a": [1]}
