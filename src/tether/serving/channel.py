"""A client channel to a control-plane gRPC port, as a proxy opens it (TLS, checking the server's identity).

Used by the debugging clients behind ``tether diagnostics`` (destination and
policy) and by tests and benchmarks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc


@dataclass(frozen=True, slots=True)
class ClientTls:
    """Roots to verify the server, the name to expect in its certificate, and an optional client certificate."""

    roots: Path | bytes | None = None  # a PEM file, or PEM read elsewhere (e.g. a cluster's trust-roots ConfigMap)
    server_name: str | None = None
    cert: Path | None = None
    key: Path | None = None


def open_channel(addr: str, tls: ClientTls | None) -> grpc.aio.Channel:
    """A channel to ``addr``; plaintext when ``tls`` is None."""
    if tls is None:
        return grpc.aio.insecure_channel(addr)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.roots.read_bytes() if isinstance(tls.roots, Path) else tls.roots,
        private_key=tls.key.read_bytes() if tls.key else None,
        certificate_chain=tls.cert.read_bytes() if tls.cert else None,
    )
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return grpc.aio.secure_channel(addr, credentials, options=options)


async def read_messages(call: Any, timeout: float | None) -> AsyncIterator[Any]:
    """Every message of a server-streaming ``call`` until it ends; ``timeout`` bounds each wait.

    gRPC errors propagate as ``grpc.aio.AioRpcError``; the call is cancelled when the caller stops.
    """
    try:
        while True:
            message = await asyncio.wait_for(call.read(), timeout)
            if message is grpc.aio.EOF:
                return
            yield message
    finally:
        call.cancel()
