"""Size and shape limits on objects, each written once: Kubernetes' where it has one, ours where it has none.

Why: a manifest is untrusted input.  A few hundred bytes of YAML aliases can expand into
billions of nodes, a deeply nested document exhausts Python's recursion, and one huge object
fills the store and every watcher.  ``tether.resources.loading`` checks a document before it
is built (aliases, depth) and each object after (size); ``tether.resources.meta`` checks the
annotations; ``tether.store.objects`` checks the size again for writers that bypass loading.

- Objects: at most ``MAX_OBJECT_BYTES`` of JSON, the limit etcd puts on a Kubernetes object
  (``--max-request-bytes`` 1.5 MiB).
- Annotations: at most ``MAX_ANNOTATION_BYTES`` (keys plus values), as apimachinery's
  ``TotalAnnotationSizeLimitB``.
- Nesting: at most ``MAX_DEPTH`` levels of mappings and lists; real manifests stay under 30.
- Aliases: a YAML document may expand to at most ``MAX_EXPANDED_NODES`` nodes once its
  aliases are followed; a document without aliases is bounded by its own size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tether.resources.errors import ValidationError

MAX_OBJECT_BYTES = 1536 * 1024
MAX_ANNOTATION_BYTES = 256 * 1024
MAX_DEPTH = 100
MAX_EXPANDED_NODES = 1_000_000


def check_object_bytes(size: int) -> None:
    """Raise when an object that serialises to ``size`` bytes of JSON is over the object limit."""
    if size > MAX_OBJECT_BYTES:
        raise ValidationError(
            f"the object is {size} bytes as JSON, over Kubernetes' limit of {MAX_OBJECT_BYTES} bytes (1.5 MiB)"
        )


def check_annotations(annotations: Mapping[str, str], path: str) -> None:
    """Raise (at ``path``) when the annotations' keys and values add up to more than 256 KiB."""
    total = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if total > MAX_ANNOTATION_BYTES:
        raise ValidationError(
            f"annotations total {total} bytes, over Kubernetes' limit of {MAX_ANNOTATION_BYTES} bytes (256 KiB)",
            path=path,
        )


def check_depth(value: Any) -> None:
    """Raise when a decoded value nests mappings and lists deeper than ``MAX_DEPTH``; iterative, never recursive."""
    level: list[Any] = [value]
    depth = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise ValidationError(f"nested more than {MAX_DEPTH} levels deep")
        level = [child for item in level for child in _children(item)]


def _children(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, dict | list)]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, dict | list)]
    return ()


class ExpansionCounter:
    """Counts the nodes a YAML node graph expands to, aliases followed, and how deep it goes.

    Shared subgraphs (what an alias points at) are measured once and remembered, so counting a
    document that would expand to 10^9 nodes takes time proportional to its text.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, int]] = {}

    def check(self, node: Any) -> None:
        """Raise when ``node`` (a ``yaml.Node``) expands beyond ``MAX_EXPANDED_NODES`` or ``MAX_DEPTH``."""
        count, depth = self._measure(node)
        if depth > MAX_DEPTH:
            raise ValidationError(f"nested more than {MAX_DEPTH} levels deep")
        if count > MAX_EXPANDED_NODES:
            raise ValidationError(
                f"the document expands to more than {MAX_EXPANDED_NODES} nodes through YAML aliases; refused"
            )

    def _measure(self, root: Any) -> tuple[int, int]:
        # Post-order walk with an explicit stack: a deep document must not exhaust Python's stack.
        stack: list[tuple[Any, bool]] = [(root, False)]
        on_path: set[int] = set()
        while stack:
            node, done = stack.pop()
            key = id(node)
            if key in self._seen:
                continue
            kids = _node_children(node)
            if not done:
                if key in on_path:
                    raise ValidationError("the document refers to itself through a YAML alias")
                on_path.add(key)
                stack.append((node, True))
                stack.extend((kid, False) for kid in kids if id(kid) not in self._seen)
                if len(on_path) > MAX_DEPTH * 2 + 2:
                    raise ValidationError(f"nested more than {MAX_DEPTH} levels deep")
                continue
            on_path.discard(key)
            count, depth = 1, 0
            for kid in kids:
                kid_count, kid_depth = self._seen[id(kid)]
                count = min(count + kid_count, MAX_EXPANDED_NODES + 1)
                depth = max(depth, kid_depth)
            self._seen[key] = (count, depth + (1 if kids or _is_collection(node) else 0))
        return self._seen[id(root)]


def _is_collection(node: Any) -> bool:
    return isinstance(node.value, list)


def _node_children(node: Any) -> list[Any]:
    value = node.value
    if not isinstance(value, list):
        return []
    if value and isinstance(value[0], tuple):  # a mapping: (key node, value node) pairs
        return [part for pair in value for part in pair]
    return list(value)
