"""Shared fixtures: the realistic manifests under manifests/ and copies of them with one field changed."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tether.resources.errors import ValidationError
from tether.resources.kinds import type_of
from tether.resources.loading import load_path
from tether.resources.model import parse

MANIFESTS = Path(__file__).parent / "manifests"


@pytest.fixture
def manifest() -> Callable[[str, str], dict[str, Any]]:
    """``manifest(type_key, name)``: a fresh copy of one object from manifests/."""
    objects = {(type_of(obj).key, obj["metadata"]["name"]): obj for _, _, obj in load_path(MANIFESTS)}
    return lambda key, name: copy.deepcopy(objects[(key, name)])


class Edits:
    """Copies of an object with the field at a path (``spec.routes[0].name``) set or removed."""

    @staticmethod
    def _walk(obj: dict[str, Any], path: str) -> tuple[dict[str, Any], Any, str | int]:
        out = copy.deepcopy(obj)
        *parents, last = [int(i) if i else k for k, i in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path)]
        node: Any = out
        for step in parents:
            node = node.setdefault(step, {}) if isinstance(node, dict) else node[step]
        return out, node, last

    def set(self, obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
        out, node, last = self._walk(obj, path)
        node[last] = value
        return out

    def delete(self, obj: dict[str, Any], path: str) -> dict[str, Any]:
        out, node, last = self._walk(obj, path)
        del node[last]
        return out

    def change(self, obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
        """Set the field, or remove it when ``value`` is None (table-driven error tests use both)."""
        return self.delete(obj, path) if value is None else self.set(obj, path, value)


@pytest.fixture
def edits() -> Edits:
    return Edits()


@pytest.fixture
def parse_error() -> Callable[[dict[str, Any]], str]:
    """``parse_error(obj)``: the message parse() gives for an object it must reject."""

    def message(obj: dict[str, Any]) -> str:
        with pytest.raises(ValidationError) as info:
            parse(obj)
        return str(info.value)

    return message
