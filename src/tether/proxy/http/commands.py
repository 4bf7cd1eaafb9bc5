"""Commands of the HTTP layer (``tether.proxy.http.layer``), done by the driver (``tether.proxy.driver``).

They extend ``tether.proxy.commands``: the layer still does no I/O. The
accepted ("down") connection is read and written with ``RecvDown`` /
``SendDown``; upstream connections come from a pool kept by the driver, one per
endpoint and TLS setting, with ``Checkout`` / ``Checkin``, and are read and
written with ``RecvUp`` / ``SendUp``. Writes wait while the socket's buffer is
over its high-water mark (backpressure), so a body is never buffered whole.
After a protocol switch (``101``, ``CONNECT``) ``Tunnel`` joins the two
connections byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tether.proxy.commands import Command, Connect


class Upstream:
    """A checked-out upstream connection; only the driver looks inside ``io``."""

    __slots__ = ("key", "io", "elapsed", "reused", "codec")

    def __init__(self, key: object, io: Any, elapsed: float, reused: bool) -> None:
        self.key = key
        self.io = io
        self.elapsed = elapsed  # connect time (the endpoint's RTT sample); 0 when reused
        self.reused = reused
        self.codec: Any = None  # the layer's HTTP/1 client codec for this connection, kept across requests


@dataclass(frozen=True, slots=True)
class RecvDown(Command):
    """Read from the accepted connection. Reply: bytes, ``b""`` at EOF (or when it is gone)."""


@dataclass(frozen=True, slots=True)
class SendDown(Command):
    """Write to the accepted connection, waiting while its buffer is full. Reply: False if it is gone."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Checkout(Command):
    """An idle pooled connection for ``connect`` (same address and TLS), else a new one.

    ``header`` (the transport header) is sent on a new connection when ALPN
    agreed to it. Reply: ``Upstream`` or ``commands.Failed``.
    """

    connect: Connect
    header: bytes | None = None


@dataclass(frozen=True, slots=True)
class RecvUp(Command):
    """Read from an upstream connection. Reply: bytes, ``b""`` at EOF (or when it is gone)."""

    up: Upstream = field(compare=False)


@dataclass(frozen=True, slots=True)
class SendUp(Command):
    """Write to an upstream connection, waiting while its buffer is full. Reply: False if it is gone."""

    up: Upstream = field(compare=False)
    data: bytes


@dataclass(frozen=True, slots=True)
class Checkin(Command):
    """Give an upstream connection back: to the pool when ``reuse``, else closed."""

    blocking: ClassVar[bool] = False
    up: Upstream = field(compare=False)
    reuse: bool


@dataclass(frozen=True, slots=True)
class Tunnel(Command):
    """After a protocol switch: write each side's unparsed bytes to the other, then copy both ways. Reply: None."""

    up: Upstream = field(compare=False)
    to_up: bytes
    to_down: bytes
