"""Commands of the HTTP layers, done by the driver (``tether.proxy.io.driver``); they extend ``core.commands``.

HTTP/1 is one command: ``ServeHttp1`` hands the accepted connection to the
push-driven ``core.http1_proxy.Http1Proxy``, which the driver feeds from the
transports' callbacks (no command per request). The HTTP/2 layer
(``core.http2_layer``) writes the accepted connection with ``SendDown``, takes
upstream connections from the driver's pool (``Checkout`` / ``Checkin``) or
opens its own (``OpenUp``), and waits on all of them at once with ``Poll``.
``Upstream`` is a connection the proxy made, as the layers hold it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from tether.proxy.core.commands import Command, Connect

if TYPE_CHECKING:
    from tether.proxy.core.http import HttpSettings, Router


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
class ServeHttp1(Command):
    """Serve the accepted connection as HTTP/1 with a push-driven ``core.http1_proxy.Http1Proxy`` (made by the
    driver over its sink) until it is over. Reply: None."""

    router: Router = field(compare=False)
    settings: HttpSettings = field(compare=False)


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
class Checkin(Command):
    """Give an upstream connection back: to the pool when ``reuse``, else closed."""

    blocking: ClassVar[bool] = False
    up: Upstream = field(compare=False)
    reuse: bool


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
