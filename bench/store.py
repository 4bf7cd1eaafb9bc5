"""The store's speed: apply throughput in one process, and watch latency across processes.

Run by ``bench/__main__.py`` (``./run bench store [-- --applies 200 ...]``).
Latency is measured closed-loop: one process applies a change, waits until every
watcher has it, then applies the next, so each figure is an unloaded delivery
time (from just before ``apply`` to the watcher's loop seeing the event; clock:
CLOCK_MONOTONIC, shared by all processes).  Watchers are spread over a bounded
number of processes, each running several watch subscriptions, because a
thousand Python processes would not fit on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from collections import Counter
from contextlib import aclosing
from multiprocessing.connection import Connection
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tether.store import Store

_SPAWN = multiprocessing.get_context("spawn")
_NAMESPACE = "bench"


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _pod(name: str, image: str = "app:1") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": _NAMESPACE, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "app", "image": image}]},
    }


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}"


def _throughput(directory: Path, count: int) -> Table:
    table = Table(title=f"apply throughput, one process, {count:,} objects")
    table.add_column("operation")
    table.add_column("objects/s", justify="right")
    with Store(directory / "throughput.db") as store:
        cases = [
            ("apply (create)", lambda i: store.apply(_pod(f"p{i}"))),
            ("apply (update spec)", lambda i: store.apply(_pod(f"p{i}", image="app:2"))),
            ("apply (identical, no-op)", lambda i: store.apply(_pod(f"p{i}", image="app:2"))),
        ]
        for label, step in cases:
            start = time.perf_counter()
            for i in range(count):
                step(i)
            table.add_row(label, _rate(count, time.perf_counter() - start))
        start = time.perf_counter()
        for first in range(0, count, 100):
            store.apply_many([_pod(f"b{i}") for i in range(first, min(first + 100, count))])
        table.add_row("apply_many (create, batches of 100)", _rate(count, time.perf_counter() - start))
        start = time.perf_counter()
        for i in range(count):
            store.delete("Pod", _NAMESPACE, f"p{i}")
        table.add_row("delete", _rate(count, time.perf_counter() - start))
    return table


def _watcher(path: str, since: int, subscriptions: int, expected: int, conn: Connection) -> None:
    """One watcher process: ``subscriptions`` watches; acks each version once all of them have it."""

    async def main() -> None:
        received: list[list[float]] = [[] for _ in range(subscriptions)]
        arrived: Counter[int] = Counter()

        async def follow(index: int) -> None:
            async with aclosing(store.watch("Pod", since, _NAMESPACE)) as events:
                async for event in events:
                    received[index].append(_now())
                    arrived[event.resource_version] += 1
                    if arrived[event.resource_version] == subscriptions:
                        conn.send(event.resource_version)
                    if len(received[index]) == expected:
                        return

        with Store(path) as store:
            await asyncio.gather(*(follow(i) for i in range(subscriptions)))
        conn.send(received)

    asyncio.run(main())


def _spread(watchers: int, max_processes: int) -> list[int]:
    processes = min(watchers, max_processes)
    share, extra = divmod(watchers, processes)
    return [share + (1 if i < extra else 0) for i in range(processes)]


def _latency(directory: Path, watchers: int, max_processes: int, applies: int) -> tuple[str, list[float], list[float]]:
    """Delivery latencies (every watcher, every apply) and the time until the last watcher had each apply."""
    path = str(directory / f"latency-{watchers}.db")
    spread = _spread(watchers, max_processes)
    with Store(path) as store:
        store.apply(_pod("subject"))
        since = store.resource_version()
        pipes, processes = [], []
        for subscriptions in spread:
            ours, theirs = _SPAWN.Pipe()
            proc = _SPAWN.Process(target=_watcher, args=(path, since, subscriptions, applies + 1, theirs))
            proc.start()
            pipes.append(ours)
            processes.append(proc)
        try:
            # A first change that every watcher must see before timing starts: by then all are subscribed.
            store.apply(_pod("subject", image="warm-up"))
            for pipe in pipes:
                pipe.recv()
            starts: list[float] = []
            for i in range(applies):
                starts.append(_now())
                store.apply(_pod("subject", image=f"app:{i}"))
                for pipe in pipes:
                    pipe.recv()
            received = [times for pipe in pipes for times in pipe.recv()]
        finally:
            for proc in processes:
                proc.join(30)
                if proc.is_alive():
                    proc.terminate()
    every = [times[i + 1] - start for times in received for i, start in enumerate(starts)]
    last = [max(times[i + 1] for times in received) - start for i, start in enumerate(starts)]
    counts = Counter(spread)
    layout = " + ".join(f"{n} proc × {k}" for k, n in sorted(counts.items(), reverse=True))
    return layout, every, last


def _ms(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.2f}"


def run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench store", description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=2000, help="objects per throughput case")
    parser.add_argument("--applies", type=int, default=200, help="timed applies per latency case")
    parser.add_argument("--watchers", default="1,100,1000", help="comma-separated watcher counts")
    parser.add_argument("--max-processes", type=int, default=8, help="watcher processes at most")
    args = parser.parse_args(argv)
    console = Console()
    with tempfile.TemporaryDirectory(prefix="tether-bench-store-") as tmp:
        directory = Path(tmp)
        console.print(_throughput(directory, args.objects))
        table = Table(title=f"watch latency, apply in one process → delivery in others, {args.applies} applies")
        table.add_column("watchers", justify="right")
        table.add_column("spread over")
        table.add_column("p50 ms", justify="right")
        table.add_column("p99 ms", justify="right")
        table.add_column("last watcher p50 ms", justify="right")
        table.add_column("last watcher p99 ms", justify="right")
        for watchers in (int(n) for n in args.watchers.split(",")):
            layout, every, last = _latency(directory, watchers, args.max_processes, args.applies)
            table.add_row(
                f"{watchers:,}", layout, _ms(every, 0.5), _ms(every, 0.99), _ms(last, 0.5), _ms(last, 0.99)
            )
        console.print(table)
