"""Certify under attack by a caller without a valid token: oversized requests, junk CSRs, deeply nested token
headers.  Each is refused with the caller's error (never INTERNAL) and the service's memory stays flat."""

from __future__ import annotations

import asyncio
import base64
import signal
import subprocess
from pathlib import Path

import grpc
import pytest
from identity_helpers import IDENTITY_SVC, WEB, FakeClock, Pki, certify_stub, csr_for, request, running_identity, web_token
from test_certify_service import http_get, metric
from test_cli import TETHER, make_pki

from tether.api import identity_pb2_grpc
from tether.identity.server import MAX_REQUEST_BYTES
from tether.platform.local.tokens import LocalTokenSigner, LocalTokenVerifier

NAME = WEB.dns_name


def _nested_header_token(depth: int = 5_000) -> bytes:
    header = base64.urlsafe_b64encode(b"[" * depth + b"]" * depth).rstrip(b"=")
    return header + b".e30.c2ln"


def test_oversized_and_junk_requests_get_the_callers_errors(
    ca_files: Pki, verifier: LocalTokenVerifier, signer: LocalTokenSigner, clock: FakeClock
) -> None:
    async def scenario() -> tuple[dict[str, grpc.StatusCode], str, bool]:
        codes = {}
        async with running_identity(ca_files, verifier, clock) as service:
            async with certify_stub(service.port, ca_files.anchors_pem) as stub:
                cases = {
                    "4MB-csr": request(NAME, b"junk", b"x" * (4 * 1024 * 1024)),
                    "junk-csr-bad-token": request(NAME, b"junk", b"x" * (MAX_REQUEST_BYTES // 2)),
                    "nested-header": request(NAME, _nested_header_token(), csr_for(NAME)),
                }
                for case, req in cases.items():
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await stub.Certify(req, timeout=10)
                    codes[case] = caught.value.code()
                issued = await stub.Certify(request(NAME, web_token(signer), csr_for(NAME)), timeout=10)
            _, metrics = await http_get(service.admin_port, "/metrics")
        return codes, metrics, bool(issued.leaf_certificate)

    codes, metrics, issued = asyncio.run(scenario())
    assert codes == {
        "4MB-csr": grpc.StatusCode.RESOURCE_EXHAUSTED,  # refused by gRPC before it is read whole
        "junk-csr-bad-token": grpc.StatusCode.INVALID_ARGUMENT,
        "nested-header": grpc.StatusCode.INVALID_ARGUMENT,
    }
    assert metric(metrics, 'identity_certify_failures_total{reason="invalid_token"}') == 2
    assert metric(metrics, 'identity_certify_failures_total{reason="internal"}') == 0
    assert metric(metrics, 'identity_certify_failures_total{reason="malformed_csr"}') == 0
    assert issued, "the service still issues to a valid caller"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_memory_stays_flat_under_a_flood_of_big_requests(tmp_path: Path) -> None:
    pki_dir = make_pki(tmp_path / "pki")
    proc = subprocess.Popen(
        [TETHER, "identity", "serve", "--trust-anchors", str(pki_dir / "ca.crt"),
         "--issuer-cert", str(pki_dir / "issuer.crt"), "--issuer-key", str(pki_dir / "issuer.key"),
         "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,  # one log line per refusal: not piped
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("identity: serving Certify on port"), line
        port = int(line.split("port ")[1].split()[0].rstrip(","))
        anchors = (pki_dir / "ca.crt").read_bytes()

        async def flood(calls: int, size: int) -> set[grpc.StatusCode]:
            credentials = grpc.ssl_channel_credentials(root_certificates=anchors)
            options = [("grpc.ssl_target_name_override", IDENTITY_SVC), ("grpc.max_send_message_length", -1)]
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
                stub = identity_pb2_grpc.IdentityStub(channel)
                req = request(NAME, b"garbage-token", b"\x30" * size)

                async def one() -> grpc.StatusCode:
                    try:
                        await stub.Certify(req, timeout=120)
                    except grpc.aio.AioRpcError as exc:
                        return exc.code()
                    return grpc.StatusCode.OK

                codes: set[grpc.StatusCode] = set()
                for _ in range(calls // 20):
                    codes |= set(await asyncio.gather(*(one() for _ in range(20))))
                return codes

        asyncio.run(flood(20, 4 * 1024 * 1024))  # warm up: the first calls allocate gRPC's pools
        before = _rss_kib(proc.pid)
        assert asyncio.run(flood(100, 4 * 1024 * 1024)) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert asyncio.run(flood(400, MAX_REQUEST_BYTES - 1024)) == {grpc.StatusCode.INVALID_ARGUMENT}
        grown = _rss_kib(proc.pid) - before
        # Before the cap, 600 calls of 4 MB took the service from 58 MB to 2 GB.
        assert grown < 64 * 1024, f"identity grew by {grown} KiB"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
