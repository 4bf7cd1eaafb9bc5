"""The check runner and Linkerd's renderings: fatal categories, warnings, retries under --wait, text and JSON."""

from __future__ import annotations

from tether.diagnose import checks


def ok() -> None:
    return None


def fail(message: str):
    def run() -> None:
        raise checks.Problem(message)
    return run


def test_text_form_is_linkerds() -> None:
    lines: list[str] = []
    printer = checks.TextPrinter(lines.append)
    report = checks.run([
        checks.Category("first", [checks.Check("passes", ok), checks.Check("warns", fail("soon"), "renew", warning=True)]),
        checks.Category("second", [checks.Check("fails", fail("broken\nsecond line"), "fix it")]),
    ], printer)
    printer.finish(report)
    assert lines == [
        "first", "-----", "\u221a passes", "\u203c warns", "    soon", "    hint: renew", "",
        "second", "------", "\u00d7 fails", "    broken", "    second line", "    hint: fix it", "",
        "Status check results are \u00d7",
    ]
    assert not report.success and report.warning


def test_warnings_alone_succeed_and_short_prints_only_problems() -> None:
    lines: list[str] = []
    printer = checks.TextPrinter(lines.append, short=True)
    report = checks.run([checks.Category("c", [checks.Check("fine", ok), checks.Check("w", fail("x"), warning=True)])],
                        printer)
    printer.finish(report)
    assert report.success
    assert lines == ["c", "-", "\u203c w", "    x", "", "Status check results are \u221a"]


def test_a_failed_fatal_category_skips_the_rest() -> None:
    report = checks.run([
        checks.Category("platform", [checks.Check("a", fail("gone")), checks.Check("b", ok)], fatal=True),
        checks.Category("later", [checks.Check("c", ok)]),
    ])
    assert [(r.category, r.description) for r in report.results] == [("platform", "a"), ("platform", "b")]


def test_json_has_linkerds_shape() -> None:
    report = checks.run([checks.Category("c", [checks.Check("ok", ok), checks.Check("bad", fail("no"), "hint")])])
    assert checks.render_json(report) == {"success": False, "categories": [{"categoryName": "c", "checks": [
        {"description": "ok", "result": "success"},
        {"description": "bad", "result": "error", "error": "no", "hint": "hint"},
    ]}]}


def test_retried_checks_wait_until_they_pass_or_the_wait_is_over() -> None:
    clock = [0.0]
    attempts = {"n": 0}

    def eventually() -> None:
        attempts["n"] += 1
        if attempts["n"] < 4:
            raise checks.Problem(f"not yet ({attempts['n']})")

    waited: list[str] = []
    sleep = lambda s: clock.__setitem__(0, clock[0] + s)  # noqa: E731
    report = checks.run([checks.Category("c", [checks.Check("ready", eventually, retry=True)])], wait=10,
                        progress=lambda c, d, e: waited.append(e), clock=lambda: clock[0], sleep=sleep)
    assert report.success and waited == ["not yet (1)", "not yet (2)", "not yet (3)"]

    clock[0] = 0.0
    report = checks.run([checks.Category("c", [checks.Check("never", fail("down"), retry=True),
                                               checks.Check("not retried", fail("x"))])],
                        wait=3, clock=lambda: clock[0], sleep=sleep)
    assert not report.success and clock[0] == 3.0
