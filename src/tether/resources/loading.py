"""Reading manifests: YAML or JSON text, files, directories and stdin, into plain objects.

Used by the CLI (``tether apply -f``) before `model.parse`. YAML is read the way
Kubernetes' own decoder reads it into JSON: timestamps stay strings, keys are
strings, and a key given twice in one mapping is an error (kubectl rejects it
too), reported with its line. ``kind: List`` (and ``*List`` kinds) are flattened
into their items, which keep the document number of their list.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tether.resources import limits
from tether.resources.errors import ValidationError
from tether.resources.fields import expect_list, index, join

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"
STDIN_SOURCE = "<stdin>"

_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _ManifestLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """A safe loader that refuses duplicate keys and keeps timestamps as text."""


# Kubernetes decodes YAML into JSON, where an unquoted date is just a string.
_ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _MappingKeyError(Exception):
    """A key problem found while building a mapping; carries the key's line."""

    def __init__(self, message: str, node: yaml.Node) -> None:
        super().__init__(message)
        self.line = node.start_mark.line + 1


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[str, Any]:
    seen: dict[str, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        if not isinstance(key_node, yaml.ScalarNode):
            raise _MappingKeyError("a mapping key must be a string, not a collection", key_node)
        # JSON keys are strings: ``80: x`` means the key "80", as the text says.
        key = key_node.value
        if key in seen:
            raise _MappingKeyError(
                f"duplicate key {key!r} (first given on line {seen[key].start_mark.line + 1})", key_node
            )
        seen[key] = key_node
    loader.flatten_mapping(node)
    return {
        key_node.value: loader.construct_object(value_node, deep=True) for key_node, value_node in node.value
    }


_ManifestLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_text(text: str, source: str) -> list[dict[str, Any]]:
    """Every object in a multi-document YAML or JSON text, ``List``s flattened, empty documents skipped."""
    return [obj for _, obj in iter_documents(text, source)]


def load_path(path: str | Path) -> list[tuple[str, int, dict[str, Any]]]:
    """``(source, doc_index, object)`` for a file, every manifest under a directory, or ``-`` (stdin).

    Directories are walked recursively in sorted order, reading ``*.yaml``,
    ``*.yml`` and ``*.json``. ``doc_index`` counts documents from 1 within each file.
    """
    if str(path) == STDIN:
        text = _decode(sys.stdin.buffer.read(), STDIN_SOURCE)
        return [(STDIN_SOURCE, i, obj) for i, obj in iter_documents(text, STDIN_SOURCE)]
    root = Path(path)
    out = []
    for file in _manifest_files(root):
        source = str(file)
        out.extend((source, i, obj) for i, obj in iter_documents(_read(file), source))
    return out


def _manifest_files(root: Path) -> list[Path]:
    try:
        if not root.is_dir():
            return [root]
    except OSError as e:  # is_dir() lets some errors through, e.g. a name too long
        raise ValidationError(f"cannot read: {e.strerror}", source=str(root)) from None
    return sorted(p for p in root.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())


def _read(file: Path) -> str:
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise ValidationError("no such file or directory", source=str(file)) from None
    except OSError as e:
        raise ValidationError(f"cannot read: {e.strerror}", source=str(file)) from None
    return _decode(data, str(file))


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValidationError(f"not UTF-8 text (byte {e.start})", source=source, line=line) from None


def iter_documents(text: str, source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(doc_index, object)`` pairs; JSON when the text starts with ``{`` or ``[``, else YAML."""
    raw_docs = _json_documents(text, source) if text.lstrip()[:1] in ("{", "[") else _yaml_documents(text, source)
    for doc_index, doc in raw_docs:
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ValidationError(
                f"expected a mapping (a Kubernetes object), got {_describe(doc)}", source=source, doc_index=doc_index
            )
        try:
            limits.check_depth(doc)
            objects = list(_flatten(doc, ""))
            for obj in objects:
                limits.check_object_bytes(len(json.dumps(obj, separators=(",", ":"), default=str)))
        except ValidationError as e:
            raise e.located(source=source, doc_index=doc_index, name=object_name(doc)) from None
        for obj in objects:
            yield doc_index, obj


def _yaml_documents(text: str, source: str) -> Iterator[tuple[int, Any]]:
    loader = _ManifestLoader(text)
    doc_index = 0
    try:
        while loader.check_node():
            doc_index += 1
            node = loader.get_node()
            if node is None:
                yield doc_index, None
                continue
            # Measured before it is built: aliases make a few bytes of text into any number of nodes.
            limits.ExpansionCounter().check(node)
            yield doc_index, loader.construct_document(node)
    except ValidationError as e:
        raise e.located(source=source, doc_index=doc_index or None) from None
    except RecursionError:
        raise ValidationError(
            f"nested more than {limits.MAX_DEPTH} levels deep", source=source, doc_index=doc_index or None
        ) from None
    except _MappingKeyError as e:
        raise ValidationError(str(e), source=source, doc_index=doc_index or None, line=e.line) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        message = ": ".join(p for p in (e.context, e.problem) if p)
        raise ValidationError(
            message, source=source, doc_index=doc_index or None, line=mark.line + 1 if mark else None
        ) from None
    except yaml.reader.ReaderError as e:
        # PyYAML's only unmarked load error: a character YAML forbids.
        code = e.character if isinstance(e.character, int) else ord(e.character)
        raise ValidationError(
            f"unacceptable character #x{code:04x}: {e.reason}",
            source=source,
            doc_index=doc_index or None,
            line=text.count("\n", 0, e.position) + 1,
        ) from None
    finally:
        loader.dispose()


def _json_documents(text: str, source: str) -> Iterator[tuple[int, Any]]:
    decoder = json.JSONDecoder(object_pairs_hook=_json_object)
    pos = 0
    doc_index = 0
    while True:
        pos = _skip_whitespace(text, pos)
        if pos == len(text):
            return
        doc_index += 1
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise ValidationError(e.msg, source=source, doc_index=doc_index, line=e.lineno) from None
        except RecursionError:
            raise ValidationError(
                f"nested more than {limits.MAX_DEPTH} levels deep", source=source, doc_index=doc_index
            ) from None
        except _DuplicateJSONKey as e:
            raise ValidationError(str(e), source=source, doc_index=doc_index) from None
        yield doc_index, doc


_WHITESPACE = re.compile(r"\s*")


def _skip_whitespace(text: str, pos: int) -> int:
    return _WHITESPACE.match(text, pos).end()


class _DuplicateJSONKey(Exception):
    pass


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateJSONKey(f"duplicate key {key!r}")
        out[key] = value
    return out


def _flatten(obj: dict[str, Any], path: str) -> Iterator[dict[str, Any]]:
    """The object itself, or the items of a ``List`` (recursively)."""
    kind = obj.get("kind")
    if not (isinstance(kind, str) and kind.endswith("List") and "items" in obj):
        yield obj
        return
    items = obj["items"]
    items_path = join(path, "items")
    if items is None:
        return
    for i, item in enumerate(expect_list(items, items_path)):
        item_path = index(items_path, i)
        if item is None:
            continue  # kubectl and Linkerd skip null items of a List
        if not isinstance(item, dict):
            raise ValidationError("expected a mapping (a Kubernetes object)", path=item_path)
        yield from _flatten(item, item_path)


def object_name(obj: dict[str, Any]) -> str | None:
    """``metadata.name`` when it is a string (for labelling errors), else None."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
