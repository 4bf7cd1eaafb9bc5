"""The proxy's tap server: ``io.linkerd.proxy.tap.Tap/Observe`` over mTLS, for the tap identity only (proxy.md §10.2).

Started when ``LINKERD2_PROXY_TAP_SVC_NAME`` is set, on
``LINKERD2_PROXY_CONTROL_LISTEN_ADDR`` (4190), on the proxy's own HTTP/2
stack (``io.grpc_server``: no grpcio in the proxy). The listener is TLS with
the proxy's own certificate and asks for a client certificate chaining to the
trust anchors. Every call is checked against the client's identity: a call
from another identity, or from a client without a certificate, ends
``UNAUTHENTICATED`` ("Unauthorized client"), as linkerd2-proxy answers. A
valid call registers a ``core.tap.Tap`` with the proxy's ``Taps`` (which the
HTTP layers report to) and streams its events until its ``limit`` of requests
has been reported and answered (then ``OK``), or the client goes away. A
request the proxy cannot serve ends ``INVALID_ARGUMENT`` naming the part
(``limit`` of 0, a malformed match, a message that does not decode).

Events leave as the client's flow-control window allows; while it is shut,
they wait in the tap's own buffer (400 events; further ones are dropped, as
linkerd2-proxy's bounded channel drops them). The request path never writes:
a tap's ``wake`` schedules the send for the loop's next turn, once.

The certificate follows rotation: each connection's handshake uses the server
context ``context()`` returns then.
Callers: ``io.proxy_tap`` (when tap is enabled) and tests.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from google.protobuf.message import DecodeError

from tether.api import tap_pb2
from tether.proxy.codec.http2 import DEFAULT_PARAMS, Http2Params
from tether.proxy.core.config import TcpOptions
from tether.proxy.core.tap import MatchError, Tap, Taps, new_tap
from tether.proxy.io.grpc_client import Code, method_path
from tether.proxy.io.grpc_server import Call, GrpcServer
from tether.proxy.io.listeners import BACKLOG

log = logging.getLogger(__name__)
UNAUTHORIZED = "Unauthorized client"
OBSERVE = method_path(tap_pb2.DESCRIPTOR.services_by_name["Tap"], "Observe")


class TapServer:
    def __init__(self, taps: Taps, tap_identity: str, context: Callable[[], ssl.SSLContext],
                 h2: Http2Params = DEFAULT_PARAMS) -> None:
        self.taps = taps
        self.tap_identity = tap_identity
        self.grpc = GrpcServer({OBSERVE: self._observe}, context, h2)
        self._changed = asyncio.Event()  # set (and replaced) when a tap opens or closes

    @property
    def port(self) -> int:
        return self.grpc.port

    async def start(self, host: str, port: int, *, backlog: int = BACKLOG, accept: TcpOptions = TcpOptions()) -> int:
        """Listen on ``host:port`` (``io.grpc_server.GrpcServer.start``)."""
        await self.grpc.start(host, port, backlog=backlog, accept=accept)
        log.info("tap server on %s:%d, for %s only", host, self.port, self.tap_identity)
        return self.port

    async def stop(self) -> None:
        await self.grpc.stop()

    async def wait_for_taps(self, count: int) -> None:
        """Until ``count`` taps are open (tests, and whoever must know a tap is listening)."""
        while len(self.taps.taps) < count:
            await self._changed.wait()

    async def wait_for_no_taps(self) -> None:
        """Until every tap is closed (their clients went away, or they finished)."""
        while self.taps.taps:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _observe(self, call: Call, message: bytes) -> None:
        if call.identity != self.tap_identity:
            call.finish(Code.UNAUTHENTICATED, UNAUTHORIZED)
            return
        try:
            request = tap_pb2.ObserveRequest.FromString(message)
        except DecodeError as err:
            call.finish(Code.INVALID_ARGUMENT, f"ObserveRequest: {err}")
            return
        stream = _TapStream(self, call)
        try:
            tap = new_tap(request, stream.wake)
        except MatchError as err:
            call.finish(Code.INVALID_ARGUMENT, str(err))
            return
        stream.tap = tap
        call.on_ready = stream.pump
        call.on_done = stream.close
        self.taps.add(tap)
        self._notify()


class _TapStream:
    """One Observe call's tap, sent as the client reads."""

    __slots__ = ("server", "call", "tap", "scheduled")

    def __init__(self, server: TapServer, call: Call) -> None:
        self.server = server
        self.call = call
        self.tap: Tap | None = None
        self.scheduled = False

    def wake(self) -> None:
        """An event arrived (called on the request path): send on the loop's next turn, not now."""
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        self.scheduled = False
        tap, call = self.tap, self.call
        if tap is None or call.done:
            return
        while tap.events and call.ready:
            call.send(tap.events.popleft().SerializeToString())
        if tap.finished and not tap.events:
            call.finish(Code.OK)
            self.close()

    def close(self) -> None:
        if self.tap is not None and self.tap in self.server.taps.taps:
            self.server.taps.remove(self.tap)
            self.server._notify()
