"""Typed reads from a decoded manifest, each failing with a `ValidationError` at its field path.

`Fields` wraps one mapping and the path it sits at (``spec.routes[0]``); the
per-kind modules (`meta`, `core`, `workloads`, `profiles`, `policy`, `routes`)
read every field through it, so type errors, missing fields and enum checks
are worded the same everywhere. A ``null`` value counts as absent, as it does
for Kubernetes' optional fields.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from tether.resources.durations import parse_duration
from tether.resources.errors import PolicyRuleViolation, ValidationError
from tether.resources.quantities import Quantity, parse_quantity

T = TypeVar("T")


REQUIRED: Any = object()
"""Default that makes a read fail with ``required`` when the field is absent."""

NameCheck = Callable[[str], "str | None"]
"""A rule from `formats`: ``None`` when fine, else the problem."""


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def map_key(path: str, key: str) -> str:
    """The path of a map entry, as Kubernetes prints it: ``metadata.labels[app]``."""
    return f"{path}[{key}]"


def expect_string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ValidationError("expected a string", path=path)
    return value


def expect_mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError("expected a mapping", path=path)
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValidationError("expected a list", path=path)
    return value


def check_name(value: str, path: str, check: NameCheck) -> str:
    problem = check(value)
    if problem:
        raise ValidationError(f"{value!r} {problem}" if value else problem, path=path)
    return value


def check_port(value: int, path: str) -> int:
    if not 1 <= value <= 65535:
        raise ValidationError("must be between 1 and 65535", path=path)
    return value


class Fields:
    """A mapping inside a manifest, read field by field."""

    __slots__ = ("data", "path")

    def __init__(self, data: Mapping[str, Any], path: str = "") -> None:
        self.data = data
        self.path = path

    @classmethod
    def of(cls, value: Any, path: str) -> "Fields":
        return cls(expect_mapping(value, path), path)

    def at(self, key: str) -> str:
        return join(self.path, key)

    def error(self, key: str | None, message: str, *, rule: bool = False) -> ValidationError:
        """An error about ``key`` (or this mapping itself when ``key`` is None).

        ``rule``: the value reads but breaks a Linkerd admission rule (a `PolicyRuleViolation`).
        """
        cls = PolicyRuleViolation if rule else ValidationError
        return cls(message, path=self.path if key is None else self.at(key))

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key)
        if value is None and default is REQUIRED:
            raise self.error(key, "required")
        return value

    def raw(self, key: str) -> Any:
        """The value as decoded, or None: for fields passed on untyped."""
        return self.data.get(key)

    def string(self, key: str, default: T = REQUIRED, *, check: NameCheck | None = None) -> str | T:
        value = self._get(key, default)
        if value is None:
            return default
        text = expect_string(value, self.at(key))
        return check_name(text, self.at(key), check) if check else text

    def integer(
        self, key: str, default: T = REQUIRED, *, minimum: int | None = None, maximum: int | None = None
    ) -> int | T:
        value = self._get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, "expected an integer")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            if minimum is None:
                raise self.error(key, f"must be at most {maximum}")
            if maximum is None:
                raise self.error(key, f"must be at least {minimum}")
            raise self.error(key, f"must be between {minimum} and {maximum}")
        return value

    def port(self, key: str, default: T = REQUIRED) -> int | T:
        self._get(key, default)
        value = self.integer(key, None)
        return default if value is None else check_port(value, self.at(key))

    def number(self, key: str, default: T = REQUIRED, *, minimum: float | None = None) -> float | T:
        value = self._get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, "expected a number")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}")
        return float(value)

    def boolean(self, key: str, default: T = REQUIRED) -> bool | T:
        value = self._get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, "expected a boolean")
        return value

    def choice(self, key: str, choices: Collection[str], default: T = REQUIRED) -> str | T:
        self._get(key, default)
        value = self.string(key, None)
        if value is None:
            return default
        if value in choices:
            return value
        supported = ", ".join(choices)
        raise self.error(key, f"unsupported value {value!r} (supported: {supported})")

    def duration(self, key: str, default: T = REQUIRED) -> float | T:
        """A non-negative Go duration (``300ms``, ``1m30s``), in seconds."""
        text = self.string(key, default)
        if text is default:
            return default
        try:
            seconds = parse_duration(text)
        except ValueError as e:
            raise self.error(key, str(e)) from None
        if seconds < 0:
            raise self.error(key, "must not be negative")
        return seconds

    def quantity(self, key: str, default: T = REQUIRED) -> Quantity | T:
        """A non-negative Kubernetes quantity, given as a string or a bare number."""
        value = self._get(key, default)
        if value is None:
            return default
        try:
            quantity = parse_quantity(value)
        except ValueError as e:
            raise self.error(key, str(e)) from None
        if quantity.value < 0:
            raise self.error(key, "must not be negative")
        return quantity

    def int_or_string(self, key: str, default: T = REQUIRED, *, check: NameCheck) -> int | str | T:
        """A port number, or a name that ``check`` accepts (Kubernetes' IntOrString)."""
        value = self._get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise self.error(key, "expected an integer or a string")
        if isinstance(value, int):
            return check_port(value, self.at(key))
        return check_name(value, self.at(key), check)

    def child(self, key: str, default: T = REQUIRED) -> "Fields | T":
        value = self._get(key, default)
        if value is None:
            return default
        return Fields.of(value, self.at(key))

    def items(self, key: str, *, required: bool = False, non_empty: bool = False) -> list[tuple[str, Any]]:
        """The (path, value) of each element of a list field; [] when absent and optional."""
        value = self._get(key, REQUIRED if required else None)
        if value is None:
            return []
        elements = expect_list(value, self.at(key))
        if non_empty and not elements:
            raise self.error(key, "must not be empty")
        return [(index(self.at(key), i), element) for i, element in enumerate(elements)]

    def children(self, key: str, *, required: bool = False, non_empty: bool = False) -> list["Fields"]:
        return [Fields.of(v, p) for p, v in self.items(key, required=required, non_empty=non_empty)]

    def strings(
        self, key: str, *, required: bool = False, non_empty: bool = False, check: NameCheck | None = None
    ) -> tuple[str, ...]:
        out = []
        for path, value in self.items(key, required=required, non_empty=non_empty):
            text = expect_string(value, path)
            out.append(check_name(text, path, check) if check else text)
        return tuple(out)

    def string_map(
        self, key: str, *, key_check: NameCheck | None = None, value_check: NameCheck | None = None
    ) -> dict[str, str]:
        """A ``map[string]string`` such as labels; {} when absent."""
        value = self._get(key, None)
        if value is None:
            return {}
        mapping = expect_mapping(value, self.at(key))
        out = {}
        for k, v in mapping.items():
            path = map_key(self.at(key), k)
            if key_check:
                check_name(k, path, key_check)
            text = expect_string(v, path)
            out[k] = check_name(text, path, value_check) if value_check else text
        return out
