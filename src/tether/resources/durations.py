"""Go ``time.ParseDuration``, the duration syntax of every Linkerd resource and annotation.

ServiceProfile timeouts and retry-budget TTLs, HTTPRoute timeouts (Linkerd parses
those with the same Go grammar) all come through here; so can annotation readers
in the controllers and the injector. Errors are `ValueError` so callers attach
their own field path.
"""

from __future__ import annotations

import re

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek small letter mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
# One "<number><unit>" component; the number needs a digit on at least one side of the dot.
_COMPONENT = re.compile(r"(\d+\.?\d*|\.\d+)([^\d.]*)")
# Go keeps durations in a signed 64-bit count of nanoseconds.
_MAX_NS = 2**63 - 1


def parse_duration(text: str) -> float:
    """Seconds in a Go duration such as ``300ms``, ``1m30s``, ``1.5h`` or ``0``.

    Follows Go exactly: an optional sign, then one or more number+unit pairs with
    units ns, us (µs/μs), ms, s, m, h; a bare ``0`` needs no unit; fractions below
    a nanosecond are dropped; values beyond Go's int64 nanoseconds are rejected.
    """
    rest = text
    negative = rest.startswith("-")
    if rest.startswith(("+", "-")):
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    pos = 0
    while pos < len(rest):
        match = _COMPONENT.match(rest, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r}")
        number, unit = match.groups()
        if not unit:
            raise ValueError(f"missing unit in duration {text!r}")
        if unit not in _NS_PER_UNIT:
            raise ValueError(f"unknown unit {unit!r} in duration {text!r}")
        total += _component_ns(number, _NS_PER_UNIT[unit])
        if total > _MAX_NS:
            raise ValueError(f"invalid duration {text!r}: out of range")
        pos = match.end()
    return (-total if negative else total) / 1e9


def _component_ns(number: str, unit_ns: int) -> int:
    """Nanoseconds in ``<number><unit>``, rounded exactly as Go does it.

    The integer part is exact; the fraction keeps digits while they fit in an
    int64, then is scaled in floating point and truncated (so
    ``0.3333333333333333333h`` is exactly 20 minutes, as in Go).
    """
    whole, _, fraction = number.partition(".")
    if len(whole.lstrip("0")) > len(str(_MAX_NS)):
        return _MAX_NS + 1  # out of range; also keeps int() away from huge digit strings
    total = int(whole or "0") * unit_ns
    digits, scale = 0, 1
    for c in fraction:
        if digits > _MAX_NS // 10:
            break
        digits, scale = digits * 10 + int(c), scale * 10
    if digits:
        total += int(float(digits) * (float(unit_ns) / scale))
    return total
