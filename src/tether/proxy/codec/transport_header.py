"""The opaque-transport header: encoder and sans-IO decoder (proxy.md §6).

Sent inside the mTLS session as the first application bytes, when ALPN
``transport.l5d.io/v1`` was negotiated::

    "transport.l5d.io/v1\\r\\n\\r\\n"  u32 big-endian length  transport.l5d.io.Header (protobuf)  app bytes...

The outbound endpoint layer calls ``encode``; the inbound direct stack (port
4143) feeds the session's first bytes to ``TransportHeaderDecoder``, which
answers ``NEED_DATA``, ``NoHeader`` (the bytes do not start with the preface)
or ``HeaderReceived`` with the bytes that followed the header (application
data). As in Linkerd, EOF before the preface and length are complete is
``NoHeader``; a length above 64 KiB, EOF inside the message, an undecodable
message, a port outside 1–65535 or a name that is not a DNS name raise
``TransportHeaderError``. The read timeout belongs to the caller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from tether.api import transport_pb2
from tether.ports import MAX_PORT, MIN_PORT, is_port
from tether.proxy.codec.addrs import is_dns_name
from tether.proxy.codec.common import NEED_DATA, LocalProtocolError, NeedData, RemoteProtocolError

ALPN_PROTOCOL = b"transport.l5d.io/v1"
PREFACE = ALPN_PROTOCOL + b"\r\n\r\n"
_LENGTH_SIZE = 4
# Linkerd bounds the message by its 64 KiB read buffer.
MAX_HEADER_LENGTH = 64 * 1024


class SessionProtocol(enum.Enum):
    """The protocol inside the connection, when the client knows it; absent means opaque TCP."""

    HTTP1 = "http1"
    HTTP2 = "http2"


@dataclass(frozen=True, slots=True)
class TransportHeader:
    """Where the peer proxy should send the connection, and what it carries.

    ``port`` is the target port (1–65535); ``name`` a target DNS name, set only for
    gateway forwarding; ``protocol`` None for opaque TCP.
    """

    port: int
    name: str | None = None
    protocol: SessionProtocol | None = None


@dataclass(frozen=True, slots=True)
class NoHeader:
    """The connection does not start with a transport header."""


@dataclass(frozen=True, slots=True)
class HeaderReceived:
    """A complete header, and the application bytes that came after it in the same reads."""

    header: TransportHeader
    trailing_data: bytes


class TransportHeaderError(RemoteProtocolError):
    """The peer sent a transport header that is too long, cut short or invalid."""


def encode(header: TransportHeader) -> bytes:
    """Preface, length and message for ``header``; raises ``LocalProtocolError`` if it is invalid."""
    problem = _problem(header.port, header.name)
    if problem is not None:
        raise LocalProtocolError(f"cannot send transport header: {problem}")
    message = transport_pb2.Header(port=header.port, name=header.name or "")
    if header.protocol is SessionProtocol.HTTP1:
        message.session_protocol.http1.SetInParent()
    elif header.protocol is SessionProtocol.HTTP2:
        message.session_protocol.http2.SetInParent()
    body: bytes = message.SerializeToString(deterministic=True)
    return PREFACE + len(body).to_bytes(_LENGTH_SIZE) + body


class TransportHeaderDecoder:
    """Reads one transport header from the start of a session; single use."""

    def __init__(self, max_length: int = MAX_HEADER_LENGTH) -> None:
        self._max_length = max_length
        self._buffer = bytearray()
        self._length: int | None = None  # known once the preface and length are in
        self._done = False

    def receive_data(self, data: bytes) -> NeedData | NoHeader | HeaderReceived:
        """Feed the next bytes (``b""`` = EOF); raises ``TransportHeaderError`` on a bad header."""
        if self._done:
            raise LocalProtocolError("TransportHeaderDecoder already finished")
        try:
            answer = self._receive(data)
        except TransportHeaderError:
            self._done = True
            raise
        self._done = answer is not NEED_DATA
        return answer

    def _receive(self, data: bytes) -> NeedData | NoHeader | HeaderReceived:
        if not data:
            if self._length is None:
                return NoHeader()
            raise TransportHeaderError(
                f"connection closed after {len(self._buffer)} of the header's {self._length} bytes"
            )
        self._buffer += data
        if self._length is None:
            seen = self._buffer[: len(PREFACE)]
            # Any byte off the preface settles it; no need to wait for all 27.
            if seen != PREFACE[: len(seen)]:
                return NoHeader()
            if len(self._buffer) < len(PREFACE) + _LENGTH_SIZE:
                return NEED_DATA
            self._length = int.from_bytes(self._buffer[len(PREFACE) : len(PREFACE) + _LENGTH_SIZE])
            if self._length > self._max_length:
                raise TransportHeaderError(
                    f"transport header length {self._length} exceeds the limit of {self._max_length} bytes"
                )
            del self._buffer[: len(PREFACE) + _LENGTH_SIZE]
        if len(self._buffer) < self._length:
            return NEED_DATA
        header = _decode_message(bytes(self._buffer[: self._length]))
        return HeaderReceived(header, bytes(self._buffer[self._length :]))


def _decode_message(body: bytes) -> TransportHeader:
    try:
        message = transport_pb2.Header.FromString(body)
    except DecodeError as err:
        raise TransportHeaderError(f"transport header is not a valid transport.l5d.io.Header: {err}") from None
    problem = _problem(message.port, message.name or None)
    if problem is not None:
        raise TransportHeaderError(f"invalid transport header: {problem}")
    # A session_protocol with neither kind set counts as absent, as in Linkerd.
    kind = message.session_protocol.WhichOneof("kind") if message.HasField("session_protocol") else None
    return TransportHeader(
        port=message.port,
        name=message.name.lower() or None,
        protocol=SessionProtocol(kind) if kind else None,
    )


def _problem(port: int, name: str | None) -> str | None:
    """What makes a header invalid on the wire, in either direction; None if nothing."""
    if not is_port(port):
        return f"port {port} is outside {MIN_PORT}-{MAX_PORT}"
    if name is not None and not is_dns_name(name):
        return f"name {name!r} is not a valid DNS name"
    return None
