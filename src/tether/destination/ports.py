"""Port sets as Linkerd annotations spell them: ``25,587,3306-3310,http`` (numbers, ranges, port names).

Used by the watchers for ``config.linkerd.io/opaque-ports`` (Service, Pod and
Namespace) and ``config.linkerd.io/skip-inbound-ports``, and by the config for
the default opaque ports.  Pure.  A name is resolved against the ports of the
object carrying the annotation (service port names for a Service, container
port names for a Pod); entries that are neither a port, a range nor a known
name are skipped and reported, as Linkerd logs and skips them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MIN_PORT = 1
MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class PortSet:
    """An immutable set of ports kept as sorted, merged, inclusive ranges (so ``1-65535`` stays small)."""

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, ports: Iterable[int | tuple[int, int]]) -> "PortSet":
        spans = sorted((p, p) if isinstance(p, int) else p for p in ports)
        merged: list[tuple[int, int]] = []
        for low, high in spans:
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
            else:
                merged.append((low, high))
        return cls(tuple(merged))

    def __contains__(self, port: object) -> bool:
        if not isinstance(port, int):
            return False
        index = bisect.bisect_right(self.ranges, (port, MAX_PORT + 1)) - 1
        return index >= 0 and self.ranges[index][0] <= port <= self.ranges[index][1]

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __str__(self) -> str:
        return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in self.ranges)


EMPTY = PortSet()
# Linkerd's chart default for ``-default-opaque-ports`` (SMTP, MySQL, Galera, Postgres, Redis, ES, Memcached).
DEFAULT_OPAQUE_PORTS = PortSet.of([25, 587, 3306, 4444, 5432, 6379, 9300, 11211])


def _port(text: str) -> int | None:
    if not (text.isascii() and text.isdigit()) or len(text) > 5:
        return None
    value = int(text)
    return value if MIN_PORT <= value <= MAX_PORT else None


def parse_port_set(text: str, names: Mapping[str, Iterable[int]] | None = None) -> tuple[PortSet, list[str]]:
    """Parse a port list; return the set and the entries that were skipped as invalid.

    Blanks and empty entries (a trailing comma) are ignored.  ``names`` maps a
    port name to the port number(s) it stands for.
    """
    ports: list[int | tuple[int, int]] = []
    skipped: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        low_s, dash, high_s = entry.partition("-")
        if dash:
            low, high = _port(low_s.strip()), _port(high_s.strip())
            if low is None or high is None or high < low:
                skipped.append(entry)
            else:
                ports.append((low, high))
            continue
        number = _port(entry)
        if number is not None:
            ports.append(number)
        elif names is not None and entry in names:
            ports.extend(names[entry])
        else:
            skipped.append(entry)
    return PortSet.of(ports), skipped


def port_of_address(addr: str) -> int | None:
    """The port of ``host:port`` (``0.0.0.0:4143``, ``[::]:4143``), or None: how proxy env addresses are read."""
    _, sep, port_s = addr.strip().rpartition(":")
    return _port(port_s) if sep else None
