"""Where a proxy's time goes under load: py-spy samples of its processes, summed by area and by frame.

``start``/``finish`` run ``py-spy record --format raw --native`` on each
process for the given seconds (while the harness drives load through them)
and return the folded stacks. Native frames (syscalls, TLS, the event loop's C)
need py-spy to pause the process for each sample, which slows it: the rate
while sampled is reported, and profiling runs after every measurement. ``summarize`` turns folded stacks into shares: samples whose
innermost frame is a wait (``epoll_wait``, ``futex``...) are idle and left out
(gRPC's threads sit there), the rest are attributed by their innermost frame
to an area (``AREAS``: the HTTP codec, the HTTP layer, the driver, TLS,
syscalls, the event loop...) and listed by frame. Shares, not times: the
report puts them next to the CPU seconds per request measured separately.

Caller: ``runner.Harness.profile``; the report's "Where the time goes".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

RATE = 250  # samples per second

# Innermost frames of a thread that is waiting, not working.
IDLE = ("epoll_wait", "epoll_pwait", "futex", "__futex", "pthread_cond", "poll (", "select (", "nanosleep",
        "clock_nanosleep", "sem_wait", "do_futex", "syscall (libc", "restart_syscall")

# (area, substrings of the innermost frame), first match wins; the order matters.
AREAS: list[tuple[str, tuple[str, ...]]] = [
    ("HTTP/1 codec", ("proxy/codec/http1.py", "httptools", "llhttp", "parser.c")),
    ("HTTP/2 codec", ("h2/", "hpack/", "hyperframe/", "proxy/codec/http2")),
    ("HTTP layer", ("proxy/core/",)),  # the layers' decisions (pure): at maximum load, HTTP's
    ("TLS", ("ssl.py", "_ssl.c", "libssl", "libcrypto", "SSLProtocol", "sslproto")),
    ("syscalls", ("write (libc", "read (libc", "writev", "readv", "send", "recv", "mmap", "munmap", "mremap",
                  "getpid", "epoll_ctl", "close (libc")),
    ("driver", ("proxy/io/",)),
    ("other proxy code", ("tether/",)),
    ("event loop and Python runtime", ("uvloop", "loop.c", "asyncio", "_asynciomodule", "libpython", "object.h",
                                       "ceval", "Py_", "_Py", "<string>")),
]


def available() -> str | None:
    """Why profiling cannot run here, or None."""
    return None if py_spy() else "py-spy not installed (bench/requirements.txt)"


def py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.is_file() else shutil.which("py-spy")


def start(pids: dict[str, int], seconds: float, workdir: Path) -> dict[str, tuple[subprocess.Popen[bytes], Path]]:
    """Begin sampling each process for ``seconds``; ``finish`` collects the result."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy not installed")
    running = {}
    for role, pid in pids.items():
        out = workdir / f"{role}.folded"
        argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", str(RATE),
                "--format", "raw", "--native", "--output", str(out)]  # native frames need the process paused
        running[role] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out)
    return running


def finish(running: dict[str, tuple[subprocess.Popen[bytes], Path]], timeout: float) -> dict[str, str]:
    """The folded stacks of each role (empty when py-spy failed: its error is on stderr)."""
    folded = {}
    for role, (proc, out) in running.items():
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if out.is_file():
            folded[role] = out.read_text()
        else:
            print(f"py-spy on {role} failed: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
            folded[role] = ""
    return folded


def area_of(frame: str) -> str:
    for area, needles in AREAS:
        if any(n in frame for n in needles):
            return area
    return "other native code"


def summarize(folded: str, top: int = 15) -> dict[str, Any]:
    """Busy samples, their shares by area and the innermost frames that take the most."""
    busy = 0
    idle = 0
    areas: Counter[str] = Counter()
    frames: Counter[str] = Counter()
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        leaf = stack.rsplit(";", 1)[-1]
        if any(leaf.startswith(w) for w in IDLE):
            idle += n
            continue
        busy += n
        areas[area_of(leaf)] += n
        frames[leaf] += n
    share = (lambda n: n / busy) if busy else (lambda n: 0.0)
    return {
        "busy_samples": busy,
        "idle_samples": idle,
        "areas": {a: share(n) for a, n in areas.most_common()},
        "top": [[f, share(n)] for f, n in frames.most_common(top)],
    }
