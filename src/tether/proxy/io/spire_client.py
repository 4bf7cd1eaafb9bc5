"""The proxy's identity from a SPIRE agent: X.509-SVIDs over the SPIFFE Workload API on a Unix socket.

With ``LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS`` (``core.config.SpireIdentityConfig``)
the proxy takes its certificate as linkerd2-proxy's spire-client does, instead of asking
Linkerd's identity service:

- one server-streaming call, ``SpiffeWorkloadAPI/FetchX509SVID``, on the agent's socket, over
  the proxy's own gRPC client (``io.grpc_client``; plaintext HTTP/2 on the Unix socket, as
  SPIRE serves it) with the metadata ``workload.spiffe.io: true`` the Workload API requires;
- each message lists every SVID the agent grants this process; the one whose ``spiffe_id`` is
  the proxy's id (``LINKERD2_PROXY_IDENTITY_SERVER_ID``) is checked (``core.certs.check_svid``, run
  by a short-lived ``python -m tether.proxy.certify`` so the proxy does not load ``cryptography``:
  its key is its certificate's, it is current, chains to ``LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS``
  -- the message's bundle is not used, as in Linkerd -- and names that ID) and installed
  (``Credentials.install``): new connections present it. Rotation is the agent's: it sends a
  new message before an SVID expires, and the stream stays open for it;
- a message without our SVID, or with one that fails the checks, is logged and counted
  (``control_identity_cert_refreshes_total{result="error"}``), and the SVID held stays;
- a stream that ends or fails is opened again after the configured backoff
  (``LINKERD2_PROXY_IDENTITY_SPIRE_EXP_BACKOFF_*``, 100 ms doubling to 1 s, jitter 0.1), except
  ``INVALID_ARGUMENT``, which the Workload API says not to retry: logged as an error, and the
  proxy keeps what it holds (without an SVID it never becomes ready).

The private key comes from the agent in the message and stays in the pod (the check's process
hands it back encrypted with a one-time password; TLS contexts get it through ``Credentials``'
memfd). Caller: ``tether.proxy.app``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

from tether.api import workload_pb2
from tether.proxy.core.config import SpireIdentityConfig
from tether.proxy.io.grpc_client import Channel, Code, RpcError, method_path
from tether.proxy.io.identity_client import Credentials, IdentityUnavailable, PrivateKey, certified_of, certify_helper

log = logging.getLogger(__name__)

FETCH_X509_SVID = method_path(workload_pb2.DESCRIPTOR.services_by_name["SpiffeWorkloadAPI"], "FetchX509SVID")
SECURITY_HEADER = ("workload.spiffe.io", "true")


class SpireClient(Credentials):
    def __init__(
        self,
        config: SpireIdentityConfig,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random_fraction: Callable[[], float] = random.random,
    ) -> None:
        anchors_pem = config.trust_anchors_pem.encode()
        super().__init__(config.local_name, anchors_pem)
        self._config = config
        self._clock = clock
        self._sleep = sleep
        self._random = random_fraction
        self.processed = asyncio.Event()  # set after each message from the agent is dealt with

    @property
    def source(self) -> str:
        """Where certificates come from, for logs."""
        return f"the SPIRE agent at {self._config.workload_api_addr}"

    async def run(self) -> None:
        """Watch the agent's SVIDs until cancelled (or told not to retry)."""
        failures = 0
        while True:
            try:
                async for response in self._fetch():
                    failures = 0
                    await self._received(response)
                problem = "the agent ended the stream"
            except RpcError as exc:
                if exc.code is Code.INVALID_ARGUMENT:
                    log.error("identity: %s refused the SVID request (%s: %s); not retrying", self.source,
                              exc.code.name, exc.details)
                    return
                problem = f"{exc.code.name}: {exc.details}"
            failures += 1
            delay = self._config.backoff.delay(failures, self._random())
            log.warning("identity: SVID stream from %s failed (%s); retrying in %.2fs", self.source, problem, delay)
            await self._sleep(delay)

    async def _fetch(self) -> AsyncIterator[workload_pb2.X509SVIDResponse]:
        async with Channel(self._config.workload_api_addr) as channel:
            async for response in channel.server_stream(FETCH_X509_SVID, workload_pb2.X509SVIDRequest(),
                                                        workload_pb2.X509SVIDResponse, metadata=[SECURITY_HEADER]):
                yield response

    async def _received(self, response: workload_pb2.X509SVIDResponse) -> None:
        try:
            await self._check(response)
        finally:
            self.processed.set()

    async def _check(self, response: workload_pb2.X509SVIDResponse) -> None:
        ours = [s for s in response.svids if s.spiffe_id == self.name]
        try:
            if not ours:
                offered = ", ".join(s.spiffe_id for s in response.svids) or "none"
                raise IdentityUnavailable(f"no SVID for {self.name} (offered: {offered})")
            password = secrets.token_bytes(32)
            checked = await certify_helper({
                "op": "svid", "chain": base64.b64encode(ours[0].x509_svid).decode(),
                "key_der": base64.b64encode(ours[0].x509_svid_key).decode(), "password": password.hex(),
                "spiffe_id": self.name, "anchors": self._config.trust_anchors_pem, "now": self._clock().isoformat()})
            if "error" in checked:
                raise IdentityUnavailable(checked["error"])
        except IdentityUnavailable as exc:
            self.refreshes["error"] += 1
            log.warning("identity: unusable SVIDs from %s: %s; keeping the one held", self.source, exc)
            return
        self.refreshes["ok"] += 1
        self.last_refresh = self._clock()
        self.install(certified_of(checked), PrivateKey.of(checked, password))
