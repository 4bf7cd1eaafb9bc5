"""Protocol detection: from a connection's first bytes, decide TLS, HTTP/2, HTTP/1 or opaque.

The I/O layer feeds each read into a ``Detector`` and keeps the bytes itself;
the detector never consumes them, so whichever layer the verdict picks gets the
whole buffer replayed. The I/O layer also owns the timer and calls
``on_timeout()`` when the detect timeout fires.

How Linkerd decides (proxy.md §4.1, §5.4), and so how this does:

- TLS (``Detector(tls=True)``, the inbound proxy on raw bytes): bytes are read
  until a whole ClientHello is in hand (at most 8 KiB) or one byte rules TLS
  out. A ClientHello with an SNI gives ``Tls``; the inbound layer compares the
  SNI with its own identity (terminate) or not (pass through). Without an SNI,
  or when the bytes are not TLS, the same bytes go on to HTTP sniffing.
  A timeout here is ``TlsTimeout``: the connection is closed.
- HTTP (``tls=False``: the outbound proxy, or the inbound one on plaintext or
  decrypted bytes): Linkerd reads **once**, so the first non-empty read decides,
  looking at no more than its first 1024 bytes. Fewer than 14 bytes is
  ``Opaque``; ``PRI * HTTP/2.0`` is ``Http2``; the start of an HTTP/1 request
  (``request_line``) is ``Http1``; anything else is ``Opaque``. A timeout before
  any byte is ``ReadTimeout``, which each caller maps its own way (§4.1 table).
- EOF before any byte is ``Closed``: drop the connection.

Callers: the inbound and outbound connection layers of ``tether.proxy``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.proxy.codec.client_hello import ClientHello, ClientHelloError, ClientHelloParser
from tether.proxy.codec.common import NEED_DATA, LocalProtocolError, NeedData
from tether.proxy.codec.request_line import looks_like_http1_request

HTTP_SNIFF_BYTES = 1024  # Linkerd's single read
HTTP_MIN_BYTES = 14  # len(b"PRI * HTTP/2.0"); shorter first reads are not HTTP
HTTP2_PREFACE_START = b"PRI * HTTP/2.0"


class Verdict:
    """Base of the detector's answers."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Http1(Verdict):
    """HTTP/1.x: hand the bytes to the HTTP/1 server."""


@dataclass(frozen=True, slots=True)
class Http2(Verdict):
    """HTTP/2 with prior knowledge: hand the bytes to the HTTP/2 server."""


@dataclass(frozen=True, slots=True)
class Opaque(Verdict):
    """Not HTTP (and not TLS with an SNI): forward the bytes as opaque TCP."""


@dataclass(frozen=True, slots=True)
class Tls(Verdict):
    """A TLS ClientHello with an SNI: terminate (SNI is ours) or pass through (it is not)."""

    client_hello: ClientHello


@dataclass(frozen=True, slots=True)
class Closed(Verdict):
    """The peer closed before sending a byte: drop the connection."""


@dataclass(frozen=True, slots=True)
class TlsTimeout(Verdict):
    """The detect timeout fired during TLS detection: close the connection."""


@dataclass(frozen=True, slots=True)
class ReadTimeout(Verdict):
    """The detect timeout fired before any byte arrived for HTTP sniffing; the caller picks the fallback."""


class Detector:
    """Decides one connection's protocol from its first bytes; single use."""

    def __init__(self, *, tls: bool) -> None:
        self._hello: ClientHelloParser | None = ClientHelloParser() if tls else None
        self._head = b""  # the first bytes, up to HTTP_SNIFF_BYTES, for HTTP sniffing
        self._verdict: Verdict | None = None

    def receive_data(self, data: bytes) -> NeedData | Verdict:
        """Feed one read (``b""`` = EOF); returns ``NEED_DATA`` or the verdict."""
        self._check_undecided()
        if self._hello is not None:
            return self._decide(self._receive_tls(self._hello, data))
        if not data:
            return self._decide(Closed())
        return self._decide(_sniff_http(data[:HTTP_SNIFF_BYTES]))

    def on_timeout(self) -> Verdict:
        """The detect timeout fired before a verdict; returns what to do (never ``NEED_DATA``)."""
        self._check_undecided()
        self._verdict = TlsTimeout() if self._hello is not None else ReadTimeout()
        return self._verdict

    def _receive_tls(self, parser: ClientHelloParser, data: bytes) -> NeedData | Verdict:
        if len(self._head) < HTTP_SNIFF_BYTES:
            self._head += data[: HTTP_SNIFF_BYTES - len(self._head)]
        try:
            hello: NeedData | ClientHello | None = parser.receive_data(data)
        except ClientHelloError:
            # Not TLS Tether can read: what has arrived so far is the single HTTP read.
            hello = None
        if hello is NEED_DATA:
            return NEED_DATA
        if isinstance(hello, ClientHello) and hello.server_name is not None:
            return Tls(hello)
        if not self._head:
            return Closed()
        return _sniff_http(self._head)

    def _decide(self, answer: NeedData | Verdict) -> NeedData | Verdict:
        if isinstance(answer, Verdict):
            self._verdict = answer
        return answer

    def _check_undecided(self) -> None:
        if self._verdict is not None:
            raise LocalProtocolError(f"Detector already decided {self._verdict}")


def _sniff_http(head: bytes) -> Verdict:
    if len(head) < HTTP_MIN_BYTES:
        return Opaque()
    if head.startswith(HTTP2_PREFACE_START):
        return Http2()
    if looks_like_http1_request(head):
        return Http1()
    return Opaque()
