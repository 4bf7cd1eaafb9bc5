"""``tether check --platform kubernetes``: Linkerd's categories against an API server.

``kubernetes-api`` (fatal), ``kubernetes-version``, ``linkerd-existence`` (fatal:
what ``tether install`` makes — namespace, ClusterRoles, ClusterRoleBindings,
ServiceAccounts, CRDs, the injector's MutatingWebhookConfiguration),
``linkerd-config``, ``linkerd-identity`` (the ``linkerd-identity-trust-roots``
ConfigMap and the ``linkerd-identity-issuer`` Secret), ``linkerd-webhooks-and-apisvc-tls``,
``control-plane-version``, ``linkerd-ha-checks`` (when ``highAvailability``),
and with ``--proxy`` the data plane categories; ``--pre`` and ``--crds`` run only
their own category.  Every answer is read with ``KubeClient`` (GETs only).

The objects to expect come from the caller (``tether.cli.check`` renders what
``tether install`` prints), so this module does not import the CLI.  Caller:
``tether.cli.check``.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

from tether.diagnose.certs import EXPIRY_WARNING, Credentials, IdentityHints, identity_checks, validity_problem
from tether.diagnose.checks import Category, Check, Problem
from tether.diagnose.local import opaque_port_problems
from tether.identity import pem
from tether.injector.annotations import PROXY_VERSION, TRUST_ROOT_SHA256, trust_root_sha256
from tether.platform.kubernetes.client import ApiError, ClientSettings, KubeClient, KubeError

MINIMUM_VERSION = (1, 31)
COMPONENT_LABEL = "linkerd.io/control-plane-component"
VERSION_LABEL = "app.kubernetes.io/version"
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


def _version(text: str) -> tuple[int, int] | None:
    match = re.match(r"^v?(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


class KubeChecks:
    def __init__(self, settings: ClientSettings, cli_version: str, namespace: str | None, expected: Expected,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.settings = settings
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

    def crd_category(self) -> Category:
        return Category("linkerd-crd", [
            Check("control plane CustomResourceDefinitions exist", lambda: self._missing("CustomResourceDefinition"),
                  "apply `tether install --crds`", retry=True),
        ])

    def _namespace_free(self) -> None:
        if self._cp in {n["metadata"]["name"] for n in self._list("/api/v1/namespaces")}:
            raise Problem(f'The "{self._cp}" namespace already exists')

    def pre_category(self) -> Category:
        return Category("pre-kubernetes-setup", [
            Check("control plane namespace does not already exist", self._namespace_free,
                  "uninstall first (`tether uninstall | kubectl delete -f -`), or use another namespace"),
        ])

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

    def config_category(self) -> Category:
        return Category("linkerd-config", [
            Check("'linkerd-config' config map exists", self._config_map, INSTALL_HINT),
            Check("control plane pods are ready", self._components_ready,
                  f"kubectl -n {self._cp} get pods; kubectl -n {self._cp} describe pods", retry=True),
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
        roots = self._get(f"/api/v1/namespaces/{self._cp}/configmaps/linkerd-identity-trust-roots")
        text = ((roots or {}).get("data") or {}).get("ca-bundle.crt")
        if not text:
            raise Problem("the linkerd-identity-trust-roots ConfigMap has no ca-bundle.crt")
        return text

    def _credentials(self) -> Credentials:
        try:
            anchors = pem.parse_certificates(self._anchors_pem().encode(), "linkerd-identity-trust-roots")
            issuer = pem.parse_certificates(self._secret_pem("linkerd-identity-issuer", "crt.pem", "tls.crt").encode(),
                                            "linkerd-identity-issuer")[0]
        except pem.PemError as exc:
            raise Problem(str(exc)) from None
        return Credentials(anchors, issuer)

    def identity_category(self) -> Category:
        hints = IdentityHints(
            config=f"the anchors are in ConfigMap {self._cp}/linkerd-identity-trust-roots, the issuer in Secret "
                   f"{self._cp}/linkerd-identity-issuer: `tether upgrade` rewrites them",
            anchors="rotate the trust anchors (`tether identity create-trust-anchor`, then `tether upgrade "
                    "--identity-trust-anchors-file`)",
            issuer="rotate the issuer (`tether identity create-issuer`, then `tether upgrade "
                   "--identity-issuer-certificate-file ... --identity-issuer-key-file ...`)",
        )
        return Category("linkerd-identity", identity_checks(self._credentials, self.now, hints))

    def _webhook_cert(self) -> Any:
        text = self._secret_pem("linkerd-proxy-injector-k8s-tls", "tls.crt")
        try:
            return pem.parse_certificates(text.encode(), "linkerd-proxy-injector-k8s-tls")[0]
        except pem.PemError as exc:
            raise Problem(str(exc)) from None

    def _webhook_valid(self) -> None:
        problem = validity_problem(self._webhook_cert(), self.now())
        if problem:
            raise Problem(f"proxy-injector cert {problem}")

    def _webhook_not_expiring(self) -> None:
        cert = self._webhook_cert()
        if cert.not_valid_after_utc - self.now() < EXPIRY_WARNING:
            raise Problem(f"proxy-injector cert will expire on {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")

    def webhook_category(self) -> Category:
        hint = "re-run `tether upgrade`: it issues the webhook's certificate anew when it is near its end"
        return Category("linkerd-webhooks-and-apisvc-tls", [
            Check("proxy-injector webhook has valid cert", self._webhook_valid, hint),
            Check("proxy-injector cert is valid for at least 60 days", self._webhook_not_expiring, hint, warning=True),
        ])

    # -- versions and HA -------------------------------------------------------------------------------

    def _cp_versions(self) -> dict[str, str]:
        pods = self._control_pods()
        if not pods:
            raise Problem(f"no control plane pods in {self._cp}")
        return {p["metadata"]["name"]: p["metadata"]["labels"].get(VERSION_LABEL, "unknown") for p in pods}

    def _versions_match(self) -> None:
        other = sorted({v for v in self._cp_versions().values() if v != self.cli_version})
        if other:
            raise Problem(f"control plane running {', '.join(other)} but cli running {self.cli_version}")

    def version_category(self) -> Category:
        return Category("control-plane-version", [
            Check("can retrieve the control plane version", lambda: self._cp_versions() and None, INSTALL_HINT),
            Check("control plane and cli versions match", self._versions_match,
                  "upgrade the control plane (`tether upgrade`) or use the matching cli", warning=True),
        ])

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
        unready = []
        for pod in pods:
            statuses = [*((pod.get("status") or {}).get("initContainerStatuses") or ()),
                        *((pod.get("status") or {}).get("containerStatuses") or ())]
            proxy = next((s for s in statuses if s.get("name") == PROXY_CONTAINER), None)
            if proxy is None or not proxy.get("ready"):
                unready.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
        if unready:
            raise Problem("\n".join(f"* {p}: the linkerd-proxy container is not ready" for p in unready))

    def _trust_roots(self) -> None:
        current = trust_root_sha256(self._anchors_pem())
        stale = [f"* {p['metadata']['namespace']}/{p['metadata']['name']}" for p in self._data_pods()
                 if (p["metadata"].get("annotations") or {}).get(TRUST_ROOT_SHA256) != current]
        if stale:
            raise Problem("\n".join(["Some pods do not have the current trust bundle and must be restarted:",
                                     *stale]))

    def _proxy_versions(self) -> None:
        other = [f"* {p['metadata']['namespace']}/{p['metadata']['name']} runs proxy "
                 f"{(p['metadata'].get('annotations') or {}).get(PROXY_VERSION, 'unknown')}"
                 for p in self._data_pods()
                 if (p["metadata"].get("annotations") or {}).get(PROXY_VERSION) != self.cli_version]
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

    # -- all -------------------------------------------------------------------------------------

    def categories(self, *, pre: bool, crds: bool, proxy: bool) -> Iterator[Category]:
        """In order; a generator, so the HA category is decided after linkerd-config was read."""
        yield from self.api_categories()
        if pre:
            yield self.pre_category()
            return
        if crds:
            yield self.crd_category()
            return
        yield from (self.existence_category(), self.config_category(), self.identity_category(),
                    self.webhook_category(), self.version_category())
        ha = self.ha_category()
        if ha is not None:
            yield ha
        if proxy:
            yield from self.data_plane_categories()
