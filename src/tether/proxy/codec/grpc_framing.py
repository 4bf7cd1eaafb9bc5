"""gRPC's message framing on an HTTP/2 stream (sans-IO): a flag byte, a 4-byte big-endian length, the message.

``frame(message)`` makes one uncompressed frame; ``MessageReader`` takes a
stream's DATA bytes in whatever pieces they come and gives back the whole
messages, refusing a compressed one (no encoding is ever negotiated) and one
above its ``max_message`` (gRPC's default is 4 MiB) with a ``FramingError``
that says which gRPC status the call ends with.

Callers: ``io.grpc_client`` (the proxy's control-plane calls) and
``io.grpc_server`` (the tap server).
"""

from __future__ import annotations

PREFIX = 5
MAX_MESSAGE = 4 * 1024 * 1024
# The gRPC status codes a framing error ends a call with (io.grpc_client.Code holds them all).
INTERNAL = 13
RESOURCE_EXHAUSTED = 8


class FramingError(ValueError):
    """A frame the reader refuses; ``code`` is the gRPC status the call ends with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


class MessageReader:
    """The messages of one direction of one call, from its DATA bytes."""

    __slots__ = ("buffer", "max_message")

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self.buffer = bytearray()
        self.max_message = max_message

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes (none while one is still partial); raises ``FramingError``."""
        buffer = self.buffer
        buffer += data
        messages: list[bytes] = []
        while len(buffer) >= PREFIX:
            if buffer[0] != 0:
                raise FramingError(INTERNAL, "compressed message without a negotiated encoding")
            size = int.from_bytes(buffer[1:PREFIX], "big")
            if size > self.max_message:
                raise FramingError(RESOURCE_EXHAUSTED, f"message of {size} bytes above {self.max_message}")
            if len(buffer) < PREFIX + size:
                break
            messages.append(bytes(buffer[PREFIX : PREFIX + size]))
            del buffer[: PREFIX + size]
        return messages

    @property
    def partial(self) -> int:
        """Bytes of a message not yet whole (a call that ends here ended inside a message)."""
        return len(self.buffer)
