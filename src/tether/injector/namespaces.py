"""The seam through which the injector learns a namespace's annotations, and its two simple forms.

An admission request names the pod's namespace but does not carry the Namespace object, and
the inheritable ``config.linkerd.io/*`` annotations and ``linkerd.io/inject`` live there.
Linkerd's injector reads them from a metadata informer. Tether's webhook takes any callable
``namespace_annotations(ns) -> Mapping`` (`NamespaceAnnotations`); the Kubernetes platform will
provide one backed by a watch. Until then: `StaticNamespaces` (a fixed map, for tests and the
CLI) and `NamespaceFile` (Namespace manifests on disk, re-read when they change; ``tether
injector serve --namespaces FILE|DIR``, ``tether inject --namespaces``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from tether.resources.kinds import NAMESPACE, type_of
from tether.resources.loading import MANIFEST_SUFFIXES, load_path
from tether.resources.model import parse


class NamespaceAnnotations(Protocol):
    """``namespace_annotations("emojivoto") -> {"linkerd.io/inject": "enabled", ...}``; {} if unknown.

    Called once per admission request, from a worker thread; it may raise, and the
    webhook then answers per its failure policy.
    """

    def __call__(self, namespace: str) -> Mapping[str, str]: ...


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
