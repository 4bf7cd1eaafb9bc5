"""The Prometheus text exposition format (and OpenMetrics' subset of it the proxy writes), parsed.

``parse(text)`` returns every sample as ``Sample(name, labels, value)``.  It
reads ``name value``, ``name{a="x",b="y"} value`` and an optional timestamp,
label values with ``\\\\``, ``\\"`` and ``\\n`` escapes, and the values ``NaN``,
``+Inf`` and ``-Inf``; ``#`` lines (``HELP``, ``TYPE``, ``EOF``) are skipped.
A line it cannot read is not fatal: it is skipped and its number kept in
``Exposition.errors``, so one odd series never blanks a whole view.

Pure: no I/O.  Callers: ``tether.viz.scrape`` and tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(slots=True)
class Exposition:
    samples: list[Sample] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)  # 1-based numbers of lines that were skipped

    def named(self, name: str) -> Iterator[Sample]:
        return (s for s in self.samples if s.name == name)

    @property
    def names(self) -> set[str]:
        return {s.name for s in self.samples}


class _BadLineError(ValueError):
    pass


def parse(text: str) -> Exposition:
    out = Exposition()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            out.samples.append(_sample(line))
        except _BadLineError:
            out.errors.append(number)
    return out


def _sample(line: str) -> Sample:
    match = _NAME.match(line)
    if match is None:
        raise _BadLineError(line)
    name = match.group()
    pos = match.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos = _labels(line, pos + 1, labels)
    rest = line[pos:].split()
    if not rest or len(rest) > 2 or (pos < len(line) and not line[pos].isspace()):
        raise _BadLineError(line)
    return Sample(name, labels, _value(rest[0]))


def _labels(line: str, pos: int, into: dict[str, str]) -> int:
    """Read ``a="x",b="y"}`` from ``pos``; returns the position after the ``}``."""
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == "}":
            return pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None:
            raise _BadLineError(line)
        key = match.group()
        pos = match.end()
        while pos < n and line[pos] in " \t":
            pos += 1
        if line[pos:pos + 2] != '="':
            raise _BadLineError(line)
        pos += 2
        chars: list[str] = []
        while True:
            if pos >= n:
                raise _BadLineError(line)
            c = line[pos]
            if c == "\\":
                escaped = line[pos + 1:pos + 2]
                chars.append(_ESCAPES.get(escaped, "\\" + escaped))
                pos += 2
            elif c == '"':
                pos += 1
                break
            else:
                chars.append(c)
                pos += 1
        into[key] = "".join(chars)
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == ",":
            pos += 1
        elif pos < n and line[pos] == "}":
            return pos + 1
        else:
            raise _BadLineError(line)


def _value(text: str) -> float:
    special = {"+inf": math.inf, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}
    lowered = text.lower()
    if lowered in special:
        return special[lowered]
    try:
        return float(text)
    except ValueError:
        raise _BadLineError(text) from None
