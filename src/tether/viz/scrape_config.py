"""Prometheus' configuration for the mesh: Linkerd viz's scrape jobs, fed by file-based discovery on the local platform.

Linkerd's bundled Prometheus discovers pods through the Kubernetes API
(``kubernetes_sd_configs``) and relabels their ``__meta_kubernetes_*`` labels.
The local platform has no Kubernetes API, so ``pod_target_groups`` turns the
store's Pod objects into ``file_sd_configs`` target groups that carry the very
labels ``kubernetes_sd`` would give each container port
(``__meta_kubernetes_namespace``, ``__meta_kubernetes_pod_name``,
``__meta_kubernetes_pod_phase``, ``__meta_kubernetes_pod_container_name``,
``__meta_kubernetes_pod_container_port_name``,
``__meta_kubernetes_pod_label_<sanitized name>`` ...).  The jobs' relabelling is
then Linkerd's, unchanged: ``linkerd-proxy`` keeps Pending/Running pods'
``linkerd-proxy`` container's ``linkerd-admin`` port of pods meshed by this
control plane, maps ``linkerd.io/proxy-<kind>`` to ``<kind>`` (``deployment``),
the other ``linkerd.io/*`` labels to their bare names, every pod label to a
label, and adds ``namespace`` and ``pod``; ``linkerd-controller`` keeps the
control plane's ``*admin`` ports and labels them with ``component``.

Pure.  Callers: ``tether.viz.local`` (install and the discovery loop), tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tether.viz.workloads import PROXY_CONTAINER

PROXY_JOB = "linkerd-proxy"
CONTROLLER_JOB = "linkerd-controller"
PROXY_ADMIN_PORT_NAME = "linkerd-admin"
CONTROLLER_PORT_NAME = "admin"
PROXIES_FILE = "proxies.json"
CONTROLLERS_FILE = "controllers.json"

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus' Kubernetes discovery spells it in a meta label."""
    return _INVALID.sub("_", name)


def proxy_relabel_configs(control_plane_ns: str) -> list[dict[str, Any]]:
    """Linkerd viz's ``linkerd-proxy`` job relabelling."""
    return [
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Pending|Running)", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_container_name", "__meta_kubernetes_pod_container_port_name",
                           "__meta_kubernetes_pod_label_linkerd_io_control_plane_ns"],
         "action": "keep", "regex": f"^{PROXY_CONTAINER};{PROXY_ADMIN_PORT_NAME};{re.escape(control_plane_ns)}$"},
        {"source_labels": ["__meta_kubernetes_namespace"], "action": "replace", "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "action": "replace", "target_label": "pod"},
        # Kubernetes' "job" would clash with Prometheus' own job label.
        {"source_labels": ["__meta_kubernetes_pod_label_linkerd_io_proxy_job"], "action": "replace",
         "target_label": "k8s_job"},
        {"action": "labeldrop", "regex": "__meta_kubernetes_pod_label_linkerd_io_proxy_job"},
        {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_linkerd_io_proxy_(.+)"},
        {"action": "labeldrop", "regex": "__meta_kubernetes_pod_label_linkerd_io_proxy_(.+)"},
        {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_linkerd_io_(.+)"},
        {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)", "replacement": "__tmp_pod_label_$1"},
        {"action": "labelmap", "regex": "__tmp_pod_label_linkerd_io_(.+)", "replacement": "__tmp_pod_label_$1"},
        {"action": "labeldrop", "regex": "__tmp_pod_label_linkerd_io_(.+)"},
        {"action": "labelmap", "regex": "__tmp_pod_label_(.+)"},
    ]


def controller_relabel_configs() -> list[dict[str, Any]]:
    """Linkerd viz's ``linkerd-controller`` job relabelling."""
    return [
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "action": "keep", "regex": ".*admin$"},
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "action": "drop",
         "regex": PROXY_ADMIN_PORT_NAME},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "action": "replace", "target_label": "component"},
    ]


def prometheus_config(sd_dir: str, self_address: str, *, control_plane_ns: str, scrape_interval: str = "10s",
                      scrape_timeout: str | None = None) -> dict[str, Any]:
    """``prometheus.yml`` for the local platform: Prometheus itself, the control plane and every proxy."""
    glob = {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval}
    if scrape_timeout:
        glob["scrape_timeout"] = scrape_timeout
    return {
        "global": glob,
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [self_address]}]},
            {"job_name": CONTROLLER_JOB,
             "file_sd_configs": [{"files": [f"{sd_dir}/{CONTROLLERS_FILE}"], "refresh_interval": "30s"}],
             "relabel_configs": controller_relabel_configs()},
            {"job_name": PROXY_JOB,
             "file_sd_configs": [{"files": [f"{sd_dir}/{PROXIES_FILE}"], "refresh_interval": "30s"}],
             "relabel_configs": proxy_relabel_configs(control_plane_ns)},
        ],
    }


def kubernetes_prometheus_config(*, control_plane_ns: str, viz_ns: str,
                                 scrape_interval: str = "10s") -> dict[str, Any]:
    """``prometheus.yml`` for a Prometheus in the cluster: the same jobs, discovering pods through the API."""
    return {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                   "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": ["localhost:9090"]}]},
            {"job_name": CONTROLLER_JOB,
             "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [control_plane_ns, viz_ns]}}],
             "relabel_configs": controller_relabel_configs()},
            {"job_name": PROXY_JOB, "kubernetes_sd_configs": [{"role": "pod"}],
             "relabel_configs": proxy_relabel_configs(control_plane_ns)},
        ],
    }


def _pod_meta(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    out = {
        "__meta_kubernetes_namespace": str(meta.get("namespace") or "default"),
        "__meta_kubernetes_pod_name": str(meta.get("name", "")),
        "__meta_kubernetes_pod_phase": str(status.get("phase") or ""),
        "__meta_kubernetes_pod_ip": str(status.get("podIP") or ""),
        "__meta_kubernetes_pod_uid": str(meta.get("uid") or ""),
        "__meta_kubernetes_pod_node_name": str(spec.get("nodeName") or ""),
    }
    for key, value in (meta.get("labels") or {}).items():
        out[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = str(value)
        out[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            out["__meta_kubernetes_pod_controller_kind"] = str(ref.get("kind", ""))
            out["__meta_kubernetes_pod_controller_name"] = str(ref.get("name", ""))
    return out


def pod_target_groups(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One target group per container port of each pod with an IP, as Kubernetes discovery lists them."""
    out: list[dict[str, Any]] = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        common = _pod_meta(pod)
        spec = pod.get("spec") or {}
        containers = [(c, False) for c in spec.get("containers") or ()]
        containers += [(c, True) for c in spec.get("initContainers") or ()]
        for container, init in containers:
            for port in container.get("ports") or ():
                number = port.get("containerPort")
                if not isinstance(number, int):
                    continue
                labels = dict(common)
                labels.update({
                    "__meta_kubernetes_pod_container_name": str(container.get("name", "")),
                    "__meta_kubernetes_pod_container_init": "true" if init else "false",
                    "__meta_kubernetes_pod_container_port_name": str(port.get("name") or ""),
                    "__meta_kubernetes_pod_container_port_number": str(number),
                    "__meta_kubernetes_pod_container_port_protocol": str(port.get("protocol") or "TCP"),
                })
                out.append({"targets": [f"{ip}:{number}"], "labels": labels})
    out.sort(key=lambda g: g["targets"][0])
    return out


def controller_target_groups(components: Sequence[tuple[str, str]], control_plane_ns: str) -> list[dict[str, Any]]:
    """The local control plane's admin endpoints (``(component, host:port)``) as Linkerd's controller pods' ports."""
    return [{"targets": [address],
             "labels": {"__meta_kubernetes_namespace": control_plane_ns,
                        "__meta_kubernetes_pod_name": f"{name}-local",
                        "__meta_kubernetes_pod_container_name": name,
                        "__meta_kubernetes_pod_container_port_name": CONTROLLER_PORT_NAME}}
            for name, address in components]
