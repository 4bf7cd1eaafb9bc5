"""`MeshConfig` from files: a Helm values document and the trust anchors, re-read when they change.

Linkerd's injector reads the ``linkerd-config`` ConfigMap's ``values`` (mounted at
``/var/run/linkerd/config/values``) and the trust-roots ConfigMap (``ca-bundle.crt``) on every
request, so a rotated anchor applies without a restart. `ConfigFiles` does the same, cheaply:
a ``stat`` per call, a re-read only when a file changed. Callers: ``tether injector serve``
(called per admission request) and ``tether inject --manual`` (once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tether.injector.config import MeshConfig
from tether.resources.errors import ValidationError


class ConfigFiles:
    """``values`` (optional) and ``trust_anchors`` (optional if the values carry them) -> `MeshConfig`.

    ``adjust`` post-processes each loaded config (flags that override values). Errors are
    `ValidationError` naming the file; the first load happens in the constructor.
    """

    def __init__(
        self,
        *,
        values: Path | None,
        trust_anchors: Path | None,
        adjust: Callable[[MeshConfig], MeshConfig] | None = None,
    ) -> None:
        if values is None and trust_anchors is None:
            raise ValidationError("needs the trust anchors: a trust anchors file, or identityTrustAnchorsPEM in values")
        self._values = values
        self._anchors = trust_anchors
        self._adjust = adjust or (lambda c: c)
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] | None = None
        self._config: MeshConfig | None = None
        self()

    def _current_stamp(self) -> tuple[int, ...]:
        out: list[int] = []
        for path in (self._values, self._anchors):
            if path is None:
                continue
            try:
                st = path.stat()
                out += [st.st_mtime_ns, st.st_size]
            except OSError:
                out += [-1, -1]
        return tuple(out)

    def __call__(self) -> MeshConfig:
        with self._lock:
            stamp = self._current_stamp()
            if self._config is None or stamp != self._stamp:
                self._config = self._adjust(self._load())
                self._stamp = stamp
            return self._config

    def _load(self) -> MeshConfig:
        anchors = _read(self._anchors) if self._anchors is not None else None
        values: Any = {}
        if self._values is not None:
            source = str(self._values)
            try:
                values = yaml.safe_load(_read(self._values)) or {}
            except yaml.YAMLError as err:
                raise ValidationError(f"not YAML: {err}".replace("\n", " "), source=source) from None
            if not isinstance(values, dict):
                raise ValidationError("expected a mapping of Helm values", source=source)
        try:
            return MeshConfig.from_values(values, trust_anchors_pem=anchors)
        except ValidationError as err:
            raise err.located(source=str(self._values) if self._values else str(self._anchors)) from None
        except ValueError as err:
            raise ValidationError(str(err), source=str(self._values or self._anchors)) from None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError("no such file", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValidationError(f"cannot read: {err}", source=str(path)) from None
