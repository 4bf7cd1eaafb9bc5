"""Durations as the ``LINKERD2_PROXY_*`` environment spells them: ``500ms``, ``10s``, ``5m``, ``1h``, ``365d``.

The format (proxy.md §2.1): optional surrounding whitespace, an unsigned
integer, then a unit ``ms|s|m|h|d`` with no space between; the bare ``0`` is also
accepted. No fractions, no other units.

Caller: ``tether.proxy.core.config``.
"""

from __future__ import annotations

import re
from datetime import timedelta

# re.ASCII: \d and \s must not match other scripts' digits and spaces.
_DURATION = re.compile(r"\s*([0-9]+)(ms|s|m|h|d)?\s*", re.ASCII)
_MILLIS_PER_UNIT = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_MAX_MILLIS = timedelta.max // timedelta(milliseconds=1)


def parse_duration(text: str) -> timedelta:
    """Parse ``text``; raises ``ValueError`` saying what is wrong with it."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (an integer and a unit ms, s, m, h or d, e.g. 10s)")
    digits, unit = match.groups()
    if unit is None:
        # Only zero may go without a unit, as in Linkerd.
        if digits.strip("0"):
            raise ValueError(f"duration {text!r} has no unit (ms, s, m, h or d)")
        return timedelta(0)
    # A length check first keeps int() away from absurdly long digit strings.
    millis = int(digits) * _MILLIS_PER_UNIT[unit] if len(digits) <= 20 else _MAX_MILLIS + 1
    if millis > _MAX_MILLIS:
        raise ValueError(f"duration {text!r} is too large")
    return timedelta(milliseconds=millis)
