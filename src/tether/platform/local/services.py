"""Services on the local platform: cluster IPs, names inside pods, and kube-proxy-like rules.

- **Cluster IPs** come from the service range (default ``10.214.0.0/16``) through the same
  IPAM as pod addresses (its own file), one per Service, and are written into the Service's
  ``spec.clusterIP``/``clusterIPs`` in the store, where the destination reads them.  A Service
  that names its own ``clusterIP`` keeps it; headless (``None``) and ExternalName services get
  none.  Addresses exist only as rule matches inside pods: nothing routes them.
- **Names**: each pod gets a hosts file, ``/etc/netns/<netns>/hosts``, which ``ip netns exec``
  puts over ``/etc/hosts`` for the pod's processes: ``<svc>.<ns>.svc.<domain>``,
  ``<svc>.<ns>.svc`` and ``<svc>.<ns>`` for every service, plain ``<svc>`` for those of the
  pod's own namespace.  The file is rewritten in place (the mount pins its inode).  A
  ``resolv.conf`` pointing at nothing makes other names fail at once instead of timing out.
- **Rules**: inside every pod's namespace, chain ``TETHER-SERVICES`` (jumped to from nat
  ``OUTPUT``) DNATs each ``clusterIP:port`` to one ready endpoint at random, as kube-proxy's
  iptables mode does; a filter chain of the same name rejects ports with no ready endpoint.
  In a meshed pod the jump comes after proxy-init's, so the app's connections still go to
  its proxy, and the proxy's own (uid 2102, returned by proxy-init) fall through to these
  rules when it forwards to an address the destination does not know.

Pure rendering plus two small I/O helpers.  Caller: ``tether.platform.local.pods``/``sandbox``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.platform.local.ipam import Ipam, IpamConfig
from tether.platform.local.netns import exec_argv, run

CHAIN = "TETHER-SERVICES"
HEADLESS = "None"


# -- cluster IPs ---------------------------------------------------------------------------


class ClusterIps:
    """Allocates Services' cluster IPs from the service range, persistently."""

    def __init__(self, state_dir: Path, cidr: ipaddress.IPv4Network) -> None:
        self._ipam = Ipam(IpamConfig(state_dir=state_dir, pod_cidr=cidr))
        self._known: dict[str, str] = {}  # owner -> address held, so a pass needs no IPAM transaction

    @staticmethod
    def owner(namespace: str, name: str) -> str:
        return f"{namespace}/{name}"

    def wanted(self, service: Mapping[str, Any]) -> str | None:
        """The cluster IP ``service`` should carry: its own, a held one, or a new one (None: it gets none)."""
        spec = service.get("spec") or {}
        if spec.get("type") == "ExternalName":
            return None
        own = spec.get("clusterIP")
        if own == HEADLESS:
            return None
        meta = service["metadata"]
        owner = self.owner(meta["namespace"], meta["name"])
        if own:
            return own
        if owner not in self._known:
            self._known[owner] = str(self._ipam.allocate(owner).ip)
        return self._known[owner]

    def release_except(self, owners: Iterable[str]) -> None:
        """Free addresses held for services that no longer exist."""
        keep = set(owners)
        for owner in self._ipam.allocations():
            if owner not in keep:
                self._ipam.release(owner)
                self._known.pop(owner, None)


def with_cluster_ip(service: Mapping[str, Any], ip: str) -> dict[str, Any] | None:
    """``service`` with ``ip`` as its cluster IP, or None when it already has it."""
    spec = service.get("spec") or {}
    if spec.get("clusterIP") == ip and (spec.get("clusterIPs") or [ip])[0] == ip:
        return None
    out = {**service, "spec": {**spec, "clusterIP": ip, "clusterIPs": [ip]}}
    return out


# -- names ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceName:
    namespace: str
    name: str
    ip: str


def service_names(services: Iterable[Mapping[str, Any]]) -> list[ServiceName]:
    out = []
    for svc in services:
        ip = (svc.get("spec") or {}).get("clusterIP")
        if ip and ip != HEADLESS:
            out.append(ServiceName(svc["metadata"]["namespace"], svc["metadata"]["name"], ip))
    return sorted(out, key=lambda s: (s.namespace, s.name))


def render_hosts(
    namespace: str, pod: str, pod_ip: str | None, services: Sequence[ServiceName], cluster_domain: str
) -> str:
    lines = [
        f"# Managed by the tether local platform for pod {namespace}/{pod}; rewritten as services change.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    if pod_ip:
        lines.append(f"{pod_ip}\t{pod}")
    for svc in services:
        names = [f"{svc.name}.{svc.namespace}.svc.{cluster_domain}", f"{svc.name}.{svc.namespace}.svc",
                 f"{svc.name}.{svc.namespace}"]
        if svc.namespace == namespace:
            names.append(svc.name)
        lines.append(f"{svc.ip}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"


def render_resolv(namespace: str, cluster_domain: str) -> str:
    return (
        "# Managed by the tether local platform: names resolve from /etc/hosts only.\n"
        f"search {namespace}.svc.{cluster_domain} svc.{cluster_domain} {cluster_domain}\n"
        "nameserver 127.0.0.1\n"
        "options ndots:5 timeout:1 attempts:1\n"
    )


def write_in_place(path: Path, text: str) -> bool:
    """Write ``text`` into ``path`` keeping its inode (bind mounts of it see the change); True if changed."""
    data = text.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.fchmod(fd, 0o644)  # readable by every user of the pod, whatever the umask
        os.write(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return True


# -- endpoints and rules -------------------------------------------------------------------


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if not status.get("podIP") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _target(pod: Mapping[str, Any], target: int | str) -> int | None:
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == target:
                return int(port["containerPort"])
    return None


@dataclass(frozen=True)
class ServicePortRule:
    namespace: str
    name: str
    port_name: str
    cluster_ip: str
    port: int
    endpoints: tuple[tuple[str, int], ...]  # (pod IP, target port), sorted


def service_rules(services: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[ServicePortRule]:
    """Every TCP port of every service with a cluster IP, with its ready endpoints."""
    by_ns: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        if _ready(pod):
            by_ns.setdefault(pod["metadata"]["namespace"], []).append(pod)
    out = []
    for svc in services:
        spec = svc.get("spec") or {}
        ip = spec.get("clusterIP")
        if not ip or ip == HEADLESS or spec.get("type") == "ExternalName":
            continue
        meta = svc["metadata"]
        selected = [
            p for p in by_ns.get(meta["namespace"], ())
            if _selects(spec.get("selector") or {}, p["metadata"].get("labels") or {})
        ]
        for port in spec.get("ports") or ():
            if port.get("protocol", "TCP") != "TCP":
                continue
            endpoints = set()
            for pod in selected:
                target = _target(pod, port.get("targetPort", port["port"]))
                if target is not None:
                    endpoints.add((pod["status"]["podIP"], target))
            out.append(ServicePortRule(meta["namespace"], meta["name"], port.get("name") or "", ip, int(port["port"]),
                                       tuple(sorted(endpoints, key=lambda e: (ipaddress.ip_address(e[0]), e[1])))))
    return sorted(out, key=lambda r: (r.namespace, r.name, r.port))


def render_rules(rules: Sequence[ServicePortRule], *, add_jumps: bool) -> str:
    """iptables-restore text (nat and filter) for a pod; ``add_jumps`` on the first application only."""
    nat = ["*nat", f":{CHAIN} - [0:0]"]
    filt = ["*filter", f":{CHAIN} - [0:0]"]
    if add_jumps:
        nat.append(f'-A OUTPUT -m comment --comment "tether/services" -j {CHAIN}')
        filt.append(f'-A OUTPUT -m comment --comment "tether/services" -j {CHAIN}')
    for rule in rules:
        what = f"{rule.namespace}/{rule.name}" + (f":{rule.port_name}" if rule.port_name else f":{rule.port}")
        match = f"-d {rule.cluster_ip}/32 -p tcp -m tcp --dport {rule.port}"
        if not rule.endpoints:
            filt.append(f'-A {CHAIN} {match} -m comment --comment "{what} has no endpoints" '
                        "-j REJECT --reject-with icmp-port-unreachable")
            continue
        count = len(rule.endpoints)
        for index, (ip, port) in enumerate(rule.endpoints):
            remaining = count - index
            chance = "" if remaining == 1 else f"-m statistic --mode random --probability {1 / remaining:.10f} "
            nat.append(f'-A {CHAIN} {match} -m comment --comment "{what}" {chance}-j DNAT --to-destination {ip}:{port}')
    return "\n".join([*nat, "COMMIT", *filt, "COMMIT"]) + "\n"


def rules_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def apply_rules(netns: str, text: str) -> None:
    """Replace the ``TETHER-SERVICES`` chains inside ``netns`` (other rules are left alone)."""
    run(exec_argv(netns, ["iptables-restore", "--noflush"]), stdin=text)


def service_env(services: Iterable[Mapping[str, Any]], namespace: str) -> dict[str, str]:
    """The ``<SVC>_SERVICE_HOST``/``_PORT`` variables the kubelet gives containers of ``namespace``."""
    env: dict[str, str] = {}
    for svc in services:
        meta = svc["metadata"]
        spec = svc.get("spec") or {}
        ip = spec.get("clusterIP")
        if meta["namespace"] != namespace or not ip or ip == HEADLESS:
            continue
        prefix = meta["name"].upper().replace("-", "_")
        ports = [p for p in spec.get("ports") or () if p.get("protocol", "TCP") == "TCP"]
        if not ports:
            continue
        env[f"{prefix}_SERVICE_HOST"] = ip
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                env[f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(port["port"])
    return env
