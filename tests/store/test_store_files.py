"""Which files the store accepts: its own, new and empty ones; corrupt, foreign or newer ones are refused untouched."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from store_workers import pod

from tether.store import Store, StoreError
from tether.store.schema import SCHEMA_VERSION


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def test_creates_the_directory_and_marks_the_file(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.db"
    with Store(path) as store:
        store.apply(pod("web"))
    header = path.read_bytes()[:100]
    assert header.startswith(b"SQLite format 3\x00")
    assert header[68:72] == b"TETH", "application_id marks a Tether store"
    assert int.from_bytes(header[60:64], "big") == SCHEMA_VERSION, "user_version holds the schema version"


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.touch()
    with pytest.raises(StoreError, match=r"store\.db: is an empty file, not a Tether store; remove it"):
        Store(path)
    assert path.read_bytes() == b""


def test_a_blank_sqlite_file_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    sqlite3.connect(path).execute("VACUUM").connection.close()
    before = _snapshot(tmp_path)
    with pytest.raises(StoreError, match="not a Tether store"):
        Store(path)
    assert _snapshot(tmp_path) == before


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"apiVersion: v1\nkind: Pod\n" + os.urandom(5000))
    before = _snapshot(tmp_path)
    with pytest.raises(StoreError) as err:
        Store(path)
    assert str(path) in str(err.value) and "not a SQLite database" in str(err.value)
    assert _snapshot(tmp_path) == before


def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE objects (name TEXT)")
        db.execute("INSERT INTO objects VALUES ('precious')")
    db.close()
    before = _snapshot(tmp_path)
    with pytest.raises(StoreError) as err:
        Store(path)
    assert str(path) in str(err.value) and "not a Tether store" in str(err.value)
    assert _snapshot(tmp_path) == before


def test_a_corrupt_store_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with Store(path) as store:
        store.apply_many([pod(f"p{i}", labels={"filler": "x" * 60}) for i in range(300)])
    # Checkpoint the WAL into the file, then damage every page after the first.
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) > 4 * page
    for offset in range(page, len(data), page):
        data[offset : offset + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    with pytest.raises(StoreError) as err:
        Store(path)
    assert str(path) in str(err.value) and "corrupt" in str(err.value)
    # SQLite may leave its (empty) -wal/-shm companions beside a WAL file it read; the file itself is untouched.
    assert path.read_bytes() == before


def test_a_truncated_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\x10\x00")
    before = _snapshot(tmp_path)
    with pytest.raises(StoreError, match=str(path)):
        Store(path)
    assert _snapshot(tmp_path) == before


def test_a_store_from_a_newer_tether_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match=rf"schema version 99, newer than this Tether understands \({SCHEMA_VERSION}\)"):
        Store(path)


def test_a_directory_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path)


def test_a_write_lock_held_too_long_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with Store(path, busy_timeout=0.05) as store:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match=r"store\.db: the store is locked by another process"):
                store.apply(pod("web"))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.apply(pod("web"))["metadata"]["resourceVersion"] == "1"
