"""Starting and always stopping the benchmark's processes, CPU pinning, ports.

Every process the harness starts goes through one ``Supervisor``: it is put in
its own process group, pinned to a CPU set, asked to die with the harness
(``PR_SET_PDEATHSIG``), and stopped (SIGTERM, then SIGKILL) when the
supervisor's ``with`` block ends, however it ends (Ctrl-C included).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence

_PR_SET_PDEATHSIG = 1
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not on Linux
    _libc = None


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Pinning:
    """Which CPUs the load generator and the system under test (proxies + backend) run on."""

    load: frozenset[int] | None
    sut: frozenset[int] | None

    @classmethod
    def plan(cls, enabled: bool = True) -> "Pinning":
        cpus = sorted(os.sched_getaffinity(0))
        if not enabled or len(cpus) < 2:
            return cls(None, None)
        return cls(frozenset(cpus[:1]), frozenset(cpus[1:]))

    def describe(self) -> str:
        if self.load is None or self.sut is None:
            return "nothing pinned (fewer than two CPUs, or --no-pin)"
        return (
            f"load generators (wrk, the open-loop generator) and the harness on CPU {_cpus(self.load)}; "
            f"proxies and the nginx backend on CPU {_cpus(self.sut)}"
        )


def _cpus(s: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(s))


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float, proc: "Proc | None" = None) -> None:
    """Wait until ``host:port`` accepts TCP connections; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.popen.poll() is not None:
            raise StartError(f"{proc.name} exited with {proc.popen.returncode} before listening on {host}:{port}\n"
                             f"{proc.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                detail = proc.log_tail() if proc is not None else ""
                raise StartError(f"nothing listening on {host}:{port} after {timeout:.0f}s\n{detail}") from None
            time.sleep(0.02)


class StartError(RuntimeError):
    """A process of the benchmark did not start."""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path | None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 20) -> str:
        if self.log is None or not self.log.exists():
            return ""
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(f"  {self.name}| {line}" for line in text[-lines:])


def _child_setup(cpus: frozenset[int] | None, nice: int) -> None:
    # Runs in the child between fork and exec: die with the harness, pin, raise priority.
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    if nice:
        # With autogroup scheduling (the default on desktop and many VM kernels) a process's nice only
        # counts inside its session's group, and each child here is a session of its own: set the
        # group's nice too, or other users' sessions still get an equal share of our CPU.
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
        except OSError:
            pass
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except PermissionError:
            pass


@dataclass
class Supervisor:
    """Owns every process and temp dir of one benchmark run."""

    procs: list[Proc] = field(default_factory=list)
    tmpdirs: list[Path] = field(default_factory=list)

    def __enter__(self) -> "Supervisor":
        # A plain `kill` of the harness cleans up like Ctrl-C does; and Ctrl-C works even when the
        # harness was started with SIGINT ignored (as a shell's background job is).
        self._old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        self._old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop_all()
        finally:
            signal.signal(signal.SIGTERM, self._old_term)
            signal.signal(signal.SIGINT, self._old_int)

    def tempdir(self, prefix: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix=f"tether-bench-{prefix}-"))
        self.tmpdirs.append(d)
        return d

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cpus: frozenset[int] | None,
        nice: int = 0,
        log: Path | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        stdout: int | IO[bytes] | None = None,
    ) -> Proc:
        """Start ``argv`` in its own process group, pinned to ``cpus`` at priority ``nice``; output to ``log``."""
        fh: IO[bytes] | None = None
        out: int | IO[bytes]
        if stdout is not None:
            out, err = stdout, subprocess.STDOUT
        elif log is not None:
            fh = open(log, "ab")  # noqa: SIM115 - the child keeps its own copy; ours is closed below
            out, err = fh, subprocess.STDOUT
        else:
            out, err = subprocess.DEVNULL, subprocess.DEVNULL
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                start_new_session=True,
                preexec_fn=lambda: _child_setup(cpus, nice),  # noqa: PLW1509 - only prctl, affinity, priority
            )
        except OSError as e:
            raise StartError(f"cannot start {name} ({argv[0]}): {e}") from e
        finally:
            if fh is not None:
                fh.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc, grace: float = 3.0) -> None:
        stop_process(proc.popen, grace, group=True)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        # Interrupts during cleanup must not leave processes behind.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for proc in reversed(list(self.procs)):
                try:
                    self.stop(proc)
                except Exception:  # noqa: BLE001 - keep stopping the others
                    pass
            for d in self.tmpdirs:
                shutil.rmtree(d, ignore_errors=True)
            self.tmpdirs.clear()
        finally:
            signal.signal(signal.SIGINT, old_int)


def stop_process(popen: subprocess.Popen[bytes], grace: float, *, group: bool = False) -> None:
    """SIGTERM, and SIGKILL if it has not exited ``grace`` seconds later; then reap it.

    ``group``: signal the process group ``popen`` leads (started with ``start_new_session``), and kill what
    is left of it even when the leader is already gone.
    """
    def send(sig: int) -> None:
        if group:
            _signal_group(popen.pid, sig)
        elif popen.poll() is None:
            popen.send_signal(sig)

    if popen.poll() is None:
        send(signal.SIGTERM)
        try:
            popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            popen.wait(timeout=grace)
    elif group:
        send(signal.SIGKILL)  # the leader is gone; make sure nothing it forked stays behind


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def which(name: str, extra: Sequence[Path] = ()) -> Path | None:
    """``name`` on PATH, in /usr/sbin and /sbin (root's tools), or in ``extra`` dirs."""
    for d in extra:
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    return Path(found) if found else None
