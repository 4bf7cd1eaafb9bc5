"""The store under damage and churn: a corrupt object body is named and the rest still served; mass deletes shrink the file."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from store_workers import pod

from tether.resources.errors import ValidationError
from tether.resources.limits import MAX_OBJECT_BYTES
from tether.store import CorruptObject, Store


def _corrupt(path: Path, name: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute("UPDATE objects SET body = '{\"metadata\": {' WHERE name = ?", (name,))


def _size(path: Path) -> int:
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())


def test_a_corrupt_body_is_named_and_the_rest_is_served(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with Store(path) as store:
        store.apply_many([pod("good"), pod("bad")])
    _corrupt(path, "bad")
    with Store(path) as store:
        with pytest.raises(CorruptObject, match=r"Pod ns/bad: the stored object is corrupt"):
            store.get("Pod", "ns", "bad")
        listed = store.list("Pod", "ns")
        assert [p["metadata"]["name"] for p in listed.items] == ["good"]
        assert len(listed.unreadable) == 1 and "Pod ns/bad" in listed.unreadable[0]
        # Writing over it replaces it; deleting it removes it.
        assert store.apply(pod("bad", image="app:2"))["metadata"]["generation"] == 1
        _corrupt(path, "bad")
        assert store.delete("Pod", "ns", "bad")["metadata"]["name"] == "bad"
        assert store.get("Pod", "ns", "bad") is None and store.list("Pod").unreadable == ()


def test_objects_over_kubernetes_size_limit_are_refused(tmp_path: Path) -> None:
    big = pod("big")
    big["metadata"]["labels"] = {"a": "b"}
    big["spec"]["containers"][0]["args"] = ["x" * (MAX_OBJECT_BYTES // 2)] * 3
    with Store(tmp_path / "store.db") as store:
        with pytest.raises(ValidationError, match=r"Pod big: .* over Kubernetes' limit of 1572864 bytes"):
            store.apply(big)
        assert store.get("Pod", "ns", "big") is None


def test_deeply_nested_objects_are_refused_not_a_crash(tmp_path: Path) -> None:
    deep: object = []
    for _ in range(2000):
        deep = [deep]
    nested = pod("deep")
    nested["spec"]["extra"] = deep
    with Store(tmp_path / "store.db") as store:
        with pytest.raises(ValidationError, match="nested more than 100 levels deep"):
            store.apply(nested)


def test_the_file_shrinks_after_mass_deletes(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    blob = "y" * 50_000
    with Store(path, history_bytes=1024 * 1024) as store:
        for batch in range(4):
            objs = [pod(f"p{batch}-{i}") for i in range(50)]
            for obj in objs:
                obj["metadata"]["annotations"] = {"blob": blob}
            store.apply_many(objs)
        peak = _size(path)
        names = [("Pod", "ns", f"p{b}-{i}") for b in range(4) for i in range(50)]
        store.delete_many(names[:100])
        store.delete_many(names[100:])
        assert store.list("Pod").items == []
        after = _size(path)  # while open: a long-running platform never closes it
    assert peak > 10_000_000, peak
    assert after < peak / 4, (peak, after)
