"""Identity benchmark: Certify calls per second over gRPC/TLS, beside the raw cost of signing the leaf.

``python -m bench identity [-- --seconds S --concurrency N --cpu C]``.  Client and server run in one
process pinned to a single CPU (``os.sched_setaffinity``), so every thread -- the asyncio loop
and gRPC's own -- shares one core.  Three rates are printed: signing the same leaf with
``cryptography`` in a loop, the whole Certify decision in-process (CSR checks, token, signing),
and Certify end to end over gRPC on loopback.  Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table

from tether.api import identity_pb2, identity_pb2_grpc
from tether.identity import pem, pki
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.identity.certifier import Certifier
from tether.identity.server import IdentityConfig, IdentityService
from tether.naming import WorkloadIdentity, control_plane_identity
from tether.platform.local.tokens import LocalTokenSigner, LocalTokenVerifier, TokenKey
from tether.proxy.core import certs

WEB = WorkloadIdentity("web", "emojivoto")


def run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench identity")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per row")
    parser.add_argument("--concurrency", type=int, default=16, help="Certify calls in flight")
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the one CPU to run on")
    args = parser.parse_args(argv)
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {args.cpu})
    try:
        with tempfile.TemporaryDirectory(prefix="tether-bench-identity-") as tmp:
            rows = _measure(Path(tmp), args.seconds, args.concurrency)
    finally:
        os.sched_setaffinity(0, previous)
    table = Table(title=f"identity: one process pinned to CPU {args.cpu} (client, server and gRPC threads share it)")
    for column in ("what", "per second", "µs each", "vs raw signing"):
        table.add_column(column, justify="left" if column == "what" else "right")
    raw = rows[0][1]
    for what, rate in rows:
        table.add_row(what, f"{rate:,.0f}", f"{1e6 / rate:,.0f}", f"{rate / raw:.2f}×")
    Console().print(table)
    Console().print(f"Certify over gRPC: {args.concurrency} calls in flight on one TLS channel, one reused CSR and token.")


def _measure(tmp: Path, seconds: float, concurrency: int) -> list[tuple[str, float]]:
    now = datetime.now(UTC)
    anchor, anchor_key = pki.create_trust_anchor(
        control_plane_ns="linkerd", trust_domain="cluster.local", valid_for=timedelta(days=365), now=now
    )
    issuer, issuer_key = pki.create_issuer(
        anchor, anchor_key, control_plane_ns="linkerd", trust_domain="cluster.local", valid_for=timedelta(days=365), now=now
    )
    for name, data, private in (
        ("ca.crt", pem.certificate_pem(anchor), False),
        ("issuer.crt", pem.certificate_pem(issuer), False),
        ("issuer.key", pem.private_key_pem(issuer_key), True),
    ):
        pem.write_file(tmp / name, data, private=private)
    authority = CertificateAuthority(Issuer.validated([issuer], issuer_key, [anchor]), IssuanceSettings())
    key = certs.new_key()
    csr = certs.csr_der(key, WEB.dns_name)
    token_key = TokenKey.load_or_create(tmp / "state")
    token = LocalTokenSigner(token_key).mint(namespace="emojivoto", service_account="web", pod="web-0")
    verifier = LocalTokenVerifier(token_key)
    certifier = Certifier(
        lambda: authority, verifier, control_plane_ns="linkerd", trust_domain="cluster.local", clock=lambda: now
    )
    sign_rate = _loop_rate(lambda: authority.issue(key.public_key(), WEB, now), seconds)
    decide_rate = _loop_rate(lambda: certifier.certify(WEB.dns_name, token, csr), seconds)
    config = IdentityConfig(
        trust_anchors=tmp / "ca.crt", issuer_cert=tmp / "issuer.crt", issuer_key=tmp / "issuer.key",
        addr="127.0.0.1:0", admin_addr="127.0.0.1:0",
    )
    grpc_rate = asyncio.run(_grpc_rate(config, verifier, pem.certificate_pem(anchor), token, csr, seconds, concurrency))
    return [
        ("sign the leaf (cryptography, in a loop)", sign_rate),
        ("Certifier.certify in-process (checks + token + sign)", decide_rate),
        ("Certify over gRPC + TLS on loopback", grpc_rate),
    ]


def _loop_rate(step: Callable[[], object], seconds: float) -> float:
    for _ in range(50):  # warm up
        step()
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            step()
        count += 100
    return count / (time.perf_counter() - start)


async def _grpc_rate(
    config: IdentityConfig, verifier: LocalTokenVerifier, anchors_pem: bytes, token: bytes, csr: bytes,
    seconds: float, concurrency: int,
) -> float:
    service = IdentityService(config, verifier)
    await service.start()
    request = identity_pb2.CertifyRequest(identity=WEB.dns_name, token=token, certificate_signing_request=csr)
    credentials = grpc.ssl_channel_credentials(root_certificates=anchors_pem)
    options = [("grpc.ssl_target_name_override", control_plane_identity("identity").dns_name)]
    try:
        async with grpc.aio.secure_channel(f"127.0.0.1:{service.port}", credentials, options=options) as channel:
            stub = identity_pb2_grpc.IdentityStub(channel)
            for _ in range(50):  # warm up: connection, TLS handshake, code paths
                await stub.Certify(request, timeout=30)
            done = 0
            deadline = time.perf_counter() + seconds

            async def caller() -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    await stub.Certify(request, timeout=30)
                    done += 1

            start = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(concurrency)))
            return done / (time.perf_counter() - start)
    finally:
        await service.stop(grace=None)
