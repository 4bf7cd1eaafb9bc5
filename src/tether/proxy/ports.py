"""Ports and port sets: the one rule for what a port is and how a port list is spelled.

A port set is Linkerd's format (proxy.md §2.1): comma-separated ports or
inclusive ``low-high`` ranges, blanks ignored, e.g. ``25,587,3306,4444-4445``.

Callers: ``tether.proxy.config`` (``LINKERD2_PROXY_INBOUND_PORTS*``),
``tether.proxy.addrs`` (the port of an address), ``tether.proxy.protocol.transport_header``
(the header's target port) and the inbound stack (is this port opaque?).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

MIN_PORT = 1
MAX_PORT = 65535


def is_port(value: int) -> bool:
    """True if ``value`` is a usable TCP port (1–65535)."""
    return MIN_PORT <= value <= MAX_PORT


def parse_port(text: str, *, allow_zero: bool = False) -> int:
    """Parse a decimal port; ``allow_zero`` admits 0, which only a listener may use (any free port).

    Raises ``ValueError`` saying what is wrong with ``text``.
    """
    # Digits only: int() would also take "+80", " 80" or "8_0".
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"port {text!r} is not a decimal number")
    # A length check first keeps int() away from absurdly long digit strings.
    value = int(text) if len(text) <= 10 else MAX_PORT + 1
    if not (is_port(value) or (allow_zero and value == 0)):
        low = 0 if allow_zero else MIN_PORT
        raise ValueError(f"port {text!r} is outside {low}-{MAX_PORT}")
    return value


@dataclass(frozen=True, slots=True)
class PortSet:
    """An immutable set of ports, kept as sorted, merged, inclusive ranges.

    Two sets with the same ports compare equal however they were spelled.
    """

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, text: str) -> PortSet:
        """Parse Linkerd's port-set syntax; raises ``ValueError`` naming the bad item."""
        spans: list[tuple[int, int]] = []
        for raw in text.split(","):
            item = raw.strip()
            if not item:
                continue
            low_s, dash, high_s = item.partition("-")
            low = parse_port(low_s.strip())
            high = parse_port(high_s.strip()) if dash else low
            if high < low:
                raise ValueError(f"port range {item!r} ends before it starts")
            spans.append((low, high))
        return cls(_merge(spans))

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
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)


def _merge(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        # Adjacent ranges merge too (1-2,3-4 is 1-4), so equal sets have one spelling.
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)
