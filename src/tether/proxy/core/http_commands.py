"""Commands of the HTTP layers, done by the driver (``tether.proxy.io.driver``); they extend ``core.commands``.

One command per version: ``ServeHttp1`` and ``ServeHttp2`` hand the accepted
connection to the push-driven ``core.http1_proxy.Http1Proxy`` or
``core.http2_proxy.Http2Proxy``, which the driver feeds from the transports'
callbacks (no command per request or stream). ``Upstream`` is a connection
the proxy made, as the cores hold it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
class ServeHttp2(Command):
    """Serve the accepted connection as HTTP/2 with a push-driven ``core.http2_proxy.Http2Proxy`` (made by the
    driver over its sink) until it is over; ``downgrade``: honour ``l5d-orig-proto``. Reply: None."""

    router: Router = field(compare=False)
    settings: HttpSettings = field(compare=False)
    downgrade: bool = False
