"""A control-plane gRPC port: its listen address, its TLS certificate (re-read when the files change), its options.

Used by ``tether.serving.process`` for destination and policy alike, so both
serve with the same TLS rules: the certificate chain and key are re-read at the
next handshake after the files change (the identity they carry is short-lived),
and with trust anchors given a client must present a certificate issued under
them (mTLS).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

# gRPC core queues incoming calls the (single-threaded) asyncio server has not picked up yet, and by
# default stalls calls beyond 1,000 (soft) / 3,000 (hard) pending: every proxy reconnecting at once
# after a restart would wait.  Found by bench/destination.py --large (5,000 streams opened together).
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.server.max_pending_requests", 1 << 20),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
    # Requests to the controllers are a target name and a token: a few hundred bytes.
    ("grpc.max_receive_message_length", 64 * 1024),
]


class ConfigError(Exception):
    """The configuration cannot be served (unreadable TLS files, unparsable or busy address)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The gRPC port's certificate chain and key (PEM), and optionally the roots to verify client certificates.

    The files are read again when they change, at the next TLS handshake.
    """

    cert: Path
    key: Path
    client_ca: Path | None = None


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` of a listen address (``[::]:8086`` for IPv6)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{addr!r} is not a host:port listen address")
    return host.strip("[]") or "0.0.0.0", int(port)


class ServingCertificate:
    """The gRPC port's certificate, read from files and read again (at the next handshake) when they change."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._stamp = self._mtimes()
        self._config = self._load()

    def _mtimes(self) -> tuple[float, ...]:
        paths = [self._files.cert, self._files.key, *([self._files.client_ca] if self._files.client_ca else [])]
        try:
            return tuple(os.stat(p).st_mtime_ns for p in paths)
        except OSError as exc:
            raise ConfigError(f"cannot read TLS file: {exc}") from None

    def _load(self) -> grpc.ServerCertificateConfiguration:
        try:
            cert, key = Path(self._files.cert).read_bytes(), Path(self._files.key).read_bytes()
            roots = Path(self._files.client_ca).read_bytes() if self._files.client_ca else None
        except OSError as exc:
            raise ConfigError(f"cannot read TLS file: {exc}") from None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=roots)

    def credentials(self) -> grpc.ServerCredentials:
        # With trust anchors given, clients must present a certificate they issued.
        return grpc.dynamic_ssl_server_credentials(
            self._config, self._fetch, require_client_authentication=self._files.client_ca is not None
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC (its own thread) before each handshake; None keeps the current certificate.
        try:
            stamp = self._mtimes()
            if stamp == self._stamp:
                return None
            config = self._load()
        except ConfigError as exc:
            log.warning("keeping the current TLS certificate: %s", exc)
            return None
        self._stamp = stamp
        log.info("serving a new TLS certificate from %s", self._files.cert)
        return config


async def start_grpc(
    handlers: Sequence[grpc.GenericRpcHandler], addr: str, tls: TlsFiles | None
) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server for ``handlers`` on ``addr`` (TLS unless ``tls`` is None); return it and its port."""
    host, port = split_addr(addr)
    certificate = ServingCertificate(tls) if tls is not None else None
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers(tuple(handlers))
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(bind) if certificate is None else server.add_secure_port(
            bind, certificate.credentials())
    except RuntimeError:
        bound = 0
    if not bound:
        raise ConfigError(f"cannot listen on {addr}")
    await server.start()
    return server, bound
