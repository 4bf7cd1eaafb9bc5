"""tether.proxy.codec.http1: wire tables, keep-alive, switches, limits, and fuzzing (no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.proxy.codec.common import LocalProtocolError, RemoteProtocolError
from tether.proxy.codec.http1 import (
    TRANSITIONS,
    BadMessage,
    Body,
    ConnectionClosed,
    EndOfMessage,
    Event,
    HeadTooLarge,
    Http1Connection,
    RequestHead,
    ResponseHead,
    Role,
    State,
    header,
)


def feed(conn: Http1Connection, data: bytes, chunk: int | None = None) -> list[Event]:
    """All events for ``data`` fed in pieces of ``chunk`` bytes, with adjacent bodies joined."""
    events: list[Event] = []
    size = chunk or max(len(data), 1)
    for i in range(0, len(data), size):
        events.extend(conn.receive_data(data[i : i + size]))
    return join_bodies(events)


def join_bodies(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        if isinstance(event, Body) and out and isinstance(out[-1], Body):
            out[-1] = Body(out[-1].data + event.data)
        elif not (isinstance(event, Body) and not event.data):
            out.append(event)
    return out


H = ((b"Host", b"a"),)

REQUESTS = [
    (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", [RequestHead(b"GET", b"/", H), EndOfMessage()]),
    (b"\r\nGET /x?y HTTP/1.0\r\n\r\n", [RequestHead(b"GET", b"/x?y", (), b"1.0"), EndOfMessage()]),
    (b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
     [RequestHead(b"POST", b"/p", H + ((b"Content-Length", b"5"),)), Body(b"hello"), EndOfMessage()]),
    (b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
     [RequestHead(b"POST", b"/p", H + ((b"Content-Length", b"0"),)), EndOfMessage()]),
    (b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\n\r\n",
     [RequestHead(b"POST", b"/p", H + ((b"Transfer-Encoding", b"chunked"),)), Body(b"hello!"), EndOfMessage()]),
    (b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n",
     [RequestHead(b"POST", b"/p", H + ((b"Transfer-Encoding", b"chunked"),)), Body(b"0123456789"),
      EndOfMessage(((b"X-T", b"1"),))]),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-Sp:   v  w \t\r\nX-Empty:\r\n\r\n",
     [RequestHead(b"GET", b"/", H + ((b"X-Sp", b"v  w"), (b"X-Empty", b""))), EndOfMessage()]),
    (b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n",
     [RequestHead(b"CONNECT", b"h:443", ((b"Host", b"h:443"),)), EndOfMessage()]),
]


@pytest.mark.parametrize(("wire", "expected"), REQUESTS)
@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_requests_parse(wire: bytes, expected: list[Event], chunk: int | None) -> None:
    assert feed(Http1Connection(Role.SERVER), wire, chunk) == expected


BAD_REQUESTS = [
    b"GET / HTTP/1.1\r\n\r\n",  # no Host
    b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
    b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
]


@pytest.mark.parametrize("wire", BAD_REQUESTS)
def test_bad_requests_are_400_and_remote(wire: bytes) -> None:
    conn = Http1Connection(Role.SERVER)
    with pytest.raises(BadMessage) as info:
        conn.receive_data(wire)
    assert info.value.status_hint == 400 and isinstance(info.value, RemoteProtocolError)
    assert conn.their_state is State.ERROR
    with pytest.raises(BadMessage):
        conn.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")


def test_duplicate_equal_content_lengths_are_one() -> None:
    wire = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\n\r\nok"
    assert feed(Http1Connection(Role.SERVER), wire)[1:] == [Body(b"ok"), EndOfMessage()]


def test_head_too_large_is_431() -> None:
    conn = Http1Connection(Role.SERVER, max_head_size=100)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n")
    with pytest.raises(HeadTooLarge) as info:
        conn.receive_data(b"X-Big: " + b"a" * 100)
    assert info.value.status_hint == 431
    # A whole head just over the limit, in one read.
    conn = Http1Connection(Role.SERVER, max_head_size=40)
    with pytest.raises(HeadTooLarge):
        conn.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: aaaaaaaaaaaa\r\n\r\n")


def test_eof_between_messages_and_inside_them() -> None:
    conn = Http1Connection(Role.SERVER)
    assert conn.receive_data(b"") == [ConnectionClosed()]
    conn = Http1Connection(Role.SERVER)
    with pytest.raises(BadMessage):
        conn.receive_data(b"GET / HTTP/1.1\r\nHo")
        conn.receive_data(b"")
    conn = Http1Connection(Role.SERVER)
    conn.receive_data(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab")
    with pytest.raises(BadMessage):
        conn.receive_data(b"")


RESPONSES = [
    (b"GET", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
     [ResponseHead(200, ((b"Content-Length", b"2"),), b"OK"), Body(b"hi"), EndOfMessage()], True),
    (b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
     [ResponseHead(200, ((b"Content-Length", b"2"),), b"OK"), EndOfMessage()], True),
    (b"GET", b"HTTP/1.1 204 No Content\r\n\r\n", [ResponseHead(204, (), b"No Content"), EndOfMessage()], True),
    (b"GET", b"HTTP/1.1 304 \r\n\r\n", [ResponseHead(304, (), b""), EndOfMessage()], True),
    (b"GET", b"HTTP/1.1 200\r\n\r\n", [ResponseHead(200)], False),  # the body runs until close
    (b"GET", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
     [ResponseHead(100, (), b"Continue"), ResponseHead(200, ((b"Content-Length", b"0"),), b"OK"), EndOfMessage()],
     True),
    (b"GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\ngrpc-status: 0\r\n\r\n",
     [ResponseHead(200, ((b"Transfer-Encoding", b"chunked"),), b"OK"), Body(b"abc"),
      EndOfMessage(((b"grpc-status", b"0"),))], True),
    (b"GET", b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
     [ResponseHead(200, ((b"Connection", b"close"), (b"Content-Length", b"1")), b"OK"), Body(b"x"),
      EndOfMessage()], False),
    (b"GET", b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
     [ResponseHead(200, ((b"Content-Length", b"1"),), b"OK", b"1.0"), Body(b"x"), EndOfMessage()], False),
]


@pytest.mark.parametrize(("method", "wire", "expected", "keep_alive"), RESPONSES)
@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_responses_parse(method: bytes, wire: bytes, expected: list[Event], keep_alive: bool,
                         chunk: int | None) -> None:
    conn = Http1Connection(Role.CLIENT)
    conn.send_head(RequestHead(method, b"/", H))
    conn.send_end()
    assert feed(conn, wire, chunk) == expected
    assert conn.keep_alive is keep_alive
    if keep_alive:
        conn.start_next_cycle()
        assert conn.our_state is conn.their_state is State.IDLE


def test_response_until_close() -> None:
    conn = Http1Connection(Role.CLIENT)
    conn.send_head(RequestHead(b"GET", b"/", H))
    conn.send_end()
    assert feed(conn, b"HTTP/1.1 200 OK\r\n\r\nsome") == [ResponseHead(200, (), b"OK"), Body(b"some")]
    assert conn.receive_data(b"") == [EndOfMessage(), ConnectionClosed()]
    assert not conn.keep_alive


def test_client_sees_an_idle_close_and_refuses_unasked_responses() -> None:
    conn = Http1Connection(Role.CLIENT)
    assert conn.receive_data(b"") == [ConnectionClosed()]
    conn = Http1Connection(Role.CLIENT)
    with pytest.raises(BadMessage):
        conn.receive_data(b"HTTP/1.1 200 OK\r\n\r\n")
    conn = Http1Connection(Role.CLIENT)
    conn.send_head(RequestHead(b"GET", b"/", H))
    conn.send_end()
    with pytest.raises(BadMessage):
        conn.receive_data(b"HTTP/1.1 101 Switching\r\n\r\n")


def test_send_framing_and_round_trip() -> None:
    client, server = Http1Connection(Role.CLIENT), Http1Connection(Role.SERVER)
    wire = client.send_head(RequestHead(b"POST", b"/u", H + ((b"Transfer-Encoding", b"chunked"),)))
    wire += client.send_body(b"abc") + client.send_body(b"") + client.send_body(b"defgh")
    wire += client.send_end(((b"x-t", b"v"),))
    assert wire.endswith(b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\nx-t: v\r\n\r\n")
    assert feed(server, wire, 3) == [RequestHead(b"POST", b"/u", H + ((b"Transfer-Encoding", b"chunked"),)),
                                     Body(b"abcdefgh"), EndOfMessage(((b"x-t", b"v"),))]
    wire = server.send_head(ResponseHead(201, ((b"Content-Length", b"3"),), b"Created"))
    wire += server.send_body(b"ok!") + server.send_end()
    assert wire == b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nok!"
    assert feed(client, wire) == [ResponseHead(201, ((b"Content-Length", b"3"),), b"Created"), Body(b"ok!"),
                                  EndOfMessage()]
    client.start_next_cycle()
    server.start_next_cycle()


def test_send_misuse_is_local() -> None:
    server = Http1Connection(Role.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    server.send_head(ResponseHead(200, ((b"Content-Length", b"2"),)))
    with pytest.raises(LocalProtocolError):
        server.send_body(b"abc")
    server = Http1Connection(Role.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    server.send_head(ResponseHead(200, ((b"Content-Length", b"2"),)))
    with pytest.raises(LocalProtocolError):
        server.send_end()
    server = Http1Connection(Role.SERVER)
    server.receive_data(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n")
    server.send_head(ResponseHead(200, ((b"Content-Length", b"2"),)))
    with pytest.raises(LocalProtocolError):
        server.send_body(b"ab")
    with pytest.raises(LocalProtocolError):
        Http1Connection(Role.SERVER).send_head(RequestHead(b"GET", b"/", H))
    with pytest.raises(LocalProtocolError):  # no next cycle before both messages are done
        Http1Connection(Role.SERVER).start_next_cycle()


def test_pipelined_requests_wait_for_the_next_cycle() -> None:
    server = Http1Connection(Role.SERVER)
    two = b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n"
    assert server.receive_data(two) == [RequestHead(b"GET", b"/1", H), EndOfMessage()]
    assert len(server.unparsed) == len(two) // 2
    assert server.receive_data(b"GET /3") == []
    server.send_head(ResponseHead(200, ((b"Content-Length", b"0"),)))
    server.send_end()
    server.start_next_cycle()
    assert server.receive_data(b" HTTP/1.1\r\nHost: a\r\n\r\n") == [RequestHead(b"GET", b"/2", H), EndOfMessage()]


def test_close_ends_keep_alive() -> None:
    server = Http1Connection(Role.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    server.send_head(ResponseHead(200, ((b"Content-Length", b"0"),)))
    server.send_end()
    assert not server.keep_alive
    with pytest.raises(LocalProtocolError):
        server.start_next_cycle()
    server = Http1Connection(Role.SERVER)
    server.receive_data(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    server.send_head(ResponseHead(200, ((b"Content-Length", b"0"),)))
    server.send_end()
    assert server.keep_alive


def test_upgrade_switches_with_trailing_data() -> None:
    up = H + ((b"Connection", b"upgrade"), (b"Upgrade", b"websocket"))
    client, server = Http1Connection(Role.CLIENT), Http1Connection(Role.SERVER)
    wire = client.send_head(RequestHead(b"GET", b"/ws", up)) + client.send_end()
    assert server.receive_data(wire + b"\x81\x00frame") == [RequestHead(b"GET", b"/ws", up), EndOfMessage()]
    answer = server.send_head(ResponseHead(101, ((b"Upgrade", b"websocket"),), b"Switching Protocols"))
    assert server.switched and server.trailing_data == b"\x81\x00frame"
    assert client.receive_data(answer + b"server-bytes") == [
        ResponseHead(101, ((b"Upgrade", b"websocket"),), b"Switching Protocols")]
    assert client.switched and client.trailing_data == b"server-bytes"


def test_upgrade_refused_goes_on_as_http() -> None:
    up = H + ((b"Upgrade", b"h2c"),)
    server = Http1Connection(Role.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\n")
    server.send_head(ResponseHead(200, ((b"Content-Length", b"0"),)))
    server.send_end()
    server.start_next_cycle()
    assert not server.switched
    assert server.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[0] == RequestHead(b"GET", b"/", H)
    assert up  # the header form the client used


def test_connect_switches_on_2xx() -> None:
    client = Http1Connection(Role.CLIENT)
    client.send_head(RequestHead(b"CONNECT", b"h:443", ((b"Host", b"h:443"),)))
    client.send_end()
    assert client.receive_data(b"HTTP/1.1 200 OK\r\n\r\n\x16\x03") == [ResponseHead(200, (), b"OK")]
    assert client.switched and client.trailing_data == b"\x16\x03"
    server = Http1Connection(Role.SERVER)
    server.receive_data(b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n\x16\x03\x01")
    server.send_head(ResponseHead(200, (), b"OK"))
    assert server.switched and server.trailing_data == b"\x16\x03\x01"


def test_transitions_table_covers_every_state() -> None:
    sources = {state for state, _ in TRANSITIONS}
    assert sources == {State.IDLE, State.BODY, State.DONE}
    assert all(target in State for target in TRANSITIONS.values())


def test_header_lookup_is_case_insensitive() -> None:
    assert header(((b"Content-Type", b"x"),), b"content-type") == b"x"
    assert header((), b"x") is None


# -- fuzzing --------------------------------------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=20))
def test_fuzz_server_raises_only_remote_errors(data: bytes, chunk: int) -> None:
    conn = Http1Connection(Role.SERVER, max_head_size=256)
    try:
        feed(conn, data, chunk)
        conn.receive_data(b"")
    except RemoteProtocolError as exc:
        assert getattr(exc, "status_hint", 400) in (400, 431)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([b"GET", b"HEAD", b"POST", b"CONNECT"]), st.binary(max_size=300))
def test_fuzz_client_raises_only_remote_errors(method: bytes, data: bytes) -> None:
    conn = Http1Connection(Role.CLIENT, max_head_size=256)
    conn.send_head(RequestHead(method, b"/", H))
    conn.send_end()
    try:
        conn.receive_data(b"HTTP/1.1 " + data)
        conn.receive_data(b"")
    except RemoteProtocolError:
        pass


_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10).map(str.encode)
_value = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ;=/", max_size=20).map(
    lambda s: s.strip().encode())
_extra = st.lists(st.tuples(_token.map(lambda t: b"x-" + t), _value), max_size=5).map(tuple)
_bodies = st.lists(st.binary(min_size=1, max_size=50), max_size=5)


@settings(max_examples=200, deadline=None)
@given(_extra, _bodies, st.booleans(), st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=5),
       st.integers(min_value=100, max_value=599).filter(lambda s: s not in (101,) and s >= 200))
def test_fuzz_round_trip_any_split(extra: tuple[tuple[bytes, bytes], ...], bodies: list[bytes], chunked: bool,
                                   splits: list[int], status: int) -> None:
    """Whatever the framing and however the bytes are split, the peer sees the body that was sent."""
    total = b"".join(bodies)
    framing = ((b"Transfer-Encoding", b"chunked"),) if chunked else ((b"Content-Length", str(len(total)).encode()),)
    client, server = Http1Connection(Role.CLIENT), Http1Connection(Role.SERVER)
    for _ in range(2):  # two cycles on one connection
        head = RequestHead(b"POST", b"/f", H + extra + framing)
        wire = client.send_head(head) + b"".join(client.send_body(b) for b in bodies) + client.send_end()
        events = _split_feed(server, wire, splits)
        assert events[0] == head
        assert b"".join(e.data for e in events if isinstance(e, Body)) == total
        assert events[-1] == EndOfMessage()
        no_body = status in (204, 304)
        rhead = ResponseHead(status, extra + (() if no_body else framing))
        wire = server.send_head(rhead)
        if not no_body:
            wire += b"".join(server.send_body(b) for b in bodies)
        wire += server.send_end()
        events = _split_feed(client, wire, splits)
        assert events[0] == rhead and events[-1] == EndOfMessage()
        assert b"".join(e.data for e in events if isinstance(e, Body)) == (b"" if no_body else total)
        client.start_next_cycle()
        server.start_next_cycle()


def _split_feed(conn: Http1Connection, wire: bytes, splits: list[int]) -> list[Event]:
    events: list[Event] = []
    i = 0
    k = 0
    while i < len(wire):
        n = splits[k % len(splits)]
        events.extend(conn.receive_data(wire[i : i + n]))
        i += n
        k += 1
    return events


def test_start_line_errors_are_their_own_kind() -> None:
    from tether.proxy.codec.http1 import MAX_START_LINE, BadStartLine

    with pytest.raises(BadStartLine):
        Http1Connection(Role.SERVER).receive_data(b"NOT-HTTP-" * (MAX_START_LINE // 9 + 2))
    conn = Http1Connection(Role.SERVER)
    with pytest.raises(BadStartLine):
        conn.receive_data(b"HELLO WORLD\r\n\r\n")
    assert conn.received == b"HELLO WORLD\r\n\r\n"  # all of it, for an opaque fallback
    with pytest.raises(BadMessage) as info:  # a header error is not a start-line error
        Http1Connection(Role.SERVER).receive_data(b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n")
    assert not isinstance(info.value, BadStartLine)


_VALID = [w for w, _ in REQUESTS]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_VALID), st.integers(min_value=0, max_value=200), st.binary(min_size=1, max_size=4),
       st.booleans())
def test_fuzz_mutated_requests(wire: bytes, at: int, junk: bytes, replace: bool) -> None:
    """Valid requests with bytes replaced or inserted: events or a Remote error, never anything else."""
    at = at % (len(wire) + 1)
    mutated = wire[:at] + junk + wire[at + (len(junk) if replace else 0):]
    conn = Http1Connection(Role.SERVER)
    try:
        events = feed(conn, mutated, 3)
        conn.receive_data(b"")
    except RemoteProtocolError:
        return
    assert all(isinstance(e, (RequestHead, Body, EndOfMessage, ConnectionClosed)) for e in events)


# -- llhttp agrees with the Python rules -------------------------------------------------------------------------

HEADER_BYTES = st.binary(max_size=12) | st.sampled_from([b"Host", b"Content-Length", b"L5D-x", b"te", b" v", b"v ", b"a\tb", b"\x7f",
                                                         b"\x80", b"a b", b"", b":", b"Transfer-Encoding",
                                                         b"Connection", b"Keep-Alive"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(HEADER_BYTES, HEADER_BYTES), max_size=4), st.booleans())
def test_fast_head_parser_is_never_laxer_than_the_python_rules(pairs: list[tuple[bytes, bytes]],
                                                               request: bool) -> None:
    """``_parse_head`` (llhttp, falling back to Python) gives what ``_parse_headers`` gives, or the same refusal."""
    from tether.proxy.codec.http1 import HOP_BY_HOP, _Llhttp, _parse_head, _parse_headers, scan_framing

    lines = [name + b":" + value for name, value in pairs]
    if any(b"\r" in line or b"\n" in line for line in lines):
        return  # not a head line
    start = b"GET / HTTP/1.1" if request else b"HTTP/1.1 200 OK"
    head = b"\r\n".join([start, *lines]) + b"\r\n"
    try:
        expected = _parse_headers(lines)
    except BadMessage:
        with pytest.raises(BadMessage):
            _parse_head(head, _Llhttp(request))
        return
    names = [k.lower() for k, _ in expected]
    # Hop-by-hop or l5d-* headers are to be rewritten, but a response's Connection: keep-alive (see ResponseHead).
    rewrite = any(n.startswith(b"l5d-") or (n in HOP_BY_HOP and (request or (n, v.lower()) != (b"connection",
                                                                                             b"keep-alive")))
                  for n, (_, v) in zip(names, expected))
    found = {name: values for name, values in scan_framing(expected).items() if values}
    assert _parse_head(head, _Llhttp(request))[:4] == (expected, found, names.count(b"host"), rewrite)
