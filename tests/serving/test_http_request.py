"""``tether.http_request``: the request rules the proxy's admin port, the webhooks and the admin ports share.

``parse_head`` and ``body_length`` are pure; ``read_request`` runs over a real
loopback connection (asyncio streams), as its callers use it.
"""

from __future__ import annotations

import asyncio

import pytest

from tether.http_request import HttpError, Request, body_length, parse_head, read_request


def test_the_head_gives_method_path_query_version_and_joined_headers() -> None:
    request = parse_head(b"PUT /env.json?A&B HTTP/1.1\r\nHost: admin\r\nX-A: 1\r\nx-a:  2 \r\n\r\n")
    assert request == Request("PUT", "/env.json", "A&B", "HTTP/1.1", {"host": "admin", "x-a": "1, 2"})
    assert request.keep_alive
    assert not parse_head(b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").keep_alive
    assert not parse_head(b"GET / HTTP/1.0\r\n\r\n").keep_alive  # HTTP/1.0 closes unless asked to keep alive
    assert parse_head(b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").keep_alive


@pytest.mark.parametrize("head", [b"GET /\r\n\r\n", b"GET / HTTP/2\r\n\r\n", b"GET  / HTTP/1.1\r\n\r\n",
                                  b"GET / HTTP/1.1\r\nno-colon\r\n\r\n", b"GET / HTTP/1.1\r\nhost : x\r\n\r\n",
                                  b"GET / HTTP/1.1\r\n: x\r\n\r\n"])
def test_a_bad_request_line_or_header_is_400(head: bytes) -> None:
    with pytest.raises(HttpError) as caught:
        parse_head(head)
    assert caught.value.status == 400


@pytest.mark.parametrize(("headers", "status"), [("transfer-encoding: chunked\r\n", 411),
                                                 ("content-length: x\r\n", 400), ("content-length: 11\r\n", 413)])
def test_bodies_are_refused_by_framing_and_size(headers: str, status: int) -> None:
    with pytest.raises(HttpError) as caught:
        body_length(parse_head(f"POST / HTTP/1.1\r\n{headers}\r\n".encode()), 10)
    assert caught.value.status == status
    assert body_length(parse_head(b"POST / HTTP/1.1\r\ncontent-length: 10\r\n\r\n"), 10) == 10


def _over_loopback(sent: bytes, *, limit: int = 1024) -> list[Request | int | None]:
    """Every ``read_request`` outcome on a connection that sent ``sent`` and closed: requests, then None or
    the status of the HttpError that ended it."""
    outcomes: list[Request | int | None] = []

    async def scenario() -> None:
        done = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    try:
                        request = await read_request(reader, 10)
                    except HttpError as exc:
                        outcomes.append(exc.status)
                        return
                    outcomes.append(request)
                    if request is None:
                        return
            finally:
                writer.close()
                done.set()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, limit=limit)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        writer.write_eof()
        await done.wait()
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
    return outcomes


def test_requests_are_read_one_after_another_with_their_bodies() -> None:
    outcomes = _over_loopback(b"POST /a HTTP/1.1\r\ncontent-length: 3\r\n\r\nabcGET /b?x HTTP/1.1\r\n\r\n")
    assert outcomes == [Request("POST", "/a", "", "HTTP/1.1", {"content-length": "3"}, b"abc"),
                        Request("GET", "/b", "x", "HTTP/1.1", {}), None]


@pytest.mark.parametrize(("sent", "status"), [
    (b"GET / HTTP/1.1\r\nhost: x", 400),  # closed inside the head
    (b"POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\nab", 400),  # closed inside the body
    (b"GET / HTTP/1.1\r\nx: " + b"y" * 2048 + b"\r\n\r\n", 431),  # over the stream's limit
])
def test_what_is_not_read_whole_is_refused_with_its_status(sent: bytes, status: int) -> None:
    assert _over_loopback(sent) == [status]
