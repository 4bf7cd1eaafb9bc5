"""The local resource store: one SQLite file, apply/get/list/delete and watch with resource versions.

Used by the local platform and the CLI.  Modules: ``store`` (the ``Store``
class), ``listwatch`` (the list-then-watch pattern as one event stream),
``objects`` (store-owned metadata rules), ``schema`` (opening and migrating the
file), ``wakeup`` (cross-process watch notifications), ``errors``.

The watch pattern, spelled out (``list_then_watch`` does this for you)::

    listed = store.list("Pod", "emojivoto")
    ...index listed.items...
    try:
        async for event in store.watch("Pod", listed.resource_version, "emojivoto"):
            ...apply event.type / event.object to the index...
    except Gone:
        ...list again and diff...
"""

from tether.store.errors import Conflict, CorruptObject, Gone, StoreError
from tether.store.listwatch import list_then_watch
from tether.store.store import DEFAULT_HISTORY, ListResult, Store, WatchEvent

__all__ = [
    "DEFAULT_HISTORY",
    "Conflict",
    "CorruptObject",
    "Gone",
    "ListResult",
    "Store",
    "StoreError",
    "WatchEvent",
    "list_then_watch",
]
