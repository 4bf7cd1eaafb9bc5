"""The seam through which the injector learns a namespace's annotations, and its two simple forms.

An admission request names the pod's namespace but does not carry the Namespace object, and
the inheritable ``config.linkerd.io/*`` annotations and ``linkerd.io/inject`` live there.
Linkerd's injector reads them from a metadata informer. Tether's webhook takes any callable
``namespace_annotations(ns) -> Mapping`` (`NamespaceAnnotations`):

- `WatchedNamespaces`: Namespaces from the platform's watch (``tether.platform.watch``; on
  Kubernetes the API server's list-then-watch), so ``kubectl annotate ns x linkerd.io/inject=enabled``
  applies to the next pod. The webhook starts answering only once the first listing is in
  (``synced``); a lookup before that raises `NotSynced`.
- `StaticNamespaces` (a fixed map, for tests and the CLI) and `NamespaceFile` (Namespace
  manifests on disk, re-read when they change; ``tether injector serve --namespaces FILE|DIR``,
  ``tether inject --namespaces``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from tether.platform.watch import ResourceWatcher
from tether.resources.kinds import NAMESPACE, type_of
from tether.resources.loading import MANIFEST_SUFFIXES, load_path
from tether.resources.model import parse


class NamespaceAnnotations(Protocol):
    """``namespace_annotations("emojivoto") -> {"linkerd.io/inject": "enabled", ...}``; {} if unknown.

    Called once per admission request, from a worker thread; it may raise, and the
    webhook then answers per its failure policy.
    """

    def __call__(self, namespace: str) -> Mapping[str, str]: ...


class NotSynced(RuntimeError):
    """The namespace watch has not listed every Namespace yet."""


class WatchedNamespaces:
    """Namespace annotations kept current by a platform watch; `run` feeds it until cancelled.

    Reads come from the webhook's worker threads: each Namespace's annotations are replaced
    whole (one dictionary assignment), never changed in place.
    """

    def __init__(self, watcher: ResourceWatcher, *, logger: logging.Logger | None = None) -> None:
        self._watcher = watcher
        self._annotations: dict[str, dict[str, str]] = {}
        self.synced = threading.Event()
        self._synced_on_loop = asyncio.Event()
        self._log = logger or logging.getLogger("tether.injector")

    async def run(self) -> None:
        async for event in self._watcher.watch(NAMESPACE.key):
            if event.type == "SYNCED":
                if not self.synced.is_set():
                    self._log.info("namespace watch synced: %d namespaces", len(self._annotations))
                self.synced.set()
                self._synced_on_loop.set()
                continue
            name = event.key[1]
            if event.type == "DELETED" or event.object is None:
                self._annotations.pop(name, None)
                continue
            annotations = (event.object.get("metadata") or {}).get("annotations") or {}
            self._annotations[name] = {k: v for k, v in annotations.items() if isinstance(v, str)}

    async def wait_synced(self) -> None:
        """Return once the first listing is in (on the loop that runs `run`)."""
        await self._synced_on_loop.wait()

    def __call__(self, namespace: str) -> Mapping[str, str]:
        if not self.synced.is_set():
            raise NotSynced("the namespace watch has not synced yet")
        return self._annotations.get(namespace, {})


class StaticNamespaces:
    """A fixed map of namespace name to annotations."""

    def __init__(self, annotations: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self._annotations = {ns: dict(a) for ns, a in (annotations or {}).items()}

    def __call__(self, namespace: str) -> Mapping[str, str]:
        return self._annotations.get(namespace, {})


class NamespaceFile:
    """Namespace objects read from a manifest file or directory, re-read when a file changes.

    Other kinds in the files are ignored. A file that does not parse raises
    `tether.resources.errors.ValidationError` (at construction, and on the lookup after it
    changed), naming the file and document.
    """

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[tuple[str, int, int], ...] | None = None
        self._annotations: dict[str, dict[str, str]] = {}
        self._reload_if_changed()

    def _files(self) -> list[Path]:
        if self._path.is_dir():
            return sorted(p for p in self._path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
        return [self._path]

    def _current_stamp(self) -> tuple[tuple[str, int, int], ...]:
        out = []
        for file in self._files():
            try:
                st = file.stat()
            except OSError:
                out.append((str(file), -1, -1))
            else:
                out.append((str(file), st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _reload_if_changed(self) -> None:
        with self._lock:
            stamp = self._current_stamp()
            if stamp == self._stamp:
                return
            annotations: dict[str, dict[str, str]] = {}
            for source, index, obj in load_path(self._path):
                if obj.get("kind") != "Namespace" or type_of(obj) != NAMESPACE:
                    continue
                namespace = parse(obj, source, index)
                annotations[namespace.name] = dict(namespace.annotations)
            self._annotations = annotations
            self._stamp = stamp

    def __call__(self, namespace: str) -> Mapping[str, str]:
        self._reload_if_changed()
        return self._annotations.get(namespace, {})
