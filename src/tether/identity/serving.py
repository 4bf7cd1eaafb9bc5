"""The identity service's own TLS certificate, signed by its issuer and renewed in place.

``tether.identity.server`` serves Certify with ``credentials()``.  The certificate names
``linkerd-identity.<cp-ns>.serviceaccount.identity.<cp-ns>.<td>``, the name proxies verify
(``LINKERD2_PROXY_IDENTITY_SVC_NAME``).  It is re-signed at half its remaining life and whenever
a new issuer loads; gRPC picks the new one up at the next handshake, and connections already
open keep the one they negotiated.  The private key exists only in this process's memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import grpc

from tether.identity import pem, pki
from tether.identity.ca import CertificateAuthority
from tether.identity.errors import CertifyError
from tether.naming import WorkloadIdentity

log = logging.getLogger(__name__)

# When signing fails (issuer expired or not yet valid), try again this often.
RETRY_INTERVAL = timedelta(seconds=10)
MIN_RENEWAL = timedelta(seconds=1)


class ServingCertificate:
    def __init__(
        self,
        identity: WorkloadIdentity,
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._identity = identity
        self._clock = clock
        self._sleep = sleep
        self._authority: CertificateAuthority | None = None
        self._config: grpc.ServerCertificateConfiguration | None = None
        self._not_after: datetime | None = None
        self._generation = 0
        self._fetched = 0
        self._issued = asyncio.Event()

    @property
    def not_after(self) -> datetime | None:
        return self._not_after

    def renew(self, authority: CertificateAuthority) -> None:
        """Sign a new certificate (over a new key) with ``authority``; keep the old one on failure."""
        self._authority = authority
        key = pki.new_key()
        try:
            leaf = authority.issue(key.public_key(), self._identity, self._clock())
        except CertifyError as exc:
            log.warning("cannot sign the identity service's own certificate: %s", exc)
            return
        chain_pem = pem.certificate_pem(leaf, *authority.issuer.intermediates)
        self._config = grpc.ssl_server_certificate_configuration([(pem.private_key_pem(key), chain_pem)])
        self._not_after = leaf.not_valid_after_utc
        self._generation += 1  # after ``_config``: ``fetch`` (on a gRPC thread) reads them in the other order
        self._issued.set()

    async def issued(self) -> None:
        """Wait until a certificate has been signed."""
        await self._issued.wait()

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that always present the latest certificate (call after ``issued``)."""
        assert self._config is not None, "credentials() before the first certificate"
        self._fetched = self._generation
        # Clients are not asked for certificates: they present a token, not a mesh identity.
        return grpc.dynamic_ssl_server_credentials(self._config, self.fetch, require_client_authentication=False)

    async def keep_fresh(self) -> None:
        """Re-sign at half the remaining life (or retry after a failure) until cancelled."""
        while True:
            now = self._clock()
            if self._not_after is None or self._not_after <= now:
                delay = RETRY_INTERVAL
            else:
                delay = max((self._not_after - now) / 2, MIN_RENEWAL)
            await self._sleep(delay.total_seconds())
            if self._authority is not None:
                self.renew(self._authority)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher, called before each handshake: the new configuration once, else ``None`` (no change)."""
        generation = self._generation
        if generation == self._fetched:
            return None
        self._fetched = generation
        return self._config
