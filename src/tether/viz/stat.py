"""``StatCollector``: scrape the proxies of the selected workloads, keep a short history, compute rows.

Each ``poll()`` lists the workloads (through the ``source`` callable, which
reads the store), scrapes every scrapable pod once, appends each scrape to
that pod's history and returns one ``StatRow`` per workload.  A pod's rates
are taken between its newest scrape and the newest one at least ``window``
seconds older (or the oldest kept, early on), so a one-shot ``stat`` polls,
waits the window and polls again, and ``--watch`` polls every interval over a
sliding window.  Pods that are gone lose their history; a pod whose scrape
failed is named in the row's ``errors`` and left out of its numbers.

Callers: ``tether.cli.stat_cmd`` and tests (with a fake scraper and clock).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tether.viz.proxy_metrics import PodCounters
from tether.viz.scrape import ADMIN_PORT, Scraped, scrape_all
from tether.viz.window import Activity, Golden, activity, golden
from tether.viz.workloads import Workload

Scraper = Callable[[Mapping[str, str]], Mapping[str, Scraped]]


@dataclass(frozen=True, slots=True)
class StatRow:
    workload: Workload
    golden: Golden
    errors: tuple[str, ...] = ()


class StatCollector:
    def __init__(self, source: Callable[[], list[Workload]], window: float, *, scraper: Scraper | None = None,
                 clock: Callable[[], float] = time.monotonic, port: int = ADMIN_PORT, timeout: float = 2.0) -> None:
        self.source = source
        self.window = window
        self._scraper = scraper or (lambda targets: scrape_all(targets, port=port, timeout=timeout))
        self._clock = clock
        self._history: dict[str, deque[tuple[float, PodCounters]]] = {}

    def poll(self) -> list[StatRow]:
        workloads = self.source()
        targets = {p.key: p.ip for w in workloads for p in w.pods if p.scrapable and p.ip}
        results = self._scraper(targets)
        now = self._clock()
        for key in list(self._history):
            if key not in targets:
                del self._history[key]
        for key, scraped in results.items():
            if scraped.counters is not None:
                self._remember(key, now, scraped.counters)
        rows = []
        for w in workloads:
            activities: list[Activity] = []
            errors: list[str] = []
            for pod in w.pods:
                if pod.key not in targets:
                    continue
                scraped = results.get(pod.key)
                if scraped is None or scraped.counters is None:
                    errors.append(f"{pod.name}: {scraped.error if scraped else 'not scraped'}")
                    continue
                activities.append(self._activity(pod.key))
            rows.append(StatRow(w, golden(activities) if activities else Golden(), tuple(errors)))
        return rows

    def _remember(self, key: str, now: float, counters: PodCounters) -> None:
        history = self._history.setdefault(key, deque())
        history.append((now, counters))
        # Keep the newest scrape that is at least a window old (the baseline) and everything after it.
        while len(history) > 2 and history[1][0] <= now - self.window:
            history.popleft()

    def _activity(self, key: str) -> Activity:
        history = self._history[key]
        t_new, newest = history[-1]
        if len(history) == 1:
            return activity(None, newest, 0.0)
        t_old, oldest = history[0]
        return activity(oldest, newest, t_new - t_old)
