"""The HTTP/1 path's shortcuts (fewer Python calls per request): each against the general branch it skips.

A shortcut must give what the general code gives: a plain response head goes down as the same object, only
when nothing in it is to change (nginx's ``Connection: keep-alive`` only where it says nothing); ``request_total``'s series kept for the response counts where a lookup would;
a plaintext stream is read without ``READ_BUFFER``, a TLS one with it.
"""

from __future__ import annotations

import asyncio

from proxy_harness import parse_metrics, samples

from tether.proxy.codec.http1 import Http1Connection, RequestHead, ResponseHead, Role, scan_framing
from tether.proxy.core.http import HttpSettings
from tether.proxy.core.http1_headers import downstream_response, end_to_end
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.io.streams import Stream


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


SETTINGS = HttpSettings(direction="outbound", clock=Clock(), strip_proxy_errors=True)
GET = b"GET / HTTP/1.1\r\nhost: web\r\n\r\n"


def _response(raw: bytes, request: bytes = GET) -> tuple[RequestHead, ResponseHead]:
    """The request and response heads as the codecs of a proxy's two connections read them."""
    server = Http1Connection(Role.SERVER)
    request_head = server.receive_data(request)[0]
    assert isinstance(request_head, RequestHead)
    client = Http1Connection(Role.CLIENT)
    client.send_head(request_head)
    head = client.receive_data(raw)[0]
    assert isinstance(head, ResponseHead)
    return request_head, head


def test_a_plain_response_head_goes_down_as_the_same_object() -> None:
    request, head = _response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\r\n\r\nok")
    assert downstream_response(head, request, True, SETTINGS) is head


def test_nginxs_connection_keep_alive_goes_down_as_it_came_only_where_it_says_nothing() -> None:
    """To an HTTP/1.1 client whose connection stays open, ``Connection: keep-alive`` is the proxy's own option
    too (RFC 9110 §7.6.1): the head's bytes go on. Otherwise, and for any other Connection value, it is dropped."""
    nginx = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"
    request, head = _response(nginx)
    assert not head.rewrite and head.found == {b"content-length": [b"2"], b"connection": [b"keep-alive"]}
    assert downstream_response(head, request, True, SETTINGS) is head
    server = Http1Connection(Role.SERVER)
    server.receive_data(GET)
    assert server.send_head(head) == nginx[:-2] and server.keep_alive  # its bytes, and the connection stays
    # The client's connection closes after this response: keep-alive would contradict the close added.
    down = downstream_response(head, request, False, SETTINGS)
    assert down.headers == ((b"Server", b"nginx"), (b"Content-Length", b"2"), (b"connection", b"close"))
    # An HTTP/1.0 client: the proxy's own keep-alive line, once.
    request, head = _response(nginx, b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
    down = downstream_response(head, request, True, SETTINGS)
    assert down.headers == ((b"Server", b"nginx"), (b"Content-Length", b"2"), (b"connection", b"keep-alive"))
    # An HTTP/1.0 response: filtered (and sent as HTTP/1.1).
    request, head = _response(nginx.replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    down = downstream_response(head, request, True, SETTINGS)
    assert down.headers == ((b"Server", b"nginx"), (b"Content-Length", b"2")) and down.version == b"1.1"
    # Anything else in Connection, or another hop-by-hop header beside it, is to be rewritten: dropped.
    for other in (b"Connection: keep-alive, x-a\r\nx-a: 1", b"Connection: Upgrade",
                  b"Connection: keep-alive\r\nKeep-Alive: timeout=5"):
        request, head = _response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n%s\r\n\r\nok" % other)
        assert head.rewrite
        assert downstream_response(head, request, True, SETTINGS).headers == ((b"Content-Length", b"2"),)
    # A request's Connection: keep-alive is to be rewritten (upstream, over HTTP/2 too, it has no place).
    request, _ = _response(nginx, b"GET / HTTP/1.1\r\nhost: web\r\nconnection: keep-alive\r\n\r\n")
    assert request.rewrite


def test_a_response_head_with_something_to_change_is_a_new_one() -> None:
    """Each condition of the shortcut, failed once: the general branch answers, and what it answers differs."""
    # Hop-by-hop: the line dropped (nginx's keep-alive, where it says something: the test above).
    request, head = _response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nte: trailers\r\n\r\nok")
    down = downstream_response(head, request, True, SETTINGS)
    assert down is not head and down.headers == ((b"content-length", b"2"),)
    # The client's connection closes after it: connection: close added.
    request, head = _response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    down = downstream_response(head, request, False, SETTINGS)
    assert down is not head and (b"connection", b"close") in down.headers
    # No length for an HTTP/1.1 client: re-framed as chunked.
    request, head = _response(b"HTTP/1.1 200 OK\r\nx-a: 1\r\n\r\nok")
    down = downstream_response(head, request, True, SETTINGS)
    assert down is not head and (b"transfer-encoding", b"chunked") in down.headers
    # An HTTP/1.0 response, an HTTP/1.0 client: a 1.1 head, the keep-alive said.
    request, head = _response(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok")
    down = downstream_response(head, request, True, SETTINGS)
    assert down is not head and down.version == b"1.1"
    request, head = _response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                              b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
    down = downstream_response(head, request, True, SETTINGS)
    assert down is not head and (b"connection", b"keep-alive") in down.headers
    # The remote proxy's error header: not for the app.
    request, head = _response(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nl5d-proxy-error: x\r\n\r\n")
    down = downstream_response(head, request, True, SETTINGS)
    assert down is not head and down.headers == ((b"content-length", b"0"),)


def test_end_to_end_finds_the_connection_listed_names_itself_or_takes_the_codecs() -> None:
    headers = ((b"Host", b"web"), (b"Connection", b"X-Gone, keep-alive"), (b"x-gone", b"1"), (b"X-Kept", b"2"),
               (b"Keep-Alive", b"timeout=5"))
    kept = ((b"Host", b"web"), (b"X-Kept", b"2"))
    assert end_to_end(headers) == kept
    assert end_to_end(headers, found=scan_framing(headers)) == kept
    assert end_to_end(headers, frozenset({b"x-gone"})) == ((b"Host", b"web"), (b"x-gone", b"1"), (b"X-Kept", b"2"))


def test_the_series_kept_from_the_request_counts_the_response() -> None:
    clock = Clock()
    metrics = HttpMetrics(clock, 600.0)
    labels = 'direction="outbound"'
    series = metrics.request(labels)
    metrics.response(labels, 200, True, 3, series=series)
    metrics.response(labels, 200, True, 3)  # looked up: the same series
    out: list[str] = []
    metrics.render(out)
    parsed = parse_metrics("\n".join(out))
    assert samples(parsed, "request_total") == [({"direction": "outbound"}, 1.0)]
    assert [v for _, v in samples(parsed, "response_total", status_code="200")] == [2.0]


def test_a_kept_series_that_expired_meanwhile_is_not_counted_into() -> None:
    """The series went at a scrape while the request was in flight: the response makes a new one (as a lookup
    would), so it is printed; counting into the dropped object would lose it."""
    clock = Clock()
    metrics = HttpMetrics(clock, 10.0)
    labels = 'direction="inbound"'
    series = metrics.request(labels)
    clock.now = 60.0
    metrics.render([])  # expires the series
    metrics.response(labels, 200, True, 3, series=series)
    other = metrics.request('direction="outbound"')
    metrics.response(labels, 503, False, 3, series=other)  # another label set's series: not counted into it
    out: list[str] = []
    metrics.render(out)
    parsed = parse_metrics("\n".join(out))
    statuses = {labels_["status_code"]: v for labels_, v in samples(parsed, "response_total", direction="inbound")}
    assert statuses == {"200": 1.0, "503": 1.0}
    assert not samples(parsed, "response_total", direction="outbound")


def test_plaintext_streams_are_read_without_the_shared_buffer_tls_ones_with_it() -> None:
    loop = asyncio.new_event_loop()
    try:
        plain, tls = Stream(loop), Stream(loop, tls=True)
        assert not isinstance(plain, asyncio.BufferedProtocol) and not plain.tls
        assert isinstance(tls, asyncio.BufferedProtocol) and isinstance(tls, Stream) and tls.tls
    finally:
        loop.close()
