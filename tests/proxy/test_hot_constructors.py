"""The objects every request makes (``RequestHead``, ``ResponseHead``, ``Body``, ``EndOfMessage``, ``Pick``) have
``__init__`` written out.

They are dataclasses (``dataclasses.replace``, equality and repr as before), but a dataclass's generated
``__init__`` is interpreted Python even in a module mypyc compiled; written out, it is compiled. These check
that the written-out ones take the fields as the generated ones did, and, when the modules are compiled, that
making one is no Python call.
"""

from __future__ import annotations

import cProfile
import inspect
import dataclasses
import pstats

import pytest

from tether.proxy import native
from tether.proxy.codec.http1 import Body, EndOfMessage, RequestHead, ResponseHead
from tether.proxy.core.http import Pick, nothing, no_outcome, no_sample


def test_request_head_fields_defaults_and_replace() -> None:
    head = RequestHead(b"GET", b"/", ((b"host", b"a"),))
    assert (head.method, head.target, head.headers, head.version, head.rewrite, head.found, head.raw) == (
        b"GET", b"/", ((b"host", b"a"),), b"1.1", True, None, None)
    full = RequestHead(method=b"POST", target=b"/x", headers=(), version=b"1.0", rewrite=False,
                       found={b"content-length": [b"1"]}, raw=b"POST /x HTTP/1.0\r\n")
    assert (full.version, full.rewrite, full.found, full.raw) == (b"1.0", False, {b"content-length": [b"1"]},
                                                                  b"POST /x HTTP/1.0\r\n")
    # rewrite, found and raw are not compared (compare=False), the rest is.
    assert full == RequestHead(b"POST", b"/x", (), b"1.0")
    assert full != RequestHead(b"POST", b"/y", (), b"1.0")
    moved = dataclasses.replace(full, target=b"/z")
    assert (moved.target, moved.raw, moved.found) == (b"/z", full.raw, full.found)
    assert [f.name for f in dataclasses.fields(RequestHead)] == ["method", "target", "headers", "version",
                                                                 "rewrite", "found", "raw"]


def test_response_head_fields_defaults_and_replace() -> None:
    head = ResponseHead(200)
    assert (head.status, head.headers, head.reason, head.version, head.rewrite, head.found, head.raw) == (
        200, (), b"", b"1.1", True, None, None)
    assert ResponseHead(404, (), b"Not Found", raw=b"x") == ResponseHead(404, (), b"Not Found")
    assert dataclasses.replace(head, status=204).status == 204


def test_body_and_end_of_message() -> None:
    assert Body(b"x").data == b"x" and Body(b"x") == Body(data=b"x") != Body(b"y")
    assert EndOfMessage().trailers == () and EndOfMessage(((b"a", b"b"),)) == EndOfMessage(trailers=((b"a", b"b"),))
    assert dataclasses.replace(EndOfMessage(), trailers=((b"a", b"b"),)).trailers == ((b"a", b"b"),)


def test_pick_fields_defaults_and_replace() -> None:
    pick = Pick("connect", None, "labels", b"authority")
    assert (pick.observe, pick.failed, pick.release, pick.outcome, pick.unreachable) == (
        no_sample, nothing, nothing, no_outcome, nothing)
    assert (pick.route, pick.frames, pick.request_frames, pick.rewrite, pick.respond, pick.upgrade) == (
        None, None, None, None, None, None)
    assert pick.strip_override is False
    other = dataclasses.replace(pick, labels="other", strip_override=True)
    assert (other.connect, other.authority, other.labels, other.strip_override) == (
        "connect", b"authority", "other", True)
    assert other != pick and dataclasses.replace(other, labels="labels", strip_override=False) == pick
    # Every field can be given by name, as dataclasses.replace gives them.
    assert dataclasses.replace(pick, **{f.name: getattr(pick, f.name) for f in dataclasses.fields(Pick)}) == pick


@pytest.mark.skipif(not native.status.startswith("compiled:"), reason="interpreted: __init__ is Python anyway")
def test_compiled_constructors_make_no_python_call() -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    RequestHead(b"GET", b"/")
    ResponseHead(200)
    Body(b"x")
    EndOfMessage()
    Pick(None, None, "", b"")
    profiler.disable()
    calls = [f"{name} ({file}:{line})" for (file, line, name) in pstats.Stats(profiler).stats  # type: ignore[attr-defined]
             if not file.startswith("~")]  # builtins are named "~"
    assert calls == []


@pytest.mark.parametrize("cls", [RequestHead, ResponseHead, Body, EndOfMessage, Pick])
def test_written_out_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    """The defaults are written twice (the field, the ``__init__``): they must not drift apart."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if [p.kind for p in params] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
        pytest.skip("a compiled __init__ shows no signature: test_native runs this module interpreted")
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for param, f in zip(params, fields):
        default = f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
        assert param.default == default, f"{cls.__name__}.{f.name}"
