"""tether.proxy.codec.request_line: httparse's verdict with zero header slots, case by case."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.proxy.codec.request_line import looks_like_http1_request

HTTP1 = [
    b"GET / HTTP/1.1\r\n\r\n",  # complete
    b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",  # too many headers
    b"GET / HTTP/1.1\nHost: example.com\n",  # bare LF line ends
    b"GET / HTTP/1.1\r\nHost: exa",  # partial header
    b"GET / HTTP/1.1\r\nHost:",
    b"GET / HTTP/1.1\r\nX-Empty:\r\n",
    b"GET / HTTP/1.1\r\nX-Tab:\t a b\t\r\n",
    b"GET / HTTP/1.1\r\n",
    b"GET / HTTP/1.1\r",
    b"GET / HTTP/1.1",  # 14 bytes, no line end yet
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET /very/long/path?x=1",  # valid so far
    b"GET / HTTP/1.",  # a short version that matches so far
    b"GET / HT",
    b"POST /api HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    b"PROPFIND /dav HTTP/1.1\r\n",
    b"M-SEARCH * HTTP/1.1\r\n",
    b"get / HTTP/1.1\r\n",  # method case is not checked
    b"CONNECT example.com:443 HTTP/1.1\r\n",
    b"OPTIONS * HTTP/1.1\r\n",
    b"GET http://example.com/a?b=c#d HTTP/1.1\r\n",
    b"GET /caf\xc3\xa9 HTTP/1.1\r\n",  # obs-text in the target
    b"GET /\"{}|^` HTTP/1.1\r\n",
    b"\r\n\r\nGET / HTTP/1.1\r\n",  # leading empty lines are skipped
    b"\n\nGET / HTTP/1.1\r\n",
    b"\r",
    b"",
]

NOT_HTTP1 = [
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2 is not an HTTP/1 version
    b"GET / HTTP/2.0\r\n",
    b"GET / HTTP/1.2\r\n",
    b"GET / HTTP/1.1 \r\n",
    b"GET / HTTQ",
    b"GET  / HTTP/1.1\r\n",  # two spaces: an empty target
    b"GET /  HTTP/1.1\r\n",
    b"GET\t/ HTTP/1.1\r\n",
    b"G(T / HTTP/1.1\r\n",  # "(" is a delimiter, not a token character
    b" GET / HTTP/1.1\r\n",
    b"GET /a\x00b HTTP/1.1\r\n",
    b"GET /a\x7fb HTTP/1.1\r\n",
    b"GET /\r\n",  # HTTP/0.9
    b"GET / HTTP/1.1\rX",
    b"\rX",
    b"GET / HTTP/1.1\r\n Host: folded\r\n",  # a header line may not start with space
    b"GET / HTTP/1.1\r\nHost : x\r\n",  # no space before the colon
    b"GET / HTTP/1.1\r\nBad\x01Name: x\r\n",
    b"GET / HTTP/1.1\r\nHost: a\x00b\r\n",
    b"GET / HTTP/1.1\r\nHost: a\rb\r\n",
    b"GET / HTTP/1.1\r\n\rX",
    b"SSH-2.0-OpenSSH_9.6\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    b"*1\r\n$4\r\nPING\r\n",  # Redis
]


@pytest.mark.parametrize("data", HTTP1)
def test_http1(data: bytes) -> None:
    assert looks_like_http1_request(data)


@pytest.mark.parametrize("data", NOT_HTTP1)
def test_not_http1(data: bytes) -> None:
    assert not looks_like_http1_request(data)


def test_every_prefix_of_a_request_counts() -> None:
    request = b"\r\nGET /index.html HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"
    assert all(looks_like_http1_request(request[:i]) for i in range(len(request) + 1))


@given(st.binary(max_size=200))
def test_fuzz_never_raises(data: bytes) -> None:
    assert looks_like_http1_request(data) in (True, False)


@given(st.binary(max_size=64))
def test_anything_after_the_first_header_is_ignored(tail: bytes) -> None:
    assert looks_like_http1_request(b"GET / HTTP/1.1\r\nHost: a\r\n" + tail)
