"""Incremental TLS ClientHello parser: is this TLS, and which SNI and ALPN does the client ask for?

Fed the first bytes of a connection, ``ClientHelloParser.receive_data`` answers
``NEED_DATA`` until it has the whole ClientHello handshake message, then a
``ClientHello``. It raises ``NotClientHello`` as soon as a byte shows the stream
is not a TLS ClientHello, so plaintext is rejected on its first byte.

The checks are Linkerd's (proxy.md §5.4, ``linkerd/tls/src/server/client_hello.rs``):
record type 22, record version 3.1 or 3.3, handshake type 1 (ClientHello), a
handshake length below 64 KiB, client version 3.3 (TLS 1.2, which TLS 1.3 also
sends). Unlike Linkerd, a ClientHello split across several records is
reassembled, and the whole message is checked, not just up to the SNI.

The buffer is bounded (8 KiB, Linkerd's TLS detection buffer): a ClientHello that
does not fit raises ``ClientHelloTooLarge``, and Linkerd then treats the
connection as not TLS.

Caller: ``tether.proxy.codec.detect``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.proxy.codec.addrs import is_dns_name
from tether.proxy.codec.common import NEED_DATA, LocalProtocolError, NeedData, RemoteProtocolError

MAX_CLIENT_HELLO_SIZE = 8192

_RECORD_HEADER = 5
_HANDSHAKE_HEADER = 4
_MAX_RECORD_FRAGMENT = 2**14  # RFC 8446 §5.1
_CONTENT_HANDSHAKE = 22
_HANDSHAKE_CLIENT_HELLO = 1
_EXT_SERVER_NAME = 0
_EXT_ALPN = 16
_NAME_TYPE_HOST_NAME = 0


class ClientHelloError(RemoteProtocolError):
    """The bytes are not a ClientHello this proxy can read; Linkerd then treats the stream as not TLS."""


class NotClientHello(ClientHelloError):
    """The bytes are not a (well-formed) TLS ClientHello."""


class ClientHelloTooLarge(ClientHelloError):
    """The ClientHello does not fit in the parser's buffer."""


class TruncatedClientHello(ClientHelloError):
    """EOF came before the ClientHello was complete."""


@dataclass(frozen=True, slots=True)
class ClientHello:
    """What the proxy needs from a ClientHello.

    ``server_name`` is the SNI host name in lower case, or None when the client
    sent none, or one that is not a valid DNS name (Linkerd counts both as "no SNI").
    ``alpn_protocols`` lists the offered ALPN protocol ids in the client's order.
    """

    server_name: str | None
    alpn_protocols: tuple[bytes, ...]


class ClientHelloParser:
    """Parses one ClientHello from a stream's first bytes; single use."""

    def __init__(self, max_size: int = MAX_CLIENT_HELLO_SIZE) -> None:
        self._max_size = max_size
        self._received = 0
        self._records = bytearray()  # raw bytes not yet split into records
        self._handshake = bytearray()  # record payloads joined: the handshake message
        self._done = False

    def receive_data(self, data: bytes) -> NeedData | ClientHello:
        """Feed the next bytes (``b""`` = EOF); returns ``NEED_DATA`` or the ``ClientHello``.

        Raises a ``ClientHelloError`` when the stream is not a readable ClientHello.
        Once it has answered or raised, the parser is finished.
        """
        if self._done:
            raise LocalProtocolError("ClientHelloParser already finished")
        try:
            return self._receive(data)
        except ClientHelloError:
            self._done = True
            raise

    def _receive(self, data: bytes) -> NeedData | ClientHello:
        if not data:
            raise TruncatedClientHello("connection closed before the ClientHello was complete")
        room = self._max_size - self._received
        overflow = len(data) > room
        data = data[:room]
        self._received += len(data)
        self._records += data
        hello = self._take_records()
        if hello is not None:
            self._done = True
            return hello
        if overflow or self._received >= self._max_size:
            raise ClientHelloTooLarge(f"ClientHello does not fit in {self._max_size} bytes")
        return NEED_DATA

    def _take_records(self) -> ClientHello | None:
        """Move complete records into the handshake buffer; parse once the message is whole."""
        while self._records:
            _check_record_header(self._records)
            if len(self._records) < _RECORD_HEADER:
                return None
            length = int.from_bytes(self._records[3:5])
            if not 0 < length <= _MAX_RECORD_FRAGMENT:
                raise NotClientHello(f"TLS record length {length} is outside 1-{_MAX_RECORD_FRAGMENT}")
            # Known from the header alone: fail now rather than buffer up to the limit first.
            record_start = self._received - len(self._records)
            if record_start + _RECORD_HEADER + length > self._max_size:
                raise ClientHelloTooLarge(f"TLS record of {length} bytes does not fit in {self._max_size} bytes")
            if len(self._records) < _RECORD_HEADER + length:
                return None
            self._handshake += self._records[_RECORD_HEADER : _RECORD_HEADER + length]
            del self._records[: _RECORD_HEADER + length]
            hello = self._parse_handshake()
            if hello is not None:
                # Bytes after the ClientHello belong to the TLS session, not to us.
                return hello
        return None

    def _parse_handshake(self) -> ClientHello | None:
        hs = self._handshake
        if hs[0] != _HANDSHAKE_CLIENT_HELLO:
            raise NotClientHello(f"handshake type {hs[0]} is not ClientHello (1)")
        # The length is 24 bits, but no real client sends 64 KiB or more (Linkerd's check).
        if len(hs) >= 2 and hs[1] != 0:
            raise NotClientHello("ClientHello length is 64 KiB or more")
        if len(hs) < _HANDSHAKE_HEADER:
            return None
        length = int.from_bytes(hs[1:4])
        if _RECORD_HEADER + _HANDSHAKE_HEADER + length > self._max_size:
            raise ClientHelloTooLarge(f"ClientHello of {length} bytes does not fit in {self._max_size} bytes")
        if len(hs) < _HANDSHAKE_HEADER + length:
            return None
        return _parse_body(bytes(hs[_HANDSHAKE_HEADER : _HANDSHAKE_HEADER + length]))


def _check_record_header(buf: bytearray) -> None:
    """Reject a record header as soon as any of its first three bytes is wrong."""
    if buf[0] != _CONTENT_HANDSHAKE:
        raise NotClientHello(f"TLS record type {buf[0]} is not handshake (22)")
    if len(buf) >= 2 and buf[1] != 3:
        raise NotClientHello(f"TLS record major version {buf[1]} is not 3")
    if len(buf) >= 3 and buf[2] not in (1, 3):
        raise NotClientHello(f"TLS record version 3.{buf[2]} is neither 3.1 nor 3.3")


class _Reader:
    """Reads big-endian integers and length-prefixed vectors from a complete message."""

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._pos = 0
        self._what = what

    def at_end(self) -> bool:
        return self._pos == len(self._data)

    def take(self, n: int, field: str) -> bytes:
        if self._pos + n > len(self._data):
            raise NotClientHello(f"{self._what} is truncated in {field}")
        chunk = self._data[self._pos : self._pos + n]
        self._pos += n
        return chunk

    def uint(self, size: int, field: str) -> int:
        return int.from_bytes(self.take(size, field))

    def vector(self, length_size: int, field: str) -> bytes:
        return self.take(self.uint(length_size, field), field)


def _parse_body(body: bytes) -> ClientHello:
    r = _Reader(body, "ClientHello")
    version = r.uint(2, "legacy_version")
    if version != 0x0303:
        raise NotClientHello(f"ClientHello version {version:#06x} is not 0x0303 (TLS 1.2 or later)")
    r.take(32, "random")
    if len(r.vector(1, "legacy_session_id")) > 32:
        raise NotClientHello("ClientHello session id is longer than 32 bytes")
    suites = r.vector(2, "cipher_suites")
    if not suites or len(suites) % 2:
        raise NotClientHello(f"ClientHello cipher_suites has an invalid length {len(suites)}")
    if not r.vector(1, "legacy_compression_methods"):
        raise NotClientHello("ClientHello offers no compression method")
    if r.at_end():
        # Extensions are optional before TLS 1.3; without them there is no SNI or ALPN.
        return ClientHello(server_name=None, alpn_protocols=())
    extensions = r.vector(2, "extensions")
    if not r.at_end():
        raise NotClientHello("ClientHello has bytes after its extensions")
    return _parse_extensions(extensions)


def _parse_extensions(data: bytes) -> ClientHello:
    r = _Reader(data, "ClientHello extensions")
    seen: set[int] = set()
    server_name: str | None = None
    alpn: tuple[bytes, ...] = ()
    while not r.at_end():
        ext_type = r.uint(2, "extension type")
        ext_data = r.vector(2, f"extension {ext_type}")
        if ext_type in seen:
            raise NotClientHello(f"ClientHello repeats extension {ext_type}")
        seen.add(ext_type)
        if ext_type == _EXT_SERVER_NAME:
            server_name = _parse_server_name(ext_data)
        elif ext_type == _EXT_ALPN:
            alpn = _parse_alpn(ext_data)
    return ClientHello(server_name=server_name, alpn_protocols=alpn)


def _parse_server_name(data: bytes) -> str | None:
    r = _Reader(data, "server_name extension")
    names = _Reader(r.vector(2, "server_name_list"), "server_name_list")
    if not r.at_end():
        raise NotClientHello("server_name extension has bytes after its list")
    name_type = names.uint(1, "name_type")
    if name_type != _NAME_TYPE_HOST_NAME:
        raise NotClientHello(f"server_name type {name_type} is not host_name (0)")
    host = names.vector(2, "host_name")
    if not names.at_end():
        raise NotClientHello("server_name_list holds more than one name")
    # Linkerd treats an SNI that is not a DNS name (e.g. an IP literal) as no SNI at all.
    text = host.decode("ascii", errors="replace")
    return text.lower() if host and is_dns_name(text) else None


def _parse_alpn(data: bytes) -> tuple[bytes, ...]:
    r = _Reader(data, "ALPN extension")
    protocols = _Reader(r.vector(2, "protocol_name_list"), "protocol_name_list")
    if not r.at_end():
        raise NotClientHello("ALPN extension has bytes after its list")
    result: list[bytes] = []
    while not protocols.at_end():
        name = protocols.vector(1, "protocol name")
        if not name:
            raise NotClientHello("ALPN protocol name is empty")
        result.append(name)
    if not result:
        raise NotClientHello("ALPN protocol list is empty")
    return tuple(result)
