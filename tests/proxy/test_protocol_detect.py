"""tether.proxy.codec.detect: verdicts from first bytes, timeouts and EOF, TLS then HTTP."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxy_tls_helpers import built_client_hello, extension, real_client_hello, sni_extension

from tether.proxy.codec.client_hello import ClientHello
from tether.proxy.codec.common import NEED_DATA, LocalProtocolError
from tether.proxy.codec.detect import (
    Closed,
    Detector,
    Http1,
    Http2,
    Opaque,
    ReadTimeout,
    Tls,
    TlsTimeout,
    Verdict,
)

MESH_NAME = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# (first read, verdict) for an HTTP-only detector: Linkerd decides on that one read.
FIRST_READ = [
    (H2_PREFACE, Http2()),
    (b"PRI * HTTP/2.0", Http2()),  # the 14 bytes Linkerd compares are enough
    (b"GET / HTTP/1.1\r\nHost: web\r\n\r\n", Http1()),
    (b"GET / HTTP/1.1", Http1()),  # 14 bytes, valid so far
    (b"POST /a/very/long/path/that/keeps", Http1()),
    (b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\n", Http1()),  # only the first 1024 bytes are looked at
    (b"GET / HTTP/1.", Opaque()),  # 13 bytes: too short to tell
    (b"GET /", Opaque()),
    (b"PRI * HTTP/2", Opaque()),
    (b"x", Opaque()),
    (b"SSH-2.0-OpenSSH_9.6\r\n", Opaque()),
    (b"*1\r\n$4\r\nPING\r\n", Opaque()),
    (b"GET / HTTP/3.0\r\n\r\n", Opaque()),
    (real_client_hello(MESH_NAME), Opaque()),  # outbound: TLS from the app is opaque to HTTP sniffing
]


@pytest.mark.parametrize(("data", "verdict"), FIRST_READ)
def test_http_detection_on_the_first_read(data: bytes, verdict: Verdict) -> None:
    assert Detector(tls=False).receive_data(data) == verdict


def test_http_detection_reads_once() -> None:
    # "GET " then the rest: Linkerd's single read saw 4 bytes, so not HTTP.
    assert Detector(tls=False).receive_data(b"GET ") == Opaque()


def test_http_timeouts_and_eof() -> None:
    assert Detector(tls=False).on_timeout() == ReadTimeout()
    assert Detector(tls=False).receive_data(b"") == Closed()


def test_tls_client_hello_with_sni() -> None:
    data = real_client_hello(MESH_NAME, ["transport.l5d.io/v1"])
    verdict = Detector(tls=True).receive_data(data)
    assert verdict == Tls(ClientHello(MESH_NAME, (b"transport.l5d.io/v1",)))


def test_tls_client_hello_arriving_in_pieces() -> None:
    data = real_client_hello("other.example", ["h2"])
    chunks = [data[i : i + 10] for i in range(0, len(data), 10)]
    detector = Detector(tls=True)
    assert [detector.receive_data(c) for c in chunks[:-1]] == [NEED_DATA] * (len(chunks) - 1)
    assert detector.receive_data(chunks[-1]) == Tls(ClientHello("other.example", (b"h2",)))


def test_tls_without_sni_is_opaque() -> None:
    # Linkerd counts a ClientHello without SNI as "no TLS", and its bytes are not HTTP.
    assert Detector(tls=True).receive_data(real_client_hello(None)) == Opaque()


def test_tls_mode_falls_back_to_http_sniffing() -> None:
    assert Detector(tls=True).receive_data(b"GET / HTTP/1.1\r\nHost: web\r\n\r\n") == Http1()
    assert Detector(tls=True).receive_data(H2_PREFACE) == Http2()
    assert Detector(tls=True).receive_data(b"hello, world!!!") == Opaque()
    assert Detector(tls=True).receive_data(b"GET /") == Opaque()


def test_tls_mode_eof() -> None:
    assert Detector(tls=True).receive_data(b"") == Closed()
    # A ClientHello cut short by EOF: what arrived is sniffed, and TLS bytes are not HTTP.
    detector = Detector(tls=True)
    assert detector.receive_data(real_client_hello(MESH_NAME)[:50]) is NEED_DATA
    assert detector.receive_data(b"") == Opaque()


def test_tls_mode_timeout_closes_even_mid_hello() -> None:
    assert Detector(tls=True).on_timeout() == TlsTimeout()
    detector = Detector(tls=True)
    assert detector.receive_data(b"\x16\x03\x01") is NEED_DATA
    assert detector.on_timeout() == TlsTimeout()


def test_tls_mode_oversized_hello_is_not_tls() -> None:
    data = built_client_hello(sni_extension(b"a.example"), extension(21, bytes(9000)), fragment_size=2**14)
    assert Detector(tls=True).receive_data(data) == Opaque()


def test_detector_is_single_use() -> None:
    detector = Detector(tls=False)
    detector.receive_data(H2_PREFACE)
    with pytest.raises(LocalProtocolError, match="already decided"):
        detector.receive_data(b"more")
    with pytest.raises(LocalProtocolError):
        detector.on_timeout()


VERDICTS = (Http1, Http2, Opaque, Tls, Closed)


def run(tls: bool, data: bytes, cuts: list[int]) -> Verdict:
    detector = Detector(tls=tls)
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for start, end in zip(bounds, bounds[1:]):
        answer = detector.receive_data(data[start:end])
        if answer is not NEED_DATA:
            return answer
    answer = detector.receive_data(b"")
    assert answer is not NEED_DATA, "EOF must give a verdict"
    return answer


@given(st.booleans(), st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=5))
def test_fuzz_always_a_verdict(tls: bool, data: bytes, cuts: list[int]) -> None:
    verdict = run(tls, data, cuts)
    assert isinstance(verdict, VERDICTS)
    if not data:
        assert verdict == Closed()


@given(st.lists(st.integers(0, 600), max_size=6))
def test_any_split_of_a_client_hello_is_tls(cuts: list[int]) -> None:
    data = real_client_hello(MESH_NAME)
    assert run(True, data, cuts) == Tls(ClientHello(MESH_NAME, ()))
