"""Does a buffer start like an HTTP/1 request? Linkerd's HTTP/1 sniffing rule, in one place.

Linkerd (``linkerd/http/detect``, proxy.md §4.1) hands the first bytes to
httparse's request parser with zero header slots and counts three answers as
HTTP/1: "complete", "partial" (valid so far) and "too many headers". So bytes
count as HTTP/1 when, before they run out, nothing contradicts:

    *( CRLF / LF )                     ; empty lines before the request are skipped
    method SP request-target SP        ; method: RFC 9110 token; target: any byte
    ("HTTP/1.0" / "HTTP/1.1") line-end ; 0x21-0x7E or 0x80-0xFF, at least one
    ( line-end / header-line )         ; the end of the head, or one full header,
                                       ; after which httparse runs out of slots

A version shorter than 8 bytes only has to match ``HTTP/1.`` so far. The
14-byte minimum and the 1024-byte window are the detector's business, not this
module's.

Caller: ``tether.proxy.codec.detect``.
"""

from __future__ import annotations

_CR, _LF, _SP, _HTAB, _COLON = 0x0D, 0x0A, 0x20, 0x09, 0x3A
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_TARGET = frozenset(range(0x21, 0x7F)) | frozenset(range(0x80, 0x100))
_FIELD_VALUE = frozenset({_HTAB}) | frozenset(range(0x20, 0x7F)) | frozenset(range(0x80, 0x100))
_VERSIONS = (b"HTTP/1.0", b"HTTP/1.1")
_VERSION_PREFIX = b"HTTP/1."


class _EndOfInput(Exception):
    """The bytes ran out before anything contradicted HTTP/1 (httparse's "partial")."""


class _Cursor:
    def __init__(self, buf: bytes) -> None:
        self._buf = buf
        self._pos = 0

    def next(self) -> int:
        if self._pos >= len(self._buf):
            raise _EndOfInput
        b = self._buf[self._pos]
        self._pos += 1
        return b

    def remaining(self) -> bytes:
        return self._buf[self._pos :]

    def skip(self, n: int) -> None:
        self._pos += n


def looks_like_http1_request(buf: bytes) -> bool:
    """True if ``buf`` is the start of an HTTP/1 request as far as httparse can tell."""
    cursor = _Cursor(buf)
    try:
        return _request_head(cursor)
    except _EndOfInput:
        return True


def _request_head(c: _Cursor) -> bool:
    b = c.next()
    while b in (_CR, _LF):
        if b == _CR and c.next() != _LF:
            return False
        b = c.next()
    # Method: a token up to a single space.
    if b not in _TOKEN:
        return False
    b = c.next()
    while b != _SP:
        if b not in _TOKEN:
            return False
        b = c.next()
    # Request target: at least one byte, up to a single space.
    b = c.next()
    if b not in _TARGET:
        return False
    b = c.next()
    while b != _SP:
        if b not in _TARGET:
            return False
        b = c.next()
    return _version(c) and _line_end(c) and _end_or_first_header(c)


def _version(c: _Cursor) -> bool:
    rest = c.remaining()
    if len(rest) >= len(_VERSIONS[0]):
        c.skip(len(_VERSIONS[0]))
        return rest[: len(_VERSIONS[0])] in _VERSIONS
    # Fewer than 8 bytes: httparse checks "HTTP/1." as far as it goes, then says partial.
    for expected in _VERSION_PREFIX:
        if c.next() != expected:
            return False
    raise _EndOfInput


def _line_end(c: _Cursor) -> bool:
    b = c.next()
    if b == _CR:
        return c.next() == _LF
    return b == _LF


def _end_or_first_header(c: _Cursor) -> bool:
    b = c.next()
    if b in (_CR, _LF):
        return b == _LF or c.next() == _LF
    # Field name: a token up to the colon, no space before it.
    if b not in _TOKEN:
        return False
    b = c.next()
    while b != _COLON:
        if b not in _TOKEN:
            return False
        b = c.next()
    b = c.next()
    while b in (_SP, _HTAB):
        b = c.next()
    while b not in (_CR, _LF):
        if b not in _FIELD_VALUE:
            return False
        b = c.next()
    return b == _LF or c.next() == _LF
