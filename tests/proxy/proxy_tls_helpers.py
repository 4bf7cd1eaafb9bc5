"""Test helpers for TLS bytes: real ClientHellos from Python's ssl over memory BIOs, and hand-built ones.

Used by test_client_hello.py and test_protocol_detect.py. No sockets: the ssl
client writes its first flight into a MemoryBIO and we read it back out.
"""

from __future__ import annotations

import ssl


def real_client_hello(server_hostname: str | None = None, alpn: list[str] | None = None) -> bytes:
    """The first flight (a ClientHello in TLS records) of a stdlib TLS client."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    try:
        client.do_handshake()
    except ssl.SSLWantReadError:
        pass  # it wrote its ClientHello and now waits for the server
    return outgoing.read()


def vector(data: bytes, length_size: int) -> bytes:
    return len(data).to_bytes(length_size) + data


def extension(ext_type: int, data: bytes) -> bytes:
    return ext_type.to_bytes(2) + vector(data, 2)


def sni_extension(*names: bytes, name_type: int = 0) -> bytes:
    entries = b"".join(bytes([name_type]) + vector(n, 2) for n in names)
    return extension(0, vector(entries, 2))


def alpn_extension(*protocols: bytes) -> bytes:
    return extension(16, vector(b"".join(vector(p, 1) for p in protocols), 2))


def client_hello_body(
    *,
    version: int = 0x0303,
    session_id: bytes = b"",
    suites: bytes = b"\x13\x01\x13\x02",
    compression: bytes = b"\x00",
    extensions: bytes | None = b"",
) -> bytes:
    """A ClientHello body; ``extensions=None`` leaves the extensions block out entirely."""
    body = version.to_bytes(2) + bytes(32) + vector(session_id, 1) + vector(suites, 2) + vector(compression, 1)
    return body if extensions is None else body + vector(extensions, 2)


def handshake(body: bytes, msg_type: int = 1) -> bytes:
    return bytes([msg_type]) + len(body).to_bytes(3) + body


def records(payload: bytes, fragment_size: int | None = None, version: bytes = b"\x03\x01") -> bytes:
    """Wrap ``payload`` in handshake records of at most ``fragment_size`` bytes each."""
    size = fragment_size or len(payload)
    chunks = [payload[i : i + size] for i in range(0, len(payload), size)]
    return b"".join(b"\x16" + version + vector(chunk, 2) for chunk in chunks)


def built_client_hello(*extensions: bytes, fragment_size: int | None = None) -> bytes:
    """A minimal well-formed ClientHello carrying ``extensions``, in records."""
    return records(handshake(client_hello_body(extensions=b"".join(extensions))), fragment_size)
