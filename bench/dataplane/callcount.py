"""Python calls per request in a Tether proxy, counted inside the proxy process while the harness sends N requests.

The harness starts every Tether proxy as ``python -m bench.dataplane.callcount``
instead of ``python -m tether.proxy``: this module runs ``tether.proxy`` (or the
module named as its argument) as ``__main__`` (the same process, the same
environment). When
``TETHER_BENCH_CALLCOUNT_DIR`` is set it first installs two signal handlers,
and nothing else (no profiler is imported or running during the measurements):

- ``SIGUSR1``: start counting: ``cProfile`` on the main thread, where the
  event loop runs every request (the profiler's C hooks count each call of a
  Python function and of a builtin); writes ``enabled`` into the directory;
- ``SIGUSR2``: stop, and write ``calls.json``: calls of Python functions and of
  builtins while counting, and the Python functions called most.

With ``TETHER_BENCH_GCSTATS_DIR`` set (the harness passes its environment on:
``TETHER_BENCH_GCSTATS_DIR=/tmp/gc ./run bench mesh ...``), the process also
records the garbage collector's passes (``gc.callbacks``: per generation, how
many, their total and longest duration, the objects they freed; and the eight
slowest, with when they ran and whether after the start-up freeze) and writes
them to ``<pid>.json`` there every few seconds and at exit: what the
collector costs a proxy under the benchmark's load (docs/benchmarks.md).

The harness (``runner.Harness.callcount``, after every measurement) signals
both proxies of a variant, sends a fixed number of requests through them with
h2load, signals again and divides by the requests. The count includes each
connection's accept and close, spread over the requests it carried.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any

ENV = "TETHER_BENCH_CALLCOUNT_DIR"
ENABLED = "enabled"
RESULT = "calls.json"


class _Counter:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.profiler: Any = None

    def start(self, signum: int, frame: object) -> None:
        import cProfile

        self.profiler = cProfile.Profile()
        self.profiler.enable()
        (self.directory / ENABLED).write_text("1")

    def stop(self, signum: int, frame: object) -> None:
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return
        profiler.disable()
        result = summarize(profiler.getstats())
        tmp = self.directory / (RESULT + ".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, self.directory / RESULT)


def summarize(entries: Any, top: int = 60) -> dict[str, Any]:
    """Totals of cProfile's entries (``Profile.getstats()``): Python function calls, builtin calls, the top."""
    python = builtin = 0
    functions: list[tuple[int, str]] = []
    for entry in entries:
        code = entry.code
        if isinstance(code, types.CodeType):
            python += entry.callcount
            where = code.co_filename
            for marker in ("site-packages/", "src/"):
                if marker in where:
                    where = where.split(marker, 1)[1]
            functions.append((entry.callcount, f"{code.co_qualname} ({where}:{code.co_firstlineno})"))
        else:
            builtin += entry.callcount
    functions.sort(reverse=True)
    return {"python_calls": python, "builtin_calls": builtin, "top": [[name, n] for n, name in functions[:top]]}


GCSTATS_ENV = "TETHER_BENCH_GCSTATS_DIR"


class _GcStats:
    """The collector's passes in this process, per generation: [passes, total ms, longest ms, objects freed];
    and the slowest passes, each as [seconds since this hook was installed, generation, ms, objects frozen at
    the time] (frozen > 0: after the proxy's start-up ``gc.freeze()``, i.e. while it serves)."""

    SLOWEST = 8

    def __init__(self, directory: Path) -> None:
        self.path = directory / f"{os.getpid()}.json"
        self.passes = {gen: [0, 0.0, 0.0, 0] for gen in range(3)}
        self.slowest: list[list[float]] = []
        self.began = 0.0
        self.installed = time.monotonic()
        self.written = self.installed

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.began = time.perf_counter()
            return
        ms = (time.perf_counter() - self.began) * 1000
        entry = self.passes[info["generation"]]
        entry[0] += 1
        entry[1] += ms
        entry[2] = max(entry[2], ms)
        entry[3] += info["collected"]
        if len(self.slowest) < self.SLOWEST or ms > self.slowest[-1][2]:
            import gc

            self.slowest.append([round(time.monotonic() - self.installed, 3), info["generation"], ms,
                                 gc.get_freeze_count()])
            self.slowest.sort(key=lambda row: -row[2])
            del self.slowest[self.SLOWEST:]
        if time.monotonic() - self.written > 2.0:
            self.write()

    def write(self) -> None:
        import gc

        self.written = time.monotonic()
        self.path.write_text(json.dumps({"thresholds": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                                         "passes": self.passes, "slowest": self.slowest}))


def main(module: str = "tether.proxy") -> None:
    """Run ``module`` as ``__main__`` (``python -m bench.dataplane.callcount [MODULE]``), counting on signals."""
    directory = os.environ.get(ENV)
    if directory:
        counter = _Counter(Path(directory))
        Path(directory).mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGUSR1, counter.start)
        signal.signal(signal.SIGUSR2, counter.stop)
    gcstats = os.environ.get(GCSTATS_ENV)
    if gcstats:
        import atexit
        import gc

        stats = _GcStats(Path(gcstats))
        Path(gcstats).mkdir(parents=True, exist_ok=True)
        gc.callbacks.append(stats)
        atexit.register(stats.write)
    sys.argv[:] = [module]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(*sys.argv[1:2])
