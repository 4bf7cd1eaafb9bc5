"""Commands of the HTTP layer (``tether.proxy.core.http1_layer``), done by the driver (``tether.proxy.io.driver``).

They extend ``tether.proxy.core.commands``: the layer still does no I/O. The
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

from tether.proxy.core.commands import Command, Connect


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
    """Read from an upstream connection. Reply: bytes, ``b""`` at EOF (or when it is gone).

    With ``timeout`` (seconds; a profile route's deadline): None when nothing came in that time.
    """

    up: Upstream = field(compare=False)
    timeout: float | None = None


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


# -- HTTP/2 (tether.proxy.core.http2_layer): many streams in one layer -------------------------------------------------
#
# An HTTP/2 connection carries many requests at once, so its layer cannot wait on one socket at a time: it
# writes and waits on all its connections with one ``Poll``, and runs the slow steps of a stream (discovery's
# ``Wait``, a connect) in the background with ``Start``, so that only the stream that asked waits for them.


@dataclass(frozen=True, slots=True)
class OpenUp(Command):
    """A new upstream connection, never pooled (an HTTP/2 connection the layer multiplexes itself).

    Opened, metered and given the transport header as ``Checkout`` does; closed
    with ``Checkin(up, reuse=False)`` (or when the accepted connection ends).
    Reply: ``Upstream`` or ``commands.Failed``.
    """

    connect: Connect
    header: bytes | None = None


@dataclass(frozen=True, slots=True)
class Start(Command):
    """Run the blocking ``command`` in the background; its reply comes with ``tag`` in a later ``Polled.done``."""

    blocking: ClassVar[bool] = False
    tag: object = field(compare=False)
    command: Command


@dataclass(frozen=True, slots=True)
class Poll(Command):
    """Write ``writes``, then wait for the first of: bytes (or EOF) from the accepted connection (when
    ``down``) or from one of ``ups``; a started command's end; a full write buffer draining.

    Writes (``None``: the accepted connection) do not wait for the buffer to
    drain: the caller bounds what it writes (HTTP/2 windows) and holds back
    data for the connections ``Polled.blocked`` names until they drain. Every
    connection is read meanwhile (its peer's window updates are what unblock
    the other side), except one with megabytes unwritten
    (``io.driver.POLL_FLOOD_LIMIT``): a peer that sends PINGs or SETTINGS and
    does not read their answers is not read either. With ``timeout`` (seconds:
    the earliest profile-route deadline of the layer's streams), an empty
    ``Polled`` when nothing came in that time. Reply: ``Polled``.
    """

    down: bool
    ups: tuple[Upstream, ...] = field(compare=False)
    writes: tuple[tuple[Upstream | None, bytes], ...] = field(compare=False, default=())
    timeout: float | None = None


@dataclass(slots=True)
class Polled:
    """What a ``Poll`` found; bytes are ``b""`` at EOF (or when the connection is gone)."""

    down: bytes | None = None  # None: nothing from the accepted connection this time
    ups: list[tuple[Upstream, bytes]] = field(default_factory=list)
    done: list[tuple[object, Any]] = field(default_factory=list)  # (tag, reply) of started commands
    blocked: frozenset[Upstream | None] = frozenset()  # connections whose write buffer is full (None: downstream)
