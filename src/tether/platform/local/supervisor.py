"""Keeps one control-plane component running: restart it when it exits, with backoff, and say so.

The launcher runs every component under this supervisor (``python -m
tether.platform.local.supervisor --state FILE ... -- ARGV``), as the pod controller runs
containers: a component that crashes or is killed comes back after ``initial`` seconds, doubling
up to ``max`` on repeated crashes, and the count starts again once a run lasted ``reset`` seconds.
Each start and exit is written to the state file (the component's own pid, how many times it was
restarted, its last exit code) that ``tether status`` reads, and to the component's log.

The supervisor and the component form one process group (the launcher starts the supervisor in a
new session): ``tether down`` signals the group, the component stops, and the supervisor then
exits instead of restarting it.  The component is killed if the supervisor itself dies
(``PR_SET_PDEATHSIG``), so a component never runs unsupervised.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from tether.platform.local.containers import Backoff

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class SupervisedState:
    """What the supervisor last wrote about its component."""

    pid: int  # the component's own process (0 while it is waiting to be restarted)
    restarts: int
    last_exit_code: int | None
    last_exit_at: str | None
    next_start_at: str | None  # while waiting to restart

    @classmethod
    def read(cls, path: Path) -> SupervisedState | None:
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None  # absent, or torn mid-write: treated as unknown

    def write(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self)) + "\n")
        os.replace(tmp, path)


def module_argv(state: Path, backoff: Backoff, argv: tuple[str, ...]) -> tuple[str, ...]:
    """The command line that runs ``argv`` under a supervisor writing ``state``."""
    return (sys.executable, "-m", __name__, "--state", str(state), "--initial", str(backoff.initial),
            "--max", str(backoff.max), "--reset", str(backoff.reset), "--", *argv)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def supervise(argv: list[str], state: Path, backoff: Backoff) -> int:
    """Run ``argv`` until SIGTERM/SIGINT, restarting it whenever it exits; returns its last exit code."""
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    restarts, failures, code = 0, 0, 0
    last_exit: tuple[int, str] | None = None
    while not stopping.is_set():
        began = time.monotonic()
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)  # noqa: PLW1509
        SupervisedState(child.pid, restarts, *(last_exit or (None, None)), None).write(state)
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
        if stopping.is_set():
            break
        last_exit = (code, _now())
        failures = 1 if time.monotonic() - began >= backoff.reset else failures + 1
        delay = backoff.delay(failures)
        print(f"--- {_now()} exited with code {code}; restarting in {delay:g}s (restart {restarts + 1})", flush=True)
        SupervisedState(0, restarts, code, last_exit[1], _now_plus(delay)).write(state)
        if stopping.wait(delay):
            break
        restarts += 1
    return code


def _now_plus(seconds: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def main() -> None:
    parser = argparse.ArgumentParser(prog="tether-supervisor", description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--initial", type=float, default=1.0)
    parser.add_argument("--max", type=float, default=30.0)
    parser.add_argument("--reset", type=float, default=60.0)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("no command to supervise")
    sys.exit(supervise(argv, args.state, Backoff(args.initial, args.max, args.reset)))


if __name__ == "__main__":
    main()
