"""Which pods make up each workload ``stat`` shows, from the store's objects.

``select(kind, ...)`` groups Pod objects under their deployment, namespace, or
themselves.  A pod belongs to deployment ``web`` when its controller is the
ReplicaSet ``web-<pod-template-hash>`` (the reference every Deployment's pod
carries, on Kubernetes as on the local platform).  A pod is *meshed* when it
has the ``linkerd.io/control-plane-ns`` label the injector adds (Linkerd's own
test); it counts in MESHED when it has not finished (phase Pending or
Running), and is scraped when it is Running with an IP.

Pure: objects in, ``Workload`` values out.  Callers: ``tether.viz.metrics_api``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEPLOYMENT = "deployment"
POD = "pod"
NAMESPACE = "namespace"
KINDS = (DEPLOYMENT, POD, NAMESPACE)

MESHED_LABEL = "linkerd.io/control-plane-ns"
PROXY_CONTAINER = "linkerd-proxy"  # the injected proxy's container name, sidecar or native
TEMPLATE_HASH = "pod-template-hash"

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    ip: str | None
    phase: str
    meshed: bool
    deployment: str | None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        return self.phase in ("Pending", "Running", "Unknown", "")

    @property
    def scrapable(self) -> bool:
        return self.meshed and self.phase == "Running" and bool(self.ip)


@dataclass(frozen=True, slots=True)
class Workload:
    kind: str
    namespace: str  # for a namespace: its own name
    name: str
    pods: tuple[PodInfo, ...]

    @property
    def meshed(self) -> int:
        return sum(1 for p in self.pods if p.active and p.meshed)

    @property
    def total(self) -> int:
        return sum(1 for p in self.pods if p.active)


def deployment_of(pod: Obj) -> str | None:
    meta = pod.get("metadata") or {}
    template_hash = (meta.get("labels") or {}).get(TEMPLATE_HASH)
    for ref in meta.get("ownerReferences") or ():
        if not ref.get("controller") or ref.get("kind") != "ReplicaSet":
            continue
        owner = str(ref.get("name", ""))
        if template_hash and owner.endswith(f"-{template_hash}"):
            return owner[: -len(template_hash) - 1]
    return None


def pod_info(pod: Obj) -> PodInfo:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return PodInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        ip=status.get("podIP") or None,
        phase=str(status.get("phase") or ""),
        meshed=MESHED_LABEL in (meta.get("labels") or {}),
        deployment=deployment_of(pod),
    )


def select(kind: str, pods: Iterable[Obj], *, deployments: Iterable[Obj] = (), namespaces: Iterable[Obj] = (),
           names: Sequence[str] = ()) -> list[Workload]:
    """The workloads of ``kind`` (named ones only, when ``names`` is given), sorted by namespace and name."""
    infos = [pod_info(p) for p in pods]
    groups: dict[tuple[str, str], list[PodInfo]] = {}
    if kind == DEPLOYMENT:
        for d in deployments:
            meta = d.get("metadata") or {}
            groups.setdefault((str(meta.get("namespace") or "default"), str(meta.get("name", ""))), [])
        for info in infos:
            if info.deployment is not None and (info.namespace, info.deployment) in groups:
                groups[(info.namespace, info.deployment)].append(info)
    elif kind == NAMESPACE:
        for ns in namespaces:
            name = str((ns.get("metadata") or {}).get("name", ""))
            groups.setdefault((name, name), [])
        for info in infos:
            groups.setdefault((info.namespace, info.namespace), []).append(info)
    elif kind == POD:
        for info in infos:
            groups[(info.namespace, info.name)] = [info]
    else:
        raise ValueError(f"unknown workload kind {kind!r}")
    wanted = set(names)
    return [Workload(kind, ns, name, tuple(sorted(members, key=lambda p: p.name)))
            for (ns, name), members in sorted(groups.items()) if not wanted or name in wanted]
