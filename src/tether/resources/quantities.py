"""Kubernetes resource quantities (``1``, ``500m``, ``1.5``, ``2Ki``, ``1e3``).

Used by `profiles` for ServiceProfile ``dstOverrides[].weight``; the destination
turns `Quantity.milli_value` into the proxy's weight as Linkerd does. Errors are
`ValueError` so callers attach their own field path.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

# The apimachinery grammar: <signedNumber><suffix>, suffix binary SI, decimal SI or e<int>.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?\d+))?"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
# Bounds the work a hostile exponent can cause; real quantities stay far inside it.
_MAX_EXPONENT = 300
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


@dataclass(frozen=True, slots=True)
class Quantity:
    """A quantity as written, with its exact value."""

    text: str
    value: Fraction

    def milli_value(self) -> int:
        """The value in thousandths, rounded up as apimachinery's ``MilliValue`` does."""
        return math.ceil(self.value * 1000)


def parse_quantity(raw: str | int | float) -> Quantity:
    """Parse a quantity given as a string or, as JSON allows, a bare number."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise ValueError("expected a quantity such as 1, 500m or 2Ki")
    text = raw if isinstance(raw, str) else repr(raw)
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid quantity {text!r}: expected a number with an optional suffix such as m, k, Ki")
    value = Fraction(match["number"])
    if match["binary"]:
        value *= _BINARY[match["binary"]]
    elif match["decimal"]:
        value *= Fraction(10) ** _DECIMAL_EXPONENT[match["decimal"]]
    elif match["exponent"]:
        exponent = int(match["exponent"])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"invalid quantity {text!r}: exponent out of range")
        value *= Fraction(10) ** exponent
    return Quantity(text, value)
