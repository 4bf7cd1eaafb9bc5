"""Kubernetes label selectors: the ``-l`` text syntax, the ``matchLabels``/``matchExpressions`` form, matching.

Semantics follow apimachinery's ``labels`` package exactly: requirements are
ANDed; ``!=`` and ``notin`` also match objects without the key; an empty
selector matches everything, while a missing one (and a Service with no
selector) matches nothing. Used by the per-kind parsers (`workloads`, `core`,
`policy`) and by the CLI for ``-l``; the destination and policy indexes call
`LabelSelector.matches`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.resources import formats
from tether.resources.errors import ValidationError
from tether.resources.fields import Fields, check_name, expect_mapping, expect_string, join, map_key


class Operator(enum.Enum):
    """How a requirement compares one label; the value is the ``-l`` spelling."""

    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = ""
    DOES_NOT_EXIST = "!"
    GREATER_THAN = ">"
    LESS_THAN = "<"


_SET_OPERATORS = (Operator.IN, Operator.NOT_IN)
_NUMERIC_OPERATORS = (Operator.GREATER_THAN, Operator.LESS_THAN)
_SPEC_OPERATORS = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
}


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``key <operator> values`` term; set operators keep their values sorted."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case Operator.EQUALS | Operator.IN:
                return present and value in self.values
            case Operator.NOT_EQUALS | Operator.NOT_IN:
                return not present or value not in self.values
            case Operator.EXISTS:
                return present
            case Operator.DOES_NOT_EXIST:
                return not present
            case Operator.GREATER_THAN | Operator.LESS_THAN:
                if not present or not _INTEGER.fullmatch(value or ""):
                    return False
                label, bound = int(value), int(self.values[0])
                return label > bound if self.operator is Operator.GREATER_THAN else label < bound

    def __str__(self) -> str:
        match self.operator:
            case Operator.EXISTS:
                return self.key
            case Operator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case Operator.IN | Operator.NOT_IN:
                return f"{self.key} {self.operator.value} ({','.join(self.values)})"
            case _:
                return f"{self.key}{self.operator.value}{self.values[0]}"


def _requirement(
    key: str, operator: Operator, values: list[str], key_path: str, values_path: str | None = None
) -> Requirement:
    """Validate a requirement as apimachinery's ``NewRequirement`` does."""
    values_path = values_path or key_path
    check_name(key, key_path, formats.qualified_name)
    if operator in _SET_OPERATORS and not values:
        raise ValidationError(f"{key}: values must not be empty for operator {operator.value}", path=values_path)
    if operator in _NUMERIC_OPERATORS and not _INTEGER.fullmatch(values[0]):
        raise ValidationError(f"{key}: {values[0]!r} is not an integer", path=values_path)
    if operator not in _NUMERIC_OPERATORS:
        for value in values:
            check_name(value, values_path, formats.label_value)
    if operator in _SET_OPERATORS:
        values = sorted(set(values))
    return Requirement(key, operator, tuple(values))


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A set of requirements, all of which must hold; or the selector that matches nothing."""

    requirements: tuple[Requirement, ...] = ()
    selects_nothing: bool = False

    def __post_init__(self) -> None:
        # A canonical order makes equal selectors compare (and print) equal.
        ordered = tuple(sorted(self.requirements, key=lambda r: (r.key, str(r))))
        object.__setattr__(self, "requirements", ordered)

    @classmethod
    def nothing(cls) -> "LabelSelector":
        return cls(selects_nothing=True)

    @property
    def is_empty(self) -> bool:
        """True for the selector that matches every object."""
        return not self.requirements and not self.selects_nothing

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.selects_nothing:
            return False
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        # kubectl prints a Service without a selector as <none>; parsing it back fails loudly.
        if self.selects_nothing:
            return "<none>"
        return ",".join(str(r) for r in self.requirements)

    @classmethod
    def parse(cls, text: str) -> "LabelSelector":
        """Parse kubectl's ``-l`` syntax; errors are `ValidationError` at path ``selector``."""
        return cls(tuple(_Parser(text).requirements()))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, path: str) -> "LabelSelector":
        """A ``metav1.LabelSelector``; ``None`` selects nothing and ``{}`` everything."""
        if spec is None:
            return cls.nothing()
        node = Fields.of(spec, path)
        requirements = [
            _requirement(key, Operator.EQUALS, [value], map_key(node.at("matchLabels"), key))
            for key, value in node.string_map("matchLabels").items()
        ]
        for expr in node.children("matchExpressions"):
            key = expr.string("key")
            operator = _SPEC_OPERATORS[expr.choice("operator", _SPEC_OPERATORS)]
            values = list(expr.strings("values"))
            if operator in _SET_OPERATORS and not values:
                raise expr.error("values", f"must not be empty when operator is {expr.string('operator')}")
            if operator not in _SET_OPERATORS and values:
                raise expr.error("values", f"must be empty when operator is {expr.string('operator')}")
            requirements.append(_requirement(key, operator, values, expr.at("key"), expr.at("values")))
        return cls(tuple(requirements))

    @classmethod
    def for_service(cls, selector: Mapping[str, Any] | None, path: str) -> "LabelSelector":
        """A Service's ``spec.selector``: equality only, and empty or missing selects no pods.

        Kubernetes' endpoints controllers skip Services without a selector (their
        endpoints are managed by hand), so such a Service must match nothing.
        """
        if not selector:
            if selector is not None:
                expect_mapping(selector, path)
            return cls.nothing()
        mapping = expect_mapping(selector, path)
        requirements = []
        for key, value in mapping.items():
            entry = map_key(path, key)
            requirements.append(_requirement(key, Operator.EQUALS, [expect_string(value, entry)], entry))
        return cls(tuple(requirements))


_INTEGER = re.compile(r"[+-]?\d+")
# apimachinery's lexer: these characters (and whitespace) end an identifier.
_TOKEN = re.compile(r"\s*(?:(!=|==|=|!|\(|\)|,|>|<)|([^\s!=(),<>]+))")
_PATH = "selector"


class _Parser:
    """Recursive-descent parser for ``-l`` selectors, one token of lookahead."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, offset); kind "sym" or "ident"
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:  # only trailing whitespace is left
                break
            symbol, ident = match.groups()
            self.tokens.append(("sym", symbol, match.start(1)) if symbol else ("ident", ident, match.start(2)))
            pos = match.end()
        self.pos = 0

    def _error(self, message: str) -> ValidationError:
        return ValidationError(f"invalid selector {self.text!r}: {message}", path=_PATH)

    def _peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next(self, expected: str) -> tuple[str, str, int]:
        token = self._peek()
        if token is None:
            raise self._error(f"expected {expected} at the end")
        self.pos += 1
        return token

    def _unexpected(self, token: tuple[str, str, int], expected: str) -> ValidationError:
        return self._error(f"found {token[1]!r} at position {token[2]}, expected {expected}")

    def _make(self, key: str, operator: Operator, values: list[str]) -> Requirement:
        try:
            return _requirement(key, operator, values, _PATH)
        except ValidationError as e:
            raise self._error(e.message) from None

    def _at_end_of_requirement(self) -> bool:
        token = self._peek()
        return token is None or token[1] == ","

    def requirements(self) -> list[Requirement]:
        out: list[Requirement] = []
        if not self.tokens:
            return out
        while True:
            out.append(self._requirement())
            token = self._peek()
            if token is None:
                return out
            if token[1] != ",":
                raise self._unexpected(token, "',' or the end")
            self.pos += 1

    def _requirement(self) -> Requirement:
        token = self._next("a label key")
        negated = token[:2] == ("sym", "!")
        if negated:
            token = self._next("a label key")
        if token[0] != "ident" or token[1] in _KEYWORDS:
            raise self._unexpected(token, "a label key")
        key = token[1]
        if negated:
            if not self._at_end_of_requirement():
                raise self._unexpected(self._next("',' or the end"), "',' or the end")
            return self._make(key, Operator.DOES_NOT_EXIST, [])
        if self._at_end_of_requirement():
            return self._make(key, Operator.EXISTS, [])
        op_token = self._next("an operator")
        operator = _OPERATOR_TOKENS.get(op_token[1])
        if operator is None:
            raise self._unexpected(op_token, "one of =, ==, !=, in, notin, >, <")
        if operator in _SET_OPERATORS:
            values = self._value_set()
        elif self._at_end_of_requirement() and operator not in _NUMERIC_OPERATORS:
            values = [""]  # ``a=`` compares with the empty value
        else:
            value = self._next("a value")
            if value[0] != "ident":
                raise self._unexpected(value, "a value")
            values = [value[1]]
        return self._make(key, operator, values)

    def _value_set(self) -> list[str]:
        opening = self._next("'('")
        if opening[1] != "(":
            raise self._unexpected(opening, "'('")
        values: list[str] = []
        if self._peek() is not None and self._peek()[1] == ")":
            self.pos += 1
            return values
        while True:
            token = self._next("a value or ')'")
            if token[0] == "ident":
                values.append(token[1])
                token = self._next("',' or ')'")
            else:
                values.append("")  # an empty element, as in ``(a,)``
            if token[1] == ")":
                return values
            if token[1] != ",":
                raise self._unexpected(token, "',' or ')'")


_KEYWORDS = ("in", "notin")
_OPERATOR_TOKENS = {
    "=": Operator.EQUALS,
    "==": Operator.EQUALS,
    "!=": Operator.NOT_EQUALS,
    "in": Operator.IN,
    "notin": Operator.NOT_IN,
    ">": Operator.GREATER_THAN,
    "<": Operator.LESS_THAN,
}


def selector_at(node: Fields, key: str) -> LabelSelector | None:
    """An optional ``metav1.LabelSelector`` field of ``node``; None when absent."""
    spec = node.raw(key)
    return None if spec is None else LabelSelector.from_spec(spec, join(node.path, key))
