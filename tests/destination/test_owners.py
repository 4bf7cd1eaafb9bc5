"""The owner in an endpoint's metric labels: Linkerd's reading on Kubernetes, the pod's own elsewhere.

On Kubernetes the destination watches ReplicaSets and Jobs (metadata only) and
labels a pod by the owner that stands for its own: a Job's CronJob (``cronjob``),
a ReplicaSet's Deployment; a Job without one is ``k8s_job``, a ReplicaSet not
found or owned by another kind ``replicaset``, a pod with several owners ``pod``.
The local platform has no ReplicaSets or Jobs: the pod's own reading holds there
(a ReplicaSet named ``<deployment>-<pod-template-hash>`` is that Deployment's).
The index is fed real objects through ``ClusterIndex.apply``; the endpoints are
encoded as the ``Get`` stream's translator encodes them.  The same over real gRPC
with kmock is in tests/k8s/test_owner_labels.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_topology import Keeper

from tether.api import destination_pb2 as pb
from tether.destination.config import DestinationConfig
from tether.destination.endpoint_translator import EndpointEncoder
from tether.destination.metrics import DestinationMetrics
from tether.destination.watcher.cluster import WATCHED, WATCHED_WITH_NODES, ClusterIndex
from tether.destination.watcher.endpoints import EndpointsWatcher
from tether.destination.watcher.facts import ExternalWorkloadFacts, facts_of
from tether.destination.watcher.listeners import Address
from tether.destination.watcher.workloads import WorkloadWatcher
from tether.platform.watch import ResourceEvent
from tether.ports import PortSet

NS = "emojivoto"
TYPE_KEYS = {"Service": "Service", "Pod": "Pod", "EndpointSlice": "EndpointSlice.discovery.k8s.io",
             "ReplicaSet": "ReplicaSet.apps", "Job": "Job.batch"}
API_VERSIONS = {"EndpointSlice": "discovery.k8s.io/v1", "ReplicaSet": "apps/v1", "Job": "batch/v1"}


def obj(kind: str, name: str, *owners: tuple[str, str], **fields: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NS, **fields.pop("metadata", {})}
    if owners:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": k, "name": n, "uid": f"{n}-uid"} for k, n in owners]
    return {"apiVersion": API_VERSIONS.get(kind, "v1"), "kind": kind, "metadata": metadata, **fields}


def pod(name: str, ip: str, *owners: tuple[str, str]) -> dict[str, Any]:
    return obj("Pod", name, *owners, metadata={"labels": {"app": "web", "pod-template-hash": "7f9c"}},
               spec={"containers": [{"name": "web", "image": "web"}]},
               status={"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]})


# (pod, ip, its owners) -> the owner label Linkerd gives it on Kubernetes, and the pod's own reading.
PODS = [
    (pod("nightly-1", "10.0.0.1", ("Job", "nightly-2901")), ("cronjob", "nightly"), ("k8s_job", "nightly-2901")),
    (pod("once-1", "10.0.0.2", ("Job", "once")), ("k8s_job", "once"), ("k8s_job", "once")),
    (pod("web-1", "10.0.0.3", ("ReplicaSet", "web-7f9c")), ("deployment", "web"), ("deployment", "web")),
    (pod("roll-1", "10.0.0.4", ("ReplicaSet", "roll-7f9c")), ("replicaset", "roll-7f9c"), ("deployment", "roll")),
    (pod("gone-1", "10.0.0.5", ("ReplicaSet", "gone-7f9c")), ("replicaset", "gone-7f9c"), ("deployment", "gone")),
    (pod("db-0", "10.0.0.6", ("StatefulSet", "db")), ("statefulset", "db"), ("statefulset", "db")),
    (pod("two-1", "10.0.0.7", ("ReplicaSet", "web-7f9c"), ("StatefulSet", "db")), ("pod", "two-1"),
     ("deployment", "web")),
    (pod("bare", "10.0.0.8"), ("pod", "bare"), ("pod", "bare")),
]
OWNER_OBJECTS = [
    obj("Job", "nightly-2901", ("CronJob", "nightly")),
    obj("Job", "once"),
    obj("ReplicaSet", "web-7f9c", ("Deployment", "web")),
    obj("ReplicaSet", "roll-7f9c", ("Rollout", "roll")),  # not a kind Linkerd looks past
]
SERVICE = obj("Service", "web", spec={"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80,
                                                                            "targetPort": 8080}]})
SLICE = obj("EndpointSlice", "web-abc", metadata={"labels": {"kubernetes.io/service-name": "web"}},
            addressType="IPv4", ports=[{"name": "http", "port": 8080}],
            endpoints=[{"addresses": [p["status"]["podIP"]],
                        "targetRef": {"kind": "Pod", "name": p["metadata"]["name"]}} for p, _, _ in PODS])


class Targets:
    def __init__(self, targets: list[Address]) -> None:
        self.targets = targets

    def update(self, target: Address, at: float | None) -> None:
        self.targets.append(target)


def owner_labels(update: bytes) -> dict[str, tuple[str, str]]:
    """pod name -> (owner label key, value), from the encoded ``add``."""
    out = {}
    for addr in pb.Update.FromString(update).add.addrs:
        labels = dict(addr.metric_labels)
        known = {"pod", "serviceaccount", "zone", "zone_locality", "pod_template_hash", "control_plane_ns"}
        [(key, value)] = [(k, v) for k, v in labels.items() if k not in known] or [("pod", labels["pod"])]
        out[labels["pod"]] = (key, value)
    return out


@pytest.mark.parametrize("kubernetes", [True, False], ids=["kubernetes", "local"])
async def test_get_labels_each_pod_by_the_owner_that_stands_for_it(kubernetes: bool) -> None:
    index = ClusterIndex(PortSet(), WATCHED_WITH_NODES if kubernetes else WATCHED)
    watcher = EndpointsWatcher(index, DestinationMetrics())
    workloads = WorkloadWatcher(index, DestinationMetrics())
    objects = [SERVICE, *(p for p, _, _ in PODS), SLICE, *(OWNER_OBJECTS if kubernetes else ())]
    for o in objects:
        index.apply(TYPE_KEYS[o["kind"]], ResourceEvent("ADDED", o, "1", 1.0))
    listener = Keeper()
    watcher.subscribe(NS, "web", 80, listener, node_name="node-a")
    [snapshot] = listener.sets
    expected = {p["metadata"]["name"]: (k8s if kubernetes else local) for p, k8s, local in PODS}
    encoder = EndpointEncoder(DestinationConfig())
    assert owner_labels(encoder.add(snapshot)) == expected
    # The endpoint profile of a pod IP reads the owner the same way.
    targets: list[Address] = []
    workloads.subscribe("10.0.0.1", 8080, Targets(targets))
    assert [t.owner for t in targets] == [expected["nightly-1"]]


async def test_a_deleted_job_leaves_its_pods_labelled_by_the_job() -> None:
    index = ClusterIndex(PortSet(), WATCHED_WITH_NODES)
    job = obj("Job", "nightly-2901", ("CronJob", "nightly"))
    index.apply("Job.batch", ResourceEvent("ADDED", job, "1", 1.0))
    index.apply("Pod", ResourceEvent("ADDED", PODS[0][0], "1", 1.0))
    nightly = index.pods[(NS, "nightly-1")]
    assert index.owner_of(nightly) == ("cronjob", "nightly")
    index.apply("Job.batch", ResourceEvent("DELETED", job, "2", 2.0))
    assert index.owner_of(nightly) == ("k8s_job", "nightly-2901")


def test_an_external_workloads_owner_is_its_kind_in_lower_case() -> None:
    workload = {"apiVersion": "workload.linkerd.io/v1beta1", "kind": "ExternalWorkload",
                "metadata": {"name": "vm-1", "namespace": NS,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "setup",
                                                  "uid": "u"}]},
                "spec": {"meshTLS": {"identity": "spiffe://cluster.local/vm", "serverName": "vm.cluster.local"},
                         "workloadIPs": [{"ip": "10.9.0.1"}]}}
    facts = facts_of(workload)
    assert isinstance(facts, ExternalWorkloadFacts)
    assert (facts.owner_kind, facts.owner_name) == ("job", "setup")  # Linkerd's: no k8s_job here, unlike pods
