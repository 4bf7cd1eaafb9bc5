"""What check and diagnose read off the local platform: settings, pods, their network namespaces and rules.

Everything here reads; nothing changes the platform.  Rules are read with
``iptables -t nat -S`` inside the pod's namespace, and judged against the chain
names proxy-init and the service rules install.

Callers: ``tether.diagnose.local`` and ``tether.diagnose.layers``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.platform.local import deployments
from tether.platform.local.config import LocalPlatformConfig
from tether.platform.local.netns import HostNet, LocalNetError, exec_argv, netns_exists, run
from tether.platform.local.proxy_init import OUTPUT_CHAIN, REDIRECT_CHAIN
from tether.platform.local.sandbox import sandbox_name
from tether.platform.local.services import CHAIN as SERVICES_CHAIN
from tether.injector.decision import PROXY_CONTAINER
from tether.store import Store

Obj = Mapping[str, Any]
DEPLOYMENT_KINDS = ("deploy", "deployment", "deployments", "deployment.apps")
POD_KINDS = ("po", "pod", "pods")


class TargetError(Exception):
    """A workload named on the command line is malformed or does not exist."""


def workload_pods(store: Store, target: str, namespace: str) -> list[dict[str, Any]]:
    """The pods of ``deploy/NAME`` (running and ready ones first, then by name) or ``po/NAME``."""
    kind, slash, name = target.partition("/")
    if not slash or not name:
        raise TargetError(f"TARGET: {target!r} is not deploy/NAME or po/NAME")
    if kind in DEPLOYMENT_KINDS:
        if store.get("Deployment.apps", namespace, name) is None:
            raise TargetError(f'deployments "{name}" not found in namespace {namespace}')
        pods = [p for p in store.list("Pod", namespace).items if deployment_of(p) == name]
        if not pods:
            raise TargetError(f"deployment {namespace}/{name} has no pods yet")
        return sorted(pods, key=lambda p: (not running(p), not ready(p), p["metadata"]["name"]))
    if kind in POD_KINDS:
        pod = store.get("Pod", namespace, name)
        if pod is None:
            raise TargetError(f'pods "{name}" not found in namespace {namespace}')
        return [pod]
    raise TargetError(f"TARGET: expected deploy/NAME or po/NAME, not {kind}/")


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def ref(pod: Obj) -> PodRef:
    return PodRef(pod["metadata"]["namespace"], pod["metadata"]["name"])


def netns_of(config: LocalPlatformConfig, pod: Obj) -> str:
    meta = pod["metadata"]
    return HostNet(config.netns).netns_name(sandbox_name(meta["namespace"], meta["name"]))


def nat_rules(netns: str) -> list[str]:
    """``iptables -t nat -S`` inside ``netns``; raises ``LocalNetError`` when it cannot be read."""
    if not netns_exists(netns):
        raise LocalNetError(f"network namespace {netns} does not exist")
    return run(exec_argv(netns, ["iptables", "-t", "nat", "-S"])).splitlines()


def redirect_problem(rules: list[str]) -> str | None:
    """What is missing of proxy-init's redirection in a meshed pod's nat table, or None."""
    missing = []
    if not any(r.startswith("-A PREROUTING") and f"-j {REDIRECT_CHAIN}" in r for r in rules):
        missing.append(f"PREROUTING does not jump to {REDIRECT_CHAIN}")
    if not any(r.startswith("-A OUTPUT") and f"-j {OUTPUT_CHAIN}" in r for r in rules):
        missing.append(f"OUTPUT does not jump to {OUTPUT_CHAIN}")
    if not any(r.startswith(f"-A {REDIRECT_CHAIN}") and "--to-ports" in r for r in rules):
        missing.append(f"{REDIRECT_CHAIN} redirects nothing to the proxy's inbound port")
    if not any(r.startswith(f"-A {OUTPUT_CHAIN}") and "--to-ports" in r for r in rules):
        missing.append(f"{OUTPUT_CHAIN} redirects nothing to the proxy's outbound port")
    return "; ".join(missing) or None


def services_problem(rules: list[str]) -> str | None:
    if not any(r.startswith("-A OUTPUT") and f"-j {SERVICES_CHAIN}" in r for r in rules):
        return f"OUTPUT does not jump to {SERVICES_CHAIN} (service addresses are not translated)"
    return None


def bridge_problem(config: LocalPlatformConfig) -> str | None:
    """Whether the host bridge is there, up, and carries the pods' gateway address."""
    try:
        links = json.loads(run(["ip", "-j", "addr", "show", "dev", config.bridge]) or "[]")
    except LocalNetError:
        return f"bridge {config.bridge} does not exist"
    if not links:
        return f"bridge {config.bridge} does not exist"
    link = links[0]
    if "UP" not in link.get("flags", ()):
        return f"bridge {config.bridge} is down"
    gateway = config.gateway
    addrs = {(a.get("local"), a.get("prefixlen")) for a in link.get("addr_info", ())}
    if (str(gateway.ip), gateway.network.prefixlen) not in addrs:
        return f"bridge {config.bridge} does not carry the pods' gateway {gateway}"
    return None


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """A Service's selector (a plain map; empty selects nothing here, as for endpoints)."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def target_port(svc_port: Obj, pod: Obj) -> int | None:
    """The pod port a Service port sends to: a number, or the container port of that name."""
    target = svc_port.get("targetPort", svc_port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or ():
        for cport in container.get("ports") or ():
            if cport.get("name") == target:
                return cport.get("containerPort")
    return None


def running(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def meshed(pod: Obj) -> bool:
    """A linkerd-proxy container (or native sidecar) runs in the pod."""
    spec = pod.get("spec") or {}
    return any(c.get("name") == PROXY_CONTAINER for c in (*(spec.get("containers") or ()),
                                                           *(spec.get("initContainers") or ())))


def ready(pod: Obj) -> bool:
    return deployments.pod_ready(pod)


def deployment_of(pod: Obj) -> str | None:
    return deployments.managed_by(pod)
