"""``tether identity serve`` and ``tether destination serve`` with ``--platform kubernetes``, as processes, against kmock.

kmock runs in the test process; the services are the real commands, configured
by a kubeconfig that points at it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import kmock
import pytest
from click.testing import CliRunner
from executables import TETHER

from tether.cli.main import cli
from tether.destination.client import open_channel, stream_endpoints, update_dict
from tether.platform.tokens import IDENTITY_AUDIENCE

from .kube_helpers import TOKEN_REVIEWS, FakeAuthenticator, emulated_api
from .test_controllers import SLICES, WEB_ID, certify, endpoint_slice, namespace, pod, service, write_pki


@asynccontextmanager
async def running(*args: str, ready: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, re.Match[str]]]:
    """Run ``tether ARGS``; yield once a line of its output matches ``ready``."""
    proc = await asyncio.create_subprocess_exec(TETHER, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            if not line:
                raise AssertionError("exited before it was ready:\n" + "".join(seen))
            seen.append(line)
            match = re.search(ready, line)
            if match:
                break

        async def drain() -> None:
            while await proc.stdout.readline():  # type: ignore[union-attr]
                pass

        drainer = asyncio.ensure_future(drain())
        yield proc, match
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 20)
        if "drainer" in locals():
            drainer.cancel()
    assert proc.returncode == 0, "".join(seen)


async def test_identity_serve_on_kubernetes(tmp_path: Path) -> None:
    anchors, issuer_cert, issuer_key = write_pki(tmp_path / "pki")
    auth = FakeAuthenticator()
    auth.add("web-token", "system:serviceaccount:emojivoto:web", [IDENTITY_AUDIENCE], pod="web-1")
    async with emulated_api(tmp_path, kmock.KubernetesScaffold) as (api, _, settings):
        api["post", TOKEN_REVIEWS] << auth
        async with running("identity", "serve", "--platform", "kubernetes", "--kubeconfig", str(settings.kubeconfig),
                           "--trust-anchors", str(anchors), "--issuer-cert", str(issuer_cert),
                           "--issuer-key", str(issuer_key), "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
                           ready=r"serving Certify on port (\d+)") as (_, match):
            port = int(match.group(1))
            issued = await certify(port, anchors, WEB_ID, b"web-token")
            assert issued.leaf_certificate
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await certify(port, anchors, WEB_ID, b"forged")
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert [r.data["spec"]["audiences"] for r in api["post"]] == [[IDENTITY_AUDIENCE]] * 2


async def test_destination_serve_on_kubernetes(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        for group_version_plural in ("policy.linkerd.io/v1beta3/servers", "linkerd.io/v1alpha2/serviceprofiles",
                                     "discovery.k8s.io/v1/endpointslices", "workload.linkerd.io/v1beta1/externalworkloads",
                                     "v1/nodes", "apps/v1/replicasets", "batch/v1/jobs"):
            api.resources[group_version_plural] = {}
        api.namespaces.append(namespace("emojivoto"))
        await api.post("/api/v1/namespaces/emojivoto/services", json=service("web", "emojivoto", "10.96.0.10"))
        await api.post("/api/v1/namespaces/emojivoto/pods", json=pod("web-1", "emojivoto", "web", "10.1.0.1"))
        await api.post(SLICES, json=endpoint_slice("web", "emojivoto", ("web-1", "10.1.0.1")))
        home = tmp_path / "home"  # must stay empty: the Kubernetes platform opens no store
        async with running("destination", "serve", "--platform", "kubernetes", "--kubeconfig",
                           str(settings.kubeconfig), "--insecure", "--addr", "127.0.0.1:0",
                           "--admin-addr", "127.0.0.1:0", "--store", str(home / "store.db"),
                           ready=r"serving gRPC on port (\d+)") as (_, match):
            async with open_channel(f"127.0.0.1:{match.group(1)}", None) as channel:
                updates = stream_endpoints(channel, "web.emojivoto.svc.cluster.local:80", timeout=10)
                first = update_dict(await anext(updates))
                assert [a["addr"] for a in first["add"]["addrs"]] == ["10.1.0.1:8080"]
                await updates.aclose()
        assert not home.exists()


def test_kubeconfig_needs_the_kubernetes_platform(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["destination", "serve", "--insecure", "--kubeconfig", str(tmp_path / "kc")])
    assert result.exit_code == 2
    assert "--kubeconfig and --kube-context need --platform kubernetes" in result.output
