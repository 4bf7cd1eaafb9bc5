"""Control-plane component processes of the local platform: start, wait until ready, stop, status.

``tether up`` hands the launcher one ``ComponentSpec`` per component (identity, destination,
the pod controller): a command line (``tether identity serve ...``), its addresses and its
admin URL.  Each component runs as its own detached process (own session, so a terminal's
Ctrl-C does not reach it), its output appended to ``<state>/logs/<name>.log``.  What was
started is recorded in ``<state>/run/<name>.json`` (pid, the process's start time so a reused
pid is never mistaken for ours, command, version, addresses), which is how ``status`` and
``down`` find it again from another ``tether`` process.  Readiness is the component's own
admin ``/ready`` answering 200, as Kubernetes probes Linkerd's components.

Every component runs under ``tether.platform.local.supervisor``, which restarts it with backoff
when it exits or is killed and records its own pid and restart count beside the record
(``<state>/run/<name>.supervisor.json``); ``status`` reports both.

The launcher imports no component: it only runs command lines.  Callers: ``tether.cli.up``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tether.platform.local import supervisor
from tether.platform.local.containers import Backoff

# Control-plane components come back quickly (every new connection in the mesh waits on them),
# but a crash loop still slows down to one start every 30 s.
DEFAULT_BACKOFF = Backoff(initial=1.0, max=30.0, reset=60.0)
PROBE_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.2
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class ComponentSpec:
    """How to run one component and how to tell it is healthy."""

    name: str
    argv: tuple[str, ...]
    admin_url: str  # http://host:port; /ready and /live are under it
    addr: str = ""  # the component's main address, for status
    version: str = ""
    stop_timeout: float = 15.0


@dataclass(frozen=True)
class Record:
    """What ``start`` wrote down about a running component."""

    name: str
    pid: int
    start_ticks: int
    argv: tuple[str, ...]
    admin_url: str
    addr: str
    version: str
    log: str
    started_at: str
    stop_timeout: float


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    # running; restarting (it exited and its supervisor waits out the backoff); stopped; exited
    # (its supervisor is gone without being stopped)
    state: str
    ready: bool
    live: bool
    record: Record | None
    log: Path
    pid: int | None = None  # the component's own process, while it runs
    restarts: int = 0

    @property
    def healthy(self) -> bool:
        return self.state == "running" and self.ready


@dataclass(frozen=True)
class Outcome:
    """How waiting for one component ended; ``problem`` is None when it became ready."""

    name: str
    problem: str | None
    seconds: float
    log: Path
    log_tail: str = ""


class Launcher:
    """Components of one state directory: records in ``records_dir``, logs in ``logs_dir``."""

    def __init__(self, records_dir: Path, logs_dir: Path, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self._records = records_dir
        self._logs = logs_dir
        self._backoff = backoff

    def log_path(self, name: str) -> Path:
        return self._logs / f"{name}.log"

    def _record_path(self, name: str) -> Path:
        return self._records / f"{name}.json"

    def _supervisor_path(self, name: str) -> Path:
        return self._records / f"{name}.supervisor.json"

    def supervised(self, name: str) -> supervisor.SupervisedState | None:
        """What the component's supervisor last wrote: its pid, restarts and last exit."""
        return supervisor.SupervisedState.read(self._supervisor_path(name))

    # -- records ---------------------------------------------------------------------------

    def record(self, name: str) -> Record | None:
        try:
            data = json.loads(self._record_path(name).read_text())
            return Record(**{**data, "argv": tuple(data["argv"])})
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError):
            return None  # a torn or foreign file: treat as not running

    def recorded(self) -> list[str]:
        """Names of every component with a record (running or not)."""
        if not self._records.is_dir():
            return []
        return sorted(p.stem for p in self._records.glob("*.json") if not p.stem.endswith(".supervisor"))

    def running(self, name: str) -> Record | None:
        """The record, if its process is still the one started (same pid and start time, not a zombie)."""
        rec = self.record(name)
        if rec is None or not _same_process(rec.pid, rec.start_ticks):
            return None
        return rec

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, spec: ComponentSpec) -> tuple[Record, bool]:
        """Start ``spec`` unless its process is already running; returns the record and whether it started now."""
        current = self.running(spec.name)
        if current is not None:
            return current, False
        self._records.mkdir(parents=True, exist_ok=True)
        self._logs.mkdir(parents=True, exist_ok=True)
        log = self.log_path(spec.name)
        with open(log, "ab") as out:
            out.write(f"--- {_now()} starting {spec.name}: {' '.join(spec.argv)}\n".encode())
            out.flush()
            self._supervisor_path(spec.name).unlink(missing_ok=True)
            proc = subprocess.Popen(
                list(supervisor.module_argv(self._supervisor_path(spec.name), self._backoff, spec.argv)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        rec = Record(
            name=spec.name,
            pid=proc.pid,
            start_ticks=_start_ticks(proc.pid) or 0,
            argv=spec.argv,
            admin_url=spec.admin_url,
            addr=spec.addr,
            version=spec.version,
            log=str(log),
            started_at=_now(),
            stop_timeout=spec.stop_timeout,
        )
        tmp = self._record_path(spec.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(rec.__dict__ | {"argv": list(rec.argv)}, indent=2) + "\n")
        os.replace(tmp, self._record_path(spec.name))
        # The Popen object is dropped: the process outlives this command.  Mark it reaped so
        # Python does not warn; the process is reaped by whoever inherits it.
        proc.returncode = 0
        return rec, True

    def wait_ready(
        self,
        names: Sequence[str],
        timeout: float,
        progress: Callable[[Outcome], None] | None = None,
    ) -> list[Outcome]:
        """Wait until each component answers /ready, its process exits, or ``timeout`` passes."""
        begin = time.monotonic()
        pending = list(names)
        outcomes: list[Outcome] = []
        while pending:
            for name in list(pending):
                elapsed = time.monotonic() - begin
                rec = self.record(name)
                problem: str | None = "not started"
                supervised = self.supervised(name)
                if rec is not None and _same_process(rec.pid, rec.start_ticks):
                    if _http_ok(rec.admin_url + "/ready"):
                        problem = None
                    elif supervised is not None and supervised.last_exit_code is not None:
                        problem = (f"its process exited (code {supervised.last_exit_code}); "
                                   "it is restarted with backoff")
                    elif elapsed < timeout:
                        continue
                    else:
                        problem = f"not ready after {timeout:.0f}s ({rec.admin_url}/ready)"
                elif rec is not None:
                    problem = "its process exited"
                outcome = Outcome(name, problem, elapsed, self.log_path(name),
                                  "" if problem is None else tail(self.log_path(name), LOG_TAIL_LINES))
                outcomes.append(outcome)
                pending.remove(name)
                if progress is not None:
                    progress(outcome)
            if pending:
                time.sleep(POLL_INTERVAL_S)
        return outcomes

    def stop(self, name: str, timeout: float | None = None) -> bool:
        """SIGTERM the component's process group, SIGKILL after ``timeout``; True if something was running."""
        rec = self.record(name)
        was_running = False
        if rec is not None and _same_process(rec.pid, rec.start_ticks):
            was_running = True
            _signal_group(rec.pid, signal.SIGTERM)
            deadline = time.monotonic() + (rec.stop_timeout if timeout is None else timeout)
            while _same_process(rec.pid, rec.start_ticks) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _same_process(rec.pid, rec.start_ticks):
                _signal_group(rec.pid, signal.SIGKILL)
                while _same_process(rec.pid, rec.start_ticks):
                    time.sleep(0.05)
            with open(self.log_path(name), "ab") as out:
                out.write(f"--- {_now()} stopped {name}\n".encode())
        self._record_path(name).unlink(missing_ok=True)
        self._supervisor_path(name).unlink(missing_ok=True)
        return was_running

    def status(self, name: str) -> ComponentStatus:
        rec = self.record(name)
        if rec is None:
            return ComponentStatus(name, "stopped", False, False, None, self.log_path(name))
        supervised = self.supervised(name)
        restarts = supervised.restarts if supervised is not None else 0
        if not _same_process(rec.pid, rec.start_ticks):
            return ComponentStatus(name, "exited", False, False, rec, self.log_path(name), restarts=restarts)
        if supervised is not None and not supervised.pid:
            return ComponentStatus(name, "restarting", False, False, rec, self.log_path(name), restarts=restarts)
        return ComponentStatus(
            name, "running", _http_ok(rec.admin_url + "/ready"), _http_ok(rec.admin_url + "/live"), rec,
            self.log_path(name), pid=supervised.pid if supervised is not None else None, restarts=restarts,
        )


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file ("" when it is missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def processes_matching(needles: Iterable[str]) -> list[int]:
    """Pids whose command line contains any of ``needles`` (leftovers after a crash)."""
    wanted = [n.encode() for n in needles if n]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(n in cmdline for n in wanted):
            found.append(int(entry.name))
    return found


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as resp:  # noqa: S310 - our own admin URL
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat fields after the command name (field 3, the state, is index 0)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    stat = _stat_fields(pid)
    return None if stat is None else int(stat[19])  # field 22: starttime


def _same_process(pid: int, start_ticks: int) -> bool:
    """Whether ``pid`` is alive (not a zombie) and is the process that started at ``start_ticks``."""
    stat = _stat_fields(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start_ticks == 0 or int(stat[19]) == start_ticks


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, signum)
