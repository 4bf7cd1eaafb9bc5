"""Route status on Kubernetes, against kmock (a mock of the API server, not a cluster).

The policy controller writes ``status.parents`` by a JSON merge patch of the route's
``status`` subresource, guarded by the resourceVersion its watch saw, and only while its
replica holds the Lease ``policy-controller-write`` in the control-plane namespace.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tether.platform.kubernetes.lease import LeaseElector
from tether.platform.kubernetes.watch import KubernetesResourceWatcher
from tether.policy import PolicyConfig, PolicyService
from tether.policy.kubernetes_status import LEASE_NAME, KubeStatusWriter
from tether.policy.model import InboundServer
from tether.policy.outbound.index import OutboundState, State
from tether.policy.status import CONTROLLER_NAME, Key

from .kube_helpers import emulated_api, watching
from .test_controllers import namespace, pod
from .test_controllers import service as service_doc
from .test_platform_cli import running

NS = "emojivoto"
ROUTES = f"/apis/policy.linkerd.io/v1beta3/namespaces/{NS}/httproutes"
SERVERS = f"/apis/policy.linkerd.io/v1beta3/namespaces/{NS}/servers"
WATCHED_CRDS = ("policy.linkerd.io/v1beta3/servers", "policy.linkerd.io/v1beta1/serverauthorizations",
                "policy.linkerd.io/v1alpha1/authorizationpolicies", "policy.linkerd.io/v1alpha1/meshtlsauthentications",
                "policy.linkerd.io/v1alpha1/networkauthentications",
                "policy.linkerd.io/v1alpha1/httplocalratelimitpolicies", "policy.linkerd.io/v1beta3/httproutes",
                "gateway.networking.k8s.io/v1/httproutes", "gateway.networking.k8s.io/v1/grpcroutes",
                "gateway.networking.k8s.io/v1alpha2/tlsroutes", "gateway.networking.k8s.io/v1alpha2/tcproutes",
                "policy.linkerd.io/v1alpha1/egressnetworks", "coordination.k8s.io/v1/leases", "v1/pods", "v1/services",
                "workload.linkerd.io/v1beta1/externalworkloads")

ROUTE = {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "HTTPRoute",
         "metadata": {"name": "r", "namespace": NS, "resourceVersion": "7"},
         "spec": {"parentRefs": [{"group": "policy.linkerd.io", "kind": "Server", "name": "web"}],
                  "rules": [{"matches": [{"path": {"value": "/api"}}]}]},
         "status": {"parents": [{"parentRef": {"kind": "Gateway", "name": "gw"}, "controllerName": "example.com/gw",
                                 "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}]}}
OUTBOUND_ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                  "metadata": {"name": "out", "namespace": NS},
                  "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                           "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}
SERVER = {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server", "metadata": {"name": "web", "namespace": NS},
          "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": 8080}}


async def _seed(api: Any, route: dict[str, Any] = ROUTE) -> None:
    for group_version_plural in WATCHED_CRDS:
        api.resources[group_version_plural] = {}
    api.namespaces.append(namespace(NS))
    await api.post(ROUTES, json=route)


def ours(route: dict[str, Any]) -> dict[str, tuple[str, str]]:
    parent = next(p for p in route["status"]["parents"] if p["controllerName"] == CONTROLLER_NAME)
    return {c["type"]: (c["status"], c["reason"]) for c in parent["conditions"]}


class Counted:
    """The real writer; ``written`` is set (and ``writes`` counts) after each write it made."""

    def __init__(self, inner: KubeStatusWriter) -> None:
        self.inner = inner
        self.written = asyncio.Event()
        self.writes = 0

    async def write(self, key: Key, resource_version: str, status: dict[str, Any]) -> str | None:
        version = await self.inner.write(key, resource_version, status)
        self.writes += 1
        self.written.set()
        return version

    def close(self) -> None:
        self.inner.close()


async def _started(settings: Any) -> tuple[KubernetesResourceWatcher, asyncio.Event, Counted, PolicyService]:
    """A policy controller on kmock with a counted status writer, writing only once ``leading`` is set."""
    watcher = KubernetesResourceWatcher(settings)
    leading = asyncio.Event()
    writer = Counted(KubeStatusWriter(watcher.client))
    service = PolicyService(PolicyConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0"), watcher, writer,
                            leading=leading)
    await asyncio.wait_for(service.start(), 20)
    return watcher, leading, writer, service


async def test_only_the_leader_patches_the_status_subresource(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _seed(api)
        watcher, leading, writer, service = await _started(settings)
        try:
            assert service.status is not None
            await asyncio.wait_for(service.status.idle.wait(), 10)  # synced, and waiting to lead
            assert writer.writes == 0 and not [r for r in api["patch"] if r.url.path.endswith("/status")]

            leading.set()
            await asyncio.wait_for(writer.written.wait(), 10)
            [patch] = [r for r in api["patch"] if r.url.path.endswith("/status")]
            assert patch.url.path == f"{ROUTES}/r/status"
            assert patch.headers["Content-Type"] == "application/merge-patch+json"
            assert patch.url.query["fieldManager"] == "linkerd.io/policy-controller"  # as Linkerd's patch names it
            assert patch.data["metadata"] == {"resourceVersion": "7"}  # as the watch saw it: a precondition
            route = (await (await api.get(f"{ROUTES}/r")).json())
            assert ours(route) == {"Accepted": ("False", "NoMatchingParent")}  # Accepted alone on a Server, as Linkerd
            assert route["status"]["parents"][0]["controllerName"] == "example.com/gw"  # another's parent kept

            await watching(api, 13)
            writer.written.clear()
            await api.post(SERVERS, json=SERVER)
            await asyncio.wait_for(writer.written.wait(), 10)
            route = (await (await api.get(f"{ROUTES}/r")).json())
            assert ours(route)["Accepted"] == ("True", "Accepted")
        finally:
            await service.stop()
            await watcher.client.close()


async def test_policy_serve_on_kubernetes_takes_the_lease_and_writes_status(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await _seed(api)
        async with running("policy", "serve", "--platform", "kubernetes", "--kubeconfig", str(settings.kubeconfig),
                           "--insecure", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
                           ready=r"serving gRPC on port (\d+)"):
            async with asyncio.timeout(20):
                while not [r for r in api["patch"] if r.url.path == f"{ROUTES}/r/status"]:
                    await asyncio.sleep(0.05)  # kmock offers no notification of writes: poll its state
            lease = await (await api.get(f"/apis/coordination.k8s.io/v1/namespaces/linkerd/leases/{LEASE_NAME}")).json()
            assert lease["spec"]["holderIdentity"]
            route = (await (await api.get(f"{ROUTES}/r")).json())
            assert ours(route)["Accepted"] == ("False", "NoMatchingParent")
        # A second replica, started while the first's Lease is fresh, would wait: the Lease is held.
        elector = LeaseElector(KubernetesResourceWatcher(settings).client, "linkerd", LEASE_NAME, "other")
        assert await elector.try_once() is False


async def test_a_route_applies_once_the_leader_has_written_its_status(tmp_path: Path) -> None:
    # As Linkerd's indexes, the controller reads acceptance back from status.parents: a replica that does not
    # lead serves the Server without its route (though the Server exists) and the Service without its route,
    # until the leader's patches land and its watches deliver them.
    async with emulated_api(tmp_path) as (api, _, settings):
        # kmock keeps a patched object's resourceVersion, which the watcher would take for a repeat: without
        # one, it compares content (an API server moves the version on; this emulator does not).
        await _seed(api, {**ROUTE, "metadata": {"name": "r", "namespace": NS}})
        await api.post(SERVERS, json=SERVER)
        await api.post(f"/api/v1/namespaces/{NS}/pods", json=pod("web-0", NS, "web", "10.1.0.5"))
        await api.post(f"/api/v1/namespaces/{NS}/services", json=service_doc("web", NS, "10.96.0.10"))
        await api.post(f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/httproutes", json=OUTBOUND_ROUTE)
        watcher, leading, writer, service = await _started(settings)
        try:
            assert service.status is not None
            await asyncio.wait_for(service.status.idle.wait(), 10)
            routed, routed_out = asyncio.Event(), asyncio.Event()
            seen: list[list[str]] = []

            def listener(server: InboundServer | None, _at: float | None) -> None:
                names = [] if server is None else [r.ref.name for r in server.http_routes]
                seen.append(names)
                if names == ["r"]:
                    routed.set()

            def outbound_listener(state: State, _at: float | None) -> None:
                if isinstance(state, OutboundState) and [r.name for r in state.http_routes] == ["out"]:
                    routed_out.set()

            service.index.subscribe(NS, "web-0", 8080, listener)
            target = service.outbound_index.service_target(f"web.{NS}.svc.cluster.local:80", NS)
            before = service.outbound_index.subscribe(target, outbound_listener)
            assert seen == [["default"]]
            assert isinstance(before, OutboundState) and before.http_routes == ()
            await watching(api, 13)  # the patches must reach the routes' watches as events
            leading.set()
            await asyncio.wait_for(routed.wait(), 10)
            await asyncio.wait_for(routed_out.wait(), 10)
            route = (await (await api.get(f"{ROUTES}/r")).json())
            assert ours(route)["Accepted"] == ("True", "Accepted")
        finally:
            await service.stop()
            await watcher.client.close()
