"""tether.proxy.codec.transport_header: golden bytes, round trips, limits and fuzzing (proxy.md §6)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.api import transport_pb2
from tether.proxy.codec.common import NEED_DATA, LocalProtocolError
from tether.proxy.codec.transport_header import (
    ALPN_PROTOCOL,
    MAX_HEADER_LENGTH,
    PREFACE,
    HeaderReceived,
    NoHeader,
    SessionProtocol,
    TransportHeader,
    TransportHeaderDecoder,
    TransportHeaderError,
    encode,
)


def framed(body: bytes) -> bytes:
    return PREFACE + len(body).to_bytes(4) + body


def decode_all(data: bytes, chunk: int | None = None) -> NoHeader | HeaderReceived:
    decoder = TransportHeaderDecoder()
    size = chunk or max(len(data), 1)
    for i in range(0, len(data), size):
        answer = decoder.receive_data(data[i : i + size])
        if answer is not NEED_DATA:
            return answer
    answer = decoder.receive_data(b"")
    assert answer is not NEED_DATA
    return answer


def test_preface_and_alpn() -> None:
    assert PREFACE == b"transport.l5d.io/v1\r\n\r\n" and len(PREFACE) == 23
    assert ALPN_PROTOCOL == b"transport.l5d.io/v1"


def test_golden_bytes_from_the_reference() -> None:
    # proxy.md §6.1: port 4040, no name, HTTP/2.
    wire = encode(TransportHeader(4040, None, SessionProtocol.HTTP2))
    assert wire == PREFACE + bytes.fromhex("00000007") + bytes.fromhex("08C81F1A021200")


@pytest.mark.parametrize(
    ("header", "body_hex"),
    [
        (TransportHeader(4040, None, SessionProtocol.HTTP1), "08C81F1A020A00"),
        (TransportHeader(4040), "08C81F"),
        (TransportHeader(1), "0801"),
        (TransportHeader(80, "web.emojivoto.svc.cluster.local"),
         "0850121F" + b"web.emojivoto.svc.cluster.local".hex()),
    ],
)
def test_encoding(header: TransportHeader, body_hex: str) -> None:
    assert encode(header) == framed(bytes.fromhex(body_hex))


def test_decoding_the_golden_bytes_with_trailing_data() -> None:
    wire = PREFACE + bytes.fromhex("00000007 08C81F1A021200") + b"GET / HTTP/1.1\r\n"
    assert decode_all(wire) == HeaderReceived(
        TransportHeader(4040, None, SessionProtocol.HTTP2), b"GET / HTTP/1.1\r\n"
    )


def test_decoding_byte_by_byte() -> None:
    wire = encode(TransportHeader(8080, "Web.Example.com", SessionProtocol.HTTP1)) + b"app"
    decoder = TransportHeaderDecoder()
    header_len = len(wire) - 3
    answers = [decoder.receive_data(wire[i : i + 1]) for i in range(header_len)]
    assert answers[:-1] == [NEED_DATA] * (header_len - 1)
    # Names are compared case-insensitively, so they come back in lower case.
    assert answers[-1] == HeaderReceived(TransportHeader(8080, "web.example.com", SessionProtocol.HTTP1), b"")


def test_no_header_as_soon_as_a_byte_differs() -> None:
    assert TransportHeaderDecoder().receive_data(b"G") == NoHeader()
    decoder = TransportHeaderDecoder()
    assert decoder.receive_data(b"transport.l5d") is NEED_DATA
    assert decoder.receive_data(b".io/v2") == NoHeader()


def test_eof_before_preface_and_length_is_no_header() -> None:
    for cut in (0, 5, 23, 26):
        assert decode_all(encode(TransportHeader(4040))[:cut]) == NoHeader()


def test_eof_inside_the_message_is_an_error() -> None:
    wire = encode(TransportHeader(4040, "a.example", SessionProtocol.HTTP2))
    with pytest.raises(TransportHeaderError, match="connection closed after 3 of the header's 18 bytes"):
        decode_all(wire[:30])


def test_length_limit() -> None:
    at_limit = PREFACE + MAX_HEADER_LENGTH.to_bytes(4)
    assert TransportHeaderDecoder().receive_data(at_limit) is NEED_DATA
    with pytest.raises(TransportHeaderError, match="length 65537 exceeds the limit of 65536 bytes"):
        TransportHeaderDecoder().receive_data(PREFACE + (MAX_HEADER_LENGTH + 1).to_bytes(4))
    with pytest.raises(TransportHeaderError, match="length 4294967295"):
        TransportHeaderDecoder().receive_data(PREFACE + b"\xff\xff\xff\xff")
    with pytest.raises(TransportHeaderError, match="exceeds the limit of 10 bytes"):
        TransportHeaderDecoder(max_length=10).receive_data(framed(bytes(11)))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "port 0 is outside 1-65535"),
        (bytes.fromhex("08 00"), "port 0 is outside"),
        (transport_pb2.Header(port=65536).SerializeToString(), "port 65536 is outside"),
        (transport_pb2.Header(port=-1).SerializeToString(), "port -1 is outside"),
        (transport_pb2.Header(port=80, name="not a name").SerializeToString(), "name 'not a name' is not"),
        (transport_pb2.Header(port=80, name="10.0.0.1").SerializeToString(), "is not a valid DNS name"),
        (bytes.fromhex("08"), "not a valid transport.l5d.io.Header"),
        (bytes.fromhex("FF FF FF"), "not a valid transport.l5d.io.Header"),
        (bytes.fromhex("0850 1202 C328"), "not a valid transport.l5d.io.Header"),  # name is not UTF-8
    ],
)
def test_invalid_messages(body: bytes, message: str) -> None:
    with pytest.raises(TransportHeaderError, match=message):
        decode_all(framed(body))


def test_session_protocol_without_a_kind_counts_as_absent() -> None:
    assert decode_all(framed(bytes.fromhex("0850 1A00"))) == HeaderReceived(TransportHeader(80), b"")


def test_unknown_fields_are_ignored() -> None:
    assert decode_all(framed(bytes.fromhex("0850 2001"))) == HeaderReceived(TransportHeader(80), b"")


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (TransportHeader(0), "port 0 is outside 1-65535"),
        (TransportHeader(65536), "port 65536"),
        (TransportHeader(80, ""), "name '' is not a valid DNS name"),
        (TransportHeader(80, "bad name"), "name 'bad name'"),
    ],
)
def test_encoding_refuses_invalid_headers(header: TransportHeader, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        encode(header)


def test_decoder_is_single_use() -> None:
    decoder = TransportHeaderDecoder()
    decoder.receive_data(encode(TransportHeader(80)))
    with pytest.raises(LocalProtocolError, match="already finished"):
        decoder.receive_data(b"app data")
    failed = TransportHeaderDecoder()
    with pytest.raises(TransportHeaderError):
        failed.receive_data(PREFACE + b"\xff\xff\xff\xff")
    with pytest.raises(LocalProtocolError):
        failed.receive_data(b"x")


label = st.from_regex(r"[a-z0-9]([a-z0-9_-]{0,10}[a-z0-9])?", fullmatch=True)
names = st.lists(label, min_size=1, max_size=4).map(".".join).filter(lambda n: not n.split(".")[-1].isdigit())
headers = st.builds(
    TransportHeader,
    port=st.integers(1, 65535),
    name=st.none() | names,
    protocol=st.none() | st.sampled_from(SessionProtocol),
)


@given(headers, st.binary(max_size=64), st.integers(1, 40))
def test_round_trip(header: TransportHeader, trailing: bytes, chunk: int) -> None:
    decoder = TransportHeaderDecoder()
    wire = encode(header) + trailing
    received = b""
    answer = None
    for i in range(0, len(wire), chunk):
        piece = wire[i : i + chunk]
        if answer is None:
            result = decoder.receive_data(piece)
            if result is not NEED_DATA:
                assert isinstance(result, HeaderReceived)
                answer = result
                received = result.trailing_data
        else:
            received += piece  # after the header, the caller owns the stream
    assert answer is not None and answer.header == header
    assert received == trailing


@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=5))
def test_fuzz_after_the_preface(body: bytes, cuts: list[int]) -> None:
    fuzz(PREFACE + body, cuts)


@given(st.binary(max_size=100), st.lists(st.integers(0, 100), max_size=5))
def test_fuzz_framed_messages(body: bytes, cuts: list[int]) -> None:
    answer = fuzz(framed(body), cuts)
    assert not isinstance(answer, NoHeader)


@given(st.binary(max_size=60), st.lists(st.integers(0, 60), max_size=5))
def test_fuzz_anything(data: bytes, cuts: list[int]) -> None:
    fuzz(data, cuts)


def fuzz(data: bytes, cuts: list[int]) -> NoHeader | HeaderReceived | None:
    """Feed ``data`` split at ``cuts``, then EOF; only a verdict or a TransportHeaderError may come out."""
    decoder = TransportHeaderDecoder()
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    try:
        for start, end in zip(bounds, bounds[1:]):
            answer = decoder.receive_data(data[start:end])
            if answer is not NEED_DATA:
                return answer
        answer = decoder.receive_data(b"")
    except TransportHeaderError:
        return None
    assert answer is not NEED_DATA, "EOF must end the decode"
    return answer
