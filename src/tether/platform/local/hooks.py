"""A container's ``lifecycle.preStop`` hook, run before its SIGTERM as the kubelet runs it.

Kubernetes runs a container's preStop handler when the pod is deleted and sends the
container SIGTERM only once the handler is over (or the grace period is); the usual use is a
sleep that keeps the app serving while the removal of its endpoint reaches every client (the
Linkerd docs' remedy for clients slow to see an endpoint go: the app's requests would
otherwise reach a process that is gone). Handlers:

- ``exec``: ``command`` runs inside the pod (its network namespace, the container's user,
  environment and working directory); its exit status is logged when not 0, as the kubelet
  reports a failed hook;
- ``sleep``: ``seconds`` of waiting, nothing run;
- ``httpGet``: a GET of ``path`` on ``port`` (a number or the container's port name) at the
  pod's address (``host`` when given), from inside the pod.

``tcpSocket`` (which Kubernetes keeps only for compatibility and never runs) and anything else
are reported by name and skipped. Each handler is bounded by the pod's grace period: the
caller cancels what is still running when it ends. Caller: ``tether.platform.local.sandbox``.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

log = logging.getLogger(__name__)

PRE_STOP_RUN = ("exec", "sleep", "httpGet")  # the handlers run (``unapplied`` names a preStop with none of them)
RunExec = Callable[[list[str]], subprocess.Popen]
HttpGet = Callable[[int, str, str | None, float], bool]  # port, path, host header, timeout -> succeeded


class Hook(Protocol):
    def done(self) -> bool:
        """Whether the handler is over (the container may be signalled)."""

    def cancel(self) -> None:
        """The grace period is over: stop what is still running."""


class _Exec:
    def __init__(self, what: str, proc: subprocess.Popen) -> None:
        self.what = what
        self.proc = proc

    def done(self) -> bool:
        code = self.proc.poll()
        if code is None:
            return False
        if code != 0:
            log.warning("%s: exited with %d", self.what, code)
        return True

    def cancel(self) -> None:
        if self.proc.poll() is None:
            log.warning("%s: still running at the end of the grace period; killed", self.what)
            self.proc.kill()
            self.proc.wait()


class _Sleep:
    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.until = clock() + seconds

    def done(self) -> bool:
        return self.clock() >= self.until

    def cancel(self) -> None:
        """Nothing runs."""


class _HttpGet:
    def __init__(self, what: str, get: Callable[[], bool]) -> None:
        self.what = what
        self.finished = threading.Event()
        threading.Thread(target=self._run, args=(get,), name="prestop-http", daemon=True).start()

    def _run(self, get: Callable[[], bool]) -> None:
        try:
            if not get():
                log.warning("%s: the GET failed", self.what)
        finally:
            self.finished.set()

    def done(self) -> bool:
        return self.finished.is_set()

    def cancel(self) -> None:
        """The GET ends by its own timeout (the grace period's rest)."""


def pre_stop(where: str, container: Mapping[str, Any], *, run_exec: RunExec, http_get: HttpGet,
             port_of: Callable[[Any], int | None], grace: float,
             clock: Callable[[], float] = time.monotonic) -> Hook | None:
    """Start ``container``'s preStop handler (``where``: the pod, for the logs); None when it has none, or one this
    platform does not run (reported by name)."""
    handler = (container.get("lifecycle") or {}).get("preStop")
    if not handler:
        return None
    what = f"pod {where}: container {container['name']}: lifecycle.preStop"
    if "exec" in handler:
        command = [str(part) for part in (handler["exec"] or {}).get("command") or ()]
        if not command:
            log.warning("%s.exec has no command; skipped", what)
            return None
        try:
            return _Exec(f"{what}.exec", run_exec(command))
        except OSError as exc:
            log.warning("%s.exec could not run: %s", what, exc)
            return None
    if "sleep" in handler:
        seconds = (handler["sleep"] or {}).get("seconds")
        if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 0:
            log.warning("%s.sleep.seconds must be a whole number of seconds >= 0, not %r; skipped", what, seconds)
            return None
        return _Sleep(float(seconds), clock)
    if "httpGet" in handler:
        http = handler["httpGet"] or {}
        port = port_of(http.get("port"))
        if port is None:
            log.warning("%s.httpGet.port %r names no port of the container; skipped", what, http.get("port"))
            return None
        path, host = str(http.get("path") or "/"), http.get("host")
        return _HttpGet(f"{what}.httpGet", lambda: http_get(port, path, host, grace))
    log.warning("%s: %s is not run by the local platform (only exec, sleep and httpGet); skipped", what,
                ", ".join(sorted(handler)) or "an empty handler")
    return None
