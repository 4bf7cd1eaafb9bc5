"""Viz on Kubernetes: the manifests ``tether viz install --platform kubernetes`` prints (``linkerd viz install``).

What runs on a cluster today is Prometheus -- the upstream image, Linkerd
viz's scrape configuration with Kubernetes discovery
(``scrape_config.kubernetes_prometheus_config``), RBAC to list pods and
nodes, a Service on 9090, Linkerd's probes, security context and an emptyDir
for its data -- in the viz namespace, labelled ``linkerd.io/extension: viz``.
The viz commands then read it with ``--prometheus-url`` (for example through
``kubectl port-forward``).  The tap server, its APIService and injector, and
the dashboard's Deployment are not part of these manifests yet: they read the
local store.

Pure (objects out).  Callers: ``tether.cli.viz``; tests validate every object
against Kubernetes 1.35.
"""

from __future__ import annotations

from typing import Any

import yaml

from tether.viz.scrape_config import kubernetes_prometheus_config

DEFAULT_NAMESPACE = "linkerd-viz"
DEFAULT_PROMETHEUS_IMAGE = "prom/prometheus:v2.55.1"


def _labels(component: str, namespace: str) -> dict[str, str]:
    return {"linkerd.io/extension": "viz", "component": component, "namespace": namespace}


def render(*, namespace: str = DEFAULT_NAMESPACE, control_plane_ns: str = "linkerd",
           prometheus_image: str = DEFAULT_PROMETHEUS_IMAGE, scrape_interval: str = "10s",
           version: str = "") -> list[dict[str, Any]]:
    """Every object, in apply order."""
    config = kubernetes_prometheus_config(control_plane_ns=control_plane_ns, viz_ns=namespace,
                                          scrape_interval=scrape_interval)
    labels = _labels("prometheus", namespace)
    annotations = {"linkerd.io/created-by": f"tether/cli {version}".strip()}
    meta = {"namespace": namespace, "labels": labels, "annotations": annotations}
    probe = {"initialDelaySeconds": 30, "timeoutSeconds": 30}
    return [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": namespace, "labels": {"linkerd.io/extension": "viz"}, "annotations": annotations}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus", **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"linkerd-{namespace}-prometheus", "labels": labels, "annotations": annotations},
         "rules": [{"apiGroups": [""], "resources": ["nodes", "nodes/proxy", "pods"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"linkerd-{namespace}-prometheus", "labels": labels, "annotations": annotations},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"linkerd-{namespace}-prometheus"},
         "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prometheus-config", **meta},
         "data": {"prometheus.yml": yaml.safe_dump(config, sort_keys=False)}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "prometheus", **meta},
         "spec": {"type": "ClusterIP", "selector": {"linkerd.io/extension": "viz", "component": "prometheus"},
                  "ports": [{"name": "admin", "port": 9090, "targetPort": 9090}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "prometheus", **meta},
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels,
                              "annotations": {**annotations, "linkerd.io/inject": "enabled",
                                              "config.linkerd.io/proxy-await": "enabled"}},
                 "spec": {
                     "serviceAccountName": "prometheus",
                     "securityContext": {"fsGroup": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "prometheus",
                         "image": prometheus_image,
                         "args": ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/data",
                                  "--storage.tsdb.retention.time=6h", "--log.level=info"],
                         "ports": [{"name": "admin", "containerPort": 9090}],
                         "livenessProbe": {"httpGet": {"path": "/-/healthy", "port": 9090}, **probe},
                         "readinessProbe": {"httpGet": {"path": "/-/ready", "port": 9090}, **probe},
                         "securityContext": {
                             "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                             "readOnlyRootFilesystem": True, "runAsGroup": 65534, "runAsNonRoot": True,
                             "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
                         "volumeMounts": [
                             {"name": "data", "mountPath": "/data"},
                             {"name": "prometheus-config", "mountPath": "/etc/prometheus/prometheus.yml",
                              "subPath": "prometheus.yml", "readOnly": True}],
                     }],
                     "volumes": [{"name": "data", "emptyDir": {}},
                                 {"name": "prometheus-config", "configMap": {"name": "prometheus-config"}}],
                 },
             },
         }},
    ]
