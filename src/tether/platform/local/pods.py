"""The local pod controller: Deployments into Pods into running sandboxes, and their status in the store.

It plays, for the local platform, the parts Kubernetes splits between the Deployment and
ReplicaSet controllers, the scheduler, the injector webhook, the kubelet and kube-proxy:

1. **Deployments -> Pod objects** (``deployments.plan``): create and delete the Pod objects
   of each Deployment (meshed by the injector's patch, handed in as a ``meshing.Mesher``), garbage-collect
   pods whose Deployment is gone, and write each Deployment's status.
2. **Admission of bare Pods**: a Pod applied directly gets this node's name and, when the
   annotations say so, the proxy, before it runs.
3. **Services**: cluster IPs from the service range (``services.ClusterIps``).
4. **Pods -> sandboxes** (``sandbox.Sandbox``): every Pod object of this node runs in its own
   network namespace; removed Pods are stopped (grace period) and their sandboxes removed.
5. **Status**: each pod's status (IP, phase, conditions, container states and restart
   counts) is written back when it changes; hosts files and service rules in every pod follow
   the services and ready endpoints.

Resources are read with the platform's watch (``LocalResourceWatcher``) into an in-memory
index; the reconcile pass runs in one worker thread, level-triggered: at every change and at
least every ``TICK_S``.  Stopping stops every pod and marks the Pod objects Pending (they
start again with the next ``tether up``).  Caller: ``tether platform run`` (``tether.cli.up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from tether.platform.local import deployments, probes, services, unapplied
from tether.platform.local.config import ETC_NETNS, LocalPlatformConfig, netns_etc_dir
from tether.platform.local.containers import Backoff
from tether.platform.local.events import StoreEvents
from tether.platform.local.ipam import Ipam, IpamConfig, is_workload_owner
from tether.platform.local.meshing import Mesher
from tether.platform.local.netns import HostNet, LocalNetError
from tether.platform.local.sandbox import ProbeJob, Sandbox, SandboxContext, now_text
from tether.platform.local.tokens import LocalTokenSigner
from tether.platform.local.watch import LocalResourceWatcher
from tether.platform.problems import Involved
from tether.store import Conflict, Store, StoreError

log = logging.getLogger(__name__)

DEPLOYMENT, POD, SERVICE, NAMESPACE = "Deployment.apps", "Pod", "Service", "Namespace"
KINDS = (DEPLOYMENT, POD, SERVICE, NAMESPACE)
TICK_S = 0.5
MAX_GRACE_S = 30.0
PROBE_WAIT_S = 12.0
SANDBOX_RETRY_S = 5.0  # a pod whose sandbox could not be made is tried again after this long
MAX_TOMBSTONES = 10_000

Key = tuple[str, str]


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


def _version(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class Index:
    """The objects the controller watches, by kind and key; safe to use from several threads.

    Writes the controller makes are put here at once (with the version the store gave them),
    and a watch event older than what is held, or than a deletion, is ignored.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[Key, dict[str, Any]]] = {kind: {} for kind in KINDS}
        self._deleted: dict[str, dict[Key, int]] = {kind: {} for kind in KINDS}

    def put(self, kind: str, obj: Mapping[str, Any]) -> None:
        key, version = _key(obj), _version(obj)
        with self._lock:
            held = self._objects[kind].get(key)
            if held is not None and _version(held) > version:
                return
            if self._deleted[kind].get(key, -1) >= version:
                return
            self._objects[kind][key] = dict(obj)

    def remove(self, kind: str, obj: Mapping[str, Any]) -> None:
        key, version = _key(obj), _version(obj)
        with self._lock:
            held = self._objects[kind].get(key)
            if held is not None and _version(held) > version:
                return  # a newer object of the same name (re-created) is held
            self._objects[kind].pop(key, None)
            tombstones = self._deleted[kind]
            tombstones[key] = max(version, tombstones.pop(key, -1))
            while len(tombstones) > MAX_TOMBSTONES:
                del tombstones[next(iter(tombstones))]  # the oldest: its watch events are long delivered

    def snapshot(self) -> dict[str, dict[Key, dict[str, Any]]]:
        with self._lock:
            return {kind: dict(objs) for kind, objs in self._objects.items()}


@dataclass
class Counters:
    """What the admin port's /metrics shows."""

    passes: int = 0
    pods_started: int = 0
    pods_removed: int = 0
    store_conflicts: int = 0
    last_pass_seconds: float = 0.0
    phases: dict[str, int] = field(default_factory=dict)
    ready_pods: int = 0
    workloads_rejected: dict[tuple[str, str], int] = field(default_factory=dict)  # by (namespace, reason)

    def workload_rejected(self, namespace: str, reason: str) -> None:
        """An ExternalWorkload left out of the endpoints (``tether.platform.problems``)."""
        key = (namespace, reason)
        self.workloads_rejected[key] = self.workloads_rejected.get(key, 0) + 1


class PodController:
    """Runs the pods of one local platform (one state directory, one bridge and prefix)."""

    def __init__(
        self,
        config: LocalPlatformConfig,
        store: Store,
        *,
        signer: LocalTokenSigner,
        mesh: Mesher,
        version: str,
        base_env: Mapping[str, str],
    ) -> None:
        self.config = config
        self.store = store
        self.version = version
        self.mesh = mesh
        self.events = StoreEvents(self.store)
        layout = config.layout
        self.net = HostNet(config.netns)
        self.ipam = Ipam(IpamConfig(state_dir=config.state_dir, pod_cidr=config.pod_cidr))
        self.cluster_ips = services.ClusterIps(layout.service_ipam_dir, config.service_cidr)
        self.index = Index()
        self.counters = Counters()
        self.sandboxes: dict[Key, Sandbox] = {}
        self.terminating: dict[Key, Future] = {}
        self._service_names: frozenset[Key] | None = None
        self.synced: set[str] = set()
        self.ready = threading.Event()
        self.dirty = threading.Event()
        self.stopping = threading.Event()
        self.probe_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="probes")
        # Each removal may wait out a grace period: its own pool, so probes never queue behind them.
        self.stop_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="stops")
        self.sandbox_ctx = SandboxContext(
            net=self.net,
            ipam=self.ipam,
            layout=layout,
            signer=signer,
            backoff=Backoff(config.restart_backoff_initial, config.restart_backoff_max, config.restart_backoff_reset),
            base_env=dict(base_env),
            cluster_domain=config.cluster_domain,
            host_ip=str(config.host_ip),
        )

    # -- running -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Watch, reconcile until ``stop`` is set, then stop every pod."""
        watcher = LocalResourceWatcher(self.store)
        watches = [asyncio.create_task(self._watch(watcher, kind)) for kind in KINDS]
        worker = asyncio.create_task(asyncio.to_thread(self._work))
        try:
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait([stopped, worker], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
        finally:
            self.stopping.set()
            self.dirty.set()
            with contextlib.suppress(Exception):
                await worker
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await asyncio.to_thread(self._shutdown)
        if worker.done() and not worker.cancelled() and worker.exception() is not None:
            raise worker.exception()  # type: ignore[misc]

    async def _watch(self, watcher: LocalResourceWatcher, kind: str) -> None:
        async for event in watcher.watch(kind):
            if event.type == "SYNCED":
                self.synced.add(kind)
            elif event.type == "DELETED":
                assert event.object is not None
                self.index.remove(kind, event.object)
            else:
                assert event.object is not None
                self.index.put(kind, event.object)
            self.dirty.set()

    def _work(self) -> None:
        while not self.stopping.is_set() and len(self.synced) < len(KINDS):
            self.dirty.wait(TICK_S)
            self.dirty.clear()
        if self.stopping.is_set():
            return
        self._remove_leftovers()
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                self._reconcile()
            except StoreError as exc:
                log.warning("reconcile: the store failed, retrying: %s", exc)
            except Exception:  # noqa: BLE001 - one bad pass must not stop every pod; it is logged in full
                log.exception("reconcile pass failed; trying again")
                time.sleep(1.0)
            self.counters.passes += 1
            self.counters.last_pass_seconds = time.monotonic() - began
            self.ready.set()
            self.dirty.wait(TICK_S)
            self.dirty.clear()

    def _remove_leftovers(self) -> None:
        """Remove sandboxes a crashed controller left behind, and addresses no pod holds."""
        for name in self.net.pods():
            log.info("removing leftover pod namespace %s", self.net.netns_name(name))
            with contextlib.suppress(LocalNetError):
                self.net.delete_pod(name)
        for etc in ETC_NETNS.glob(f"{self.config.prefix}-*"):
            shutil.rmtree(etc, ignore_errors=True)
        pods = self.index.snapshot()[POD]
        owners = {f"{ns}/{name}" for ns, name in pods}
        for owner in self.ipam.allocations():
            if owner not in owners and not is_workload_owner(owner):  # workloads' are the workload controller's
                self.ipam.release(owner)

    # -- one pass ----------------------------------------------------------------------------

    def _reconcile(self) -> None:
        snap = self.index.snapshot()
        # Read namespaces from the store, not the index: the index's per-kind watches may deliver a
        # Deployment before the Namespace applied with it, and the injection decision (like the
        # admission webhook's) must see the namespace as stored when the pod is made.
        namespaces = {ns["metadata"]["name"]: (ns["metadata"].get("annotations") or {})
                      for ns in self.store.list(NAMESPACE).items}
        self._sync_deployments(snap, namespaces)
        self._sync_services(snap)
        self._admit_bare_pods(snap, namespaces)
        snap = self.index.snapshot()
        self._sync_sandboxes(snap)
        self._run_pods(snap)
        self._write_pod_statuses()

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """Write ``obj`` (guarded by its resourceVersion when it has one); None on a conflict."""
        try:
            stored = self.store.apply(obj)
        except Conflict as exc:
            self.counters.store_conflicts += 1
            log.debug("write conflict, will retry on the next pass: %s", exc)
            return None
        self.index.put(kind, stored)
        return stored

    def _delete(self, kind: str, key: Key) -> None:
        gone = self.store.delete(kind, key[0] or None, key[1])
        if gone is not None:
            self.index.remove(kind, gone)

    def _sync_deployments(self, snap: Mapping[str, dict[Key, dict]], namespaces: Mapping[str, Mapping[str, str]]) -> None:
        pods = list(snap[POD].values())
        claimed: set[Key] = set()
        for deployment in snap[DEPLOYMENT].values():
            owned = [p for p in pods if deployments.belongs_to(p, deployment)]
            claimed.update(_key(p) for p in owned)
            plan = deployments.plan(deployment, owned)
            for name in plan.delete:
                log.info("deployment %s/%s: deleting pod %s", *_key(deployment), name)
                self._delete(POD, (deployment["metadata"]["namespace"], name))
            hash_ = deployments.template_hash(deployment["spec"]["template"])
            for _ in range(plan.create):
                name = deployments.new_pod_name(deployment["metadata"]["name"], hash_)
                pod = deployments.new_pod(deployment, hash_, name, self.config.node_name)
                meshed = self.mesh(pod, namespaces.get(deployment["metadata"]["namespace"], {}))
                for warning in meshed.warnings:
                    log.warning("pod %s/%s: %s", pod["metadata"]["namespace"], name, warning)
                log.info("deployment %s/%s: creating pod %s (%s)", *_key(deployment), name,
                         "meshed" if meshed.meshed else f"not meshed: {meshed.reason}")
                if meshed.event is not None:  # on the pod's owner, as the webhook records it
                    self.events.record(Involved.of(deployment), *meshed.event)
                self._apply(POD, meshed.obj)
            remaining = [p for p in self.index.snapshot()[POD].values() if deployments.belongs_to(p, deployment)]
            status = deployments.status(deployment, remaining, now_text())
            if status != deployment.get("status"):
                self._apply(DEPLOYMENT, {**deployment, "status": status})
        for pod in pods:
            if deployments.managed_by(pod) is not None and _key(pod) not in claimed:
                log.info("pod %s/%s: its deployment is gone; deleting it", *_key(pod))
                self._delete(POD, _key(pod))

    def _sync_services(self, snap: Mapping[str, dict[Key, dict]]) -> None:
        for svc in snap[SERVICE].values():
            try:
                ip = self.cluster_ips.wanted(svc)
            except Exception as exc:  # noqa: BLE001 - IPAM exhaustion or a bad range: report, go on
                log.error("service %s/%s: no cluster IP: %s", *_key(svc), exc)
                continue
            if ip is None:
                continue
            updated = services.with_cluster_ip(svc, ip)
            if updated is not None:
                self._apply(SERVICE, updated)
        names = frozenset(snap[SERVICE])
        if names != self._service_names:
            self.cluster_ips.release_except(services.ClusterIps.owner(ns, name) for ns, name in names)
            self._service_names = names

    def _admit_bare_pods(self, snap: Mapping[str, dict[Key, dict]], namespaces: Mapping[str, Mapping[str, str]]) -> None:
        """Pods applied directly: give them this node and, if asked, the proxy (once, before they run)."""
        for pod in snap[POD].values():
            spec = pod.get("spec") or {}
            if spec.get("nodeName"):
                continue
            admitted = {**pod, "spec": {**spec, "nodeName": self.config.node_name}}
            admitted["spec"].setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
            meshed = self.mesh(admitted, namespaces.get(pod["metadata"]["namespace"], {}))
            for warning in meshed.warnings:
                log.warning("pod %s/%s: %s", *_key(pod), warning)
            log.info("pod %s/%s: admitted (%s)", *_key(pod),
                     "meshed" if meshed.meshed else f"not meshed: {meshed.reason}")
            self._apply(POD, meshed.obj)

    def _sync_sandboxes(self, snap: Mapping[str, dict[Key, dict]]) -> None:
        for key, future in list(self.terminating.items()):
            if future.done():
                del self.terminating[key]
                self.counters.pods_removed += 1
                with contextlib.suppress(Exception):
                    future.result()
        desired = {k: p for k, p in snap[POD].items() if (p.get("spec") or {}).get("nodeName") == self.config.node_name}
        for key, box in list(self.sandboxes.items()):
            pod = desired.get(key)
            if pod is None or pod["metadata"].get("uid", "") != box.uid:
                log.info("pod %s/%s: removed; stopping it", *key)
                del self.sandboxes[key]
                self.terminating[key] = self.stop_pool.submit(self._terminate, box, True)
            elif box.error is not None and self.sandbox_ctx.clock() - box.created_at > SANDBOX_RETRY_S:
                log.info("pod %s/%s: trying to make its sandbox again", *key)
                del self.sandboxes[key]
                box.destroy(forget=False)
        names = services.service_names(snap[SERVICE].values())
        for key, pod in desired.items():
            if key in self.sandboxes or key in self.terminating:
                continue
            box = Sandbox(pod, self.sandbox_ctx)
            not_applied = unapplied.unapplied_fields(pod.get("spec") or {})
            if not_applied:
                log.warning("pod %s/%s: not applied on this platform: %s", *key, "; ".join(not_applied))
                self.events.record(Involved.of(pod), unapplied.REASON, "; ".join(not_applied), "Warning")
            box.create(self._hosts(box, names), services.render_resolv(box.namespace, self.config.cluster_domain))
            self.sandboxes[key] = box
            self.counters.pods_started += 1
            if box.error is None:
                log.info("pod %s/%s: sandbox %s with address %s", *key, box.netns, box.ip)

    def _terminate(self, box: Sandbox, forget: bool) -> None:
        began = time.monotonic()
        grace = float((box.pod.get("spec") or {}).get("terminationGracePeriodSeconds", MAX_GRACE_S))
        lingering = box.stop(min(grace, MAX_GRACE_S))
        box.destroy(forget)
        log.info("pod %s/%s: stopped and removed in %.1fs%s", box.namespace, box.name, time.monotonic() - began,
                 f" (killed after the grace period: {', '.join(lingering)})" if lingering else "")

    def _hosts(self, box: Sandbox, names: list[services.ServiceName]) -> str:
        return services.render_hosts(box.namespace, box.name, box.ip, names, self.config.cluster_domain)

    def _run_pods(self, snap: Mapping[str, dict[Key, dict]]) -> None:
        svc_objs = list(snap[SERVICE].values())
        env_by_ns: dict[str, dict[str, str]] = {}
        jobs: list[ProbeJob] = []
        for box in self.sandboxes.values():
            if box.namespace not in env_by_ns:
                env_by_ns[box.namespace] = services.service_env(svc_objs, box.namespace)
            jobs += box.step(env_by_ns[box.namespace])
        if jobs:
            futures = {self.probe_pool.submit(self._probe, job): job for job in jobs}
            done, _ = wait(futures, timeout=PROBE_WAIT_S)
            for future in done:
                job = futures[future]
                box = self.sandboxes.get(job.pod)
                if box is not None:
                    box.probe_result(job, future.result())
        self._sync_network(snap)

    @staticmethod
    def _probe(job: ProbeJob) -> bool:
        return all(probes.run(job.netns, job.address, check) for check in job.checks)

    def _sync_network(self, snap: Mapping[str, dict[Key, dict]]) -> None:
        names = services.service_names(snap[SERVICE].values())
        # Endpoints follow the statuses this controller is about to write, not the stored ones.
        pods = dict(snap[POD])
        for key, box in self.sandboxes.items():
            if key in pods:
                pods[key] = {**pods[key], "status": box.status()}
        rules = services.service_rules(snap[SERVICE].values(), pods.values())
        for box in self.sandboxes.values():
            if box.error is not None:
                continue
            try:
                services.write_in_place(netns_etc_dir(box.netns) / "hosts", self._hosts(box, names))
                if box.initialized:
                    text = services.render_rules(rules, add_jumps=box.rules_applied is None)
                    digest = services.rules_digest(services.render_rules(rules, add_jumps=False))
                    if digest != box.rules_applied:
                        services.apply_rules(box.netns, text)
                        box.rules_applied = digest
            except (OSError, LocalNetError) as exc:
                log.warning("pod %s/%s: cannot update its names or service rules: %s", box.namespace, box.name, exc)

    def _write_pod_statuses(self) -> None:
        phases: dict[str, int] = {}
        ready = 0
        current = self.index.snapshot()[POD]
        for key, box in self.sandboxes.items():
            pod = current.get(key)
            if pod is None or pod["metadata"].get("uid", "") != box.uid:
                continue
            status = box.status()
            phases[status["phase"]] = phases.get(status["phase"], 0) + 1
            ready += any(c.get("type") == "Ready" and c.get("status") == "True" for c in status["conditions"])
            if status != pod.get("status"):
                self._apply(POD, {**pod, "status": status})
        self.counters.phases = phases
        self.counters.ready_pods = ready

    def metrics_text(self) -> str:
        """Prometheus text for the admin port."""
        c = self.counters
        lines = ["# HELP tether_platform_pods Pods running on this node, by phase.", "# TYPE tether_platform_pods gauge"]
        lines += [f'tether_platform_pods{{phase="{phase}"}} {n}' for phase, n in sorted(c.phases.items())]
        for name, kind, value, text in (
            ("tether_platform_ready_pods", "gauge", c.ready_pods, "Pods whose Ready condition is True."),
            ("tether_platform_pods_started_total", "counter", c.pods_started, "Pod sandboxes made."),
            ("tether_platform_pods_removed_total", "counter", c.pods_removed, "Pod sandboxes removed."),
            ("tether_platform_reconcile_passes_total", "counter", c.passes, "Reconcile passes."),
            ("tether_platform_store_conflicts_total", "counter", c.store_conflicts, "Writes retried on a conflict."),
            ("tether_platform_last_pass_seconds", "gauge", round(c.last_pass_seconds, 6), "The last pass's duration."),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        name = "tether_platform_externalworkload_rejected_total"
        lines += [f"# HELP {name} ExternalWorkloads left out of every EndpointSlice, once per set of problems "
                  "(as its Warning Event), by reason.", f"# TYPE {name} counter"]
        lines += [f'{name}{{namespace="{ns}",reason="{reason}"}} {n}'
                  for (ns, reason), n in sorted(c.workloads_rejected.items())]
        return "\n".join(lines) + "\n"

    # -- stopping ------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Stop every pod, remove their sandboxes, and mark their Pod objects Pending."""
        boxes = list(self.sandboxes.values())
        self.sandboxes.clear()
        futures = [self.stop_pool.submit(self._terminate, box, False) for box in boxes]
        futures += list(self.terminating.values())
        wait(futures)
        self.probe_pool.shutdown(wait=True)
        current = self.index.snapshot()[POD]
        for box in boxes:
            pod = current.get(box.key)
            if pod is None:
                continue
            with contextlib.suppress(StoreError):
                self._apply(POD, {**pod, "status": _stopped_status(pod)})
        self.stop_pool.shutdown(wait=True)


def _stopped_status(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What a pod's status says while the platform is down: not running, restart counts kept."""
    previous = pod.get("status") or {}

    def stopped(statuses: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "name": s.get("name"),
                "image": s.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": s.get("restartCount", 0),
                "state": {"waiting": {"reason": "PlatformStopped"}},
                "lastState": {},
            }
            for s in statuses
        ]

    out: dict[str, Any] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_text()},
            {"type": "Ready", "status": "False", "reason": "PlatformStopped", "lastTransitionTime": now_text(),
             "message": "the local platform is down; the pod starts again with `tether up`"},
        ],
        "containerStatuses": stopped(previous.get("containerStatuses") or ()),
    }
    if previous.get("initContainerStatuses"):
        out["initContainerStatuses"] = stopped(previous["initContainerStatuses"])
    return out

