"""tether.proxy.codec.http2: send buffers within the windows, GOAWAY without closing, errors with codes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.proxy.codec import http2_events as events_
from tether.proxy.codec.http2 import CONNECTION_WINDOW, PREFACE, ErrorCodes, GoAway, H2Endpoint, H2ProtocolError

REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"web"), (b":path", b"/")]


def pair() -> tuple[H2Endpoint, H2Endpoint]:
    client, server = H2Endpoint(client=True), H2Endpoint(client=False)
    client.initiate()
    server.initiate()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())  # the SETTINGS ack
    return client, server


def test_data_waits_for_the_window_and_the_end_follows_it() -> None:
    client, server = pair()
    sid = client.next_stream_id()
    client.send_headers(sid, REQUEST)
    client.queue_data(sid, b"a" * 100_000)
    client.queue_end(sid, [(b"x-trailer", b"1")])
    assert client.flush() == {sid: 65_535}  # the stream's window, in frames of at most 16 KiB
    assert client.buffered(sid) == 100_000 - 65_535 and client.pending(sid)
    got = b""
    events = server.receive_data(client.data_to_send())
    got += b"".join(e.data for e in events if isinstance(e, events_.DataReceived))
    server.ack(sid, len(got))  # the proxy's "sent on": the window comes back
    client.receive_data(server.data_to_send())
    assert client.flush(sid) == {sid: 100_000 - 65_535}
    events = server.receive_data(client.data_to_send())
    got += b"".join(e.data for e in events if isinstance(e, events_.DataReceived))
    assert got == b"a" * 100_000 and not client.pending(sid)
    assert [e.headers for e in events if isinstance(e, events_.TrailersReceived)] == [[(b"x-trailer", b"1")]]


def test_the_connection_window_is_linkerds() -> None:
    client, server = pair()
    assert client.remote_initial_window == 65_535
    assert server._recv_window == CONNECTION_WINDOW
    assert client._send_window == CONNECTION_WINDOW


def test_a_goaway_is_reported_and_streams_in_flight_go_on() -> None:
    client, server = pair()
    sid = client.next_stream_id()
    client.send_headers(sid, REQUEST, end_stream=True)
    server.receive_data(client.data_to_send())
    events = server.receive_data(frame(0x7, 0, 0, bytes(8)))  # GOAWAY(last stream 0, NO_ERROR) from the client
    assert events == [GoAway(0, 0, b"")]
    # h2 alone would refuse to send anything now; the response still goes out.
    assert server.send_headers(sid, [(b":status", b"200")], end_stream=True)
    events = client.receive_data(server.data_to_send())
    assert any(isinstance(e, events_.ResponseReceived) for e in events)


def test_a_protocol_error_raises_with_its_code_and_queues_a_goaway() -> None:
    _, server = pair()
    with pytest.raises(H2ProtocolError) as caught:
        server.receive_data(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")  # DATA on stream 0
    assert caught.value.error_code == ErrorCodes.PROTOCOL_ERROR
    assert b"\x07\x00\x00\x00\x00\x00" in server.data_to_send()  # GOAWAY
    with pytest.raises(H2ProtocolError):
        server.receive_data(b"more")


def test_sends_on_a_reset_stream_are_dropped_not_raised() -> None:
    client, server = pair()
    sid = client.next_stream_id()
    client.send_headers(sid, REQUEST)
    server.receive_data(client.data_to_send())
    server.reset(sid, ErrorCodes.CANCEL)
    client.receive_data(server.data_to_send())
    client.queue_data(sid, b"late")
    assert client.flush() == {sid: 0} and not client.pending(sid)  # nothing went; nothing is left
    assert not client.send_headers(sid, [(b"x", b"y")], end_stream=True)


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def summary(events: list[object]) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for event in events:
        if isinstance(event, events_.DataReceived):
            if out and out[-1][0] == "data":  # data may come in more events when split
                out[-1] = ("data", out[-1][1] + event.data)  # type: ignore[operator]
            else:
                out.append(("data", event.data))
        elif not isinstance(event, events_.WindowUpdated):
            out.append((type(event).__name__, getattr(event, "stream_id", None)))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["data", "goaway", "ping", "bad-goaway"]), max_size=8),
       st.lists(st.integers(1, 200), max_size=6))
def test_goaway_filtering_does_not_depend_on_how_bytes_are_split(ops: list[str], cuts: list[int]) -> None:
    client, _ = pair()
    sid = client.next_stream_id()
    client.send_headers(sid, REQUEST)
    stream = PREFACE + frame(0x4, 0, 0, b"") + client.data_to_send()  # preface, SETTINGS, the request's HEADERS
    for op in ops:
        if op == "data":
            stream += frame(0x0, 0, sid, b"payload")
        elif op == "goaway":
            stream += frame(0x7, 0, 0, (1).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"bye")
        elif op == "ping":
            stream += frame(0x6, 0, 0, b"12345678")
        else:
            stream += frame(0x7, 0, 3, b"\x00" * 8)  # GOAWAY on a stream: h2's to refuse

    def run(pieces: list[bytes]) -> tuple[list[tuple[str, object]], str]:
        server = H2Endpoint(client=False)
        server.initiate()
        events: list[object] = []
        try:
            for piece in pieces:
                events += server.receive_data(piece)
        except H2ProtocolError as exc:
            return [], f"error {exc.error_code}"  # (events of earlier pieces are not comparable then)
        return summary(events), "ok"

    points = sorted({c for c in cuts if c < len(stream)})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert run(pieces) == run([stream])
