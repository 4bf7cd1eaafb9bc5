"""The proxy's tap server: ``io.linkerd.proxy.tap.Tap/Observe`` over mTLS, for the tap identity only (proxy.md §10.2).

Started when ``LINKERD2_PROXY_TAP_SVC_NAME`` is set, on
``LINKERD2_PROXY_CONTROL_LISTEN_ADDR`` (4190).  The listener is gRPC over TLS
with the proxy's own certificate, and wants a client certificate that chains
to the trust anchors.  Every call first checks the client's identity (the DNS
SAN of its certificate): another mesh identity still reaches a gRPC server, but
each call fails with ``UNAUTHENTICATED`` ("Unauthorized client"), as
linkerd2-proxy answers.  One difference: grpcio's server can ask for a client
certificate only by requiring it, so a client without one fails the TLS
handshake (the call ends ``UNAVAILABLE``) where linkerd2-proxy would answer
``UNAUTHENTICATED`` -- no one but the tap service is served either way.  A valid call registers a
``core.tap.Tap`` with the proxy's ``Taps`` (which the HTTP layers report to)
and streams its events until its ``limit`` of requests has been reported and
answered, or the client goes away.

The certificate follows rotation: the server's TLS configuration is fetched
again on each handshake and replaced when the proxy's material changed.
Callers: ``tether.proxy.app`` (when tap is enabled) and tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc

from tether.api import tap_pb2, tap_pb2_grpc
from tether.proxy.core.tap import MatchError, Taps, new_tap

log = logging.getLogger(__name__)
UNAUTHORIZED = "Unauthorized client"


@dataclass(frozen=True, slots=True)
class ServingCert:
    """What the server presents: its key and chain (PEM), and the anchors client certificates must chain to."""

    key_pem: bytes
    chain_pem: bytes
    anchors_pem: bytes


def client_identities(context: grpc.aio.ServicerContext) -> list[str]:
    """The DNS SANs of the client's verified certificate; empty without one."""
    auth = context.auth_context() or {}
    return [v.decode() if isinstance(v, bytes) else str(v) for v in auth.get("x509_subject_alternative_name", ())]


class TapService(tap_pb2_grpc.TapServicer):
    def __init__(self, taps: Taps, tap_identity: str) -> None:
        self.taps = taps
        self.tap_identity = tap_identity
        self.changed = asyncio.Condition()

    async def Observe(self, request: tap_pb2.ObserveRequest,  # noqa: N802 - the gRPC method's name
                      context: grpc.aio.ServicerContext) -> AsyncIterator[tap_pb2.TapEvent]:
        if self.tap_identity not in client_identities(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)
        wake = asyncio.Event()
        try:
            tap = new_tap(request, wake.set)
        except MatchError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        self.taps.add(tap)
        async with self.changed:
            self.changed.notify_all()
        try:
            while True:
                while tap.events:
                    yield tap.events.popleft()
                if tap.finished:
                    return
                wake.clear()
                if not tap.events and not tap.finished:
                    await wake.wait()
        finally:
            self.taps.remove(tap)
            async with self.changed:
                self.changed.notify_all()

    async def wait_for_taps(self, count: int) -> None:
        """Until ``count`` taps are open (tests, and whoever must know a tap is listening)."""
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.taps.taps) >= count)


class TapServer:
    def __init__(self, taps: Taps, tap_identity: str, cert: Callable[[], ServingCert]) -> None:
        self.service = TapService(taps, tap_identity)
        self._cert = cert
        self._current = cert()
        self._server: grpc.aio.Server | None = None
        self.port = 0

    def _config(self, current: ServingCert) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(current.key_pem, current.chain_pem)],
                                                         root_certificates=current.anchors_pem)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        latest = self._cert()
        if latest == self._current:
            return None
        self._current = latest
        return self._config(latest)

    async def start(self, host: str, port: int) -> int:
        # No SO_REUSEPORT (grpcio's default): another process must not share, or take over, the tap port.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        tap_pb2_grpc.add_TapServicer_to_server(self.service, server)
        credentials = grpc.dynamic_ssl_server_credentials(self._config(self._current), self._fetch,
                                                          require_client_authentication=True)
        self.port = server.add_secure_port(f"{host}:{port}", credentials)
        await server.start()
        self._server = server
        log.info("tap server on %s:%d, for %s only", host, self.port, self.service.tap_identity)
        return self.port

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
