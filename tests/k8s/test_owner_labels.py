"""The owner label of endpoints on Kubernetes: real ``Get`` streams over real gRPC; the API server is kmock.

The destination watches Jobs and ReplicaSets as metadata only (as Linkerd's
metadata informers do) and labels a pod of a CronJob's Job ``cronjob``, a pod of
a Deployment's ReplicaSet ``deployment``, by the objects themselves rather than by
names.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tether.cli.platform_opts import Platform
from tether.destination import DestinationConfig, DestinationService
from tether.destination.client import open_channel, stream_endpoints, update_dict
from tether.platform.kubernetes.client import METADATA_LIST, METADATA_WATCH

from .kube_helpers import emulated_api
from .test_controllers import pod
from .test_topology import NS, SLICES, serve_destination_kinds, service


def owned(manifest: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    manifest["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": kind, "name": name, "uid": f"{name}-uid",
                                                "controller": True}]
    return manifest


def endpoint_slice(*pods: tuple[str, str]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "web-abcde", "namespace": NS, "labels": {"kubernetes.io/service-name": "web"}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "namespace": NS, "name": name}} for name, ip in pods]}


async def test_get_labels_pods_by_their_cronjob_and_deployment(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        serve_destination_kinds(api)
        await api.post(f"/apis/batch/v1/namespaces/{NS}/jobs",
                       json=owned({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "report-29012",
                                   "namespace": NS}, "spec": {"template": {}}}, "CronJob", "report"))
        # A ReplicaSet whose name does not end in the pods' template hash: only the object says whose it is.
        await api.post(f"/apis/apps/v1/namespaces/{NS}/replicasets",
                       json=owned({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-v2",
                                   "namespace": NS}, "spec": {"replicas": 1}}, "Deployment", "web"))
        await api.post(f"/api/v1/namespaces/{NS}/services", json=service("web", "Cluster"))
        await api.post(f"/api/v1/namespaces/{NS}/pods", json=owned(pod("report-x", NS, "web", "10.1.0.1"),
                                                                    "Job", "report-29012"))
        await api.post(f"/api/v1/namespaces/{NS}/pods", json=owned(pod("web-x", NS, "web", "10.1.0.2"),
                                                                    "ReplicaSet", "web-v2"))
        await api.post(SLICES, json=endpoint_slice(("report-x", "10.1.0.1"), ("web-x", "10.1.0.2")))

        config = DestinationConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0")
        service_ = DestinationService(config, Platform("kubernetes", settings.kubeconfig).resource_watcher())
        await asyncio.wait_for(service_.start(), 20)
        try:
            async with open_channel(f"127.0.0.1:{service_.port}", None) as channel:
                stream = stream_endpoints(channel, f"web.{NS}.svc.cluster.local:80", "", 10)
                labels = {a["addr"]: a["metric_labels"] for a in update_dict(await anext(stream))["add"]["addrs"]}
                await stream.aclose()
        finally:
            await service_.stop()
        assert labels["10.1.0.1:8080"]["cronjob"] == "report" and "k8s_job" not in labels["10.1.0.1:8080"]
        assert labels["10.1.0.2:8080"]["deployment"] == "web" and "replicaset" not in labels["10.1.0.2:8080"]
        for path in ("/apis/batch/v1/jobs", "/apis/apps/v1/replicasets"):
            assert {r.headers["Accept"] for r in api["list"] if r.url.path == path} == {METADATA_LIST}
            assert {r.headers["Accept"] for r in api["watch"] if r.url.path == path} <= {METADATA_WATCH}
