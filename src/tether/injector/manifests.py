"""Multi-document YAML or JSON text in, the same text with its workloads transformed out (for the CLI).

Caller: ``tether inject``/``uninject``, with a transform such as `patch.inject` bound to its
configuration. Documents the transform leaves alone are copied through as written, comments
and all; a changed document is re-emitted (YAML in block style with multi-line strings as
literal blocks, or JSON indented by two), keeping its ``---`` line and leading comments.
``kind: List`` documents are transformed item by item. Order is kept.

The text is first read by `tether.resources.loading`, so a syntax error, a duplicate key or
a document that is not an object is reported as ``tether apply`` reports it (file, document,
line); a workload whose template is malformed raises `ValidationError` naming the document,
kind and name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from tether.injector.patch import InjectResult, Report
from tether.resources.errors import ValidationError
from tether.resources.loading import load_text

Transform = Callable[[dict[str, Any]], InjectResult]

_DOC_START = re.compile(r"^---(?=\s|$)")
_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """Safe loading as Kubernetes reads YAML: an unquoted date stays a string."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _Dumper(yaml.SafeDumper):
    """Block style, keys in their order, multi-line strings (a PEM bundle) as ``|`` blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1 << 20, allow_unicode=True)


@dataclass(frozen=True, slots=True)
class DocumentReport:
    source: str
    doc_index: int
    report: Report


@dataclass(frozen=True, slots=True)
class Output:
    text: str
    reports: tuple[DocumentReport, ...]
    is_json: bool


def transform_text(text: str, source: str, transform: Transform) -> Output:
    """Apply ``transform`` to every object (List items included) of ``text``."""
    load_text(text, source)  # the same errors as tether apply, before anything is transformed
    if text.lstrip()[:1] in ("{", "["):
        return _transform_json(text, source, transform)
    return _transform_yaml(text, source, transform)


def _apply(obj: Any, source: str, doc_index: int, transform: Transform, reports: list[DocumentReport]) -> tuple[Any, bool]:
    """``(new object, changed)``; Lists recurse into their items."""
    if not isinstance(obj, dict):
        return obj, False
    kind = obj.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(obj.get("items"), list):
        changed = False
        items = []
        for item in obj["items"]:
            new, item_changed = _apply(item, source, doc_index, transform, reports)
            items.append(new)
            changed |= item_changed
        return ({**obj, "items": items} if changed else obj), changed
    try:
        result = transform(obj)
    except ValidationError as err:
        metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        name = metadata.get("name")
        raise err.located(
            source=source,
            doc_index=doc_index,
            kind=kind if isinstance(kind, str) else None,
            name=name if isinstance(name, str) else None,
        ) from None
    reports.append(DocumentReport(source, doc_index, result.report))
    return result.obj, result.changed


@dataclass(frozen=True, slots=True)
class _Chunk:
    header: str  # the "---..." line (with its newline), or "" for text before the first one
    body: str

    @property
    def text(self) -> str:
        return self.header + self.body


def _chunks(text: str) -> list[_Chunk]:
    chunks: list[_Chunk] = []
    header, body = "", []
    for line in text.splitlines(keepends=True):
        if _DOC_START.match(line):
            chunks.append(_Chunk(header, "".join(body)))
            header, body = line, []
        else:
            body.append(line)
    chunks.append(_Chunk(header, "".join(body)))
    return chunks


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith(("#", "%")) for line in text.splitlines())


def _leading_comments(body: str) -> str:
    out = []
    for line in body.splitlines(keepends=True):
        if line.strip() and not line.lstrip().startswith("#"):
            break
        out.append(line)
    return "".join(out)


def _transform_yaml(text: str, source: str, transform: Transform) -> Output:
    reports: list[DocumentReport] = []
    pieces: list[str] = []
    doc_index = 0
    for chunk in _chunks(text):
        if not chunk.header and _only_comments(chunk.body):
            pieces.append(chunk.text)  # before the first "---": no document
            continue
        doc_index += 1
        inline = chunk.header[3:] if chunk.header else ""
        obj = yaml.load(inline + chunk.body, Loader=_Loader)  # noqa: S506 - a safe loader
        new, changed = _apply(obj, source, doc_index, transform, reports)
        if not changed:
            pieces.append(chunk.text)
            continue
        header = "---\n" if chunk.header else ""
        piece = header + _leading_comments(chunk.body) + dump_yaml(new)
        pieces.append(piece)
    out = "".join(pieces)
    if out and not out.endswith("\n"):
        out += "\n"
    return Output(out, tuple(reports), is_json=False)


def _transform_json(text: str, source: str, transform: Transform) -> Output:
    decoder = json.JSONDecoder()
    reports: list[DocumentReport] = []
    pieces: list[str] = []
    pos = 0
    doc_index = 0
    whitespace = re.compile(r"\s*")
    while True:
        end = whitespace.match(text, pos).end()
        pieces.append(text[pos:end])
        pos = end
        if pos == len(text):
            break
        doc_index += 1
        obj, end = decoder.raw_decode(text, pos)
        new, changed = _apply(obj, source, doc_index, transform, reports)
        pieces.append(json.dumps(new, indent=2) if changed else text[pos:end])
        pos = end
    out = "".join(pieces)
    if out and not out.endswith("\n"):
        out += "\n"
    return Output(out, tuple(reports), is_json=True)
