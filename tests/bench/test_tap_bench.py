"""bench/tap.py runs (a tiny run; its figures belong in docs/viz.md, not in assertions)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import tap  # noqa: E402


def test_every_case_is_timed_and_rendered() -> None:
    figures = tap.measure(requests=200, repeat=2)
    assert set(figures) == set(tap.CASES) and all(v > 0 for v in figures.values())
    table = tap.render(figures).splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == list(tap.CASES)
    # The matching case's tap really takes the requests (its events are built, then drained).
    observer, taps = tap._setup("one tap, matching")
    assert observer is not None
    observer.request(object(), tap.HEAD, tap.LABELS, tap.CLIENT)
    assert [e.http.WhichOneof("event") for e in taps.taps[0].events] == ["request_init"]
