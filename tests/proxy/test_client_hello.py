"""tether.proxy.codec.client_hello: real ClientHellos from Python's ssl, edge cases by hand, fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxy_tls_helpers import (
    alpn_extension,
    built_client_hello,
    client_hello_body,
    extension,
    handshake,
    real_client_hello,
    records,
    sni_extension,
)

from tether.proxy.codec.client_hello import (
    MAX_CLIENT_HELLO_SIZE,
    ClientHello,
    ClientHelloError,
    ClientHelloParser,
    ClientHelloTooLarge,
    NotClientHello,
    TruncatedClientHello,
)
from tether.proxy.codec.common import NEED_DATA, LocalProtocolError

MESH_NAME = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"


def parse(data: bytes, chunk: int | None = None) -> ClientHello:
    """Feed ``data`` in chunks of ``chunk`` bytes; expect a ClientHello by the end."""
    parser = ClientHelloParser()
    size = chunk or len(data)
    for i in range(0, len(data), size):
        answer = parser.receive_data(data[i : i + size])
        if answer is not NEED_DATA:
            return answer
    raise AssertionError("no ClientHello after all the bytes")


def test_real_client_hello_with_sni_and_alpn() -> None:
    data = real_client_hello(MESH_NAME, ["transport.l5d.io/v1", "h2"])
    assert parse(data) == ClientHello(MESH_NAME, (b"transport.l5d.io/v1", b"h2"))


def test_real_client_hello_without_alpn() -> None:
    assert parse(real_client_hello("example.com")) == ClientHello("example.com", ())


def test_real_client_hello_without_sni() -> None:
    # Python sends no SNI when there is no server_hostname, or when it is an IP.
    assert parse(real_client_hello(None, ["h2"])) == ClientHello(None, (b"h2",))
    assert parse(real_client_hello("10.0.0.1")).server_name is None


def test_sni_is_lower_cased() -> None:
    assert parse(built_client_hello(sni_extension(b"Web.Example.COM"))).server_name == "web.example.com"


def test_byte_by_byte_needs_data_until_the_last_byte() -> None:
    data = real_client_hello(MESH_NAME, ["h2"])
    parser = ClientHelloParser()
    for i in range(len(data) - 1):
        assert parser.receive_data(data[i : i + 1]) is NEED_DATA, i
    assert parser.receive_data(data[-1:]) == ClientHello(MESH_NAME, (b"h2",))


def test_bytes_after_the_client_hello_are_ignored() -> None:
    data = real_client_hello(MESH_NAME) + b"\x17\x03\x03\x00\x05early"
    assert parse(data).server_name == MESH_NAME


@pytest.mark.parametrize("fragment_size", [1, 7, 100, 511])
def test_client_hello_spanning_records(fragment_size: int) -> None:
    data = built_client_hello(sni_extension(b"example.com"), alpn_extension(b"h2"), fragment_size=fragment_size)
    assert parse(data, chunk=13) == ClientHello("example.com", (b"h2",))


def test_tls_12_style_hello_without_extensions() -> None:
    data = records(handshake(client_hello_body(extensions=None)))
    assert parse(data) == ClientHello(None, ())


def test_record_version_3_3_is_accepted() -> None:
    data = records(handshake(client_hello_body(extensions=sni_extension(b"a.example"))), version=b"\x03\x03")
    assert parse(data).server_name == "a.example"


@pytest.mark.parametrize(
    "sni",
    [b"10.0.0.1", b"bad name", b"caf\xc3\xa9.example", b"-x.example"],
)
def test_sni_that_is_not_a_dns_name_counts_as_none(sni: bytes) -> None:
    assert parse(built_client_hello(sni_extension(sni))).server_name is None


# Each case: bytes, and the start of the NotClientHello message.
NOT_CLIENT_HELLO = [
    (b"GET / HTTP/1.1\r\n", "TLS record type 71 is not handshake"),
    (b"\x17\x03\x03\x00\x10", "TLS record type 23"),
    (b"\x16\x02", "TLS record major version 2"),
    (b"\x16\x03\x02", "TLS record version 3.2"),
    (b"\x16\x03\x01\x00\x00", "TLS record length 0"),
    (b"\x16\x03\x01\x40\x01", "TLS record length 16385"),
    (records(handshake(client_hello_body(), msg_type=2)), "handshake type 2 is not ClientHello"),
    (b"\x16\x03\x01\x00\x04\x01\x01\x00\x00", "ClientHello length is 64 KiB or more"),
    (records(handshake(client_hello_body(version=0x0301))), "ClientHello version 0x0301"),
    (records(handshake(client_hello_body(session_id=bytes(33)))), "session id is longer than 32"),
    (records(handshake(client_hello_body(suites=b""))), "cipher_suites has an invalid length 0"),
    (records(handshake(client_hello_body(suites=b"\x13"))), "cipher_suites has an invalid length 1"),
    (records(handshake(client_hello_body(compression=b""))), "offers no compression method"),
    (records(handshake(client_hello_body()[:-1] + b"\x05")), "ClientHello is truncated in extensions"),
    (records(handshake(client_hello_body() + b"\x00")), "bytes after its extensions"),
    (records(handshake(bytes(20))), "ClientHello version 0x0000"),
    (built_client_hello(sni_extension(b"a.example"), sni_extension(b"b.example")), "repeats extension 0"),
    (built_client_hello(sni_extension(b"a.example", b"b.example")), "more than one name"),
    (built_client_hello(sni_extension(b"a.example", name_type=1)), "server_name type 1"),
    (built_client_hello(extension(0, b"")), "server_name extension is truncated"),
    (built_client_hello(extension(0, b"\x00\x00\x00")), "server_name extension has bytes after"),
    (built_client_hello(alpn_extension()), "ALPN protocol list is empty"),
    (built_client_hello(alpn_extension(b"h2", b"")), "ALPN protocol name is empty"),
    (built_client_hello(extension(16, b"\x00\x03\x05h2")), "protocol_name_list is truncated"),
    (built_client_hello(b"\x00"), "ClientHello extensions is truncated in extension type"),
]


@pytest.mark.parametrize(("data", "message"), NOT_CLIENT_HELLO, ids=[m for _, m in NOT_CLIENT_HELLO])
def test_not_a_client_hello(data: bytes, message: str) -> None:
    with pytest.raises(NotClientHello, match=message):
        parse(data)


def test_plaintext_is_rejected_on_its_first_byte() -> None:
    with pytest.raises(NotClientHello):
        ClientHelloParser().receive_data(b"G")


def test_eof_before_the_end_is_truncated() -> None:
    data = real_client_hello(MESH_NAME)
    for cut in (0, 1, 5, len(data) // 2, len(data) - 1):
        parser = ClientHelloParser()
        if cut:
            assert parser.receive_data(data[:cut]) is NEED_DATA
        with pytest.raises(TruncatedClientHello, match="closed before the ClientHello was complete"):
            parser.receive_data(b"")


def test_announced_size_over_the_limit_fails_early() -> None:
    body = client_hello_body(extensions=extension(21, bytes(MAX_CLIENT_HELLO_SIZE)))
    data = records(handshake(body), fragment_size=2**14)
    with pytest.raises(ClientHelloTooLarge, match="does not fit in 8192 bytes"):
        ClientHelloParser().receive_data(data[:9])


def test_buffer_is_bounded_even_when_records_keep_coming() -> None:
    # Tiny records make the on-wire size exceed the message size; the buffer cap still holds.
    body = client_hello_body(extensions=extension(21, bytes(4000)))
    data = records(handshake(body), fragment_size=1)
    parser = ClientHelloParser()
    with pytest.raises(ClientHelloTooLarge):
        for i in range(0, len(data), 1000):
            assert parser.receive_data(data[i : i + 1000]) is NEED_DATA


def test_a_smaller_limit() -> None:
    with pytest.raises(ClientHelloTooLarge, match="does not fit in 100 bytes"):
        ClientHelloParser(max_size=100).receive_data(real_client_hello(MESH_NAME))


def test_parser_is_single_use() -> None:
    parser = ClientHelloParser()
    parser.receive_data(real_client_hello(MESH_NAME))
    with pytest.raises(LocalProtocolError):
        parser.receive_data(b"more")
    failed = ClientHelloParser()
    with pytest.raises(NotClientHello):
        failed.receive_data(b"x")
    with pytest.raises(LocalProtocolError):
        failed.receive_data(b"\x16")


def feed_all(data: bytes, cuts: list[int]) -> ClientHello | None:
    """Feed ``data`` split at ``cuts`` and then EOF; returns the hello, or None if it raised."""
    parser = ClientHelloParser()
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    try:
        for start, end in zip(bounds, bounds[1:]):
            answer = parser.receive_data(data[start:end])
            if answer is not NEED_DATA:
                assert isinstance(answer, ClientHello)
                return answer
        parser.receive_data(b"")
    except ClientHelloError:
        return None
    raise AssertionError("EOF must end the parse")


@given(st.binary(max_size=600), st.lists(st.integers(0, 600), max_size=6))
def test_fuzz_random_bytes(data: bytes, cuts: list[int]) -> None:
    feed_all(data, cuts)


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6))
def test_fuzz_bytes_behind_a_plausible_record_header(tail: bytes, cuts: list[int]) -> None:
    feed_all(b"\x16\x03\x01" + tail, cuts)


REAL = real_client_hello(MESH_NAME, ["transport.l5d.io/v1"])


@given(st.integers(0, len(REAL) - 1), st.integers(0, 255), st.lists(st.integers(0, len(REAL)), max_size=4))
def test_fuzz_one_flipped_byte_of_a_real_hello(pos: int, value: int, cuts: list[int]) -> None:
    mutated = REAL[:pos] + bytes([value]) + REAL[pos + 1 :]
    hello = feed_all(mutated, cuts)
    if mutated == REAL:
        assert hello == ClientHello(MESH_NAME, (b"transport.l5d.io/v1",))


@given(st.lists(st.integers(0, len(REAL)), max_size=8))
def test_any_split_of_a_real_hello_gives_the_same_answer(cuts: list[int]) -> None:
    assert feed_all(REAL, cuts) == ClientHello(MESH_NAME, (b"transport.l5d.io/v1",))
