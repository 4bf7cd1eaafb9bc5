"""Tap in the running proxy: the registry, the HTTP layers' observers, and the Observe server's lifecycle.

When ``LINKERD2_PROXY_TAP_SVC_NAME`` is set, ``tether.proxy.app`` makes one
``ProxyTap``: its ``core.tap.Taps`` registry (stream ids based on a random
number per process, as linkerd2-proxy's), one ``core.tap.TapObserver`` per
direction -- passed as ``observer=`` of the inbound and outbound
``HttpSettings``, so HTTP/1 and HTTP/2 both report to it -- and, once the
proxy holds its first certificate, ``io.tap_server.TapServer`` on
``LINKERD2_PROXY_CONTROL_LISTEN_ADDR`` (4190): gRPC over mTLS with the proxy's
own key and chain, serving only the tap identity (proxy.md §10.2).

The server is grpcio's, which this module imports only in ``start``: a proxy
without tap never loads grpcio (the import-linter contract
``proxy-no-grpcio`` allows it in ``io.tap_server`` alone, and
``tests/proxy/test_proxy_imports.py`` checks the modules loaded at start).
grpcio's server rather than the proxy's own h2 stack because it already
speaks gRPC server-side streaming with flow control and cancellation; the
~16 MB it costs is paid only by proxies that are tapped.

With no tap open the request path pays one call and one test of an empty
list per request (``TapObserver.request``); ``bench`` measures it
(``tether-http-tap`` against ``tether-http``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.core.tap import INBOUND, OUTBOUND, TapObserver, Taps

if TYPE_CHECKING:
    from tether.proxy.io.tap_server import ServingCert, TapServer

log = logging.getLogger(__name__)

# (key, chain, anchors) PEM of the proxy's current certificate (``IdentityClient.serving_pems``).
Pems = tuple[bytes, bytes, bytes]


class TapBindError(OSError):
    """The tap server could not listen on its address."""


class ProxyTap:
    def __init__(self, tap_identity: str, addr: SocketAddr, *, rng: random.Random | None = None) -> None:
        self.tap_identity = tap_identity
        self.addr = addr
        self.taps = Taps(base=(rng or random.SystemRandom()).getrandbits(32))
        self.inbound = TapObserver(self.taps, INBOUND, time.monotonic)
        self.outbound = TapObserver(self.taps, OUTBOUND, time.monotonic)
        self.server: TapServer | None = None
        self.serving = asyncio.Event()  # set once the server listens (tests, and the ready log)
        self._pems: Callable[[], Pems] | None = None
        self._cached: tuple[Pems, ServingCert] | None = None

    @property
    def port(self) -> int:
        """The bound port (``addr``'s, or the one chosen for port 0); 0 before ``start``."""
        return self.server.port if self.server is not None else 0

    async def start(self, pems: Callable[[], Pems]) -> None:
        """Serve Observe on ``addr`` with the certificate ``pems`` returns (asked again on each handshake, so
        rotation is followed). Raises ``TapBindError`` naming the address when it cannot listen."""
        from tether.proxy.io.tap_server import TapServer  # grpcio: loaded only when tap runs

        self._pems = pems
        server = TapServer(self.taps, self.tap_identity, self._cert)
        host = f"[{self.addr.ip}]" if self.addr.ip.version == 6 else str(self.addr.ip)
        try:
            await server.start(host, self.addr.port)
        except RuntimeError as err:  # grpcio's "Failed to bind to address ..."
            await server.stop(0)
            raise TapBindError(f"tap server: cannot listen on {self.addr} "
                               f"(LINKERD2_PROXY_CONTROL_LISTEN_ADDR): {err}") from err
        self.server = server
        self.serving.set()

    def _cert(self) -> ServingCert:
        from tether.proxy.io.tap_server import ServingCert

        assert self._pems is not None
        pems = self._pems()
        if self._cached is None or self._cached[0] != pems:
            self._cached = pems, ServingCert(key_pem=pems[0], chain_pem=pems[1], anchors_pem=pems[2])
        return self._cached[1]

    async def stop(self) -> None:
        for tap in list(self.taps.taps):
            self.taps.remove(tap)
        if self.server is not None:
            await self.server.stop(0)
            self.server = None
