"""The owner rule the webhook applies with the API's help (Linkerd's GetOwnerKindAndName) and its Events' target."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tether.injector.owners import ObjectRef, resolve
from tether.injector.workloads import Owner


def pod_owned_by(kind: str, name: str, api_version: str = "apps/v1", *more: dict[str, Any]) -> dict[str, Any]:
    refs = [{"apiVersion": api_version, "kind": kind, "name": name, "controller": True}, *more]
    return {"metadata": {"name": "p", "ownerReferences": refs}}


class Api:
    """Owner metadata by (kind, name); raises for the names in ``failing``."""

    def __init__(self, objects: Mapping[tuple[str, str], dict[str, Any]], failing: tuple[str, ...] = ()) -> None:
        self.objects = objects
        self.failing = failing
        self.asked: list[tuple[str, str, str]] = []

    def __call__(self, namespace: str, kind: str, name: str) -> Mapping[str, Any] | None:
        self.asked.append((namespace, kind, name))
        if name in self.failing:
            raise TimeoutError("the API did not answer")
        return self.objects.get((kind, name))


def owned(uid: str, *refs: tuple[str, str]) -> dict[str, Any]:
    return {"uid": uid, "ownerReferences": [{"kind": k, "name": n} for k, n in refs]}


@pytest.mark.parametrize(("pod", "objects", "label"), [
    (pod_owned_by("ReplicaSet", "web-legacy"), {("ReplicaSet", "web-legacy"): owned("u1", ("Deployment", "web"))},
     Owner("deployment", "web")),
    (pod_owned_by("Job", "nightly-29", "batch/v1"), {("Job", "nightly-29"): owned("u2", ("CronJob", "nightly"))},
     Owner("cronjob", "nightly")),
    (pod_owned_by("Job", "once", "batch/v1"), {("Job", "once"): owned("u3")}, Owner("job", "once")),
    (pod_owned_by("ReplicaSet", "bare"), {("ReplicaSet", "bare"): owned("u4")}, Owner("replicaset", "bare")),
    (pod_owned_by("StatefulSet", "db"), {("StatefulSet", "db"): owned("u5", ("Thing", "x"))}, Owner("statefulset", "db")),
])
def test_the_label_names_the_workload_the_api_knows(pod: dict, objects: dict, label: Owner) -> None:
    resolved = resolve(pod, "ns", Api(objects))
    assert resolved.owner == label
    assert resolved.parent is not None and resolved.parent.namespace == "ns" and resolved.parent.uid.startswith("u")


def test_an_owner_the_api_lacks_or_cannot_give_labels_by_the_reference_and_gets_no_event() -> None:
    missing = resolve(pod_owned_by("ReplicaSet", "gone"), "ns", Api({}))
    assert (missing.owner, missing.parent) == (Owner("replicaset", "gone"), None)
    down = resolve(pod_owned_by("ReplicaSet", "slow"), "ns", Api({}, failing=("slow",)))
    assert (down.owner, down.parent) == (Owner("replicaset", "slow"), None)


def test_no_single_owner_or_no_api_means_no_lookup() -> None:
    api = Api({})
    two = pod_owned_by("ReplicaSet", "a", "apps/v1", {"apiVersion": "v1", "kind": "Node", "name": "n"})
    assert resolve(two, "ns", api).parent is None
    assert resolve({"metadata": {"name": "bare"}}, "ns", api).owner is None
    assert api.asked == []
    assert resolve(pod_owned_by("ReplicaSet", "web-1"), "ns", None).owner is None  # the patch's own rule decides


def test_the_event_names_the_parent_as_the_reference_does() -> None:
    api = Api({("ReplicaSet", "web-legacy"): owned("u1", ("Deployment", "web"))})
    parent = resolve(pod_owned_by("ReplicaSet", "web-legacy"), "shop", api).parent
    assert parent == ObjectRef("apps/v1", "ReplicaSet", "shop", "web-legacy", "u1")
