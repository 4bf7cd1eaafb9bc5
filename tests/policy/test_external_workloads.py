"""Inbound policy for ExternalWorkloads: what a VM's proxy receives when it asks as ``external_workload``.

A Server selects ExternalWorkloads with ``externalWorkloadSelector`` (and pods only with
``podSelector``); its port may name one of the workload's ``spec.ports``.  Everything
else (authorizations, routes, defaults) is decided as for a pod.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from policy_helpers import NS, Harness, Pki, external_workload, mesh_tls, namespace, pod, policy, sa_id, server

P = "policy.linkerd.io"
VM = {"external": True, "pod_name": "vm-1"}


def vm_server(name: str, *, port: int | str = "http", app: str = "billing", protocol: str = "HTTP/1") -> dict[str, Any]:
    obj = server(name, port=port, app=app, protocol=protocol)
    obj["spec"]["externalWorkloadSelector"] = obj["spec"].pop("podSelector")
    return obj


async def test_a_server_selects_an_external_workload_by_its_named_port(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(app="billing"), external_workload(),
                       vm_server("billing"), mesh_tls("web-only", identities=[sa_id("web")]),
                       policy("web-to-vm", (P, "Server", "billing"), [(P, "MeshTLSAuthentication", "web-only")])) as h:
        s = await h.get(8080, **VM)
        assert s["labels"] == {"group": P, "kind": "server", "name": "billing"} and s["protocol"] == "http1"
        assert [(a["ref"], a["identities"]) for a in s["authorizations"]] == [
            ("authorizationpolicy/web-to-vm", [sa_id("web")])]
        # The same labels on a pod: an externalWorkloadSelector does not select it.
        assert (await h.get(8080))["labels"]["name"] == "all-unauthenticated"
        # A port the workload does not name: the default policy.
        assert (await h.get(9090, **VM))["labels"] == {"group": "", "kind": "default", "name": "all-unauthenticated"}


async def test_a_pod_selector_does_not_select_an_external_workload(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), external_workload(), server("pods-only", app="billing")) as h:
        assert (await h.get(8080, **VM))["labels"]["name"] == "all-unauthenticated"


async def test_a_vm_follows_changes_to_its_workload_and_its_servers(workdir: Path, pki: Pki) -> None:
    annotated = external_workload(annotations={"config.linkerd.io/default-inbound-policy": "deny"})
    async with Harness(workdir, pki, namespace(), annotated) as h:
        watch = h.watch(8080, **VM)
        assert (await watch.next())["labels"]["name"] == "deny"  # its own default-inbound-policy annotation
        h.apply(vm_server("billing"))
        assert (await watch.next())["labels"]["name"] == "billing"
        h.apply(external_workload(annotations={"config.linkerd.io/default-inbound-policy": "deny"}, app="other"))
        assert (await watch.next())["labels"]["name"] == "deny"  # relabelled: no longer selected
        h.delete("externalworkloads", "vm-1")
        assert await watch.code() == grpc.StatusCode.OK  # gone: the stream ends, as for a deleted pod


async def test_an_unknown_external_workload_is_not_found(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(name="vm-1")) as h:  # a pod of that name is no workload
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await h.get(8080, **VM)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert f"unknown server: no external workload {NS}/vm-1" in (caught.value.details() or "")
        assert (await h.watch(8080, **VM).error()).code() == grpc.StatusCode.NOT_FOUND
