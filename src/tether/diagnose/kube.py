"""``tether check --platform kubernetes``: Linkerd's categories against an API server.

``kubernetes-api`` (fatal), ``kubernetes-version``, ``gateway-api-crd`` (the Gateway API route CRDs:
optional, but serving the versions the policy controller watches), ``linkerd-existence`` (fatal:
what ``tether install`` makes — namespace, ClusterRoles, ClusterRoleBindings,
ServiceAccounts, CRDs, the injector's MutatingWebhookConfiguration),
``linkerd-config`` (with the cluster-network checks), ``linkerd-cni-plugin`` (when the CNI is enabled, by flag or
``cniEnabled``), ``linkerd-identity`` (the ``linkerd-identity-trust-roots``
ConfigMap and the ``linkerd-identity-issuer`` Secret, the issuer's name under the
trust domain ``linkerd-config`` holds), ``linkerd-webhooks-and-apisvc-tls``,
``linkerd-version`` and ``control-plane-version`` (the version ``linkerd-config``
records), ``linkerd-control-plane-proxy`` (when control-plane pods carry
proxies), ``linkerd-ha-checks`` (when ``highAvailability``), with ``--proxy`` the
data plane categories, then ``linkerd-extension-checks`` and the checks of each
extension found (``linkerd-viz``); ``--pre`` runs ``pre-kubernetes-setup`` (the
user's permissions asked with SelfSubjectAccessReviews, the front-proxy CA, the
nodes' clocks) and ``--crds`` only its own category.  Every answer is read with
``KubeClient``: GETs, and SelfSubjectAccessReviews (which change nothing).

The objects to expect come from the caller (``tether.cli.check`` renders what
``tether install`` prints), so this module does not import the CLI.  Caller:
``tether.cli.check``.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import re
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from tether.diagnose.certs import EXPIRY_WARNING, Credentials, IdentityHints, identity_checks, validity_problem
from tether.diagnose.checks import Category, Check, Problem
from tether.diagnose.local import opaque_port_problems
from tether.identity import pem, pki
from tether.injector.annotations import PROXY_VERSION, TRUST_ROOT_SHA256, trust_root_sha256
from tether.naming import TRUST_ROOTS_CONFIGMAP, issuer_name
from tether.platform.kubernetes.client import ApiError, ClientSettings, KubeClient, KubeError
from tether.platform.kubernetes.resources import api_resource
from tether.policy.config import InvalidNetworks, parse_networks
from tether.resources import kinds
from tether.resources.policy import Network

MINIMUM_VERSION = (1, 31)
COMPONENT_LABEL = "linkerd.io/control-plane-component"
PROXY_CONTAINER = "linkerd-proxy"
_PATHS = {
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts/{name}",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}",
}
_EXISTENCE = [
    ("ClusterRole", "control plane ClusterRoles exist", "l5d-existence-cr"),
    ("ClusterRoleBinding", "control plane ClusterRoleBindings exist", "l5d-existence-crb"),
    ("ServiceAccount", "control plane ServiceAccounts exist", "l5d-existence-sa"),
    ("CustomResourceDefinition", "control plane CustomResourceDefinitions exist", "l5d-existence-crd"),
    ("MutatingWebhookConfiguration", "control plane MutatingWebhookConfigurations exist", "l5d-existence-mwc"),
    ("ValidatingWebhookConfiguration", "control plane ValidatingWebhookConfigurations exist", "l5d-existence-vwc"),
]
INSTALL_HINT = "apply what `tether install` prints (`tether install --crds` first)"
# The Gateway API routes the policy controller watches: (plural.group, the version it watches), HTTPRoute first.
GATEWAY_ROUTES = tuple((f"{r.plural}.{r.group}", r.version) for r in map(api_resource, (
    kinds.GATEWAY_HTTP_ROUTE.key, kinds.GRPC_ROUTE.key, kinds.TLS_ROUTE.key, kinds.TCP_ROUTE.key)))
EXTENSION_LABEL = "linkerd.io/extension"
CNI_NAME = "linkerd-cni"
CNI_CONFIG_MAP = "linkerd-cni-config"
# Linkerd's allowance: five minutes plus the issuer's clock-skew allowance (10 s) between a node's last
# heartbeat and this machine's clock.
ALLOWED_CLOCK_SKEW = timedelta(minutes=5, seconds=10)
# kind -> (API group, resource) of what `tether install` makes outside any namespace, for the access reviews.
_CLUSTER_SCOPED = {
    "Namespace": ("", "namespaces"),
    "ClusterRole": ("rbac.authorization.k8s.io", "clusterroles"),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io", "clusterrolebindings"),
    "CustomResourceDefinition": ("apiextensions.k8s.io", "customresourcedefinitions"),
    "MutatingWebhookConfiguration": ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    "ValidatingWebhookConfiguration": ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    "APIService": ("apiregistration.k8s.io", "apiservices"),
}
# (description, verb, API group, resource) asked in the control plane's namespace, in Linkerd's order.
_NAMESPACED_ACCESS = [
    ("can create ServiceAccounts", "create", "", "serviceaccounts"),
    ("can create Services", "create", "", "services"),
    ("can create Deployments", "create", "apps", "deployments"),
    ("can create CronJobs", "create", "batch", "cronjobs"),
    ("can create ConfigMaps", "create", "", "configmaps"),
    ("can create Secrets", "create", "", "secrets"),
    ("can read Secrets", "get", "", "secrets"),
]


@dataclass(frozen=True)
class Options:
    """The flags that add or change categories: ``--linkerd-cni-enabled``, ``--cni-namespace``,
    ``--expected-version`` (the latest version to compare with; Tether has no release channel to ask)."""

    cni_enabled: bool = False
    cni_namespace: str = CNI_NAME
    expected_version: str | None = None


@dataclass(frozen=True)
class Expected:
    """What ``tether install`` makes: the control-plane namespace and ``(kind, name)`` of each object."""

    namespace: str
    objects: Sequence[tuple[str, str]]


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _proxy_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    spec = pod.get("spec") or {}
    return next((c for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
                 if c.get("name") == PROXY_CONTAINER), None)


def mesh_domains(values: dict[str, Any]) -> tuple[str, str]:
    """The cluster domain and identity trust domain ``linkerd-config``'s values hold (an empty trust domain
    is the cluster domain, as `tether install` renders it)."""
    cluster_domain = str(values.get("clusterDomain") or "cluster.local")
    return cluster_domain, str(values.get("identityTrustDomain") or cluster_domain)


def _unready_proxies(pods: Sequence[dict[str, Any]]) -> list[str]:
    unready = []
    for pod in pods:
        statuses = [*((pod.get("status") or {}).get("initContainerStatuses") or ()),
                    *((pod.get("status") or {}).get("containerStatuses") or ())]
        proxy = next((s for s in statuses if s.get("name") == PROXY_CONTAINER), None)
        if proxy is None or not proxy.get("ready"):
            unready.append(f"* {pod['metadata']['namespace']}/{pod['metadata']['name']}: the linkerd-proxy container "
                           "is not ready")
    return unready


def _other_proxy_versions(pods: Sequence[dict[str, Any]], version: str) -> list[str]:
    return [f"* {p['metadata']['namespace']}/{p['metadata']['name']} runs proxy "
            f"{(p['metadata'].get('annotations') or {}).get(PROXY_VERSION, 'unknown')}"
            for p in pods if (p["metadata"].get("annotations") or {}).get(PROXY_VERSION) != version]


def _pod_addresses(pod: dict[str, Any]) -> list[str]:
    """A pod's own addresses (a host-network pod has the node's, which the cluster networks need not hold)."""
    if (pod.get("spec") or {}).get("hostNetwork"):
        return []
    status = pod.get("status") or {}
    return [a["ip"] for a in status.get("podIPs") or () if a.get("ip")] or (
        [status["podIP"]] if status.get("podIP") else [])


def _cluster_ips(service: dict[str, Any]) -> list[str]:
    """A ClusterIP Service's cluster IPs (headless and ExternalName Services have none)."""
    spec = service.get("spec") or {}
    if spec.get("type", "ClusterIP") != "ClusterIP":
        return []
    ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    return [ip for ip in ips if ip != "None"]


def _version(text: str) -> tuple[int, int] | None:
    match = re.match(r"^v?(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


class KubeChecks:
    def __init__(self, settings: ClientSettings, cli_version: str, namespace: str | None, expected: Expected,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC), options: Options = Options()) -> None:
        self.settings = settings
        self.options = options
        self.cli_version = cli_version
        self.namespace = namespace
        self.expected = expected
        self.now = now
        self._loop = asyncio.new_event_loop()
        self._client = KubeClient(settings)

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()

    # -- API access ------------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            return self._loop.run_until_complete(coro)
        except KubeError as exc:
            raise Problem(str(exc)) from None

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return self._loop.run_until_complete(self._client.get(path))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise Problem(str(exc)) from None
        except KubeError as exc:
            raise Problem(str(exc)) from None

    def _list(self, path: str, **params: str) -> list[dict[str, Any]]:
        return list(self._run(self._client.get(path, params)).get("items") or ())

    @property
    def _cp(self) -> str:
        return self.expected.namespace

    # -- kubernetes-api / kubernetes-version ----------------------------------------------------

    def _open(self) -> None:
        self._run(self._client.open())

    def _query(self) -> None:
        self._server = self._run(self._client.get("/version"))

    def _minimum(self) -> None:
        found = _version(f"{self._server.get('major', '')}.{self._server.get('minor', '').rstrip('+')}")
        if found is None or found < MINIMUM_VERSION:
            shown = self._server.get("gitVersion") or f"{self._server.get('major')}.{self._server.get('minor')}"
            raise Problem(f"Kubernetes is on version [{shown}], but version "
                          f"[{'.'.join(map(str, MINIMUM_VERSION))}.0] or more recent is required")

    def api_categories(self) -> list[Category]:
        return [
            Category("kubernetes-api", [
                Check("can initialize the client", self._open, "check --kubeconfig and --kube-context"),
                Check("can query the Kubernetes API", self._query, "is the API server reachable?", retry=True),
            ], fatal=True),
            Category("kubernetes-version", [
                Check("is running the minimum Kubernetes API version", self._minimum,
                      "upgrade the cluster to Kubernetes 1.31 or later"),
            ]),
        ]

    # -- existence ----------------------------------------------------------------------------------

    def _missing(self, kind: str) -> None:
        missing = [name for k, name in self.expected.objects if k == kind
                   if self._get(_PATHS[kind].format(ns=self._cp, name=name)) is None]
        if missing:
            raise Problem(f"missing {kind}s: {', '.join(missing)}")

    def _namespace(self) -> None:
        names = {n["metadata"]["name"] for n in self._list("/api/v1/namespaces")}
        if self._cp not in names:
            raise Problem(f'The "{self._cp}" namespace does not exist')

    def existence_category(self) -> Category:
        checks = [Check("control plane Namespace exists", self._namespace, INSTALL_HINT)]
        for kind, description, _ in _EXISTENCE:
            if any(k == kind for k, _ in self.expected.objects):
                checks.append(Check(description, lambda kind=kind: self._missing(kind), INSTALL_HINT))
        return Category("linkerd-existence", checks, fatal=True)

    def _gateway_crd(self, name: str) -> dict[str, Any] | None:
        return self._get(_PATHS["CustomResourceDefinition"].format(name=name))

    def _gateway_installed(self) -> None:
        missing = [name for name, _ in GATEWAY_ROUTES[:2] if self._gateway_crd(name) is None]
        if missing:
            raise Problem(f"the {' and '.join(missing)} CRD{'s are' if len(missing) > 1 else ' is'} not installed: "
                          "routes of the Gateway API cannot be applied (policy.linkerd.io HTTPRoutes work without)")

    def _gateway_versions(self) -> None:
        wrong = []
        for name, version in GATEWAY_ROUTES:
            crd = self._gateway_crd(name)
            if crd is None:
                continue  # optional: watched once it exists
            served = {v.get("name") for v in (crd.get("spec") or {}).get("versions") or () if v.get("served")}
            if version not in served:
                wrong.append(f"the {name} CRD does not serve {version} "
                             f"(it serves {', '.join(sorted(filter(None, served))) or 'nothing'})")
        if wrong:
            raise Problem("; ".join(wrong) + ": the policy controller sees none of those routes; upgrade to Gateway "
                          "API v1.0.0 or later")

    def gateway_category(self) -> Category:
        """The Gateway API's route CRDs: optional for Tether (its policy controller watches each only once it
        exists, and reads policy.linkerd.io HTTPRoutes without), so their absence is a warning; one that does not
        serve the version the controller watches makes those routes silently invisible, an error."""
        hint = ("kubectl apply --server-side -f https://github.com/kubernetes-sigs/gateway-api/releases/download/"
                "v1.4.0/standard-install.yaml")
        return Category("gateway-api-crd", [
            Check("Gateway API is installed", self._gateway_installed, hint, warning=True),
            Check("Gateway API CRDs serve the versions the policy controller watches", self._gateway_versions, hint),
        ])

    def crd_category(self) -> Category:
        return Category("linkerd-crd", [
            Check("control plane CustomResourceDefinitions exist", lambda: self._missing("CustomResourceDefinition"),
                  "apply `tether install --crds`", retry=True),
        ])

    def _namespace_free(self) -> None:
        if self._cp in {n["metadata"]["name"] for n in self._list("/api/v1/namespaces")}:
            raise Problem(f'The "{self._cp}" namespace already exists')

    def _allowed(self, verb: str, group: str, resource: str, namespace: str = "") -> str | None:
        """None when the kubeconfig's user may ``verb`` ``resource``, else why not (a SelfSubjectAccessReview)."""
        attributes = {"verb": verb, "group": group, "resource": resource, **({"namespace": namespace} if namespace
                                                                              else {})}
        review = self._run(self._client.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes}}))
        status = review.get("status") or {}
        if status.get("allowed"):
            return None
        what = resource + (f".{group}" if group else "") + (f" in namespace {namespace}" if namespace else "")
        why = status.get("reason") or status.get("evaluationError") or ""
        return f"not authorized to {verb} {what}" + (f": {why}" if why else "")

    def _can_create_cluster_objects(self) -> None:
        kinds = sorted({kind for kind, _ in self.expected.objects if kind in _CLUSTER_SCOPED})
        problems = [problem for kind in kinds if (problem := self._allowed("create", *_CLUSTER_SCOPED[kind]))]
        if problems:
            raise Problem("\n".join(problems))

    def _can(self, verb: str, group: str, resource: str) -> None:
        problem = self._allowed(verb, group, resource, self._cp)
        if problem:
            raise Problem(problem)

    def _front_proxy_ca(self) -> None:
        found = self._get("/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication")
        if found is None:
            raise Problem("the kube-system/extension-apiserver-authentication ConfigMap does not exist")
        if not (found.get("data") or {}).get("requestheader-client-ca-file"):
            raise Problem("--requestheader-client-ca-file is not configured")

    def _clock_skew(self) -> None:
        now = self.now()
        skewed = []
        for node in self._list("/api/v1/nodes"):
            for condition in (node.get("status") or {}).get("conditions") or ():
                if condition.get("type") != "Ready" or condition.get("status") != "True":
                    continue
                try:
                    beat = datetime.fromisoformat(str(condition.get("lastHeartbeatTime")).replace("Z", "+00:00"))
                except ValueError:
                    continue  # no heartbeat time to compare
                if abs(now - beat) > ALLOWED_CLOCK_SKEW:
                    skewed.append(node["metadata"]["name"])
        if skewed:
            raise Problem(f"clock skew detected for node(s): {', '.join(skewed)}")

    def pre_category(self) -> Category:
        rbac = "the kubeconfig's user needs this permission to install the control plane (`kubectl auth can-i`)"
        return Category("pre-kubernetes-setup", [
            Check("control plane namespace does not already exist", self._namespace_free,
                  "uninstall first (`tether uninstall | kubectl delete -f -`), or use another namespace"),
            Check("can create non-namespaced resources", self._can_create_cluster_objects, rbac),
            *(Check(description, lambda v=verb, g=group, r=resource: self._can(v, g, r), rbac)
              for description, verb, group, resource in _NAMESPACED_ACCESS),
            Check("can read extension-apiserver-authentication configmap", self._front_proxy_ca,
                  "the API server needs a front-proxy CA (--requestheader-client-ca-file) and the user must read "
                  "kube-system/extension-apiserver-authentication"),
            Check("no clock skew detected", self._clock_skew,
                  "synchronize the nodes' clocks and this machine's (NTP): certificates are judged by them",
                  warning=True),
        ])

    # -- linkerd-cni-plugin -----------------------------------------------------------------------------

    def _cni_object(self, what: str, path: str) -> dict[str, Any]:
        found = self._get(path)
        if found is None:
            raise Problem(f"missing {what}")
        return found

    def _cni_ready(self) -> None:
        daemon_set = self._cni_object(f"DaemonSet: {CNI_NAME}",
                                      f"/apis/apps/v1/namespaces/{self.options.cni_namespace}/daemonsets/{CNI_NAME}")
        status = daemon_set.get("status") or {}
        scheduled, ready = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
        if scheduled != ready:
            raise Problem(f"number ready: {ready}, number scheduled: {scheduled}")

    def cni_category(self) -> Category | None:
        """Linkerd's CNI checks, when the CNI plugin is enabled (``--linkerd-cni-enabled`` or ``cniEnabled``)."""
        if not (self.options.cni_enabled or (getattr(self, "_values", None) or {}).get("cniEnabled")):
            return None
        ns = self.options.cni_namespace
        hint = "install the Linkerd CNI plugin (`linkerd install-cni | kubectl apply -f -`) in " + ns
        objects = [
            ("ConfigMap", f"ConfigMap: {CNI_CONFIG_MAP}", f"/api/v1/namespaces/{ns}/configmaps/{CNI_CONFIG_MAP}"),
            ("ClusterRole", f"ClusterRole: {CNI_NAME}", _PATHS["ClusterRole"].format(name=CNI_NAME)),
            ("ClusterRoleBinding", f"ClusterRoleBinding: {CNI_NAME}",
             _PATHS["ClusterRoleBinding"].format(name=CNI_NAME)),
            ("ServiceAccount", f"ServiceAccount: {CNI_NAME}", _PATHS["ServiceAccount"].format(ns=ns, name=CNI_NAME)),
            ("DaemonSet", f"DaemonSet: {CNI_NAME}", f"/apis/apps/v1/namespaces/{ns}/daemonsets/{CNI_NAME}"),
        ]
        return Category("linkerd-cni-plugin", [
            *(Check(f"cni plugin {kind} exists", lambda w=what, p=path: self._cni_object(w, p) and None, hint)
              for kind, what, path in objects),
            Check("cni plugin pod is running on all nodes", self._cni_ready,
                  f"kubectl -n {ns} get pods -o wide; kubectl -n {ns} logs ds/{CNI_NAME}", retry=True),
        ], fatal=True)

    # -- linkerd-config ------------------------------------------------------------------------------

    def _config_map(self) -> None:
        found = self._get(f"/api/v1/namespaces/{self._cp}/configmaps/linkerd-config")
        if found is None:
            raise Problem("the linkerd-config ConfigMap does not exist")
        self._values = yaml.safe_load((found.get("data") or {}).get("values") or "") or {}

    def _control_pods(self) -> list[dict[str, Any]]:
        return [p for p in self._list(f"/api/v1/namespaces/{self._cp}/pods") if
                COMPONENT_LABEL in ((p.get("metadata") or {}).get("labels") or {})]

    def _components_ready(self) -> None:
        pods = self._control_pods()
        components = {p["metadata"]["labels"][COMPONENT_LABEL] for p in pods}
        wanted = {name.removeprefix("linkerd-") for kind, name in self.expected.objects if kind == "Deployment"}
        missing = sorted(wanted - components)
        unready = sorted(p["metadata"]["name"] for p in pods if not _pod_ready(p))
        if missing or unready:
            raise Problem("; ".join(
                ([f"no pods for {', '.join(missing)}"] if missing else [])
                + ([f"not ready: {', '.join(unready)}"] if unready else [])))

    def _cluster_networks(self) -> tuple[str, tuple[Network, ...]]:
        """``clusterNetworks`` as linkerd-config holds it: the text and the networks."""
        values = getattr(self, "_values", None)
        if values is None:
            raise Problem("the cluster networks are unknown: the linkerd-config ConfigMap could not be read")
        text = str(values.get("clusterNetworks") or "")
        try:
            return text, parse_networks(text)
        except InvalidNetworks as exc:
            raise Problem(f"linkerd-config's clusterNetworks: {exc}") from None

    def _node_cidrs_covered(self) -> None:
        text, networks = self._cluster_networks()
        outside = set()
        for node in self._list("/api/v1/nodes"):
            spec = node.get("spec") or {}
            for cidr in spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else []):
                try:
                    network = ipaddress.ip_network(cidr, strict=False)
                except ValueError:
                    outside.add(cidr)
                    continue
                if not any(network.version == n.cidr.version and network.subnet_of(n.cidr)  # type: ignore[arg-type]
                           for n in networks):
                    outside.add(cidr)
        if outside:
            cidrs = sorted(outside)
            wanted = "\\,".join([*(part for part in text.split(",") if part.strip()), *cidrs])  # --set escapes
            raise Problem(f"node has podCIDR(s) [{' '.join(cidrs)}] which are not contained in the Linkerd "
                          f'clusterNetworks.\n\tTry installing linkerd via --set clusterNetworks="{wanted}"')

    def _addresses_covered(self, what: str, path: str, addresses: Callable[[dict[str, Any]], list[str]]) -> None:
        text, networks = self._cluster_networks()
        outside = []
        for obj in self._list(path):
            meta = obj.get("metadata") or {}
            for address in addresses(obj):
                try:
                    ip = ipaddress.ip_address(address)
                except ValueError:
                    continue
                if not any(n.contains(ip) for n in networks):
                    outside.append(f"{what} {meta.get('namespace', '')}/{meta.get('name', '')} ({address})")
        if outside:
            raise Problem(f"the Linkerd clusterNetworks [{text!r}] do not include " + ", ".join(outside))

    def config_category(self) -> Category:
        # Without them a proxy takes a call to a pod or Service outside these networks for egress: no
        # discovery, no mTLS (Linkerd's checks, in its order, wording and hint anchors).
        networks_hint = ("re-install with --set clusterNetworks=... naming every pod and Service network "
                         "(https://linkerd.io/2/checks/#l5d-cluster-networks-{})")
        return Category("linkerd-config", [
            Check("'linkerd-config' config map exists", self._config_map, INSTALL_HINT),
            Check("control plane pods are ready", self._components_ready,
                  f"kubectl -n {self._cp} get pods; kubectl -n {self._cp} describe pods", retry=True),
            Check("cluster networks contains all node podCIDRs", self._node_cidrs_covered,
                  networks_hint.format("cidr")),
            Check("cluster networks contains all pods", lambda: self._addresses_covered(
                "pod", "/api/v1/pods", _pod_addresses), networks_hint.format("pods")),
            Check("cluster networks contains all services", lambda: self._addresses_covered(
                "svc", "/api/v1/services", _cluster_ips), networks_hint.format("pods")),
        ])

    # -- identity and webhook certificates -------------------------------------------------------------

    def _secret_pem(self, name: str, *keys: str) -> str:
        secret = self._get(f"/api/v1/namespaces/{self._cp}/secrets/{name}")
        if secret is None:
            raise Problem(f"the {name} Secret does not exist")
        data = secret.get("data") or {}
        for key in keys:
            if key in data:
                return base64.b64decode(data[key]).decode()
        raise Problem(f"the {name} Secret has none of {', '.join(keys)}")

    def _anchors_pem(self) -> str:
        roots = self._get(f"/api/v1/namespaces/{self._cp}/configmaps/{TRUST_ROOTS_CONFIGMAP}")
        text = ((roots or {}).get("data") or {}).get("ca-bundle.crt")
        if not text:
            raise Problem(f"the {TRUST_ROOTS_CONFIGMAP} ConfigMap has no ca-bundle.crt")
        return text

    def _credentials(self) -> Credentials:
        try:
            anchors = pem.parse_certificates(self._anchors_pem().encode(), TRUST_ROOTS_CONFIGMAP)
            issuer = pem.parse_certificates(self._secret_pem("linkerd-identity-issuer", "crt.pem", "tls.crt").encode(),
                                            "linkerd-identity-issuer")[0]
        except pem.PemError as exc:
            raise Problem(str(exc)) from None
        values = getattr(self, "_values", None)
        if values is None:
            raise Problem("the trust domain is unknown: the linkerd-config ConfigMap could not be read")
        # The identity service refuses an issuer not named for the trust domain it serves (Linkerd's too).
        expected = issuer_name(self._cp, mesh_domains(values)[1])
        names = {pki.subject_cn(issuer), *(str(n.value) for n in pki.sans(issuer))}
        if expected not in names:
            raise Problem(f"the issuer certificate is for {', '.join(sorted(names))}, not {expected} (the trust "
                          "domain linkerd-config holds)")
        return Credentials(anchors, issuer)

    def identity_category(self) -> Category:
        hints = IdentityHints(
            config=f"the anchors are in ConfigMap {self._cp}/{TRUST_ROOTS_CONFIGMAP}, the issuer in Secret "
                   f"{self._cp}/linkerd-identity-issuer: `tether upgrade` rewrites them",
            anchors="rotate the trust anchors (`tether identity create-trust-anchor`, then `tether upgrade "
                    "--identity-trust-anchors-file`)",
            issuer="rotate the issuer (`tether identity create-issuer`, then `tether upgrade "
                   "--identity-issuer-certificate-file ... --identity-issuer-key-file ...`)",
        )
        return Category("linkerd-identity", identity_checks(self._credentials, self.now, hints))

    def _webhook_cert(self, webhook: str) -> Any:
        secret = f"linkerd-{webhook}-k8s-tls"
        text = self._secret_pem(secret, "tls.crt")
        try:
            return pem.parse_certificates(text.encode(), secret)[0]
        except pem.PemError as exc:
            raise Problem(str(exc)) from None

    def _webhook_valid(self, webhook: str) -> None:
        problem = validity_problem(self._webhook_cert(webhook), self.now())
        if problem:
            raise Problem(f"{webhook} cert {problem}")

    def _webhook_not_expiring(self, webhook: str) -> None:
        cert = self._webhook_cert(webhook)
        if cert.not_valid_after_utc - self.now() < EXPIRY_WARNING:
            raise Problem(f"{webhook} cert will expire on {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")

    def webhook_category(self) -> Category:
        """Linkerd's checks of each webhook's serving certificate: the proxy injector's and the policy
        validator's (Tether has no ServiceProfile validator webhook: ``tether apply`` and the policy
        controller's rule set validate)."""
        def hint(webhook: str) -> str:
            # `tether upgrade --from` keeps a webhook certificate it is given, and issues one it is not.
            return (f"run `tether upgrade --from` on the saved objects without Secret linkerd-{webhook}-k8s-tls: "
                    "it issues that webhook a new certificate")

        return Category("linkerd-webhooks-and-apisvc-tls", [
            check
            for webhook in ("proxy-injector", "policy-validator")
            for check in (
                Check(f"{webhook} webhook has valid cert", lambda w=webhook: self._webhook_valid(w), hint(webhook)),
                Check(f"{webhook} cert is valid for at least 60 days", lambda w=webhook: self._webhook_not_expiring(w),
                      hint(webhook), warning=True),
            )
        ])

    # -- versions and HA -------------------------------------------------------------------------------

    def _latest(self) -> str:
        if self.options.expected_version is None:
            raise Problem("Tether has no release channel to ask: give --expected-version VERSION to compare with")
        return self.options.expected_version

    def _cli_up_to_date(self) -> None:
        latest = self._latest()
        if latest != self.cli_version:
            raise Problem(f"is running version {self.cli_version} but the latest version is {latest}")

    def linkerd_version_category(self) -> Category:
        return Category("linkerd-version", [
            Check("can determine the latest version", lambda: self._latest() and None,
                  "pass --expected-version with the version you mean to run", warning=True),
            Check("cli is up-to-date", self._cli_up_to_date, "install the latest tether", warning=True),
        ])

    def _server_version(self) -> str:
        """The control plane's version as ``linkerd-config`` records it (``linkerdVersion``), as Linkerd reads it."""
        values = getattr(self, "_values", None)
        if values is None:
            raise Problem("the linkerd-config ConfigMap could not be read")
        version = values.get("linkerdVersion")
        if not version:
            raise Problem("linkerd-config records no linkerdVersion")
        return str(version)

    def _cp_up_to_date(self) -> None:
        latest, server = self._latest(), self._server_version()
        if latest != server:
            raise Problem(f"is running version {server} but the latest version is {latest}")

    def _versions_match(self) -> None:
        server = self._server_version()
        if server != self.cli_version:
            raise Problem(f"control plane running {server} but cli running {self.cli_version}")

    def version_category(self) -> Category:
        upgrade = "upgrade the control plane (`tether upgrade`) or use the matching cli"
        return Category("control-plane-version", [
            Check("can retrieve the control plane version", lambda: self._server_version() and None, INSTALL_HINT),
            Check("control plane is up-to-date", self._cp_up_to_date, upgrade, warning=True),
            Check("control plane and cli versions match", self._versions_match, upgrade, warning=True),
        ])

    def _control_plane_proxies(self) -> list[dict[str, Any]]:
        return [p for p in self._control_pods() if _proxy_of(p) is not None]

    def _cp_proxies_healthy(self) -> None:
        unready = _unready_proxies(self._control_plane_proxies())
        if unready:
            raise Problem("\n".join(unready))

    def _cp_proxy_versions(self) -> None:
        other = _other_proxy_versions(self._control_plane_proxies(), self.cli_version)
        if other:
            raise Problem("\n".join([f"some proxies are not running {self.cli_version}:", *other]))

    def control_plane_proxy_category(self) -> Category | None:
        """Linkerd's checks of the control plane's proxies, when its pods carry any (`tether install`'s run
        without: the components serve TLS themselves, ``linkerd.io/inject: disabled``)."""
        if not self._control_plane_proxies():
            return None
        return Category("linkerd-control-plane-proxy", [
            Check("control plane proxies are healthy", self._cp_proxies_healthy,
                  f"kubectl -n {self._cp} logs POD -c {PROXY_CONTAINER}", retry=True),
            Check("control plane proxies and cli versions match", self._cp_proxy_versions,
                  "restart the control plane pods", warning=True),
        ], fatal=True)

    def _replicas(self) -> None:
        counts: dict[str, int] = {}
        for pod in self._control_pods():
            if _pod_ready(pod):
                name = pod["metadata"]["labels"][COMPONENT_LABEL]
                counts[name] = counts.get(name, 0) + 1
        single = sorted(name for name, count in counts.items() if count < 2)
        if single:
            raise Problem(f"not enough replicas available for {', '.join(single)}")

    def ha_category(self) -> Category | None:
        if not (getattr(self, "_values", None) or {}).get("highAvailability"):
            return None
        return Category("linkerd-ha-checks", [
            Check("multiple replicas of control plane pods", self._replicas,
                  "with --ha each component runs 3 replicas: check the nodes' capacity", warning=True, retry=True),
        ])

    # -- data plane ------------------------------------------------------------------------------------

    def _data_pods(self) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{self.namespace}/pods" if self.namespace else "/api/v1/pods"
        return [p for p in self._list(path) if _proxy_of(p) is not None]

    def _data_namespace(self) -> None:
        if self.namespace and self.namespace not in {n["metadata"]["name"] for n in self._list("/api/v1/namespaces")}:
            raise Problem(f'The "{self.namespace}" namespace does not exist')

    def _proxies_ready(self) -> None:
        pods = self._data_pods()
        if not pods:
            raise Problem('No "linkerd-proxy" containers found')
        unready = _unready_proxies(pods)
        if unready:
            raise Problem("\n".join(unready))

    def _trust_roots(self) -> None:
        current = trust_root_sha256(self._anchors_pem())
        stale = [f"* {p['metadata']['namespace']}/{p['metadata']['name']}" for p in self._data_pods()
                 if (p["metadata"].get("annotations") or {}).get(TRUST_ROOT_SHA256) != current]
        if stale:
            raise Problem("\n".join(["Some pods do not have the current trust bundle and must be restarted:",
                                     *stale]))

    def _proxy_versions(self) -> None:
        other = _other_proxy_versions(self._data_pods(), self.cli_version)
        if other:
            raise Problem("\n".join([f"some proxies are not running {self.cli_version}:", *other]))

    def _opaque_ports(self) -> None:
        svc_path = f"/api/v1/namespaces/{self.namespace}/services" if self.namespace else "/api/v1/services"
        pod_path = f"/api/v1/namespaces/{self.namespace}/pods" if self.namespace else "/api/v1/pods"
        problems = opaque_port_problems(self._list(svc_path), self._list(pod_path))
        if problems:
            raise Problem("\n".join(f"* {p}" for p in problems))

    def data_plane_categories(self) -> list[Category]:
        restart = "restart the pods (`kubectl rollout restart`)"
        return [
            Category("linkerd-identity-data-plane", [
                Check("data plane proxies certificate match CA", self._trust_roots, restart),
            ]),
            Category("linkerd-data-plane", [
                Check("data plane namespace exists", self._data_namespace, "create it, or pass another -n"),
                Check("data plane proxies are ready", self._proxies_ready,
                      "kubectl logs POD -c linkerd-proxy", retry=True),
                Check("data plane and cli versions match", self._proxy_versions, restart, warning=True),
            ]),
            Category("linkerd-opaque-ports-definition", [
                Check("opaque ports are properly annotated", self._opaque_ports,
                      "annotate the Service and its pods with the same config.linkerd.io/opaque-ports", warning=True),
            ]),
        ]

    # -- extensions -------------------------------------------------------------------------------------

    def _extension_namespaces(self) -> dict[str, list[str]]:
        """Extension name -> the namespaces labelled ``linkerd.io/extension`` with it."""
        found: dict[str, list[str]] = {}
        for ns in self._list("/api/v1/namespaces"):
            extension = ((ns.get("metadata") or {}).get("labels") or {}).get(EXTENSION_LABEL)
            if extension:
                found.setdefault(extension, []).append(ns["metadata"]["name"])
        return found

    def _extension_labels(self) -> None:
        doubled = [f"* label \"{EXTENSION_LABEL}={ext}\" is present on more than one namespace:\n"
                   + "\n".join(f"    * {ns}" for ns in sorted(namespaces))
                   for ext, namespaces in sorted(self._extension_namespaces().items()) if len(namespaces) > 1]
        if doubled:
            raise Problem("some extensions have invalid configuration\n" + "\n".join(doubled))

    def _no_checks_for(self, extension: str) -> None:
        raise Problem(f"Tether runs the checks of the viz extension only; `linkerd-{extension} check` is not run")

    def extension_categories(self) -> Iterator[Category]:
        """``linkerd-extension-checks``, then the categories of each extension installed (viz's)."""
        try:
            found = self._extension_namespaces()
        except Problem:
            found = {}
        yield Category("linkerd-extension-checks", [
            Check("namespace configuration for extensions", self._extension_labels,
                  f"keep one namespace per {EXTENSION_LABEL} value", warning=True),
            *(Check(f"Linkerd extension command linkerd-{ext} exists", lambda e=ext: self._no_checks_for(e),
                    "run that extension's own check", warning=True)
              for ext in sorted(found) if ext != "viz"),
        ])
        if "viz" in found:
            yield from self._viz_categories(sorted(found["viz"])[0])

    def _viz_expected(self, namespace: str) -> list[tuple[str, str]]:
        from tether.viz.manifests import WebhookTls, render

        objects = render(tap_injector_tls=WebhookTls("", "", ""), tap_tls=WebhookTls("", "", ""), namespace=namespace,
                         control_plane_ns=self._cp)
        return [(o["kind"], o["metadata"]["name"]) for o in objects]

    def _viz_missing(self, namespace: str, kind: str) -> None:
        missing = [name for k, name in self._viz_expected(namespace) if k == kind
                   if self._get(_PATHS[kind].format(ns=namespace, name=name)) is None]
        if missing:
            raise Problem(f"missing {kind}s: {', '.join(missing)}")

    def _viz_pods(self, namespace: str) -> None:
        pods = self._list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{EXTENSION_LABEL}=viz")
        components = {((p["metadata"].get("labels") or {}).get("component")) for p in pods}
        wanted = {name for kind, name in self._viz_expected(namespace) if kind == "Deployment"}
        missing = sorted(wanted - components)
        unready = sorted(p["metadata"]["name"] for p in pods if not _pod_ready(p))
        if missing or unready:
            raise Problem("; ".join(([f"no running pods for {', '.join(missing)}"] if missing else [])
                                    + ([f"not ready: {', '.join(unready)}"] if unready else [])))

    def _prometheus(self, namespace: str) -> None:
        for what, path in (("ConfigMap prometheus-config", f"/api/v1/namespaces/{namespace}/configmaps/prometheus-config"),
                           ("Service prometheus", f"/api/v1/namespaces/{namespace}/services/prometheus")):
            if self._get(path) is None:
                raise Problem(f"{what} does not exist in {namespace}")

    def _viz_namespace(self, namespace: str) -> None:
        if namespace not in {n["metadata"]["name"] for n in self._list("/api/v1/namespaces")}:
            raise Problem(f"the \"{namespace}\" namespace does not exist")

    def _tap_cert(self, namespace: str) -> Any:
        name = "tap-k8s-tls"
        secret = self._get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if secret is None:
            raise Problem(f"the {name} Secret does not exist in {namespace}")
        data = (secret.get("data") or {}).get("tls.crt")
        if not data:
            raise Problem(f"the {name} Secret has no tls.crt")
        try:
            return pem.parse_certificates(base64.b64decode(data), name)[0]
        except (pem.PemError, ValueError) as exc:
            raise Problem(str(exc)) from None

    def _tap_cert_valid(self, namespace: str) -> None:
        cert = self._tap_cert(namespace)
        problem = validity_problem(cert, self.now())
        if problem:
            raise Problem(f"tap API server cert {problem}")
        service = f"tap.{namespace}.svc"
        names = {str(n.value) for n in pki.sans(cert)}
        if service not in names:
            raise Problem(f"tap API server cert is for {', '.join(sorted(names)) or 'no DNS name'}, not {service}")

    def _tap_cert_not_expiring(self, namespace: str) -> None:
        cert = self._tap_cert(namespace)
        if cert.not_valid_after_utc - self.now() < EXPIRY_WARNING:
            raise Problem(f"tap API server cert will expire on {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")

    def _tap_apiservice(self) -> None:
        name = "v1alpha1.tap.linkerd.io"
        found = self._get(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
        if found is None:
            raise Problem(f"the APIService {name} does not exist")
        available = next((c for c in (found.get("status") or {}).get("conditions") or ()
                          if c.get("type") == "Available"), None)
        if available is None or available.get("status") != "True":
            why = (available or {}).get("message") or (available or {}).get("reason") or "no Available condition"
            raise Problem(f"{name} is not available: {why}")

    def _viz_meshed_pods(self, namespace: str) -> tuple[list[dict[str, Any]], set[str]]:
        """The viz pods, and the components whose manifests ask for a proxy (``linkerd.io/inject: enabled``)."""
        from tether.viz.manifests import WebhookTls, render

        objects = render(tap_injector_tls=WebhookTls("", "", ""), tap_tls=WebhookTls("", "", ""), namespace=namespace,
                         control_plane_ns=self._cp)
        meshed = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"
                  and (o["spec"]["template"]["metadata"].get("annotations") or {}).get("linkerd.io/inject") == "enabled"}
        pods = self._list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{EXTENSION_LABEL}=viz")
        return pods, meshed

    def _viz_injected(self, namespace: str) -> None:
        pods, meshed = self._viz_meshed_pods(namespace)
        bare = sorted(p["metadata"]["name"] for p in pods
                      if (p["metadata"].get("labels") or {}).get("component") in meshed and _proxy_of(p) is None)
        if bare:
            raise Problem(f"pods without a proxy: {', '.join(bare)} (is the proxy injector running?)")

    def _viz_proxies(self, namespace: str) -> list[dict[str, Any]]:
        pods, _ = self._viz_meshed_pods(namespace)
        return [p for p in pods if _proxy_of(p) is not None]

    def _viz_proxies_healthy(self, namespace: str) -> None:
        unready = _unready_proxies(self._viz_proxies(namespace))
        if unready:
            raise Problem("\n".join(unready))

    def _viz_proxies_up_to_date(self, namespace: str) -> None:
        latest = self._latest()
        other = _other_proxy_versions(self._viz_proxies(namespace), latest)
        if other:
            raise Problem("\n".join([f"some proxies are not running the latest version {latest}:", *other]))

    def _viz_proxy_versions(self, namespace: str) -> None:
        other = _other_proxy_versions(self._viz_proxies(namespace), self.cli_version)
        if other:
            raise Problem("\n".join([f"some proxies are not running {self.cli_version}:", *other]))

    def _viz_categories(self, namespace: str) -> Iterator[Category]:
        """Linkerd's ``linkerd-viz`` category, in its order (``linkerd viz check`` and ``linkerd check``)."""
        hint = "apply what `tether viz install --platform kubernetes` prints"
        cert_hint = "re-run `tether viz install --platform kubernetes` and apply it: it issues tap's certificate anew"
        pods_hint = f"kubectl -n {namespace} get pods; kubectl -n {namespace} describe pods"
        yield Category("linkerd-viz", [
            Check("linkerd-viz Namespace exists", lambda: self._viz_namespace(namespace), hint),
            Check("linkerd-viz ClusterRoles exist", lambda: self._viz_missing(namespace, "ClusterRole"), hint),
            Check("linkerd-viz ClusterRoleBindings exist", lambda: self._viz_missing(namespace, "ClusterRoleBinding"),
                  hint),
            Check("tap API server has valid cert", lambda: self._tap_cert_valid(namespace), cert_hint),
            Check("tap API server cert is valid for at least 60 days", lambda: self._tap_cert_not_expiring(namespace),
                  cert_hint, warning=True),
            Check("tap API service is running", self._tap_apiservice,
                  f"kubectl get apiservice v1alpha1.tap.linkerd.io -o yaml; kubectl -n {namespace} logs deploy/tap",
                  retry=True),
            Check("linkerd-viz pods are injected", lambda: self._viz_injected(namespace),
                  "the proxy injector must be running when the viz pods are created: delete them to recreate them",
                  retry=True),
            Check("viz extension pods are running", lambda: self._viz_pods(namespace), pods_hint, retry=True),
            Check("viz extension proxies are healthy", lambda: self._viz_proxies_healthy(namespace), pods_hint,
                  retry=True),
            Check("viz extension proxies are up-to-date", lambda: self._viz_proxies_up_to_date(namespace),
                  f"kubectl -n {namespace} rollout restart deploy", warning=True),
            Check("viz extension proxies and cli versions match", lambda: self._viz_proxy_versions(namespace),
                  f"kubectl -n {namespace} rollout restart deploy", warning=True),
            Check("prometheus is installed and configured correctly", lambda: self._prometheus(namespace), hint),
        ])

    def _proxy_metrics(self, scraped: Callable[[], set[tuple[str, str]]]) -> None:
        pods = self._data_pods()
        if not pods:
            raise Problem('No "linkerd-proxy" containers found')
        have = scraped()
        missing = sorted(f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}" for p in pods
                         if (p["metadata"].get("namespace", ""), p["metadata"]["name"]) not in have)
        if missing:
            raise Problem(f"Data plane metrics not found for {', '.join(missing)}.")

    def viz_categories(self, namespace: str | None, *,
                       scraped: Callable[[], set[tuple[str, str]]] | None = None) -> Iterator[Category]:
        """``tether viz check --platform kubernetes``: the API server's categories, then viz's, for the namespace
        labelled ``linkerd.io/extension=viz`` (or ``namespace``); with ``scraped`` (``--proxy``: the (namespace,
        pod) pairs whose proxy metrics Prometheus holds) ``linkerd-viz-data-plane`` for the meshed pods of this
        checker's namespace (all without one)."""
        yield from self.api_categories()
        if namespace is None:
            found = self._extension_namespaces().get("viz") or ["linkerd-viz"]
            namespace = sorted(found)[0]
        yield from self._viz_categories(namespace)
        if scraped is not None:
            yield Category("linkerd-viz-data-plane", [
                Check("data plane namespace exists", self._data_namespace, "create it, or pass another -n"),
                Check("data plane proxy metrics are present in Prometheus", lambda: self._proxy_metrics(scraped),
                      "wait for Prometheus' next scrape; `tether viz check` lists the failing scrapes", retry=True),
            ])

    # -- all -------------------------------------------------------------------------------------

    def categories(self, *, pre: bool, crds: bool, proxy: bool) -> Iterator[Category]:
        """In order; a generator, so the HA category is decided after linkerd-config was read."""
        yield from self.api_categories()
        if pre:
            yield self.pre_category()
            cni = self.cni_category()
            if cni is not None:
                yield cni
            return
        if crds:
            yield self.crd_category()
            return
        yield self.gateway_category()
        yield from (self.existence_category(), self.config_category())
        for optional in (self.cni_category, self.identity_category, self.webhook_category,
                         self.linkerd_version_category, self.version_category, self.control_plane_proxy_category,
                         self.ha_category):
            category = optional()  # each decided once the categories before it have run (linkerd-config read)
            if category is not None:
                yield category
        if proxy:
            yield from self.data_plane_categories()
        yield from self.extension_categories()
