"""``tether.http_response``: the response head every small server writes (the proxy's admin port, the webhooks,
the components' admin port)."""

from __future__ import annotations

from tether.http_response import response


def test_a_response_says_its_type_length_and_whether_the_connection_stays() -> None:
    assert response(200, b"ok\n", "text/plain", keep_alive=True) == (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\nconnection: keep-alive\r\n\r\nok\n")
    assert response(404, b"", "text/plain", keep_alive=False, headers=[("x-a", "1")]) == (
        b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\nx-a: 1\r\ncontent-length: 0\r\n"
        b"connection: close\r\n\r\n")


def test_a_head_answer_has_the_bodys_length_but_not_the_body() -> None:
    assert response(200, b"live\n", "text/plain", keep_alive=False, head_only=True).endswith(
        b"content-length: 5\r\nconnection: close\r\n\r\n")


def test_a_204_has_no_length_and_no_body() -> None:
    assert response(204, b"ignored", "text/plain", keep_alive=True) == (
        b"HTTP/1.1 204 No Content\r\ncontent-type: text/plain\r\nconnection: keep-alive\r\n\r\n")
