"""Writes and reads in one process: store-owned metadata, generations, no-ops, conflicts, atomic batches, lists."""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor
import re
from pathlib import Path

import pytest
from store_workers import namespace, pod

from tether.resources.errors import ValidationError
from tether.resources.selectors import LabelSelector
from tether.store import Conflict, Store, StoreError

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "state" / "store.db") as s:
        yield s


def test_apply_creates_with_store_owned_metadata(store: Store) -> None:
    given = pod("web", labels={"app": "web"})
    stored = store.apply(given)
    meta = stored["metadata"]
    assert meta["resourceVersion"] == "1" and store.resource_version() == 1
    assert meta["generation"] == 1
    assert RFC3339.match(meta["creationTimestamp"])
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["uid"])
    assert store.get("Pod", "ns", "web") == stored
    assert "uid" not in given["metadata"], "the caller's object must not be modified"
    other = store.apply(pod("api"))
    assert other["metadata"]["uid"] != meta["uid"] and other["metadata"]["resourceVersion"] == "2"


def test_identical_apply_is_a_noop(store: Store) -> None:
    first = store.apply(pod("web", labels={"app": "web"}))
    again = store.apply(pod("web", labels={"app": "web"}))
    assert again == first
    assert store.resource_version() == 1


def test_generation_counts_only_spec_changes(store: Store) -> None:
    first = store.apply(pod("web", labels={"app": "web"}))
    relabelled = store.apply(pod("web", labels={"app": "web", "tier": "front"}))
    assert relabelled["metadata"]["resourceVersion"] == "2"
    assert relabelled["metadata"]["generation"] == 1
    for field in ("uid", "creationTimestamp"):
        assert relabelled["metadata"][field] == first["metadata"][field]

    with_status = {**relabelled, "status": {"phase": "Running", "podIP": "10.0.0.7"}}
    reported = store.apply(with_status)
    assert reported["metadata"]["generation"] == 1 and reported["metadata"]["resourceVersion"] == "3"

    changed = store.apply(pod("web", labels={"app": "web", "tier": "front"}, image="app:2"))
    assert changed["metadata"]["generation"] == 2 and changed["metadata"]["resourceVersion"] == "4"
    assert changed["metadata"]["uid"] == first["metadata"]["uid"]


def test_apply_without_status_keeps_the_stored_status(store: Store) -> None:
    created = store.apply(pod("web"))
    store.apply({**created, "status": {"phase": "Running"}})
    reapplied = store.apply(pod("web"))
    assert reapplied["status"] == {"phase": "Running"}
    assert reapplied["metadata"]["resourceVersion"] == "2", "re-applying the manifest changed nothing"


def test_stale_resource_version_is_a_conflict(store: Store) -> None:
    v1 = store.apply(pod("web"))
    v2 = store.apply({**v1, "status": {"phase": "Pending"}})
    with pytest.raises(Conflict, match=r"Pod ns/web: resourceVersion 1 is stale, the stored one is 2"):
        store.apply({**v1, "status": {"phase": "Failed"}})
    assert store.get("Pod", "ns", "web") == v2
    v3 = store.apply({**v2, "status": {"phase": "Running"}})
    assert v3["metadata"]["resourceVersion"] == "3"
    with pytest.raises(Conflict, match="does not exist"):
        store.apply({**pod("gone"), "metadata": {"name": "gone", "namespace": "ns", "resourceVersion": "3"}})
    assert store.get("Pod", "ns", "gone") is None


def test_namespace_rules(store: Store) -> None:
    no_namespace = pod("web")
    del no_namespace["metadata"]["namespace"]
    with pytest.raises(ValidationError) as err:
        store.apply(no_namespace)
    assert err.value.path == "metadata.namespace"
    with pytest.raises(ValidationError, match="cluster-scoped"):
        store.apply({**namespace("emojivoto"), "metadata": {"name": "emojivoto", "namespace": "ns"}})
    assert store.resource_version() == 0
    stored = store.apply(namespace("emojivoto"))
    assert store.get("Namespace", None, "emojivoto") == stored
    assert "namespace" not in stored["metadata"]


def test_invalid_objects_are_rejected_by_the_resource_rules(store: Store) -> None:
    with pytest.raises(ValidationError, match="spec"):
        store.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ns"}})
    with pytest.raises(ValidationError, match="unknown kind"):
        store.apply({"apiVersion": "v1", "kind": "Gadget", "metadata": {"name": "g"}})
    not_json = pod("web")
    not_json["spec"]["containers"][0]["x-when"] = datetime.date(2024, 1, 1)
    with pytest.raises(ValidationError, match="JSON"):
        store.apply(not_json)
    assert store.resource_version() == 0 and store.list("Pod").items == []


def test_apply_many_is_all_or_nothing(store: Store) -> None:
    existing = store.apply(pod("web"))
    bad = pod("broken")
    del bad["spec"]
    with pytest.raises(ValidationError):
        store.apply_many([pod("a"), pod("b"), bad])
    stale = {**existing, "spec": {"containers": [{"name": "app", "image": "app:9"}]}}
    store.apply(pod("web", image="app:2"))
    with pytest.raises(Conflict):
        store.apply_many([pod("a"), stale, pod("b")])
    assert [o["metadata"]["name"] for o in store.list("Pod").items] == ["web"]
    assert store.resource_version() == 2

    stored = store.apply_many([pod("a"), pod("b"), pod("a", image="app:2"), pod("web", image="app:2")])
    assert [o["metadata"]["resourceVersion"] for o in stored] == ["3", "4", "5", "2"]
    assert stored[2]["metadata"]["generation"] == 2, "a later object in a batch sees the earlier one"


def test_delete_returns_the_object_with_the_deletions_version(store: Store) -> None:
    created = store.apply(pod("web"))
    deleted = store.delete("Pod", "ns", "web")
    assert deleted is not None and deleted["metadata"]["resourceVersion"] == "2"
    assert deleted["metadata"]["uid"] == created["metadata"]["uid"]
    assert store.get("Pod", "ns", "web") is None
    assert store.delete("Pod", "ns", "web") is None
    assert store.resource_version() == 2
    recreated = store.apply(pod("web"))
    assert recreated["metadata"]["uid"] != created["metadata"]["uid"]
    assert recreated["metadata"]["generation"] == 1


def test_delete_many_is_all_or_nothing(store: Store) -> None:
    store.apply_many([pod("a"), pod("b"), namespace("ns")])
    with pytest.raises(ValueError):
        store.delete_many([("Pod", "ns", "a"), ("Pod", "ns")])  # type: ignore[list-item]
    assert store.get("Pod", "ns", "a") is not None
    deleted = store.delete_many([("Pod", "ns", "a"), ("Pod", "ns", "missing"), ("Namespace", None, "ns")])
    assert [d and d["metadata"]["name"] for d in deleted] == ["a", None, "ns"]
    assert [d["metadata"]["resourceVersion"] for d in deleted if d] == ["4", "5"]
    assert [o["metadata"]["name"] for o in store.list("Pod").items] == ["b"]


def test_list_filters_by_namespace_and_selector(store: Store) -> None:
    store.apply_many(
        [
            pod("web-2", "emojivoto", {"app": "web", "version": "v2"}),
            pod("web-1", "emojivoto", {"app": "web", "version": "v1"}),
            pod("emoji", "emojivoto", {"app": "emoji"}),
            pod("web", "other", {"app": "web"}),
            pod("bare", "other"),
            namespace("emojivoto"),
        ]
    )
    names = lambda result: [(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in result.items]  # noqa: E731
    everything = store.list("Pod")
    assert names(everything) == [
        ("emojivoto", "emoji"), ("emojivoto", "web-1"), ("emojivoto", "web-2"), ("other", "bare"), ("other", "web")
    ]
    assert everything.resource_version == 6
    assert names(store.list("Pod", "other")) == [("other", "bare"), ("other", "web")]
    web = LabelSelector.parse("app=web")
    assert names(store.list("Pod", None, web)) == [("emojivoto", "web-1"), ("emojivoto", "web-2"), ("other", "web")]
    assert names(store.list("Pod", "emojivoto", LabelSelector.parse("app=web,version!=v1"))) == [
        ("emojivoto", "web-2")
    ]
    assert names(store.list("Pod", "other", LabelSelector.parse("!app"))) == [("other", "bare")]
    assert names(store.list("Namespace")) == [(None, "emojivoto")]
    assert store.list("Pod", "nowhere").items == []


def test_reopening_keeps_objects_and_versions(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with Store(path) as first:
        created = first.apply(pod("web"))
    with Store(path) as second:
        assert second.get("Pod", "ns", "web") == created
        assert second.apply(pod("api"))["metadata"]["resourceVersion"] == "2"


def test_a_closed_store_says_so(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.db")
    store.close()
    with pytest.raises(StoreError, match=r"store\.db: the store is closed"):
        store.get("Pod", "ns", "web")


def test_threads_may_share_a_store(store: Store) -> None:
    def write(worker: int) -> list[int]:
        return [int(store.apply(pod(f"t{worker}-{i}"))["metadata"]["resourceVersion"]) for i in range(50)]

    with ThreadPoolExecutor(4) as pool:
        per_thread = list(pool.map(write, range(4)))
    assert all(versions == sorted(versions) for versions in per_thread)
    assert sorted(v for versions in per_thread for v in versions) == list(range(1, 201))


def test_reapplying_a_service_keeps_its_allocated_cluster_ip(tmp_path) -> None:
    from tether.store import Store

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
           "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}
    with Store(tmp_path / "s.db") as store:
        first = store.apply(svc)
        allocated = {**first, "spec": {**first["spec"], "clusterIP": "10.214.0.7", "clusterIPs": ["10.214.0.7"]}}
        allocated = store.apply(allocated)
        again = store.apply(svc)
        assert again["spec"]["clusterIP"] == "10.214.0.7"
        assert again["metadata"]["resourceVersion"] == allocated["metadata"]["resourceVersion"]
        changed = store.apply({**svc, "spec": {**svc["spec"], "ports": [{"port": 81}]}})
        assert changed["spec"]["clusterIP"] == "10.214.0.7" and changed["spec"]["ports"] == [{"port": 81}]
