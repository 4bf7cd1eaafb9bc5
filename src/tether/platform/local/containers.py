"""One container of a local pod: its command line and environment, its process, restarts with backoff.

A container here is a command run on the host's filesystem inside the pod's network
namespace (the ``image`` is not used).  Its environment is built as the kubelet builds it:
the container's ``env`` (literal values and ``fieldRef`` downward-API values, with
``$(VAR)`` references expanded), after the service variables of its namespace; its command
and args get the same expansion.  Output goes to ``<pod dir>/<container>.log``; the previous
run's log is kept as ``<container>.previous.log``.

``Container`` keeps Kubernetes' container state (waiting, running, terminated, last state,
restart count) and the crash backoff: a container that exits is started again after
``initial`` seconds, doubling up to ``max``, and the doubling starts over once a run lasted
``reset`` seconds.  Probes are run by the sandbox (``tether.platform.local.probes``); this
module only counts their results.  Caller: ``tether.platform.local.sandbox``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD_MAP = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known variables are replaced, ``$$`` is a literal ``$``,
    unknown references stay as written."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REFERENCE.sub(sub, text)


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API ``fieldRef`` value of ``pod`` ("" when it has none yet)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(ip.get("ip", "") for ip in status.get("podIPs") or ()),
        "status.hostIPs": ",".join(ip.get("ip", "") for ip in status.get("hostIPs") or ()),
    }
    if path in simple:
        return simple[path] or ""
    match = _FIELD_MAP.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    return ""


def build_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], base: Mapping[str, str]
) -> dict[str, str]:
    """The container's environment: ``base`` (PATH, HOSTNAME, service variables), then its ``env`` in order."""
    env = dict(base)
    for var in container.get("env") or ():
        name = var.get("name")
        if not name:
            continue
        ref = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if ref:
            env[name] = field_value(pod, ref)
        elif "value" in var:
            env[name] = expand(str(var.get("value") or ""), env)
        else:
            env.setdefault(name, "")
    return env


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded; [] when the container names no command."""
    return [expand(str(part), env) for part in [*(container.get("command") or ()), *(container.get("args") or ())]]


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Backoff:
    initial: float
    max: float
    reset: float

    def delay(self, failures: int) -> float:
        """Seconds to wait before the restart that follows ``failures`` consecutive crashes (>= 1)."""
        return min(self.max, self.initial * 2 ** max(0, failures - 1))


@dataclass
class ProbeState:
    successes: int = 0
    failures: int = 0
    last_run: float = 0.0


Spawn = Callable[[list[str], dict[str, str], int | None, int | None, str, Path], subprocess.Popen]


@dataclass
class Container:
    """One container's process and its Kubernetes-style status."""

    spec: Mapping[str, Any]
    kind: str  # "init" (runs to completion), "sidecar" (restartable init container), "app"
    log: Path
    backoff: Backoff
    clock: Callable[[], float] = time.monotonic
    proc: subprocess.Popen | None = None
    restart_count: int = 0
    started_at: str | None = None  # RFC 3339 wall time of the current run
    run_began: float = 0.0  # monotonic time of the current run
    failures: int = 0  # consecutive crashes, for the backoff
    next_start: float = 0.0  # monotonic time before which it must not start again
    waiting_reason: str = "PodInitializing"
    waiting_message: str = ""
    terminated: dict[str, Any] | None = None  # state.terminated of the current (finished) run
    last_terminated: dict[str, Any] | None = None
    completed: bool = False  # an init container that exited 0
    started: bool = False  # startup probe passed (or there is none)
    ready: bool = False
    runs: int = 0  # how many times it was started (restart_count = runs - 1 for restarted ones)
    probes: dict[str, ProbeState] = field(default_factory=dict)
    # How the current run was started (user, group, environment, directory): its preStop ``exec`` runs so too.
    started_as: tuple[int | None, int | None, dict[str, str], str] | None = None

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def running(self) -> bool:
        return self.proc is not None

    def can_start(self, now: float) -> bool:
        return self.proc is None and not self.completed and now >= self.next_start

    def start(self, spawn: Spawn, argv: list[str], env: dict[str, str], uid: int | None, gid: int | None,
              cwd: str) -> None:
        """Start a run; the previous run's log becomes ``.previous.log``."""
        if not argv:
            self.waiting_reason = "CreateContainerConfigError"
            self.waiting_message = (
                f"container {self.name} has no command: the local platform runs commands on the host, not images"
            )
            self.next_start = self.clock() + self.backoff.max
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if self.log.exists() and self.log.stat().st_size:
            os.replace(self.log, self.log.with_name(self.log.name.removesuffix(".log") + ".previous.log"))
        if self.runs:
            self.restart_count += 1
        self.runs += 1
        self.proc = spawn(argv, env, uid, gid, cwd, self.log)
        self.started_as = (uid, gid, env, cwd)
        self.started_at = _now_text()
        self.run_began = self.clock()
        self.terminated = None
        self.waiting_reason = self.waiting_message = ""
        self.started = not self.spec.get("startupProbe")
        self.ready = False
        self.probes.clear()

    def poll(self) -> bool:
        """Notice an exit; returns True when the process ended in this call."""
        if self.proc is None:
            return False
        code = self.proc.poll()
        if code is None:
            return False
        self._ended(code)
        return True

    def _ended(self, code: int) -> None:
        now = self.clock()
        self.proc = None
        signalled = code < 0
        exit_code = 128 - code if signalled else code
        state = {
            "exitCode": exit_code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.started_at,
            "finishedAt": _now_text(),
        }
        if signalled:
            state["signal"] = -code
        self.terminated = state
        self.last_terminated = state
        self.ready = False
        self.started = False
        if self.kind == "init" and code == 0:
            self.completed = True
            return
        if now - self.run_began >= self.backoff.reset:
            self.failures = 0
        self.failures += 1
        delay = self.backoff.delay(self.failures)
        self.next_start = now + delay
        self.waiting_reason = "CrashLoopBackOff"
        self.waiting_message = f"back-off {delay:g}s restarting failed container={self.name}"

    def signal(self, signum: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass
            except PermissionError:
                self.proc.send_signal(signum)

    def kill_for_restart(self, reason: str) -> None:
        """A failed liveness or startup probe: kill the run; the normal backoff restarts it."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return
        self._ended(code)
        if self.terminated is not None:
            self.terminated["reason"] = reason

    def status(self, image_id: str = "") -> dict[str, Any]:
        """``containerStatuses[]`` entry."""
        if self.proc is not None:
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.completed and self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            waiting: dict[str, Any] = {"reason": self.waiting_reason or "ContainerCreating"}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            state = {"waiting": waiting}
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": image_id,
            "ready": self.ready,
            "started": self.proc is not None and self.started,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated and not self.completed else {},
        }
        return out


def wait_all(containers: Sequence[Container], deadline: float) -> None:
    """Wait (polling) until every container's process has exited or ``deadline`` (monotonic) passes."""
    while any(c.proc is not None for c in containers) and time.monotonic() < deadline:
        for container in containers:
            container.poll()
        time.sleep(0.05)
