"""Opening the store file: refuse anything that is not a Tether store, create or migrate the schema.

Called by ``Store.__init__``; ``sqlite_errors`` is also used around every
statement ``tether.store.store`` runs, so that no ``sqlite3`` exception leaves
the package.

A file that is corrupt, foreign or from a newer Tether is never written to: it
is only opened read-only, through SQLite, until it is recognised.  (Never through
a plain file descriptor either: closing one would drop the POSIX locks SQLite
holds on the file for the whole process.)  A new store is built under a
temporary name and hard-linked into place, so no process ever sees a half-made
store, and several processes creating the same store at once simply agree on
whichever link landed first.
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from tether.store.errors import StoreError

log = logging.getLogger(__name__)

# PRAGMA application_id marks the file as a Tether store ("TETH" in ASCII).
APPLICATION_ID = 0x54455448
SCHEMA_VERSION = 2

# Freed pages go back to the file system (``PRAGMA incremental_vacuum``, run by the store after
# writes that free many pages), so a store shrinks again after mass deletes.
AUTO_VACUUM_INCREMENTAL = 2
# The write-ahead log is cut back to this after each checkpoint instead of keeping its peak size.
WAL_SIZE_LIMIT = 4 * 1024 * 1024

# Statements that bring a store from version N-1 to N; PRAGMA user_version holds N.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        # namespace is '' for cluster-scoped kinds so that it can be part of the key.
        """CREATE TABLE objects (
            type_key TEXT NOT NULL,
            namespace TEXT NOT NULL,
            name TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (type_key, namespace, name)
        ) WITHOUT ROWID""",
        # The bounded change history that watches replay; the key is the resource version.
        """CREATE TABLE events (
            resource_version INTEGER PRIMARY KEY,
            type TEXT NOT NULL,
            type_key TEXT NOT NULL,
            namespace TEXT NOT NULL,
            body TEXT NOT NULL
        )""",
        # resource_version: the last version handed out; compacted_through: events up
        # to this version may have been dropped, so a watch from before it is Gone.
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
        "INSERT INTO counters VALUES ('resource_version', 0), ('compacted_through', 0)",
    ),
    2: (
        # The bytes of event bodies kept, so that the history is bounded in size as well as in count.
        "INSERT INTO counters SELECT 'history_bytes', coalesce(sum(length(CAST(body AS BLOB))), 0) FROM events",
    ),
}


@contextmanager
def sqlite_errors(path: Path) -> Iterator[None]:
    """Turn any ``sqlite3.Error`` raised inside into a ``StoreError`` naming ``path``."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        text = str(e)
        if "not a database" in text or "malformed" in text:
            raise StoreError(f"{path}: the store file is corrupt ({text})") from None
        if "locked" in text or "busy" in text:
            raise StoreError(f"{path}: the store is locked by another process ({text})") from None
        raise StoreError(f"{path}: {text}") from None
    except sqlite3.Error as e:
        raise StoreError(f"{path}: {e}") from None


def _version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version of a Tether store; raises for any other file, or a store from a newer Tether."""
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e):
            raise StoreError(
                f"{path}: not a SQLite database (corrupt, or another kind of file); it was left untouched"
            ) from None
        raise
    if app_id != APPLICATION_ID:
        raise StoreError(
            f"{path}: this SQLite database is not a Tether store (application_id {app_id:#x}); "
            "it was left untouched"
        )
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: the store has schema version {version}, newer than this Tether "
            f"understands ({SCHEMA_VERSION}); it was left untouched"
        )
    return version


def _inspect(path: Path, busy_timeout: float) -> int:
    """Check, read-only, that ``path`` is a sound Tether store this code can use; its schema version."""
    with sqlite_errors(path):
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=busy_timeout)
        try:
            version = _version(conn, path)
            # Checked before the first write: writing into a damaged file could spread the damage.
            problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
            if problems != ["ok"]:
                raise StoreError(f"{path}: the store file is corrupt ({'; '.join(problems)}); it was left untouched")
            return version
        finally:
            conn.close()


def stored_version(path: Path, busy_timeout: float = 2.0) -> int:
    """The schema version of the store at ``path``, read without changing anything (``tether check``)."""
    if not path.is_file():
        raise StoreError(f"{path}: no store file")
    return _inspect(path, busy_timeout)


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the open store up to ``SCHEMA_VERSION`` in one transaction (nothing to do if it is there)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Another process may have migrated it meanwhile: decide under the write lock.
        version = _version(conn, path)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[target]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _create(path: Path) -> None:
    """Make a new, empty store at ``path`` unless some process gets there first."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{path}: cannot create the state directory ({e.strerror})") from None
    draft = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.new")
    try:
        with sqlite_errors(path):
            conn = sqlite3.connect(draft, isolation_level=None)
            try:
                # WAL is recorded in the file, so every later connection gets it without
                # switching modes (a switch needs an exclusive lock and can fail under contention).
                conn.execute(f"PRAGMA auto_vacuum = {AUTO_VACUUM_INCREMENTAL}")  # before the first table
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                _migrate(conn, path)
            finally:
                conn.close()
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another process created it first; use theirs
        except OSError as e:
            raise StoreError(f"{path}: cannot create the store file ({e.strerror})") from None
    finally:
        for leftover in (draft, draft.with_name(draft.name + "-wal"), draft.with_name(draft.name + "-shm")):
            leftover.unlink(missing_ok=True)


def _enable_incremental_vacuum(conn: sqlite3.Connection, path: Path) -> None:
    """Convert a store made before incremental vacuum (one full VACUUM); a busy store tries at its next open."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == AUTO_VACUUM_INCREMENTAL:
        return
    conn.execute(f"PRAGMA auto_vacuum = {AUTO_VACUUM_INCREMENTAL}")
    try:
        conn.execute("VACUUM")
    except sqlite3.OperationalError as e:
        log.info("%s: not converted to incremental vacuum this time (%s)", path, e)


def open_store(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """Open the store at ``path`` for reading and writing, creating or migrating it first.

    The connection is in autocommit mode: the caller brackets its work in
    explicit transactions.  Raises ``StoreError`` naming ``path`` on any failure.
    """
    try:
        if path.is_dir():
            raise StoreError(f"{path}: is a directory, not a store file")
        if not path.exists():
            _create(path)
        elif path.stat().st_size == 0:
            raise StoreError(f"{path}: is an empty file, not a Tether store; remove it to start a new store")
    except OSError as e:
        raise StoreError(f"{path}: cannot use the store file ({e.strerror})") from None
    _inspect(path, busy_timeout)
    with sqlite_errors(path):
        conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        try:
            _migrate(conn, path)
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"{path}: the store is not in WAL mode (found {mode!r}); was it edited by hand?")
            # NORMAL sync under WAL survives any process crash; only a power cut may lose the last commits.
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
            _enable_incremental_vacuum(conn, path)
        except BaseException:
            conn.close()
            raise
    return conn
