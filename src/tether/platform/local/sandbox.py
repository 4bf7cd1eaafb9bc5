"""One running local pod: its network namespace, files, containers, probes and status.

``Sandbox.create`` gives the pod an address (IPAM), a namespace with a veth on the bridge
(``HostNet``), its ``/etc/netns/<netns>/hosts`` and ``resolv.conf``, and a workload token.
``step`` then runs the pod the way the kubelet does: init containers one after another to
completion; restartable init containers (native sidecars, such as ``linkerd-proxy``) started
in order, each awaited until its startup probe passes; then the app containers together.
Crashed containers restart with backoff.  Readiness: a container's ``readinessProbe`` if it
has one; otherwise every declared TCP port must accept (a local-platform rule, so a pod is
not ready before its app listens); a container with neither is ready once started.

``stop`` ends the pod as Kubernetes does (each container's ``preStop`` hook, ``hooks``, then its
SIGTERM: the app containers, then the sidecars, within the grace period) and ``destroy`` removes everything made for it.  All methods block;
the controller calls them from its worker thread.  Caller: ``tether.platform.local.pods``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tether.platform.local import hooks, probes, services
from tether.platform.local.config import RUN_ROOT, Layout, netns_etc_dir
from tether.platform.local.containers import Backoff, Container, ProbeState, build_env, command_line, wait_all
from tether.platform.local.ipam import Ipam
from tether.platform.local.netns import HostNet, LocalNetError
from tether.platform.local.tokens import LocalTokenSigner

log = logging.getLogger(__name__)

TOKEN_REFRESH_S = 12 * 3600.0  # tokens live a day; rewrite them at half life
SIDECAR_STOP_S = 2.0
HOOK_POLL_S = 0.05  # how often stopping looks whether a preStop hook is over
# The uid a pod's proxy runs as (2102 in the pod spec) is, on the host, a uid of that pod alone:
# POD_UID_BASE plus the pod address's index in the pod range.  Processes of one uid can read each
# other's files, /proc/<pid>/root and memory, so a shared 2102 would let any pod's proxy (or any
# workload running as 2102) read another pod's token and private key.  Kubernetes gets the same
# from user namespaces (``hostUsers: false``).  Inside the pod the rules and the spec say 2102;
# the runtime maps it, proxy-init's ``--proxy-uid`` included.
POD_UID_BASE = 210_200_000
_PROXY_UID_FLAG = "--proxy-uid"


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sandbox_name(namespace: str, pod: str) -> str:
    """The name the pod's network objects are made under (pod names are unique per namespace only)."""
    return f"{pod}.{namespace}"


@dataclass
class SandboxContext:
    net: HostNet
    ipam: Ipam
    layout: Layout
    signer: LocalTokenSigner
    backoff: Backoff
    base_env: Mapping[str, str]
    cluster_domain: str
    host_ip: str
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class ProbeJob:
    """A probe to run for one run of one container; ``kind`` is startup, liveness or readiness."""

    pod: tuple[str, str]
    container: str
    run: int
    kind: str
    netns: str
    address: str
    checks: tuple[probes.ProbeSpec, ...]


def _uid_gid(pod: Mapping[str, Any], container: Mapping[str, Any]) -> tuple[int | None, int | None]:
    pod_ctx = (pod.get("spec") or {}).get("securityContext") or {}
    own = container.get("securityContext") or {}
    uid = own.get("runAsUser", pod_ctx.get("runAsUser"))
    gid = own.get("runAsGroup", pod_ctx.get("runAsGroup"))
    if uid == 0 and gid in (None, 0):
        return None, None  # root: no setpriv needed
    return uid, gid


class Sandbox:
    """A pod's runtime state; made from the Pod object as it was when the pod started."""

    def __init__(self, pod: Mapping[str, Any], ctx: SandboxContext) -> None:
        self.pod: dict[str, Any] = dict(pod)
        self.ctx = ctx
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta.get("uid", "")
        self.sandbox = sandbox_name(self.namespace, self.name)
        self.netns = ctx.net.netns_name(self.sandbox)
        self.ip: str | None = None
        self.error: str | None = None
        self.initialized = False
        self.rules_applied: str | None = None
        self.start_time = now_text()
        self.created_at = ctx.clock()
        self.token_written = 0.0
        self._conditions: dict[str, tuple[str, str]] = {}
        spec = pod.get("spec") or {}
        backoff = ctx.backoff
        pod_dir = ctx.layout.pod_dir(self.namespace, self.name)
        self.init_containers = [
            Container(c, "sidecar" if c.get("restartPolicy") == "Always" else "init",
                      pod_dir / f"{c['name']}.log", backoff, clock=ctx.clock)
            for c in spec.get("initContainers") or ()
        ]
        self.app_containers = [
            Container(c, "app", pod_dir / f"{c['name']}.log", backoff, clock=ctx.clock)
            for c in spec.get("containers") or ()
        ]
        previous = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or ()}
        previous |= {s.get("name"): s for s in (pod.get("status") or {}).get("initContainerStatuses") or ()}
        for container in self.containers:
            # Restart counts survive a controller restart, as the kubelet keeps them per pod.
            container.restart_count = int((previous.get(container.name) or {}).get("restartCount", 0))
            if container.restart_count:
                container.runs = 1

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def containers(self) -> list[Container]:
        return [*self.init_containers, *self.app_containers]

    @property
    def sidecars(self) -> list[Container]:
        return [c for c in self.init_containers if c.kind == "sidecar"]

    # -- making and removing -------------------------------------------------------------

    def create(self, hosts: str, resolv: str) -> None:
        """Address, namespace, files and token; on failure ``error`` says why and nothing runs."""
        ctx = self.ctx
        try:
            address = ctx.ipam.allocate(f"{self.namespace}/{self.name}")
            ctx.net.ensure_bridge(ctx.ipam.gateway)
            if self.sandbox in ctx.net.pods():
                ctx.net.delete_pod(self.sandbox)  # a leftover of a crashed controller
            ctx.net.create_pod(self.sandbox, address, ctx.ipam.gateway.ip)
            self.ip = str(address.ip)
            etc = netns_etc_dir(self.netns)
            services.write_in_place(etc / "hosts", hosts)
            services.write_in_place(etc / "resolv.conf", resolv)
            ctx.layout.pod_dir(self.namespace, self.name).mkdir(parents=True, exist_ok=True)
            self._write_token()
        except (LocalNetError, OSError, ValueError) as exc:
            self.error = str(exc)
            log.error("pod %s/%s: cannot create its sandbox: %s", self.namespace, self.name, exc)

    def _write_token(self) -> None:
        ctx = self.ctx
        run_dir = ctx.layout.pod_run_dir(self.namespace, self.name)
        # Every directory down to the pod's must be traversable by the proxy's uid, whatever the umask.
        chain = [run_dir, run_dir.parent, run_dir.parent.parent, ctx.layout.run_dir]
        if ctx.layout.run_dir.parent == RUN_ROOT:
            chain.append(RUN_ROOT)
        for directory in reversed(chain):
            directory.mkdir(mode=0o755, exist_ok=True, parents=True)
            os.chmod(directory, 0o755)
        owner = self._host_id(self._proxy_uid())
        identity_dir = ctx.layout.identity_dir(self.namespace, self.name)
        identity_dir.mkdir(mode=0o700, exist_ok=True)
        token = ctx.signer.mint(
            namespace=self.namespace,
            service_account=(self.pod.get("spec") or {}).get("serviceAccountName") or "default",
            pod=self.name,
        )
        path = ctx.layout.token_file(self.namespace, self.name)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(token)
        if owner is not None:
            os.chown(tmp, owner, owner)
            os.chown(identity_dir, owner, owner)
        os.replace(tmp, path)
        self.token_written = ctx.clock()

    def _proxy_uid(self) -> int | None:
        for container in self.sidecars:
            uid, _ = _uid_gid(self.pod, container.spec)
            if uid is not None:
                return uid
        return None

    def _host_id(self, pod_id: int | None) -> int | None:
        """The host uid/gid for a uid/gid of the pod's spec: the proxy's is this pod's own (see POD_UID_BASE)."""
        if pod_id is None or pod_id != self._proxy_uid() or self.ip is None:
            return pod_id
        network = self.ctx.ipam.gateway.network
        return POD_UID_BASE + int(ipaddress.ip_address(self.ip)) - int(network.network_address)

    def _host_argv(self, argv: list[str]) -> list[str]:
        """proxy-init's ``--proxy-uid`` names the proxy's uid as the kernel sees it: the host one."""
        proxy = self._proxy_uid()
        if proxy is None:
            return argv
        host = str(self._host_id(proxy))
        out = list(argv)
        for i, arg in enumerate(out):
            if arg == _PROXY_UID_FLAG and i + 1 < len(out) and out[i + 1] == str(proxy):
                out[i + 1] = host
            elif arg == f"{_PROXY_UID_FLAG}={proxy}":
                out[i] = f"{_PROXY_UID_FLAG}={host}"
        return out

    def stop(self, grace: float) -> list[str]:
        """Stop the app containers, then the sidecars (reverse order), each group within the grace: each running
        container's preStop hook first, its SIGTERM once the hook is over (``_stop_group``).

        Returns the names of the containers still running afterwards (``destroy`` kills them).
        """
        deadline = self.ctx.clock() + grace
        self._stop_group(self.app_containers, deadline)
        self._stop_group(list(reversed(self.init_containers)), max(deadline, self.ctx.clock() + SIDECAR_STOP_S))
        return [c.name for c in self.containers if c.proc is not None]

    def _stop_group(self, group: list[Container], deadline: float) -> None:
        """The kubelet's way for each container: its preStop hook (all of the group's at once), then SIGTERM as soon
        as that hook is over, or at ``deadline``; then wait (until ``deadline``) for the group to exit."""
        clock = self.ctx.clock
        pending = [(c, self._pre_stop(c, deadline - clock())) for c in group if c.running]
        while pending:
            over = clock() >= deadline
            for container, hook in list(pending):
                if hook is not None and not hook.done():
                    if not over:
                        continue
                    hook.cancel()
                container.signal(signal.SIGTERM)
                pending.remove((container, hook))
            if pending:
                time.sleep(HOOK_POLL_S)
        wait_all(group, deadline)

    def _pre_stop(self, container: Container, grace: float) -> hooks.Hook | None:
        where = f"{self.namespace}/{self.name}"
        uid, gid, env, cwd = container.started_as or (None, None, {}, "/")  # (host ids already)

        def run_exec(argv: list[str]) -> subprocess.Popen:
            return self.ctx.net.spawn(self.sandbox, argv, uid=uid, gid=gid,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)

        def http_get(port: int, path: str, host: str | None, timeout: float) -> bool:
            return probes.run(self.netns, host or self.ip or "", probes.ProbeSpec(port, path, max(timeout, 0.1)))

        return hooks.pre_stop(where, container.spec, run_exec=run_exec, http_get=http_get,
                              port_of=lambda port: self._port(container, port), grace=grace, clock=self.ctx.clock)

    def destroy(self, forget: bool) -> None:
        """Kill what is left, remove the namespace, veth, files and address; ``forget`` also drops the logs."""
        ctx = self.ctx
        try:
            ctx.net.delete_pod(self.sandbox)
        except LocalNetError as exc:
            log.error("pod %s/%s: removing its namespace failed: %s", self.namespace, self.name, exc)
        for container in self.containers:
            if container.proc is not None:
                try:
                    container.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                container.poll()
        shutil.rmtree(netns_etc_dir(self.netns), ignore_errors=True)
        shutil.rmtree(ctx.layout.pod_run_dir(self.namespace, self.name), ignore_errors=True)
        ctx.ipam.release(f"{self.namespace}/{self.name}")
        if forget:
            shutil.rmtree(ctx.layout.pod_dir(self.namespace, self.name), ignore_errors=True)

    # -- running ---------------------------------------------------------------------------

    def _spawn(self, argv: list[str], env: dict[str, str], uid: int | None, gid: int | None, cwd: str,
               log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as out:
            return self.ctx.net.spawn(
                self.sandbox, argv, uid=uid, gid=gid, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True,
            )

    def _start(self, container: Container, service_env: Mapping[str, str]) -> None:
        uid, gid = _uid_gid(self.pod, container.spec)
        base = {**self.ctx.base_env, "HOSTNAME": self.name, "HOME": "/root" if uid is None else "/", **service_env}
        # Downward-API values come from the pod as it is now: with its address.
        current = {**self.pod, "status": {"podIP": self.ip, "podIPs": [{"ip": self.ip}], "hostIP": self.ctx.host_ip,
                                          "hostIPs": [{"ip": self.ctx.host_ip}]}}
        env = build_env(current, container.spec, base)
        cwd = container.spec.get("workingDir") or "/"
        try:
            argv = self._host_argv(command_line(container.spec, env))
            container.start(self._spawn, argv, env, self._host_id(uid), self._host_id(gid), cwd)
        except (OSError, LocalNetError) as exc:
            container.waiting_reason = "RunContainerError"
            container.waiting_message = str(exc)
            container.next_start = self.ctx.clock() + self.ctx.backoff.initial

    def step(self, service_env: Mapping[str, str]) -> list[ProbeJob]:
        """Notice exits, start what is due, and return the probes due now."""
        if self.error is not None or self.ip is None:
            return []
        now = self.ctx.clock()
        for container in self.containers:
            container.poll()
        if now - self.token_written > TOKEN_REFRESH_S:
            try:
                self._write_token()
            except OSError as exc:
                log.warning("pod %s/%s: cannot refresh its token: %s", self.namespace, self.name, exc)
        if not self.initialized:
            self._step_init(now, service_env)
        if self.initialized:
            for container in [*self.sidecars, *self.app_containers]:
                if container.can_start(now):
                    self._start(container, service_env)
        return self._probes_due(now)

    def _step_init(self, now: float, service_env: Mapping[str, str]) -> None:
        for container in self.init_containers:
            if container.kind == "init":
                if container.completed:
                    continue
                if container.can_start(now):
                    self._start(container, service_env)
                return  # wait for it to complete
            if container.running and container.started:
                continue
            if container.can_start(now):
                self._start(container, service_env)
                if container.running and container.started:
                    continue
            return  # wait for the sidecar's startup probe
        self.initialized = True

    def _probes_due(self, now: float) -> list[ProbeJob]:
        jobs = []
        for container in self.containers:
            if not container.running:
                continue
            spec = container.spec
            kinds = []
            if not container.started:
                kinds.append("startup")
            else:
                if spec.get("livenessProbe"):
                    kinds.append("liveness")
                if container.kind != "init":
                    kinds.append("readiness")
            for kind in kinds:
                probe = spec.get(f"{kind}Probe")
                checks = self._checks(container, probe)
                if checks is None:
                    # Nothing this platform can check: ready (or started) once running.
                    if kind == "readiness":
                        container.ready = True
                    elif kind == "startup":
                        container.started = True
                    continue
                period = float((probe or {}).get("periodSeconds", 1 if probe is None else 10))
                delay = float((probe or {}).get("initialDelaySeconds", 0))
                state = container.probes.setdefault(kind, ProbeState())
                if now - container.run_began < delay or now - state.last_run < period:
                    continue
                state.last_run = now
                timeout = float((probe or {}).get("timeoutSeconds", 1))
                jobs.append(ProbeJob(self.key, container.name, container.runs, kind, self.netns, self.ip or "",
                                     tuple(probes.ProbeSpec(c.port, c.path, timeout, c.host_header) for c in checks)))
        return jobs

    def _checks(self, container: Container, probe: Mapping[str, Any] | None) -> tuple[probes.ProbeSpec, ...] | None:
        """What a probe checks; None when there is nothing to check (readiness without probe or ports)."""
        if probe is None:
            if container.kind == "app":
                ports = [int(p["containerPort"]) for p in container.spec.get("ports") or ()
                         if p.get("protocol", "TCP") == "TCP"]
                return tuple(probes.ProbeSpec(p) for p in ports) or None
            return None
        if "httpGet" in probe:
            http = probe["httpGet"]
            port = self._port(container, http.get("port"))
            host = http.get("host")
            return () if port is None else (probes.ProbeSpec(port, http.get("path") or "/", host_header=host),)
        if "tcpSocket" in probe:
            port = self._port(container, probe["tcpSocket"].get("port"))
            return () if port is None else (probes.ProbeSpec(port),)
        return None  # exec and grpc probes are not supported locally: treated as passing

    @staticmethod
    def _port(container: Container, port: Any) -> int | None:
        if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            return int(port)
        for declared in container.spec.get("ports") or ():
            if declared.get("name") == port:
                return int(declared["containerPort"])
        return None

    def probe_result(self, job: ProbeJob, ok: bool) -> None:
        container = next((c for c in self.containers if c.name == job.container), None)
        if container is None or container.runs != job.run or not container.running:
            return  # the run it probed is over
        probe = container.spec.get(f"{job.kind}Probe") or {}
        success_threshold = int(probe.get("successThreshold", 1))
        failure_threshold = int(probe.get("failureThreshold", 3 if probe else 1))
        state = container.probes.setdefault(job.kind, ProbeState())
        if ok:
            state.successes += 1
            state.failures = 0
        else:
            state.failures += 1
            state.successes = 0
        if job.kind == "startup":
            if ok:
                container.started = True
            elif state.failures >= failure_threshold:
                log.warning("pod %s/%s: container %s failed its startup probe; restarting it",
                            self.namespace, self.name, container.name)
                container.kill_for_restart("StartupProbeFailed")
        elif job.kind == "liveness":
            if not ok and state.failures >= failure_threshold:
                log.warning("pod %s/%s: container %s failed its liveness probe; restarting it",
                            self.namespace, self.name, container.name)
                container.kill_for_restart("LivenessProbeFailed")
        elif ok and state.successes >= success_threshold:
            container.ready = True
        elif not ok and state.failures >= failure_threshold:
            container.ready = False

    # -- status ------------------------------------------------------------------------------

    def _condition(self, kind: str, true: bool, reason: str = "") -> dict[str, Any]:
        status = "True" if true else "False"
        before = self._conditions.get(kind)
        if before is None or before[0] != status:
            self._conditions[kind] = (status, now_text())
        out = {"type": kind, "status": status, "lastTransitionTime": self._conditions[kind][1]}
        if reason and not true:
            out["reason"] = reason
        return out

    def status(self) -> dict[str, Any]:
        """The Pod's ``status`` as the kubelet would report it now."""
        if self.error is not None:
            return {
                "phase": "Pending",
                "conditions": [
                    self._condition("PodScheduled", True),
                    {**self._condition("Ready", False, "SandboxCreationFailed"), "message": self.error},
                ],
                "startTime": self.start_time,
            }
        apps_ready = all(c.ready for c in self.app_containers)
        sidecars_ready = all(c.ready for c in self.sidecars)
        running = self.initialized and all(c.runs > 0 for c in self.app_containers)
        status: dict[str, Any] = {
            "phase": "Running" if running else "Pending",
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", self.initialized, "ContainersNotInitialized"),
                self._condition("ContainersReady", apps_ready and running, "ContainersNotReady"),
                self._condition("Ready", apps_ready and sidecars_ready and running, "ContainersNotReady"),
            ],
            "hostIP": self.ctx.host_ip,
            "hostIPs": [{"ip": self.ctx.host_ip}],
            "startTime": self.start_time,
            "qosClass": "BestEffort",
        }
        if self.ip:
            status["podIP"] = self.ip
            status["podIPs"] = [{"ip": self.ip}]
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        status["containerStatuses"] = [c.status() for c in self.app_containers]
        return status

    def pids(self) -> dict[str, int]:
        """Running containers' pids, by container name."""
        return {c.name: c.proc.pid for c in self.containers if c.proc is not None}
