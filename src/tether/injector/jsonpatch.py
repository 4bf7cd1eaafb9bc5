"""JSON Patch (RFC 6902) between two JSON documents, and applying one (RFC 6901 pointers).

Callers: `admission` turns the pure patch's output into the patch an AdmissionResponse
carries (``diff(pod, patched_pod)``); tests apply it back (``apply``) to check the webhook and
the pure function agree. ``diff`` prefers small operations: map keys are added or removed one
by one, and a list that only gained (or only lost) elements gets one ``add`` (``remove``) per
element, so a webhook patch reads like Linkerd's (``add /spec/initContainers/0``...).
"""

from __future__ import annotations

import copy
from typing import Any

Operation = dict[str, Any]


class JsonPatchError(ValueError):
    """A patch that cannot be applied to the document (a missing path, a failed ``test``...)."""


def escape(token: str) -> str:
    """One reference token of a JSON pointer: ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def diff(old: Any, new: Any) -> list[Operation]:
    """Operations that turn ``old`` into ``new`` (``apply(old, diff(old, new)) == new``)."""
    ops: list[Operation] = []
    _diff(old, new, "", ops)
    return ops


def _same(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's ==, true is not 1, at any depth."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _diff(old: Any, new: Any, path: str, ops: list[Operation]) -> None:
    if _same(old, new):
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in new.items():
            child = f"{path}/{escape(key)}"
            if key in old:
                _diff(old[key], value, child, ops)
            else:
                ops.append({"op": "add", "path": child, "value": copy.deepcopy(value)})
        return
    if isinstance(old, list) and isinstance(new, list):
        _diff_list(old, new, path, ops)
        return
    ops.append({"op": "replace", "path": path, "value": copy.deepcopy(new)})


def _subsequence_gaps(short: list[Any], long: list[Any]) -> list[int] | None:
    """Indices of ``long`` not matched when ``short`` is an in-order subsequence of it, else None."""
    gaps = []
    i = 0
    for j, item in enumerate(long):
        if i < len(short) and _same(short[i], item):
            i += 1
        else:
            gaps.append(j)
    return gaps if i == len(short) else None


def _diff_list(old: list[Any], new: list[Any], path: str, ops: list[Operation]) -> None:
    if len(new) > len(old):
        added = _subsequence_gaps(old, new)
        if added is not None:
            # In increasing order, each element lands at its final index.
            ops.extend({"op": "add", "path": f"{path}/{j}", "value": copy.deepcopy(new[j])} for j in added)
            return
    elif len(new) < len(old):
        removed = _subsequence_gaps(new, old)
        if removed is not None:
            ops.extend({"op": "remove", "path": f"{path}/{j}"} for j in reversed(removed))
            return
    else:
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(a, b, f"{path}/{i}", ops)
        return
    ops.append({"op": "replace", "path": path, "value": copy.deepcopy(new)})


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise JsonPatchError(f"path {pointer!r} is not a JSON pointer (must start with /)")
    return [unescape(t) for t in pointer[1:].split("/")]


def _index(container: list[Any], token: str, pointer: str, *, for_add: bool = False) -> int:
    if token == "-" and for_add:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise JsonPatchError(f"{pointer}: {token!r} is not an array index")
    i = int(token)
    if i > len(container) or (i == len(container) and not for_add):
        raise JsonPatchError(f"{pointer}: index {i} is out of range")
    return i


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    tokens = _tokens(pointer)
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise JsonPatchError(f"{pointer}: {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, pointer)]
        else:
            raise JsonPatchError(f"{pointer}: cannot descend into a scalar")
    return node, tokens[-1]


def _get(doc: Any, pointer: str) -> Any:
    if pointer == "":
        return doc
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict):
        if token not in parent:
            raise JsonPatchError(f"{pointer}: does not exist")
        return parent[token]
    if isinstance(parent, list):
        return parent[_index(parent, token, pointer)]
    raise JsonPatchError(f"{pointer}: cannot descend into a scalar")


def _add(doc: Any, pointer: str, value: Any) -> Any:
    if pointer == "":
        return value
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, pointer, for_add=True), value)
    else:
        raise JsonPatchError(f"{pointer}: cannot add to a scalar")
    return doc


def _remove(doc: Any, pointer: str) -> tuple[Any, Any]:
    if pointer == "":
        raise JsonPatchError("cannot remove the whole document")
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict):
        if token not in parent:
            raise JsonPatchError(f"{pointer}: does not exist")
        return doc, parent.pop(token)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, token, pointer))
    raise JsonPatchError(f"{pointer}: cannot remove from a scalar")


def apply(doc: Any, ops: list[Operation]) -> Any:
    """``doc`` with the operations applied in order (``doc`` itself is left as it is)."""
    out = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise JsonPatchError(f"not an operation: {op!r}")
        kind, path = op.get("op"), op["path"]
        if kind == "add":
            out = _add(out, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            out, _ = _remove(out, path)
        elif kind == "replace":
            _get(out, path)
            if path == "":
                out = copy.deepcopy(op["value"])
            else:
                out, _ = _remove(out, path)
                out = _add(out, path, copy.deepcopy(op["value"]))
        elif kind == "move":
            out, value = _remove(out, op["from"])
            out = _add(out, path, value)
        elif kind == "copy":
            out = _add(out, path, copy.deepcopy(_get(out, op["from"])))
        elif kind == "test":
            if not _same(_get(out, path), op.get("value")):
                raise JsonPatchError(f"{path}: test failed")
        else:
            raise JsonPatchError(f"unknown operation {kind!r}")
    return out
