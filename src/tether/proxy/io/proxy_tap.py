"""Tap in the running proxy: the registry, the HTTP layers' observers, and the Observe server's lifecycle.

When ``LINKERD2_PROXY_TAP_SVC_NAME`` is set, ``tether.proxy.app`` makes one
``ProxyTap``: its ``core.tap.Taps`` registry (stream ids based on a random
number per process, as linkerd2-proxy's), one ``core.tap.TapObserver`` per
direction -- passed as ``observer=`` of the inbound and outbound
``HttpSettings``, so HTTP/1 and HTTP/2 both report to it -- and, once the
proxy holds its first certificate, ``io.tap_server.TapServer`` on
``LINKERD2_PROXY_CONTROL_LISTEN_ADDR`` (4190): gRPC over mTLS with the proxy's
own key and chain, serving only the tap identity (proxy.md §10.2).

The server runs on the proxy's own HTTP/2 stack (``io.grpc_server``), so a
tapped proxy loads no grpcio and runs no thread (the import-linter contract
``proxy-no-grpcio`` keeps grpcio out of the whole proxy). Its TLS server
context is the proxy's own (``IdentityClient.contexts_for`` with ALPN ``h2``),
made once per certificate and used from the next connection on.

With no tap open the request path pays one call and one test of an empty
list per request (``TapObserver.request``); ``bench`` measures it
(``tether-http-tap`` against ``tether-http``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Callable

from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.codec.http2 import DEFAULT_PARAMS, Http2Params
from tether.proxy.core.config import TcpOptions
from tether.proxy.core.tap import INBOUND, OUTBOUND, TapObserver, Taps
from tether.proxy.io.identity_client import TlsMaterial
from tether.proxy.io.listeners import BACKLOG
from tether.proxy.io.tap_server import TapServer
from tether.proxy.io.tls import ContextFactory

log = logging.getLogger(__name__)


class TapBindError(OSError):
    """The tap server could not listen on its address."""


class ProxyTap:
    def __init__(self, tap_identity: str, addr: SocketAddr, *, rng: random.Random | None = None,
                 h2: Http2Params = DEFAULT_PARAMS, backlog: int = BACKLOG, accept: TcpOptions = TcpOptions()) -> None:
        self.tap_identity = tap_identity
        # The inbound server's HTTP/2 settings, listen backlog and accept socket options: the control listener
        # follows them, as linkerd2-proxy's (proxy.md §2.2).
        self.h2 = h2
        self.backlog = backlog
        self.accept = accept
        self.addr = addr
        self.taps = Taps(base=(rng or random.SystemRandom()).getrandbits(32))
        self.inbound = TapObserver(self.taps, INBOUND, time.monotonic)
        self.outbound = TapObserver(self.taps, OUTBOUND, time.monotonic)
        self.server: TapServer | None = None
        self.serving = asyncio.Event()  # set once the server listens (tests, and the ready log)
        self._material: Callable[[], TlsMaterial | None] | None = None
        self._contexts_for: ContextFactory | None = None
        self._cached: tuple[TlsMaterial, ssl.SSLContext] | None = None

    @property
    def port(self) -> int:
        """The bound port (``addr``'s, or the one chosen for port 0); 0 before ``start``."""
        return self.server.port if self.server is not None else 0

    async def start(self, material: Callable[[], TlsMaterial | None], contexts_for: ContextFactory) -> None:
        """Serve Observe on ``addr`` with the certificate ``material`` returns (asked again on each handshake, so
        rotation is followed). Raises ``TapBindError`` naming the address when it cannot listen."""
        self._material, self._contexts_for = material, contexts_for
        server = TapServer(self.taps, self.tap_identity, self._context, self.h2)
        try:
            await server.start(str(self.addr.ip), self.addr.port, backlog=self.backlog, accept=self.accept)
        except OSError as err:
            await server.stop()
            raise TapBindError(f"tap server: cannot listen on {self.addr} "
                               f"(LINKERD2_PROXY_CONTROL_LISTEN_ADDR): {err}") from err
        self.server = server
        self.serving.set()

    def _context(self) -> ssl.SSLContext:
        assert self._material is not None and self._contexts_for is not None
        material = self._material()
        assert material is not None, "the tap server starts after the first certificate"
        if self._cached is None or self._cached[0] is not material:
            server = self._contexts_for(material, ["h2"])[0]
            server.num_tickets = 0  # tap clients do not resume sessions either
            self._cached = material, server
        return self._cached[1]

    async def stop(self) -> None:
        for tap in list(self.taps.taps):
            self.taps.remove(tap)
        if self.server is not None:
            await self.server.stop()
            self.server = None
