"""The issuer in use, reloaded from its files when they change, without a restart.

``tether.identity.server`` owns one ``IssuerSource``: ``watch`` polls the issuer certificate and
key, Certify takes ``current`` once per call, and ``tether.identity.serving`` listens for new
issuers to re-sign the service's own certificate.  Polling compares content hashes, so it works
for plain file writes and for Kubernetes' symlink-swapped Secret volumes alike.

A swap is one reference assignment: a call in flight keeps the authority it took, so no call
fails during a rotation.  New content that does not load (unreadable, not a CA, not chained to
the trust anchors) keeps the previous issuer, is logged once and counted in
``identity_issuer_reload_failures_total``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography import x509

from tether.identity import pem, pki
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.identity.metrics import IdentityMetrics

log = logging.getLogger(__name__)

IssuerListener = Callable[[CertificateAuthority], None]


class IssuerSource:
    def __init__(
        self,
        cert_path: Path,
        key_path: Path,
        anchors: Sequence[x509.Certificate],
        settings: IssuanceSettings,
        metrics: IdentityMetrics,
    ) -> None:
        self._cert_path = cert_path
        self._key_path = key_path
        self._anchors = tuple(anchors)
        self._settings = settings
        self._metrics = metrics
        self._current: CertificateAuthority | None = None
        self._applied: bytes | None = None  # digest of the files behind ``_current``
        self._rejected: bytes | None = None  # digest of files that failed; not retried until they change
        self._pending: bytes | None = None  # digest seen once, loaded if still the same at the next poll
        self._listeners: list[IssuerListener] = []
        self._changed = asyncio.Event()

    @property
    def current(self) -> CertificateAuthority | None:
        """The authority to sign with, or ``None`` until an issuer has loaded."""
        return self._current

    def add_listener(self, listener: IssuerListener) -> None:
        """Call ``listener`` with each newly loaded authority (after the swap)."""
        self._listeners.append(listener)

    def poll(self) -> None:
        """Look at the files once; load them if their content is new and has settled."""
        content = self._read()
        digest = _digest(content)
        if digest in (self._applied, self._rejected):
            self._pending = None
            return
        if self._current is not None and digest != self._pending:
            # Certificate and key are two files written one after the other; wait one poll so a
            # half-done rotation is not reported as a failure.
            self._pending = digest
            return
        self._pending = None
        try:
            if isinstance(content, pem.PemError):
                raise content
            issuer = self._parse(*content)
        except (pem.PemError, pki.PkiError) as exc:
            self._rejected = digest
            self._metrics.issuer_reload_failures.inc()
            outcome = "keeping the previous issuer" if self._current else "Certify is unavailable until one loads"
            log.warning("issuer not loaded: %s; %s", exc, outcome)
        else:
            self._applied, self._rejected = digest, None
            authority = CertificateAuthority(issuer, self._settings)
            self._current = authority
            self._metrics.issuer_loaded(issuer.not_after)
            log.info(
                "issuer %r loaded from %s (valid until %s)",
                pki.subject_cn(issuer.certificate), self._cert_path, issuer.not_after.isoformat(),
            )
            for listener in self._listeners:
                listener(authority)
        self._changed.set()
        self._changed = asyncio.Event()

    async def watch(self, interval: float) -> None:
        """Poll every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.poll()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, re-checking after each load attempt."""
        while not condition():
            await self._changed.wait()

    def _read(self) -> tuple[bytes, bytes] | pem.PemError:
        try:
            return pem.read_bytes(self._cert_path), pem.read_bytes(self._key_path)
        except pem.PemError as exc:
            return exc

    def _parse(self, cert_pem: bytes, key_pem: bytes) -> Issuer:
        certs = pem.parse_certificates(cert_pem, str(self._cert_path))
        key = pem.parse_private_key(key_pem, str(self._key_path))
        try:
            return Issuer.validated(certs, key, self._anchors)
        except pki.PkiError as exc:
            raise pki.PkiError(f"{self._cert_path}: {exc}") from None


def _digest(content: tuple[bytes, bytes] | pem.PemError) -> bytes:
    if isinstance(content, pem.PemError):
        return hashlib.sha256(str(content).encode()).digest()
    cert_pem, key_pem = content
    return hashlib.sha256(len(cert_pem).to_bytes(8, "big") + cert_pem + key_pem).digest()
