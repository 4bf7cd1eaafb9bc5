"""The store's errors: every failure a caller of ``tether.store`` can see.

Raised by ``tether.store.store`` and ``tether.store.schema``; caught by the
platform (``Conflict`` when writing status, ``Gone`` when a watch falls behind)
and by the CLI, which prints the message as is.  No raw ``sqlite3`` exception
ever leaves the package: they are all turned into ``StoreError`` naming the file.
"""

from __future__ import annotations


class StoreError(Exception):
    """The store file can't be used: missing permission, corrupt, foreign, busy, closed."""


class CorruptObject(StoreError):
    """One stored object's body cannot be read back; the message names the object.

    The rest of the store is fine: ``list`` and watches leave that object out (and say so),
    ``apply`` replaces it and ``delete`` removes it.
    """


class Conflict(StoreError):
    """A write carried a ``metadata.resourceVersion`` that is no longer the stored one.

    The caller read a stale copy; it should read again, reapply its change and retry.
    """


class Gone(StoreError):
    """A watch asked for changes older than the retained history; the caller must list again.

    The counterpart of Kubernetes' ``410 Gone``.
    """
