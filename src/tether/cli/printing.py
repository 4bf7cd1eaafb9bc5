"""Renders resources as kubectl does: tables (default and wide), YAML, JSON and names."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import click
import yaml

from tether.resources.kinds import ResourceType, type_of

OUTPUT_FORMATS = ("wide", "yaml", "json", "name")

Column = tuple[str, Callable[[dict], str]]


def age(obj: dict, now: datetime | None = None) -> str:
    """kubectl's short age: 42s, 5m, 3h, 2d."""
    ts = obj.get("metadata", {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    created = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    secs = int(((now or datetime.now(timezone.utc)) - created).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= 2 * size or (unit == "m" and secs >= size):
            return f"{secs // size}{unit}"
    return f"{max(secs, 0)}s"


def _pod_containers(pod: dict) -> tuple[list[dict], list[dict]]:
    """The containers kubectl counts and their statuses: app containers plus native sidecars."""
    spec, status = pod.get("spec", {}), pod.get("status", {})
    sidecars = {c.get("name") for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"}
    containers = list(spec.get("containers") or []) + [c for c in spec.get("initContainers") or []
                                                        if c.get("name") in sidecars]
    statuses = list(status.get("containerStatuses") or []) + [
        s for s in status.get("initContainerStatuses") or [] if s.get("name") in sidecars]
    return containers, statuses


def _pod_ready(pod: dict) -> str:
    containers, statuses = _pod_containers(pod)
    return f"{sum(1 for s in statuses if s.get('ready'))}/{len(containers)}"


def _pod_restarts(pod: dict) -> str:
    return str(sum(int(s.get("restartCount", 0)) for s in _pod_containers(pod)[1]))


def _svc_ports(svc: dict) -> str:
    ports = svc.get("spec", {}).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _selector(svc: dict) -> str:
    sel = svc.get("spec", {}).get("selector") or {}
    return ",".join(f"{k}={v}" for k, v in sel.items()) or "<none>"


def _slice_ports(eps: dict) -> str:
    return ",".join(str(p.get("port", "<all>")) for p in eps.get("ports") or ()) or "<unset>"


def _slice_endpoints(eps: dict) -> str:
    """The addresses, at most three then ``+ N more...``, as kubectl prints them."""
    addresses = [a for e in eps.get("endpoints") or () for a in e.get("addresses") or ()]
    if not addresses:
        return "<unset>"
    shown = ",".join(addresses[:3])
    return shown + (f" + {len(addresses) - 3} more..." if len(addresses) > 3 else "")


def _involved(event: dict) -> str:
    """``kind/name`` of what an Event is about, as kubectl's OBJECT column shows it."""
    involved = event.get("involvedObject") or {}
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _status(path: Sequence[str], default: str = "<none>") -> Callable[[dict], str]:
    def get(obj: dict) -> str:
        cur: Any = obj
        for part in path:
            cur = cur.get(part) if isinstance(cur, dict) else None
        return default if cur in (None, "") else str(cur)

    return get


# Extra columns per resource type key, (default, wide-only); NAME and AGE are always there.
_COLUMNS: dict[str, tuple[list[Column], list[Column]]] = {
    "Pod": (
        [("READY", _pod_ready), ("STATUS", _status(("status", "phase"), "Pending")), ("RESTARTS", _pod_restarts)],
        [("IP", _status(("status", "podIP"))), ("NODE", _status(("spec", "nodeName")))],
    ),
    "Service": (
        [("TYPE", _status(("spec", "type"), "ClusterIP")), ("CLUSTER-IP", _status(("spec", "clusterIP"))),
         ("PORT(S)", _svc_ports)],
        [("SELECTOR", _selector)],
    ),
    "Deployment.apps": (
        [("READY", lambda d: f"{d.get('status', {}).get('readyReplicas', 0)}/{d.get('spec', {}).get('replicas', 1)}")],
        [],
    ),
    "EndpointSlice.discovery.k8s.io": (
        [("ADDRESSTYPE", _status(("addressType",))), ("PORTS", _slice_ports), ("ENDPOINTS", _slice_endpoints)],
        [("SERVICE", _status(("metadata", "labels", "kubernetes.io/service-name")))],
    ),
    "Event": (
        [("TYPE", _status(("type",), "Normal")), ("REASON", _status(("reason",))), ("OBJECT", _involved),
         ("MESSAGE", _status(("message",)))],
        [("COUNT", _status(("count",), "1"))],
    ),
    "Server.policy.linkerd.io": (
        [("PORT", _status(("spec", "port"))), ("PROTOCOL", _status(("spec", "proxyProtocol"), "unknown"))],
        [],
    ),
}


def resource_name(obj: dict) -> str:
    """``kind[.group]/name`` as ``kubectl get -o name`` prints it."""
    rtype = type_of(obj)
    prefix = rtype.kind.lower() + (f".{rtype.group}" if rtype.group else "")
    return f"{prefix}/{obj['metadata']['name']}"


def as_list(objs: Sequence[dict]) -> dict:
    return {"apiVersion": "v1", "kind": "List", "items": list(objs), "metadata": {"resourceVersion": ""}}


def render(objs: Sequence[dict], output: str | None, single: bool, all_namespaces: bool) -> str:
    """Render objects; ``single`` means the user named exactly one object (no List wrapper)."""
    if output == "name":
        return "\n".join(resource_name(o) for o in objs)
    if output in ("json", "yaml"):
        doc = objs[0] if single and len(objs) == 1 else as_list(objs)
        if output == "json":
            return json.dumps(doc, indent=4)
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).rstrip("\n")
    return _table(objs, wide=output == "wide", all_namespaces=all_namespaces)


def _table(objs: Sequence[dict], wide: bool, all_namespaces: bool) -> str:
    blocks: list[str] = []
    by_type: dict[str, tuple[ResourceType, list[dict]]] = {}
    for obj in objs:
        rtype = type_of(obj)
        by_type.setdefault(rtype.key, (rtype, []))[1].append(obj)
    mixed = len(by_type) > 1
    for key, (rtype, items) in by_type.items():
        extra, wide_cols = _COLUMNS.get(key, ([], []))
        cols: list[Column] = []
        if all_namespaces and rtype.namespaced:
            cols.append(("NAMESPACE", lambda o: o["metadata"].get("namespace", "")))
        name_of = (lambda o: resource_name(o)) if mixed else (lambda o: o["metadata"]["name"])
        cols += [("NAME", name_of), *extra, ("AGE", age), *(wide_cols if wide else [])]
        rows = [[h for h, _ in cols]] + [[f(o) for _, f in cols] for o in items]
        widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
        blocks.append("\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows))
    return "\n\n".join(blocks)


def echo(text: str) -> None:
    if text:
        click.echo(text)
