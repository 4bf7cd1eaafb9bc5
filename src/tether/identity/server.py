"""The identity component as a process: Certify over gRPC/TLS, issuer reloads, admin port.

``tether identity serve`` (``tether.cli.identity``) builds an ``IdentityConfig`` and a platform
``TokenVerifier`` and runs an ``IdentityService``; tests and benchmarks run it in-process.
The gRPC servicer here is a thin shell: decisions are made by ``tether.identity.certifier``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
from cryptography.hazmat.primitives.serialization import Encoding
from google.protobuf.timestamp_pb2 import Timestamp

from tether.api import identity_pb2, identity_pb2_grpc
from tether.identity import pem
from tether.admin import AdminServer
from tether.identity.ca import IssuanceSettings
from tether.identity.certifier import Certifier, Issued
from tether.identity.errors import CertifyError, Reason
from tether.identity.issuer_source import IssuerSource
from tether.identity.metrics import IdentityMetrics
from tether.identity.serving import ServingCertificate
from tether.naming import DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN, control_plane_identity
from tether.platform.tokens import TokenVerifier

log = logging.getLogger(__name__)

# Largest Certify request read: a CSR (an RSA-4096 one is under 2 KiB) and a token (a Kubernetes
# projected token is 1-2 KiB) with room to spare.  gRPC's default, 4 MiB, let callers without a
# valid token make the service hold megabytes per call.
MAX_REQUEST_BYTES = 64 * 1024

DEFAULT_ADDR = "0.0.0.0:8080"
DEFAULT_ADMIN_ADDR = "0.0.0.0:9990"


@dataclass(frozen=True, slots=True)
class IdentityConfig:
    trust_anchors: Path  # PEM bundle; any of its roots may have signed the issuer
    issuer_cert: Path  # PEM: the issuer, optionally followed by its chain up to an anchor
    issuer_key: Path
    addr: str = DEFAULT_ADDR
    admin_addr: str = DEFAULT_ADMIN_ADDR
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS
    issuance: IssuanceSettings = field(default_factory=IssuanceSettings)
    issuer_poll_interval: float = 1.0  # seconds between looks at the issuer files


class ConfigError(Exception):
    """The service cannot start with this configuration; the message names the file or address."""


def split_host_port(addr: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into its parts, else ``ValueError`` naming ``addr``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{addr!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


def utc_now() -> datetime:
    return datetime.now(UTC)


class IdentityService:
    def __init__(
        self,
        config: IdentityConfig,
        verifier: TokenVerifier,
        *,
        clock: Callable[[], datetime] = utc_now,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self._admin_addr = _address("admin address", config.admin_addr)
        self._grpc_addr = _grpc_target(*_address("address", config.addr))
        self.metrics = IdentityMetrics(clock)
        try:
            anchors = pem.read_certificates(config.trust_anchors)
        except pem.PemError as exc:
            raise ConfigError(f"trust anchors: {exc}") from None
        self.issuer = IssuerSource(config.issuer_cert, config.issuer_key, anchors, config.issuance, self.metrics)
        self.serving = ServingCertificate(
            control_plane_identity("identity", config.control_plane_ns, config.trust_domain), clock, sleep
        )
        self.issuer.add_listener(self.serving.renew)
        certifier = Certifier(
            lambda: self.issuer.current,
            verifier,
            control_plane_ns=config.control_plane_ns,
            trust_domain=config.trust_domain,
            clock=clock,
        )
        self._servicer = _CertifyServicer(certifier, self.metrics)
        self._admin = AdminServer.for_registry(self.metrics.registry, lambda: self.ready, "no issuer loaded yet")
        self._grpc: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = False
        self.port = 0
        self.admin_port = 0

    async def start(self) -> None:
        """Serve admin at once and Certify as soon as an issuer has loaded (``ready`` then turns true)."""
        try:
            self.admin_port = await self._admin.start(*self._admin_addr)
        except OSError as exc:
            raise ConfigError(f"admin address {self.config.admin_addr}: {exc.strerror}") from None
        self.issuer.poll()
        self._tasks = [
            asyncio.create_task(self.issuer.watch(self.config.issuer_poll_interval), name="issuer-watch"),
            asyncio.create_task(self.serving.keep_fresh(), name="serving-cert"),
        ]
        await self.serving.issued()
        # so_reuseport off: a second identity on the same port must fail, not share the traffic.
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_REQUEST_BYTES)]
        )
        identity_pb2_grpc.add_IdentityServicer_to_server(self._servicer, server)
        try:
            self.port = server.add_secure_port(self._grpc_addr, self.serving.credentials())
        except RuntimeError:
            raise ConfigError(f"address {self.config.addr}: cannot listen (in use or not local)") from None
        await server.start()
        self._grpc = server
        self.ready = True
        log.info("identity serving Certify on port %d (admin on port %d)", self.port, self.admin_port)

    async def stop(self, grace: float | None = 1.0) -> None:
        self.ready = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._grpc is not None:
            await self._grpc.stop(grace)
        await self._admin.stop()


class _CertifyServicer(identity_pb2_grpc.IdentityServicer):
    def __init__(self, certifier: Certifier, metrics: IdentityMetrics) -> None:
        self._certifier = certifier
        self._metrics = metrics

    async def Certify(  # noqa: N802 - the generated servicer's method name
        self, request: identity_pb2.CertifyRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.CertifyResponse:
        try:
            issued = self._certifier.certify(request.identity, request.token, request.certificate_signing_request)
        except CertifyError as exc:
            failure = exc
        except Exception:  # this is the driver: anything unexpected is our fault, reported as INTERNAL
            log.exception("Certify for %r failed", request.identity)
            failure = CertifyError(Reason.INTERNAL, "internal error")
        else:
            self._metrics.certificates_issued.inc()
            log.debug("issued a certificate for %r until %s", request.identity, issued.valid_until)
            return _response(issued)
        self._metrics.certify_failures.labels(failure.reason.label).inc()
        log.info("Certify for %r refused (%s): %s", request.identity, failure.reason.code.name, failure)
        await context.abort(failure.reason.code, str(failure))  # raises: ends the call with that status


def _address(what: str, addr: str) -> tuple[str, int]:
    try:
        return split_host_port(addr)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _grpc_target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _response(issued: Issued) -> identity_pb2.CertifyResponse:
    valid_until = Timestamp()
    valid_until.FromDatetime(issued.valid_until)
    return identity_pb2.CertifyResponse(
        leaf_certificate=issued.leaf.public_bytes(Encoding.DER),
        intermediate_certificates=[c.public_bytes(Encoding.DER) for c in issued.intermediates],
        valid_until=valid_until,
    )
