"""Viz on Kubernetes: the manifests ``tether viz install --platform kubernetes`` prints (``linkerd viz install``).

What runs on a cluster today is Prometheus -- the upstream image, Linkerd
viz's scrape configuration with Kubernetes discovery
(``scrape_config.kubernetes_prometheus_config``), RBAC to list pods and
nodes, a Service on 9090, Linkerd's probes, security context and an emptyDir
for its data -- and the tap injector (``tether viz tap-injector``, Tether's
image): its ServiceAccount, which may only read namespaces, its TLS Secret,
Service (443 -> 8443), Deployment and the ``linkerd-tap-injector-webhook-config``
MutatingWebhookConfiguration (pod CREATE, failure policy Ignore, reinvoked
after the proxy injector), all in the viz namespace, labelled
``linkerd.io/extension: viz``.  The viz commands read Prometheus with
``--prometheus-url`` (for example through ``kubectl port-forward``).  The tap
server, its APIService, and the dashboard's Deployment are not part of these
manifests yet: they read the local store.

Pure (objects out; the webhook's certificates come in).  Callers:
``tether.cli.viz``; tests validate every object against Kubernetes 1.35.
"""

from __future__ import annotations

from typing import Any

import base64
from dataclasses import dataclass

import yaml

from tether.viz.scrape_config import kubernetes_prometheus_config

DEFAULT_NAMESPACE = "linkerd-viz"
DEFAULT_PROMETHEUS_IMAGE = "prom/prometheus:v2.55.1"
DEFAULT_TETHER_IMAGE = "ghcr.io/tether-mesh/tether"
TAP_INJECTOR_PORT = 8443
TAP_INJECTOR_WEBHOOK = "linkerd-tap-injector-webhook-config"
_TLS_DIR = "/var/run/linkerd/tls"


@dataclass(frozen=True, slots=True)
class WebhookTls:
    """PEM text: the CA the API server trusts (caBundle), and the webhook's certificate and key."""

    ca: str
    crt: str
    key: str


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _labels(component: str, namespace: str) -> dict[str, str]:
    return {"linkerd.io/extension": "viz", "component": component, "namespace": namespace}


def render(*, tap_injector_tls: WebhookTls, namespace: str = DEFAULT_NAMESPACE, control_plane_ns: str = "linkerd",
           trust_domain: str = "cluster.local", prometheus_image: str = DEFAULT_PROMETHEUS_IMAGE,
           tether_image: str = "", scrape_interval: str = "10s", version: str = "") -> list[dict[str, Any]]:
    """Every object, in apply order (``tether_image`` default: Tether's, tagged ``version``)."""
    return [*_prometheus(namespace, control_plane_ns, prometheus_image, scrape_interval, version),
            *_tap_injector(namespace, control_plane_ns, trust_domain,
                           tether_image or f"{DEFAULT_TETHER_IMAGE}:{version or 'latest'}", tap_injector_tls, version)]


def _prometheus(namespace: str, control_plane_ns: str, prometheus_image: str, scrape_interval: str,
                version: str) -> list[dict[str, Any]]:
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


_RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
               "runAsNonRoot": True, "runAsUser": 2103, "runAsGroup": 2103,
               "seccompProfile": {"type": "RuntimeDefault"}}


def _tap_injector(namespace: str, control_plane_ns: str, trust_domain: str, image: str, tls: WebhookTls,
                  version: str) -> list[dict[str, Any]]:
    labels = _labels("tap-injector", namespace)
    annotations = {"linkerd.io/created-by": f"tether/cli {version}".strip()}
    meta = {"namespace": namespace, "labels": labels, "annotations": annotations}
    cluster_meta = {"labels": labels, "annotations": annotations}
    role = f"linkerd-{namespace}-tap-injector"
    probe = {"httpGet": {"path": "/ready", "port": TAP_INJECTOR_PORT, "scheme": "HTTPS"}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tap-injector", **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role, **cluster_meta},
         "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role, **cluster_meta},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": "tap-injector", "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
         "metadata": {"name": "tap-injector-k8s-tls", **meta},
         "data": {"tls.crt": _b64(tls.crt), "tls.key": _b64(tls.key)}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tap-injector", **meta},
         "spec": {"type": "ClusterIP", "selector": {"linkerd.io/extension": "viz", "component": "tap-injector"},
                  "ports": [{"name": "tap-injector", "port": 443, "targetPort": "tap-injector"}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "tap-injector", **meta},
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels, "annotations": {**annotations, "linkerd.io/inject": "enabled"}},
                 "spec": {
                     "serviceAccountName": "tap-injector",
                     "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "tap-injector",
                         "image": image,
                         "command": ["tether"],
                         "args": ["viz", "tap-injector", f"--tls-cert={_TLS_DIR}/tls.crt",
                                  f"--tls-key={_TLS_DIR}/tls.key", f"--addr=0.0.0.0:{TAP_INJECTOR_PORT}",
                                  f"--viz-namespace={namespace}", f"--control-plane-ns={control_plane_ns}",
                                  f"--trust-domain={trust_domain}"],
                         "ports": [{"name": "tap-injector", "containerPort": TAP_INJECTOR_PORT}],
                         "livenessProbe": probe,
                         "readinessProbe": probe,
                         "securityContext": _RESTRICTED,
                         "volumeMounts": [{"name": "tls", "mountPath": _TLS_DIR, "readOnly": True}],
                     }],
                     "volumes": [{"name": "tls", "secret": {"secretName": "tap-injector-k8s-tls"}}],
                 },
             },
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": TAP_INJECTOR_WEBHOOK, **cluster_meta},
         "webhooks": [{
             "name": "tap-injector.linkerd.io",
             "clientConfig": {"service": {"name": "tap-injector", "namespace": namespace, "path": "/"},
                              "caBundle": _b64(tls.ca)},
             # After the proxy injector has added the proxy: the API server calls webhooks in name order
             # and calls this one again when a later one changed the pod.
             "reinvocationPolicy": "IfNeeded",
             "failurePolicy": "Ignore",
             "admissionReviewVersions": ["v1"],
             "sideEffects": "None",
             "timeoutSeconds": 10,
             "namespaceSelector": {"matchExpressions": [
                 {"key": "config.linkerd.io/admission-webhooks", "operator": "NotIn", "values": ["disabled"]},
                 {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]},
             "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                        "scope": "Namespaced"}],
         }]},
    ]
