"""The tap server's mesh identity on Kubernetes: a certificate from identity's ``Certify``, as a proxy gets its own.

The tap controller presents the tap identity
(``tap.<viz-ns>.serviceaccount.identity.<cp-ns>.<td>``) to each proxy's
``Observe``.  On the local platform ``viz install`` has the platform's issuer
sign it; on a cluster the issuer's key stays in the cluster, so the tap pod
asks identity as a proxy does: a P-256 key made here and kept in memory, a CSR
for the name, and the pod's service-account token (projected with audience
``identity.l5d.io``, which identity checks with a TokenReview) over TLS to
identity, whose certificate must carry identity's own name and chain to the
trust anchors.  ``IdentityRenewer`` renews at 70 % of each certificate's
lifetime (as linkerd2-proxy does) and retries with backoff on failure, keeping
the current certificate meanwhile.

Callers: ``tether viz tap-apiserver``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID

from tether.api import identity_pb2, identity_pb2_grpc
from tether.csr import csr_der
from tether.viz.tap import TapCredentials

log = logging.getLogger(__name__)

RENEW_AT = 0.7  # of the certificate's lifetime
RETRY_MIN, RETRY_MAX = 1.0, 60.0  # seconds between failed attempts, doubling


class TapIdentityError(Exception):
    """A Certify attempt failed; the message says where and why."""


@dataclass(frozen=True, slots=True)
class IdentitySource:
    addr: str  # identity's host:port
    server_name: str  # the name identity's certificate must carry
    anchors_pem: bytes
    token_file: Path  # read again for every attempt (the kubelet rotates it)
    name: str  # the identity to ask for: the tap identity


async def certify(source: IdentitySource, key: ec.EllipticCurvePrivateKey,
                  timeout: float = 10.0) -> tuple[TapCredentials, datetime]:
    """One Certify call: the credentials it gives and when they expire. ``TapIdentityError`` says why not."""
    try:
        token = source.token_file.read_bytes()
    except OSError as err:
        raise TapIdentityError(f"cannot read the service-account token {source.token_file}: {err}") from None
    request = identity_pb2.CertifyRequest(identity=source.name, token=token,
                                          certificate_signing_request=csr_der(key, source.name))
    credentials = grpc.ssl_channel_credentials(root_certificates=source.anchors_pem)
    async with grpc.aio.secure_channel(source.addr, credentials,
                                       options=[("grpc.ssl_target_name_override", source.server_name)]) as channel:
        try:
            answer = await identity_pb2_grpc.IdentityStub(channel).Certify(request, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise TapIdentityError(f"identity at {source.addr} refused {source.name}: "
                                   f"{err.code().name}: {err.details()}") from None
    try:
        leaf = x509.load_der_x509_certificate(answer.leaf_certificate)
        names = leaf.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
        chain = [leaf, *(x509.load_der_x509_certificate(d) for d in answer.intermediate_certificates)]
    except (ValueError, x509.ExtensionNotFound) as err:
        raise TapIdentityError(f"identity at {source.addr} answered an unreadable certificate: {err}") from None
    if source.name not in names.get_values_for_type(x509.DNSName):
        raise TapIdentityError(f"identity at {source.addr} certified another name than {source.name}")
    if leaf.public_key().public_numbers() != key.public_key().public_numbers():
        raise TapIdentityError(f"identity at {source.addr} certified another key")
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    chain_pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)
    return TapCredentials(key_pem, chain_pem, source.anchors_pem), leaf.not_valid_after_utc


class IdentityRenewer:
    """Keeps ``current`` credentials (set, with ``ready``, by the first Certify) and gives each renewal to
    ``install``."""

    def __init__(self, source: IdentitySource, install: Callable[[TapCredentials], None],
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.source = source
        self.install = install
        self.clock = clock
        self.ready = asyncio.Event()
        self.current: TapCredentials | None = None
        self.expires: datetime | None = None

    async def run(self) -> None:
        retry = RETRY_MIN
        while True:
            started = self.clock()
            try:
                credentials, expires = await certify(self.source, ec.generate_private_key(ec.SECP256R1()))
            except TapIdentityError as err:
                log.warning("tap identity: %s; again in %.0fs", err, retry)
                await asyncio.sleep(retry)
                retry = min(retry * 2, RETRY_MAX)
                continue
            retry = RETRY_MIN
            self.current, self.expires = credentials, expires
            self.install(credentials)
            self.ready.set()
            log.info("tap identity: certified as %s until %s", self.source.name, expires.isoformat())
            await asyncio.sleep(max(1.0, (expires - started).total_seconds() * RENEW_AT))
