"""The check model of ``tether check``: categories of checks, a runner, and Linkerd's two renderings.

A ``Check`` is a description (Linkerd's wording where Linkerd has the check), a
function that returns None when all is well or raises ``Problem``, a hint the
user can act on, and two flags: ``warning`` (a failure is reported as ``‼`` and
does not fail the run, as Linkerd's "valid for at least 60 days") and ``retry``
(with ``--wait`` the check is tried again until it passes or the wait is over,
as Linkerd retries "control plane pods are ready").  A ``Category`` is an id and
its checks; a failed check of a ``fatal`` category skips the categories after it
(nothing else can be checked without a reachable platform).

``run`` reports every final result to an observer as it is decided, so the text
form prints while later checks still run; ``render_json`` builds Linkerd's
``{"success", "categories": [{"categoryName", "checks": [...]}]}`` shape.

Callers: ``tether.cli.check`` (and the category builders in this package).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

OK, WARN, FAIL = "\u221a", "\u203c", "\u00d7"  # √ ‼ ×
RETRY_INTERVAL_S = 1.0


class Outcome(str, Enum):
    SUCCESS = "success"
    WARNING = "warning"
    ERROR = "error"


class Problem(Exception):
    """A check did not pass; the message says what was found."""


@dataclass(frozen=True)
class Check:
    description: str
    run: Callable[[], None]
    hint: str = ""
    warning: bool = False
    retry: bool = False


@dataclass(frozen=True)
class Category:
    name: str
    checks: Sequence[Check]
    fatal: bool = False


@dataclass(frozen=True)
class Result:
    category: str
    description: str
    outcome: Outcome
    error: str = ""
    hint: str = ""

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"description": self.description, "result": self.outcome.value}
        if self.outcome is not Outcome.SUCCESS:
            doc["error"] = self.error
            if self.hint:
                doc["hint"] = self.hint
        return doc


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return not any(r.outcome is Outcome.ERROR for r in self.results)

    @property
    def warning(self) -> bool:
        return any(r.outcome is Outcome.WARNING for r in self.results)


Observer = Callable[[Result], None]
Progress = Callable[[str, str, str], None]  # (category, description, the error being waited out)


def _attempt(check: Check) -> str | None:
    try:
        check.run()
    except Problem as exc:
        return str(exc) or "failed"
    return None


def run(categories: Iterable[Category], observer: Observer = lambda r: None, *, wait: float = 0.0,
        progress: Progress = lambda c, d, e: None, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep) -> Report:
    """Run the categories in order; retried checks wait up to ``wait`` seconds in all."""
    report = Report()
    deadline = clock() + wait
    for category in categories:
        failed = False
        for check in category.checks:
            error = _attempt(check)
            while error is not None and check.retry and clock() < deadline:
                progress(category.name, check.description, error)
                sleep(min(RETRY_INTERVAL_S, max(0.0, deadline - clock())))
                error = _attempt(check)
            if error is None:
                result = Result(category.name, check.description, Outcome.SUCCESS)
            else:
                outcome = Outcome.WARNING if check.warning else Outcome.ERROR
                result = Result(category.name, check.description, outcome, error, check.hint)
                failed |= outcome is Outcome.ERROR
            report.results.append(result)
            observer(result)
        if failed and category.fatal:
            break
    return report


class TextPrinter:
    """Linkerd's table form: a header per category, one line per check, error and hint lines under failures."""

    def __init__(self, echo: Callable[[str], None], *, short: bool = False) -> None:
        self._echo = echo
        self._short = short
        self._category = ""

    def __call__(self, result: Result) -> None:
        if self._short and result.outcome is Outcome.SUCCESS:
            return
        if result.category != self._category:
            if self._category:
                self._echo("")
            self._echo(result.category)
            self._echo("-" * len(result.category))
            self._category = result.category
        mark = {Outcome.SUCCESS: OK, Outcome.WARNING: WARN, Outcome.ERROR: FAIL}[result.outcome]
        self._echo(f"{mark} {result.description}")
        if result.outcome is not Outcome.SUCCESS:
            for line in result.error.splitlines() or [""]:
                self._echo(f"    {line}")
            if result.hint:
                self._echo(f"    hint: {result.hint}")

    def finish(self, report: Report) -> None:
        if not self._short or not report.success or report.warning:
            self._echo("")
        self._echo(f"Status check results are {OK if report.success else FAIL}")


def render_json(report: Report) -> dict[str, Any]:
    categories: list[dict[str, Any]] = []
    for result in report.results:
        if not categories or categories[-1]["categoryName"] != result.category:
            categories.append({"categoryName": result.category, "checks": []})
        categories[-1]["checks"].append(result.as_json())
    return {"success": report.success, "categories": categories}
