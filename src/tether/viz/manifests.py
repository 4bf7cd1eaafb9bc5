"""Viz on Kubernetes: the manifests ``tether viz install --platform kubernetes`` prints (``linkerd viz install``).

What runs on a cluster today is Prometheus -- the upstream image, Linkerd
viz's scrape configuration with Kubernetes discovery
(``scrape_config.kubernetes_prometheus_config``), RBAC to list pods and
nodes, a Service on 9090, Linkerd's probes, security context and an emptyDir
for its data -- and the tap injector (``tether viz tap-injector``, Tether's
image): its ServiceAccount, which may only read namespaces, its TLS Secret,
Service (443 -> 8443), Deployment and the ``linkerd-tap-injector-webhook-config``
MutatingWebhookConfiguration (pod CREATE, failure policy Ignore, reinvoked
after the proxy injector) -- and tap (``tether viz tap-apiserver``, Tether's
image): its ServiceAccount and RBAC (read the workloads tap resolves, create
SubjectAccessReviews, delegate authentication, read the front-proxy
settings in kube-system and the trust roots in the control plane's
namespace), its TLS Secret, Service (443 -> 8089), Deployment (with the
projected token identity certifies the tap identity with) and the
``v1alpha1.tap.linkerd.io`` APIService with the CA as ``caBundle``; plus the
``linkerd-<ns>-tap-admin`` ClusterRole to bind users to -- and the dashboard
(``web``: ``tether viz dashboard --platform kubernetes`` on 8084, reading the
API server and Prometheus, tapping through the APIService as its service
account) -- and the ``kubelet`` NetworkAuthentication (every network) that
``viz allow-scrapes`` authorizes probes with (``tether.viz.allow_scrapes``).
All in the viz namespace, labelled ``linkerd.io/extension: viz``.
The viz commands read Prometheus with ``--prometheus-url`` (for example
through ``kubectl port-forward``) and tap through the API server.

Pure (objects out; the webhook's certificates come in).  Callers:
``tether.cli.viz``; tests validate every object against Kubernetes 1.35.
"""

from __future__ import annotations

from typing import Any

import base64
from dataclasses import dataclass

import yaml

from tether.naming import TRUST_ROOTS_CONFIGMAP
from tether.viz import allow_scrapes
from tether.viz.scrape_config import kubernetes_prometheus_config

DEFAULT_NAMESPACE = "linkerd-viz"
DEFAULT_PROMETHEUS_IMAGE = "prom/prometheus:v2.55.1"
DEFAULT_TETHER_IMAGE = "ghcr.io/tether-mesh/tether"
TAP_INJECTOR_PORT = 8443
TAP_INJECTOR_WEBHOOK = "linkerd-tap-injector-webhook-config"
_TLS_DIR = "/var/run/linkerd/tls"
_TLS_MOUNT = {"name": "tls", "mountPath": _TLS_DIR, "readOnly": True}


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


def render(*, tap_injector_tls: WebhookTls, tap_tls: WebhookTls, namespace: str = DEFAULT_NAMESPACE,
           control_plane_ns: str = "linkerd", trust_domain: str = "cluster.local",
           cluster_domain: str = "cluster.local", prometheus_image: str = DEFAULT_PROMETHEUS_IMAGE,
           tether_image: str = "", scrape_interval: str = "10s", version: str = "") -> list[dict[str, Any]]:
    """Every object, in apply order (``tether_image`` default: Tether's, tagged ``version``)."""
    image = tether_image or f"{DEFAULT_TETHER_IMAGE}:{version or 'latest'}"
    return [*_prometheus(namespace, control_plane_ns, prometheus_image, scrape_interval, version),
            # What `viz allow-scrapes` authorizes the kubelet's probes of a locked-down namespace with.
            allow_scrapes.kubelet_authentication(namespace, version),
            *_tap_injector(namespace, control_plane_ns, trust_domain, image, tap_injector_tls, version),
            *_tap(namespace, control_plane_ns, trust_domain, cluster_domain, image, tap_tls, version),
            *_web(namespace, control_plane_ns, trust_domain, cluster_domain, image, version)]


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
        _tether_deployment("tap-injector", meta, image, inject="enabled", args=[
            "viz", "tap-injector", f"--tls-cert={_TLS_DIR}/tls.crt", f"--tls-key={_TLS_DIR}/tls.key",
            f"--addr=0.0.0.0:{TAP_INJECTOR_PORT}", f"--viz-namespace={namespace}",
            f"--control-plane-ns={control_plane_ns}", f"--trust-domain={trust_domain}"],
            port=TAP_INJECTOR_PORT, probe=probe,
            volumes=[{"name": "tls", "secret": {"secretName": "tap-injector-k8s-tls"}}]),
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


TAP_PORT = 8089
TAP_API_GROUP = "tap.linkerd.io"
_TOKEN_DIR = "/var/run/secrets/tokens"
_TOKEN = "linkerd-identity-token"


def _tap(namespace: str, control_plane_ns: str, trust_domain: str, cluster_domain: str, image: str,
         tls: WebhookTls, version: str) -> list[dict[str, Any]]:
    labels = _labels("tap", namespace)
    annotations = {"linkerd.io/created-by": f"tether/cli {version}".strip()}
    meta = {"namespace": namespace, "labels": labels, "annotations": annotations}
    cluster_meta = {"labels": labels, "annotations": annotations}
    role = f"linkerd-{namespace}-tap"
    sa = [{"kind": "ServiceAccount", "name": "tap", "namespace": namespace}]
    rbac = "rbac.authorization.k8s.io"
    # TCP: every HTTPS request must carry the aggregator's front-proxy certificate, which the kubelet has not.
    probe = {"tcpSocket": {"port": TAP_PORT}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tap", **meta}},
        # What tap resolves a resource to pods with, and the review of each user's tap.
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": role, **cluster_meta},
         "rules": [
             {"apiGroups": [""], "resources": ["pods", "services", "replicationcontrollers", "namespaces"],
              "verbs": ["list", "get", "watch"]},
             {"apiGroups": ["apps"], "resources": ["deployments", "replicasets", "daemonsets", "statefulsets"],
              "verbs": ["list", "get", "watch"]},
             {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": ["list", "get", "watch"]},
             {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role, **cluster_meta},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": role}, "subjects": sa},
        # For users: bind it to let them tap (`linkerd viz tap` needs watch on <type>s/tap).
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": f"{role}-admin", **cluster_meta},
         "rules": [{"apiGroups": [TAP_API_GROUP], "resources": ["*"], "verbs": ["watch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{role}-auth-delegator", **cluster_meta},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:auth-delegator"}, "subjects": sa},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{role}-auth-reader", "namespace": "kube-system", **cluster_meta},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "extension-apiserver-authentication-reader"},
         "subjects": sa},
        # The mesh's trust anchors, to check identity's certificate and the proxies'.
        {"apiVersion": f"{rbac}/v1", "kind": "Role",
         "metadata": {"name": f"{role}-trust-roots", "namespace": control_plane_ns, **cluster_meta},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [TRUST_ROOTS_CONFIGMAP],
                    "verbs": ["get"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{role}-trust-roots", "namespace": control_plane_ns, **cluster_meta},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": f"{role}-trust-roots"}, "subjects": sa},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": {"name": "tap-k8s-tls", **meta},
         "data": {"tls.crt": _b64(tls.crt), "tls.key": _b64(tls.key)}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tap", **meta},
         "spec": {"type": "ClusterIP", "selector": {"linkerd.io/extension": "viz", "component": "tap"},
                  "ports": [{"name": "apiserver", "port": 443, "targetPort": "apiserver"}]}},
        # Not meshed: it presents the tap identity to the proxies itself (a proxy of its own would wrap that
        # mTLS again); it gets the identity from identity's Certify with the projected token.
        _tether_deployment("tap", meta, image, inject="disabled", args=[
            "viz", "tap-apiserver", f"--tls-cert={_TLS_DIR}/tls.crt", f"--tls-key={_TLS_DIR}/tls.key",
            f"--addr=0.0.0.0:{TAP_PORT}", f"--viz-namespace={namespace}", f"--control-plane-ns={control_plane_ns}",
            f"--trust-domain={trust_domain}", f"--cluster-domain={cluster_domain}",
            f"--token-file={_TOKEN_DIR}/{_TOKEN}"], port=TAP_PORT, port_name="apiserver", probe=probe,
            volumes=[{"name": "tls", "secret": {"secretName": "tap-k8s-tls"}},
                     {"name": _TOKEN, "projected": {"sources": [{"serviceAccountToken": {
                         "path": _TOKEN, "expirationSeconds": 86400, "audience": "identity.l5d.io"}}]}}],
            mounts=(_TLS_MOUNT, {"name": _TOKEN, "mountPath": _TOKEN_DIR, "readOnly": True})),
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": f"v1alpha1.{TAP_API_GROUP}", **cluster_meta},
         "spec": {"group": TAP_API_GROUP, "version": "v1alpha1", "groupPriorityMinimum": 1000,
                  "versionPriority": 100, "service": {"name": "tap", "namespace": namespace},
                  "caBundle": _b64(tls.ca)}},
    ]


def _tether_deployment(name: str, meta: dict[str, Any], image: str, *, inject: str, args: list[str], port: int,
                       probe: dict[str, Any], volumes: list[dict[str, Any]], port_name: str = "",
                       mounts: tuple[dict[str, Any], ...] = (_TLS_MOUNT,)) -> dict[str, Any]:
    """A Deployment of one viz server in Tether's image: its own service account, non-root and read-only (its TLS
    Secret mounted at ``_TLS_DIR`` unless ``mounts`` says otherwise)."""
    labels = meta["labels"]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, **meta},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {**meta["annotations"], "linkerd.io/inject": inject}},
                "spec": {
                    "serviceAccountName": name,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": name,
                        "image": image,
                        "command": ["tether"],
                        "args": args,
                        "ports": [{"name": port_name or name, "containerPort": port}],
                        "livenessProbe": probe,
                        "readinessProbe": probe,
                        "securityContext": _RESTRICTED,
                        "volumeMounts": list(mounts),
                    }],
                    "volumes": volumes,
                },
            },
        },
    }


WEB_PORT = 8084


def _web(namespace: str, control_plane_ns: str, trust_domain: str, cluster_domain: str, image: str,
         version: str) -> list[dict[str, Any]]:
    """The dashboard (``tether viz dashboard --platform kubernetes``): read-only, reached with ``kubectl
    port-forward`` (its Host check admits localhost only, as Linkerd's web by default)."""
    labels = _labels("web", namespace)
    annotations = {"linkerd.io/created-by": f"tether/cli {version}".strip()}
    meta = {"namespace": namespace, "labels": labels, "annotations": annotations}
    cluster_meta = {"labels": labels, "annotations": annotations}
    role = f"linkerd-{namespace}-web"
    rbac = "rbac.authorization.k8s.io"
    read = ["get", "list", "watch"]
    prometheus = f"http://prometheus.{namespace}.svc.{cluster_domain}:9090"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "web", **meta}},
        # What the pages join with Prometheus' series, and the live tap as this service account.
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": role, **cluster_meta},
         "rules": [{"apiGroups": [""], "resources": ["pods", "services", "namespaces"], "verbs": read},
                   {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": read},
                   {"apiGroups": ["linkerd.io"], "resources": ["serviceprofiles"], "verbs": read},
                   # The policy routes `routes` lists without traffic (and the Servers they attach to).
                   {"apiGroups": ["policy.linkerd.io"], "resources": ["servers", "httproutes"], "verbs": read},
                   {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes", "grpcroutes"],
                    "verbs": read},
                   {"apiGroups": [TAP_API_GROUP], "resources": ["*"], "verbs": ["watch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role, **cluster_meta},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": "web", "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", **meta},
         "spec": {"type": "ClusterIP", "selector": {"linkerd.io/extension": "viz", "component": "web"},
                  "ports": [{"name": "http", "port": WEB_PORT, "targetPort": "http"}]}},
        # TCP probes: the kubelet's Host header (the pod's IP) is not one the dashboard serves.
        _tether_deployment("web", meta, image, inject="enabled", args=[
            "viz", "dashboard", "--platform=kubernetes", "--address=0.0.0.0", f"--port={WEB_PORT}", "--show=url",
            f"--prometheus-url={prometheus}", f"--control-plane-ns={control_plane_ns}",
            f"--trust-domain={trust_domain}", f"--cluster-domain={cluster_domain}"], port=WEB_PORT, port_name="http",
            probe={"tcpSocket": {"port": WEB_PORT}}, volumes=[], mounts=()),
    ]
