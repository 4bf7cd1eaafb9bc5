"""Ports and port lists: the one rule for what a port is and how Linkerd spells a list of them.

A port list is Linkerd's annotation, flag and variable format (proxy.md §2.1): comma-separated
items, each a port (``25``), an inclusive range (``4000-4010``) or, where the caller passes
``names``, a port name (``http``); blanks and empty items are ignored.  Ports are 1-65535; only a
listener address may say 0 (``parse_port(..., allow_zero=True)``).

Pure, and imports nothing else of Tether (the ``pure-bottom`` import contract), so the proxy, the
controllers, the injector and the local platform all share it.  Callers pick how to treat a bad
item: the proxy's variables and ``tether init``'s flags reject it (``parse_port_ranges``,
``PortSet.parse``), while annotations are read as Linkerd reads them, logging and skipping it
(``read_port_list``, ``parse_port_set``).  Each caller adds the field, variable or annotation
to the message, which names the bad item.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

MIN_PORT = 1
MAX_PORT = 65535

Span = tuple[int, int]
"""An inclusive ``(low, high)`` port range; a single port is ``(p, p)``."""

PortNames = Mapping[str, int | Iterable[int]]
"""Port name -> the port(s) it stands for (a pod's container ports may share a name)."""


def is_port(value: int) -> bool:
    """True if ``value`` is a usable TCP port (1-65535)."""
    return MIN_PORT <= value <= MAX_PORT


def _port_problem(text: str, allow_zero: bool) -> str | None:
    """Why ``text`` is not a decimal port, or None; says ``'text' is ...`` so callers can prefix it."""
    # Digits only: int() would also take "+80", " 80" or "8_0".
    if not (text.isascii() and text.isdigit()):
        return f"{text!r} is not a decimal number"
    # A length check first keeps int() away from absurdly long digit strings.
    value = int(text) if len(text) <= 10 else MAX_PORT + 1
    if not (is_port(value) or (allow_zero and value == 0)):
        return f"{text!r} is outside {0 if allow_zero else MIN_PORT}-{MAX_PORT}"
    return None


def parse_port(text: str, *, allow_zero: bool = False) -> int:
    """Parse a decimal port; ``allow_zero`` admits 0, which only a listener may use (any free port).

    Raises ``ValueError`` saying what is wrong with ``text``.
    """
    problem = _port_problem(text, allow_zero)
    if problem:
        raise ValueError(f"port {problem}")
    return int(text)


def port_of_address(addr: str) -> int | None:
    """The port of ``host:port`` (``0.0.0.0:4143``, ``[::]:4143``), or None if it has no usable port."""
    _, sep, port_s = addr.strip().rpartition(":")
    return int(port_s) if sep and _port_problem(port_s, False) is None else None


class PortListError(ValueError):
    """One item of a port list is not a port, a range or a known name; ``item`` is that item as written."""

    def __init__(self, item: str, message: str) -> None:
        super().__init__(message)
        self.item = item


def _item_spans(item: str, names: PortNames | None) -> list[Span]:
    """The ranges one stripped, non-empty item stands for; raises ``PortListError`` naming it."""
    # Names first: a Kubernetes port name may contain '-' (``http-alt``) but is never all digits.
    if names is not None and item in names:
        named = names[item]
        return [(named, named)] if isinstance(named, int) else [(p, p) for p in named]
    low_s, dash, high_s = (part.strip() for part in item.partition("-"))
    problem = _port_problem(low_s, False) or (_port_problem(high_s, False) if dash else None)
    if problem:
        what = "a port, a range like 4000-4010 or a known port name" if names is not None else (
            "a port or a range like 4000-4010"
        )
        raise PortListError(item, f"{item!r} is not {what}: {problem}")
    low = int(low_s)
    high = int(high_s) if dash else low
    if high < low:
        raise PortListError(item, f"{item!r} is not a range: it ends before it starts")
    return [(low, high)]


def read_port_list(text: str, *, names: PortNames | None = None) -> tuple[list[Span], list[PortListError]]:
    """Every range of a port list in written order, and an error for each item that could not be read.

    Never raises: the caller decides whether a bad item is fatal or, as Linkerd does for
    annotations, logged and skipped.
    """
    spans: list[Span] = []
    errors: list[PortListError] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        try:
            spans.extend(_item_spans(item, names))
        except PortListError as err:
            errors.append(err)
    return spans, errors


def parse_port_ranges(text: str, *, names: PortNames | None = None) -> list[Span]:
    """The ranges of a port list in written order; raises ``PortListError`` for the first bad item."""
    spans, errors = read_port_list(text, names=names)
    if errors:
        raise errors[0]
    return spans


def format_span(span: Span) -> str:
    """``25`` or ``4000-4010``: how a range is written back in a port list."""
    low, high = span
    return str(low) if low == high else f"{low}-{high}"


@dataclass(frozen=True, slots=True)
class PortSet:
    """An immutable set of ports, kept as sorted, merged, inclusive ranges (so ``1-65535`` stays small).

    Two sets with the same ports compare equal however they were spelled.
    """

    ranges: tuple[Span, ...] = ()

    @classmethod
    def of(cls, ports: Iterable[int | Span]) -> PortSet:
        """The set of some ports and ranges, in any order, overlapping or not."""
        return cls(_merge((p, p) if isinstance(p, int) else p for p in ports))

    @classmethod
    def parse(cls, text: str, *, names: PortNames | None = None) -> PortSet:
        """Parse a port list strictly; raises ``PortListError`` (a ``ValueError``) naming the bad item."""
        return cls.of(parse_port_ranges(text, names=names))

    def with_port(self, port: int) -> PortSet:
        """This set plus ``port``."""
        if not is_port(port):
            raise ValueError(f"port {port} is outside {MIN_PORT}-{MAX_PORT}")
        return PortSet(_merge([*self.ranges, (port, port)]))

    def __contains__(self, port: object) -> bool:
        if not isinstance(port, int):
            return False
        # The last range starting at or before `port` is the only one that can hold it.
        i = bisect.bisect_right(self.ranges, (port, MAX_PORT + 1)) - 1
        return i >= 0 and self.ranges[i][0] <= port <= self.ranges[i][1]

    def __iter__(self) -> Iterator[int]:
        for low, high in self.ranges:
            yield from range(low, high + 1)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __str__(self) -> str:
        return ",".join(map(format_span, self.ranges))


def _merge(spans: Iterable[Span]) -> tuple[Span, ...]:
    merged: list[Span] = []
    for low, high in sorted(spans):
        # Adjacent ranges merge too (1-2,3-4 is 1-4), so equal sets have one spelling.
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def parse_port_set(text: str, names: PortNames | None = None) -> tuple[PortSet, list[str]]:
    """Read a port list as Linkerd reads an annotation: the set, and the items skipped as invalid."""
    spans, errors = read_port_list(text, names=names)
    return PortSet.of(spans), [err.item for err in errors]


# Linkerd's chart default for the opaque ports (SMTP, MySQL, Galera, Postgres, Redis, ES, Memcached).
DEFAULT_OPAQUE_PORTS = PortSet.of([25, 587, 3306, 4444, 5432, 6379, 9300, 11211])
