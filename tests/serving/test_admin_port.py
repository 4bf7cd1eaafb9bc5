"""``tether.admin``: the components' admin port reads its request with ``tether.http_request`` (real loopback)."""

from __future__ import annotations

import asyncio

from tether.admin import AdminServer


def _exchange(sent: bytes) -> bytes:
    async def scenario() -> bytes:
        admin = AdminServer(lambda: b"", lambda: True)
        port = await admin.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(sent)
            answer = await reader.read()
            writer.close()
            return answer
        finally:
            await admin.stop()

    return asyncio.run(scenario())


def test_a_request_is_answered_and_junk_is_not() -> None:
    assert _exchange(b"GET /live?x=1 HTTP/1.1\r\nhost: a\r\n\r\n").startswith(b"HTTP/1.1 200 OK\r\n")
    assert _exchange(b"HEAD /nope HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert _exchange(b"GET /live\r\n\r\n") == b""  # no HTTP version: not a request this port answers
