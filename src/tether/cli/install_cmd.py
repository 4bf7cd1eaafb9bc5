"""``tether install``, ``tether upgrade``, ``tether uninstall``: print the manifests of the mesh on Kubernetes.

Registered by ``tether.cli.main``.  Like ``linkerd install`` these print YAML for
``kubectl apply -f -`` and never talk to a cluster:

* ``install --crds``: the CustomResourceDefinitions of every mesh kind
  (``tether.cli.manifests.crds``);
* ``install``: the control plane in its namespace: service accounts, RBAC, the
  identity issuer Secret and trust-roots ConfigMap (generated with
  ``tether.identity.pki`` unless ``--identity-external-issuer`` or given as files),
  ``linkerd-config`` (the values, read by the proxy injector), the serving
  certificates of the destination and the webhook, Deployments and Services for
  identity, destination, the policy controller (``linkerd-policy``) and the proxy
  injector, the MutatingWebhookConfiguration and the policy controller's
  ValidatingWebhookConfiguration with their CA bundles; ``--ha`` lays ``values-ha.yaml`` over the defaults (3 replicas,
  anti-affinity, disruption budgets);
* ``upgrade``: the same, keeping the issuer, the trust anchors, the serving
  certificates and the stored values of a previous install (read from ``--from``, a
  file of the previous output or of ``kubectl get ... -o yaml``);
* ``uninstall``: every object ``install`` makes, named only, for ``kubectl delete -f -``.

Values use Linkerd's key names: defaults (``manifests/values.yaml``) < ``--ha`` <
the previous install's values (upgrade) < ``-f`` files in order < ``--set``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tether import __version__
from tether.cli.errors import CliError
from tether.cli.manifests import crds, load_values
from tether.identity import pem, pki
from tether.naming import TRUST_ROOTS_CONFIGMAP, InvalidName, check_label, check_trust_domain, control_plane_identity

Obj = dict[str, Any]

CA_LIFETIME = timedelta(days=365)
PRIVATE_VALUES = (("identity", "issuer", "tls", "keyPEM"), ("proxyInjector", "keyPEM"),
                  ("destinationController", "tls", "keyPEM"))

# Where the control-plane containers find their files (Linkerd's mount points).
TRUST_ROOTS_DIR = "/var/run/linkerd/identity/trust-roots"
ISSUER_DIR = "/var/run/linkerd/identity/issuer"
TLS_DIR = "/var/run/linkerd/tls"
CONFIG_DIR = "/var/run/linkerd/config"

# Names of the objects, as Linkerd's charts name them (proxies and tools look for these).
ISSUER_SECRET = "linkerd-identity-issuer"
CONFIG = "linkerd-config"
DESTINATION_TLS = "linkerd-destination-tls"
INJECTOR_TLS = "linkerd-proxy-injector-k8s-tls"
WEBHOOK_CONFIG = "linkerd-proxy-injector-webhook-config"
POLICY_VALIDATOR_TLS = "linkerd-policy-validator-k8s-tls"
POLICY_WEBHOOK_CONFIG = "linkerd-policy-validator-webhook-config"
POLICY_TLS_DIR = "/var/run/linkerd/policy-validator-tls"


class ValuesError(CliError):
    """A value that cannot be used; the message names its key."""


# -- values -------------------------------------------------------------------------------------------


def merge(base: Obj, overlay: Obj) -> Obj:
    """``overlay`` over ``base``, maps merged key by key (as Helm merges values); a new object."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_SET_PART = re.compile(r"^([^\[\]]+)(?:\[(\d+)\])?$")


def _split_unescaped(text: str, sep: str) -> list[str]:
    """Split at ``sep`` except where written ``\\<sep>``; other escapes stay for the next split."""
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append(char if char == sep else "\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _scalar(text: str) -> Any:
    """Helm's ``--set`` typing: true/false, null, integers; everything else stays a string."""
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def apply_set(values: Obj, expression: str) -> Obj:
    """Apply one ``--set`` argument (``a.b=1,c.d[0]=x``; ``\\,`` and ``\\.`` escape) to a copy of ``values``."""
    out = copy.deepcopy(values)
    for assignment in _split_unescaped(expression, ","):
        path, sep, raw = assignment.partition("=")
        if not sep or not path:
            raise ValuesError(f"--set {expression}: expected key=value")
        keys = _split_unescaped(path, ".")
        node: Any = out
        for depth, key in enumerate(keys):
            match = _SET_PART.match(key)
            if match is None:
                raise ValuesError(f"--set {expression}: bad key {key!r}")
            name, index = match.group(1), match.group(2)
            last = depth == len(keys) - 1
            if not isinstance(node, dict):
                raise ValuesError(f"--set {expression}: {'.'.join(keys[:depth])} is not a map")
            if index is None:
                if last:
                    node[name] = _scalar(raw)
                else:
                    if not isinstance(node.get(name), dict):
                        node[name] = {}
                    node = node[name]
                continue
            items = node.get(name)
            if not isinstance(items, list):
                items = node[name] = []
            position = int(index)
            while len(items) <= position:
                items.append({} if not last else None)
            if last:
                items[position] = _scalar(raw)
            else:
                if not isinstance(items[position], dict):
                    items[position] = {}
                node = items[position]
    return out


def _load_values_file(path: Path) -> Obj:
    try:
        data = yaml.safe_load(path.read_text()) if str(path) != "-" else yaml.safe_load(sys.stdin.read())
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CliError(f"{path}: a values file must be a YAML map")
    return data


def build_values(ha: bool, previous: Obj | None, files: tuple[Path, ...], sets: tuple[str, ...]) -> Obj:
    values = load_values("values.yaml")
    if ha:
        values = merge(values, load_values("values-ha.yaml"))
    if previous:
        values = merge(values, previous)
    for path in files:
        values = merge(values, _load_values_file(path))
    for expression in sets:
        values = apply_set(values, expression)
    if not values.get("linkerdVersion"):
        values["linkerdVersion"] = __version__
    return values


def _get(values: Obj, *path: str, default: Any = None) -> Any:
    node: Any = values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def _text(values: Obj, *path: str) -> str:
    value = _get(values, *path)
    if value is None or isinstance(value, dict | list):
        raise ValuesError(f"{'.'.join(path)}: expected a string, found {value!r}")
    return str(value)


def _int(values: Obj, *path: str, minimum: int = 0) -> int:
    value = _get(values, *path)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValuesError(f"{'.'.join(path)}: expected an integer of at least {minimum}, found {value!r}")
    return value


def without_private(values: Obj) -> Obj:
    out = copy.deepcopy(values)
    for path in PRIVATE_VALUES:
        node = _get(out, *path[:-1])
        if isinstance(node, dict) and path[-1] in node:
            node[path[-1]] = ""
    return out


# -- certificates -------------------------------------------------------------------------------------


@dataclass
class Credentials:
    """Every certificate and key the control plane needs, as PEM text ("" where not ours to hold)."""

    anchors: str
    issuer_crt: str = ""
    issuer_key: str = ""
    destination_crt: str = ""
    destination_key: str = ""
    webhook_ca: str = ""
    webhook_crt: str = ""
    webhook_key: str = ""
    policy_webhook_ca: str = ""
    policy_webhook_crt: str = ""
    policy_webhook_key: str = ""


def _pem_cert(cert: x509.Certificate) -> str:
    return pem.certificate_pem(cert).decode()


def _leaf(
    name: str, sans: list[x509.GeneralName], signer: x509.Certificate, signer_key: Any, now: datetime,
    valid_for: timedelta,
) -> tuple[str, str]:
    key = pki.new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
        .issuer_name(signer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(min(now + valid_for, signer.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, content_commitment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(pki.authority_key_id(signer), critical=False)
        .sign(signer_key, hashes.SHA256())
    )
    return _pem_cert(cert), pem.private_key_pem(key).decode()


def webhook_certificate(service: str, cluster_domain: str, now: datetime) -> tuple[str, str, str]:
    """A webhook's self-signed CA (its caBundle) and serving certificate and key for ``service`` (``name.ns.svc``)."""
    ca, ca_key = _webhook_ca(now, service)
    crt, key = _leaf(service, [x509.DNSName(service), x509.DNSName(f"{service}.{cluster_domain}")],
                     ca, ca_key, now, CA_LIFETIME)
    return _pem_cert(ca), crt, key


def _webhook_ca(now: datetime, service: str) -> tuple[x509.Certificate, Any]:
    key = pki.new_key()
    # Not the service's own name: a leaf whose issuer name equals its subject looks self-signed to OpenSSL.
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"webhook CA {service}"[:64])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _parse_certs(text: str, what: str) -> list[x509.Certificate]:
    try:
        return pem.parse_certificates(text.encode(), what)
    except pem.PemError as exc:
        raise CliError(str(exc)) from None


def complete_credentials(creds: Credentials, values: Obj, external_issuer: bool, now: datetime) -> Credentials:
    """Generate what is missing: anchors + issuer (unless external), the destination and webhook certificates."""
    namespace = _text(values, "controllerNamespace")
    trust_domain = _text(values, "identityTrustDomain") or _text(values, "clusterDomain")
    if not creds.anchors:
        if external_issuer:
            raise CliError("--identity-external-issuer needs the trust anchors: --identity-trust-anchors-file FILE "
                           "(the ca.crt of the issuer Secret) or --set identityTrustAnchorsPEM=...")
        anchor, anchor_key = pki.create_trust_anchor(control_plane_ns=namespace, trust_domain=trust_domain,
                                                     valid_for=CA_LIFETIME, now=now)
        issuer, issuer_key = pki.create_issuer(anchor, anchor_key, control_plane_ns=namespace,
                                               trust_domain=trust_domain, valid_for=CA_LIFETIME, now=now)
        creds.anchors = _pem_cert(anchor)
        creds.issuer_crt, creds.issuer_key = _pem_cert(issuer), pem.private_key_pem(issuer_key).decode()
    anchors = _parse_certs(creds.anchors, "trust anchors")
    if not external_issuer:
        if not (creds.issuer_crt and creds.issuer_key):
            raise CliError("the trust anchors were given without the issuer: give --identity-issuer-certificate-file "
                           "and --identity-issuer-key-file too (or --identity-external-issuer)")
        chain = _parse_certs(creds.issuer_crt, "issuer certificate")
        problems = [f"{v.signer}: {v.problem}" for v in pki.chain_verdicts(chain, anchors) if v.problem]
        if problems:
            raise CliError(f"the issuer certificate does not chain to the trust anchors: {'; '.join(problems)}")
        if not pki.is_ca(chain[0]):
            raise CliError("the issuer certificate is not a CA")
        if chain[0].not_valid_after_utc <= now:
            raise CliError(f"the issuer certificate expired on {chain[0].not_valid_after_utc:%Y-%m-%d}")
        try:
            issuer_key = pem.parse_private_key(creds.issuer_key.encode(), "issuer key")
            pki.check_ca_pair(chain[0], issuer_key)
        except (pem.PemError, pki.PkiError) as exc:
            raise CliError(f"issuer key: {exc}") from None
        if not creds.destination_crt:
            identity = control_plane_identity("destination", namespace, trust_domain).dns_name
            creds.destination_crt, creds.destination_key = _leaf(
                identity, [x509.DNSName(identity)], chain[0], issuer_key, now, CA_LIFETIME)
            creds.destination_crt += creds.issuer_crt if creds.issuer_crt.endswith("\n") else "\n" + creds.issuer_crt
    if not creds.webhook_crt:
        creds.webhook_ca, creds.webhook_crt, creds.webhook_key = webhook_certificate(
            f"linkerd-proxy-injector.{namespace}.svc", _text(values, "clusterDomain"), now)
    if not creds.policy_webhook_crt:
        creds.policy_webhook_ca, creds.policy_webhook_crt, creds.policy_webhook_key = webhook_certificate(
            f"linkerd-policy-validator.{namespace}.svc", _text(values, "clusterDomain"), now)
    return creds


# -- objects ------------------------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


class Renderer:
    """Builds the control plane's objects from merged values and complete credentials."""

    def __init__(self, values: Obj, creds: Credentials, external_issuer: bool) -> None:
        self.values = values
        self.creds = creds
        self.external_issuer = external_issuer
        try:
            self.ns = check_label("controllerNamespace", _text(values, "controllerNamespace"))
            self.cluster_domain = check_trust_domain(_text(values, "clusterDomain"))
            self.trust_domain = check_trust_domain(_text(values, "identityTrustDomain") or self.cluster_domain)
        except InvalidName as exc:
            raise ValuesError(str(exc)) from None
        self.version = _text(values, "linkerdVersion")
        self.image = f"{_text(values, 'controllerImage')}:{_text(values, 'controllerImageVersion') or self.version}"
        self.replicas = _int(values, "controllerReplicas", minimum=1)
        self.scheme = "kubernetes.io/tls" if external_issuer else _text(values, "identity", "issuer", "scheme")

    # -- helpers --

    def labels(self, component: str | None = None) -> dict[str, str]:
        labels = {"linkerd.io/control-plane-ns": self.ns, "app.kubernetes.io/part-of": "tether",
                  "app.kubernetes.io/version": self.version}
        if component:
            labels["linkerd.io/control-plane-component"] = component
            labels["app.kubernetes.io/name"] = component
        return labels

    def meta(self, name: str, component: str | None = None, *, namespaced: bool = True,
             annotations: dict[str, str] | None = None) -> Obj:
        metadata: Obj = {"name": name}
        if namespaced:
            metadata["namespace"] = self.ns
        metadata["labels"] = self.labels(component)
        if annotations:
            metadata["annotations"] = annotations
        return metadata

    def resources(self, key: str) -> Obj:
        spec = _get(self.values, key, default={}) or {}
        out: Obj = {}
        for kind in ("cpu", "memory", "ephemeral-storage"):
            for which, target in (("request", "requests"), ("limit", "limits")):
                value = _get(spec, kind, which)
                if value not in (None, ""):
                    out.setdefault(target, {})[kind] = str(value)
        return out

    # -- the objects --

    def render(self) -> list[Obj]:
        objects: list[Obj] = [self.namespace()]
        for component in ("identity", "destination", "policy", "proxy-injector"):
            objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": self.meta(f"linkerd-{component}", component)})
        objects += self.rbac()
        objects += self.secrets_and_config()
        objects += self.services()
        objects += self.deployments()
        if _get(self.values, "enablePodDisruptionBudget"):
            objects += [self.disruption_budget(c) for c in ("identity", "destination", "policy", "proxy-injector")]
        objects.append(self.webhook())
        objects.append(self.policy_webhook())
        return objects

    def namespace(self) -> Obj:
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": self.ns,
            "labels": {"linkerd.io/is-control-plane": "true", "config.linkerd.io/admission-webhooks": "disabled",
                       "linkerd.io/control-plane-ns": self.ns},
            "annotations": {"linkerd.io/inject": "disabled"},
        }}

    def rbac(self) -> list[Obj]:
        watch = ["get", "list", "watch"]
        rules = {
            "identity": [
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            ],
            "destination": [
                {"apiGroups": [""], "resources": ["pods", "services", "endpoints", "namespaces", "nodes"], "verbs": watch},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": [*watch, "create", "update", "patch", "delete"]},  # the ExternalWorkload controller
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],  # its writer's Lease
                 "verbs": ["get", "create", "update", "patch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},  # on objects it cannot use
                {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": watch},
                {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": watch},
                {"apiGroups": ["linkerd.io"], "resources": ["serviceprofiles"], "verbs": watch},
                {"apiGroups": ["policy.linkerd.io"], "resources": [
                    "servers", "serverauthorizations", "authorizationpolicies", "meshtlsauthentications",
                    "networkauthentications", "httproutes", "httplocalratelimitpolicies", "egressnetworks"],
                 "verbs": watch},
                {"apiGroups": ["workload.linkerd.io"], "resources": ["externalworkloads"], "verbs": watch},
                {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes", "grpcroutes"], "verbs": watch},
            ],
            "policy": [
                {"apiGroups": [""], "resources": ["pods", "services", "namespaces"], "verbs": watch},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": watch},
                {"apiGroups": ["policy.linkerd.io"], "resources": [
                    "servers", "serverauthorizations", "authorizationpolicies", "meshtlsauthentications",
                    "networkauthentications", "httproutes", "httplocalratelimitpolicies", "egressnetworks"],
                 "verbs": watch},
                {"apiGroups": ["policy.linkerd.io"], "resources": [
                    "httproutes/status", "httplocalratelimitpolicies/status", "egressnetworks/status"],
                 "verbs": ["patch"]},
                {"apiGroups": ["workload.linkerd.io"], "resources": ["externalworkloads"], "verbs": watch},
                {"apiGroups": ["gateway.networking.k8s.io"],
                 "resources": ["httproutes", "grpcroutes", "tlsroutes", "tcproutes"], "verbs": watch},
                {"apiGroups": ["gateway.networking.k8s.io"],
                 "resources": ["httproutes/status", "grpcroutes/status", "tlsroutes/status", "tcproutes/status"],
                 "verbs": ["patch"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "verbs": ["create", "get", "list", "watch", "update", "patch"]},
            ],
            "proxy-injector": [
                {"apiGroups": [""], "resources": ["namespaces", "replicationcontrollers"], "verbs": watch},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                {"apiGroups": ["apps"], "resources": ["replicasets", "deployments", "statefulsets", "daemonsets"],
                 "verbs": watch},
                {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": watch},
            ],
        }
        objects: list[Obj] = []
        for component, component_rules in rules.items():
            name = f"linkerd-{self.ns}-{component}"
            objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": self.meta(name, component, namespaced=False), "rules": component_rules})
            objects.append({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": self.meta(name, component, namespaced=False),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": f"linkerd-{component}", "namespace": self.ns}],
            })
        return objects

    def secrets_and_config(self) -> list[Obj]:
        c = self.creds
        objects: list[Obj] = []
        if not self.external_issuer:
            objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                            "metadata": self.meta(ISSUER_SECRET, "identity",
                                                  annotations={"linkerd.io/identity-issuer-expiry": self._expiry(c.issuer_crt)}),
                            "data": {"crt.pem": _b64(c.issuer_crt), "key.pem": _b64(c.issuer_key)}})
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": self.meta(TRUST_ROOTS_CONFIGMAP, "identity"), "data": {"ca-bundle.crt": c.anchors}})
        stored = without_private(self.values)
        stored["identityTrustAnchorsPEM"] = c.anchors
        stored["controllerNamespace"] = self.ns
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta(CONFIG),
                        "data": {"values": yaml.safe_dump(stored, sort_keys=True)}})
        if c.destination_crt:
            objects.append({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                            "metadata": self.meta(DESTINATION_TLS, "destination"),
                            "data": {"tls.crt": _b64(c.destination_crt), "tls.key": _b64(c.destination_key)}})
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                        "metadata": self.meta(INJECTOR_TLS, "proxy-injector"),
                        "data": {"tls.crt": _b64(c.webhook_crt), "tls.key": _b64(c.webhook_key),
                                 "ca.crt": _b64(c.webhook_ca)}})
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                        "metadata": self.meta(POLICY_VALIDATOR_TLS, "policy"),
                        "data": {"tls.crt": _b64(c.policy_webhook_crt), "tls.key": _b64(c.policy_webhook_key),
                                 "ca.crt": _b64(c.policy_webhook_ca)}})
        return objects

    @staticmethod
    def _expiry(crt: str) -> str:
        return _parse_certs(crt, "issuer certificate")[0].not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")

    def services(self) -> list[Obj]:
        def service(name: str, component: str, port: int, target: str, *, headless: bool = False,
                    port_name: str = "grpc") -> Obj:
            spec: Obj = {"type": "ClusterIP", "selector": self.selector(component),
                         "ports": [{"name": port_name, "port": port, "targetPort": target}]}
            if headless:
                spec["clusterIP"] = "None"
            return {"apiVersion": "v1", "kind": "Service", "metadata": self.meta(name, component), "spec": spec}

        return [
            service("linkerd-identity", "identity", 8080, "grpc"),
            service("linkerd-identity-headless", "identity", 8080, "grpc", headless=True),
            service("linkerd-dst", "destination", 8086, "grpc"),
            service("linkerd-dst-headless", "destination", 8086, "grpc", headless=True),
            service("linkerd-proxy-injector", "proxy-injector", 443, "proxy-injector", port_name="proxy-injector"),
            # The name the injector points proxies at (LINKERD2_PROXY_POLICY_SVC_ADDR).
            service("linkerd-policy", "policy", 8090, "grpc"),
            service("linkerd-policy-validator", "policy", 443, "policy-https", port_name="policy-https"),
        ]

    def selector(self, component: str) -> dict[str, str]:
        return {"linkerd.io/control-plane-component": component, "linkerd.io/control-plane-ns": self.ns}

    def deployments(self) -> list[Obj]:
        td, ns = self.trust_domain, self.ns
        issuer_files = ("tls.crt", "tls.key") if self.scheme == "kubernetes.io/tls" else ("crt.pem", "key.pem")
        anchors_file = f"{TRUST_ROOTS_DIR}/ca-bundle.crt"
        identity_args = [
            "identity", "serve", "--platform=kubernetes", "--addr=0.0.0.0:8080", "--admin-addr=0.0.0.0:9990",
            f"--trust-anchors={anchors_file}", f"--issuer-cert={ISSUER_DIR}/{issuer_files[0]}",
            f"--issuer-key={ISSUER_DIR}/{issuer_files[1]}", f"--trust-domain={td}", f"--control-plane-ns={ns}",
            f"--issuance-lifetime={_go_duration(_text(self.values, 'identity', 'issuer', 'issuanceLifetime'))}",
            f"--clock-skew-allowance={_go_duration(_text(self.values, 'identity', 'issuer', 'clockSkewAllowance'))}",
            f"--log-level={self._log_level()}",
        ]
        destination_args = [
            "destination", "serve", "--platform=kubernetes", "--addr=0.0.0.0:8086", "--admin-addr=0.0.0.0:9996",
            f"--tls-cert={TLS_DIR}/tls.crt", f"--tls-key={TLS_DIR}/tls.key",
            f"--cluster-domain={self.cluster_domain}", f"--identity-trust-domain={td}", f"--controller-namespace={ns}",
            f"--default-opaque-ports={_text(self.values, 'proxy', 'opaquePorts')}",
            f"--stream-queue-capacity={_int(self.values, 'destinationController', 'streamQueueCapacity', minimum=1)}",
            "--enable-h2-upgrade" if _get(self.values, "enableH2Upgrade", default=True) else "--disable-h2-upgrade",
            "--disable-ipv6" if _get(self.values, "disableIPv6", default=True) else "--enable-ipv6",
            f"--outbound-transport-mode={_text(self.values, 'proxy', 'outboundTransportMode')}",
            f"--log-level={self._log_level()}",
        ]
        policy_args = [
            "policy", "serve", "--platform=kubernetes", "--addr=0.0.0.0:8090", "--admin-addr=0.0.0.0:9990",
            f"--tls-cert={TLS_DIR}/tls.crt", f"--tls-key={TLS_DIR}/tls.key",
            "--server-addr=0.0.0.0:9443", f"--server-tls-cert={POLICY_TLS_DIR}/tls.crt",
            f"--server-tls-key={POLICY_TLS_DIR}/tls.key",
            f"--cluster-networks={_text(self.values, 'clusterNetworks')}",
            f"--default-policy={_text(self.values, 'proxy', 'defaultInboundPolicy')}",
            f"--identity-domain={td}", f"--cluster-domain={self.cluster_domain}", f"--control-plane-namespace={ns}",
            f"--default-opaque-ports={_text(self.values, 'proxy', 'opaquePorts')}",
            f"--log-level={self._log_level()}",
        ]
        injector_args = [
            "injector", "serve", "--platform=kubernetes", "--addr=0.0.0.0:8443", "--admin-addr=0.0.0.0:9995",
            f"--tls-cert={TLS_DIR}/tls.crt", f"--tls-key={TLS_DIR}/tls.key", f"--values={CONFIG_DIR}/values",
            f"--identity-trust-anchors-file={anchors_file}",
            f"--failure-policy={_text(self.values, 'webhookFailurePolicy')}", f"--log-level={self._log_level()}",
        ]
        trust_roots = {"name": "trust-roots", "configMap": {"name": TRUST_ROOTS_CONFIGMAP}}
        trust_mount = {"name": "trust-roots", "mountPath": TRUST_ROOTS_DIR, "readOnly": True}
        config_hash = hashlib.sha256(json.dumps(without_private(self.values), sort_keys=True).encode()).hexdigest()
        return [
            self.deployment("identity", identity_args, grpc_port=8080, admin_port=9990,
                            volumes=[{"name": "identity-issuer", "secret": {"secretName": ISSUER_SECRET}}, trust_roots],
                            mounts=[{"name": "identity-issuer", "mountPath": ISSUER_DIR, "readOnly": True}, trust_mount],
                            checksum=hashlib.sha256((self.creds.issuer_crt + self.creds.anchors).encode()).hexdigest()),
            self.deployment("destination", destination_args, grpc_port=8086, admin_port=9996,
                            volumes=[{"name": "tls", "secret": {"secretName": DESTINATION_TLS}}],
                            mounts=[{"name": "tls", "mountPath": TLS_DIR, "readOnly": True}],
                            checksum=hashlib.sha256(self.creds.destination_crt.encode()).hexdigest()),
            # Serves gRPC with the destination's identity, which proxies expect of the policy service too.
            self.deployment("policy", policy_args, grpc_port=8090, admin_port=9990,
                            volumes=[{"name": "tls", "secret": {"secretName": DESTINATION_TLS}},
                                     {"name": "validator-tls", "secret": {"secretName": POLICY_VALIDATOR_TLS}}],
                            mounts=[{"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
                                    {"name": "validator-tls", "mountPath": POLICY_TLS_DIR, "readOnly": True}],
                            checksum=hashlib.sha256((self.creds.destination_crt
                                                     + self.creds.policy_webhook_crt).encode()).hexdigest(),
                            extra_ports=[{"name": "policy-https", "containerPort": 9443}]),
            self.deployment("proxy-injector", injector_args, grpc_port=8443, admin_port=9995, port_name="proxy-injector",
                            volumes=[{"name": "tls", "secret": {"secretName": INJECTOR_TLS}},
                                     {"name": "config", "configMap": {"name": CONFIG}}, trust_roots],
                            mounts=[{"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
                                    {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}, trust_mount],
                            checksum=config_hash),
        ]

    def _log_level(self) -> str:
        level = _text(self.values, "controllerLogLevel").lower()
        return {"warn": "warning", "trace": "debug"}.get(level, level)

    def deployment(self, component: str, args: list[str], *, grpc_port: int, admin_port: int, volumes: list[Obj],
                   mounts: list[Obj], checksum: str, port_name: str = "grpc",
                   extra_ports: list[Obj] | None = None) -> Obj:
        uid = _int(self.values, "controllerUID", minimum=1)
        gid = _get(self.values, "controllerGID", default=-1)
        security: Obj = {"runAsNonRoot": True, "runAsUser": uid, "allowPrivilegeEscalation": False,
                         "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                         "seccompProfile": {"type": "RuntimeDefault"}}
        if isinstance(gid, int) and gid >= 0:
            security["runAsGroup"] = gid
        container: Obj = {
            "name": component,
            "image": self.image,
            "imagePullPolicy": _text(self.values, "imagePullPolicy"),
            "command": ["tether"],
            "args": args,
            "env": [{"name": "TETHER_HOME", "value": "/var/run/tether"}],
            "ports": [{"name": port_name, "containerPort": grpc_port},
                      {"name": "admin-http", "containerPort": admin_port}, *(extra_ports or [])],
            "livenessProbe": {"httpGet": {"path": "/live", "port": admin_port}, "initialDelaySeconds": 10,
                              "periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 3},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": admin_port}, "periodSeconds": 5,
                               "timeoutSeconds": 1, "failureThreshold": 7},
            "startupProbe": {"httpGet": {"path": "/live", "port": admin_port}, "periodSeconds": 2,
                             "timeoutSeconds": 1, "failureThreshold": 60},
            "resources": self.resources({"identity": "identityResources", "destination": "destinationResources",
                                         "policy": "policyControllerResources",
                                         "proxy-injector": "proxyInjectorResources"}[component]),
            "securityContext": security,
            "volumeMounts": [*mounts, {"name": "tether-home", "mountPath": "/var/run/tether"},
                             {"name": "tmp", "mountPath": "/tmp"}],
        }
        pod_labels = {**self.labels(component), **dict(_get(self.values, "podLabels", default={}) or {})}
        annotations = {"linkerd.io/created-by": f"tether/cli {self.version}", "linkerd.io/inject": "disabled",
                       "tether.io/config-checksum": checksum,
                       **dict(_get(self.values, "podAnnotations", default={}) or {})}
        pod_spec: Obj = {
            "serviceAccountName": f"linkerd-{component}",
            "automountServiceAccountToken": True,
            "nodeSelector": dict(_get(self.values, "nodeSelector", default={}) or {}),
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": [*volumes, {"name": "tether-home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
        }
        if _get(self.values, "tolerations"):
            pod_spec["tolerations"] = list(self.values["tolerations"])
        if _get(self.values, "priorityClassName"):
            pod_spec["priorityClassName"] = _text(self.values, "priorityClassName")
        if _get(self.values, "imagePullSecrets"):
            pod_spec["imagePullSecrets"] = list(self.values["imagePullSecrets"])
        if _get(self.values, "enablePodAntiAffinity"):
            term = {"labelSelector": {"matchLabels": self.selector(component)}}
            pod_spec["affinity"] = {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{**term, "topologyKey": "kubernetes.io/hostname"}],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {**term, "topologyKey": "topology.kubernetes.io/zone"}}],
            }}
        strategy = _get(self.values, "deploymentStrategy", default={}) or {}
        return {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": self.meta(f"linkerd-{component}", component),
            "spec": {
                "replicas": self.replicas,
                "revisionHistoryLimit": 10,
                "selector": {"matchLabels": self.selector(component)},
                "strategy": {"type": "RollingUpdate", **({"rollingUpdate": strategy["rollingUpdate"]}
                                                         if isinstance(strategy.get("rollingUpdate"), dict) else {})},
                "template": {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod_spec},
            },
        }

    def disruption_budget(self, component: str) -> Obj:
        return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": self.meta(f"linkerd-{component}", component),
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": self.selector(component)}}}

    def webhook(self) -> Obj:
        injector = _get(self.values, "proxyInjector", default={}) or {}
        hook: Obj = {
            "name": "linkerd-proxy-injector.linkerd.io",
            "clientConfig": {"service": {"name": "linkerd-proxy-injector", "namespace": self.ns, "path": "/",
                                         "port": 443},
                             "caBundle": _b64(self.creds.webhook_ca)},
            "failurePolicy": _text(self.values, "webhookFailurePolicy"),
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "reinvocationPolicy": "IfNeeded",
            "timeoutSeconds": _int(self.values, "proxyInjector", "timeoutSeconds", minimum=1),
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                       "scope": "Namespaced"}],
        }
        for key in ("namespaceSelector", "objectSelector"):
            if injector.get(key):
                hook[key] = injector[key]
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": self.meta(WEBHOOK_CONFIG, "proxy-injector", namespaced=False), "webhooks": [hook]}

    def policy_webhook(self) -> Obj:
        """Linkerd's policy validator: CREATE/UPDATE of the policy kinds, admitted by ``tether.policy.admission``."""
        hook: Obj = {
            "name": "linkerd-policy-validator.linkerd.io",
            "clientConfig": {"service": {"name": "linkerd-policy-validator", "namespace": self.ns, "path": "/",
                                         "port": 443},
                             "caBundle": _b64(self.creds.policy_webhook_ca)},
            "failurePolicy": "Ignore",
            "admissionReviewVersions": ["v1", "v1beta1"],
            "sideEffects": "None",
            "timeoutSeconds": 10,
            "rules": [
                {"operations": ["CREATE", "UPDATE"], "apiGroups": ["policy.linkerd.io"], "apiVersions": ["*"],
                 "resources": ["authorizationpolicies", "httplocalratelimitpolicies", "httproutes",
                               "networkauthentications", "meshtlsauthentications", "serverauthorizations",
                               "servers", "egressnetworks"]},
                {"operations": ["CREATE", "UPDATE"], "apiGroups": ["gateway.networking.k8s.io"],
                 "apiVersions": ["*"], "resources": ["httproutes", "grpcroutes", "tlsroutes", "tcproutes"]},
            ],
        }
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": self.meta(POLICY_WEBHOOK_CONFIG, "policy", namespaced=False), "webhooks": [hook]}


_GO_DURATION = re.compile(r"(\d+)(h|m|s|ms)")


def _go_duration(text: str) -> str:
    """``24h0m0s`` as ``tether identity serve`` reads it (zero parts dropped)."""
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValuesError(f"{text!r} is not a duration like 24h0m0s or 20s")
    kept = [n + u for n, u in parts if int(n)]
    return "".join(kept) or text


# -- reading a previous install -------------------------------------------------------------------------


def read_objects(path: Path) -> list[Obj]:
    """Objects of a YAML/JSON file: documents, and the items of ``List`` objects (``kubectl get -o yaml``)."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
        documents = list(yaml.safe_load_all(text))
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not YAML or JSON: {exc}") from None
    out: list[Obj] = []
    for document in documents:
        if isinstance(document, dict) and isinstance(document.get("items"), list):
            out += [item for item in document["items"] if isinstance(item, dict)]
        elif isinstance(document, dict):
            out.append(document)
    return out


def _secret_text(secret: Obj, key: str) -> str:
    if key in (secret.get("stringData") or {}):
        return str(secret["stringData"][key])
    raw = (secret.get("data") or {}).get(key)
    return _unb64(raw) if raw else ""


def previous_install(objects: list[Obj]) -> tuple[Credentials, Obj | None]:
    """The credentials and stored values found among a previous install's objects."""
    by_name = {(o.get("kind"), (o.get("metadata") or {}).get("name")): o for o in objects}
    creds = Credentials(anchors="")
    roots = by_name.get(("ConfigMap", TRUST_ROOTS_CONFIGMAP))
    if roots:
        creds.anchors = str((roots.get("data") or {}).get("ca-bundle.crt") or "")
    issuer = by_name.get(("Secret", ISSUER_SECRET))
    if issuer:
        creds.issuer_crt = _secret_text(issuer, "crt.pem") or _secret_text(issuer, "tls.crt")
        creds.issuer_key = _secret_text(issuer, "key.pem") or _secret_text(issuer, "tls.key")
        if not creds.anchors:
            creds.anchors = _secret_text(issuer, "ca.crt")
    destination = by_name.get(("Secret", DESTINATION_TLS))
    if destination:
        creds.destination_crt, creds.destination_key = _secret_text(destination, "tls.crt"), _secret_text(destination, "tls.key")
    validator = by_name.get(("Secret", POLICY_VALIDATOR_TLS))
    if validator and _secret_text(validator, "ca.crt"):
        creds.policy_webhook_crt, creds.policy_webhook_key = (_secret_text(validator, "tls.crt"),
                                                              _secret_text(validator, "tls.key"))
        creds.policy_webhook_ca = _secret_text(validator, "ca.crt")
    injector = by_name.get(("Secret", INJECTOR_TLS))
    if injector and _secret_text(injector, "ca.crt"):
        creds.webhook_crt, creds.webhook_key = _secret_text(injector, "tls.crt"), _secret_text(injector, "tls.key")
        creds.webhook_ca = _secret_text(injector, "ca.crt")
    values = None
    config = by_name.get(("ConfigMap", CONFIG))
    if config and (config.get("data") or {}).get("values"):
        loaded = yaml.safe_load(config["data"]["values"])
        if isinstance(loaded, dict):
            values = loaded
            values.pop("identityTrustAnchorsPEM", None)
            values.pop("linkerdVersion", None)  # an upgrade moves to this version
            for path in PRIVATE_VALUES:  # stored blank: never let them blank out the kept credentials
                node = _get(values, *path[:-1])
                if isinstance(node, dict):
                    node.pop(path[-1], None)
    return creds, values


def _read_pem_file(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text()
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None


def credentials_from(values: Obj, anchors_file: Path | None, issuer_crt_file: Path | None,
                     issuer_key_file: Path | None, base: Credentials | None = None) -> Credentials:
    creds = base or Credentials(anchors="")
    creds.anchors = _read_pem_file(anchors_file) or creds.anchors or str(values.get("identityTrustAnchorsPEM") or "")
    creds.issuer_crt = _read_pem_file(issuer_crt_file) or creds.issuer_crt or str(
        _get(values, "identity", "issuer", "tls", "crtPEM", default="") or "")
    creds.issuer_key = _read_pem_file(issuer_key_file) or creds.issuer_key or str(
        _get(values, "identity", "issuer", "tls", "keyPEM", default="") or "")
    creds.destination_crt = creds.destination_crt or str(_get(values, "destinationController", "tls", "crtPEM", default="") or "")
    creds.destination_key = creds.destination_key or str(_get(values, "destinationController", "tls", "keyPEM", default="") or "")
    injector = _get(values, "proxyInjector", default={}) or {}
    if injector.get("crtPEM") and injector.get("keyPEM") and injector.get("caBundle"):
        creds.webhook_crt, creds.webhook_key, creds.webhook_ca = (
            str(injector["crtPEM"]), str(injector["keyPEM"]), str(injector["caBundle"]))
    if bool(creds.issuer_crt) != bool(creds.issuer_key):
        raise CliError("give both the issuer certificate and its key")
    if creds.issuer_crt and not creds.anchors:
        raise CliError("the issuer was given without the trust anchors: give --identity-trust-anchors-file too")
    return creds


# -- output -------------------------------------------------------------------------------------------


def emit(objects: list[Obj], output: str) -> None:
    if output == "json":
        click.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
        return
    click.echo("\n".join("---\n" + yaml.safe_dump(o, sort_keys=False, width=1000).rstrip() for o in objects))


def render_all(values: Obj, creds: Credentials, external_issuer: bool) -> list[Obj]:
    return Renderer(values, creds, external_issuer).render()


# -- the commands ---------------------------------------------------------------------------------------

_values_options = [
    click.option("--ha", is_flag=True, help="High availability: values-ha.yaml (3 replicas, anti-affinity, PDBs)."),
    click.option("--identity-external-issuer", is_flag=True,
                 help="The issuer Secret (kubernetes.io/tls) is managed outside Tether, e.g. by cert-manager."),
    click.option("--identity-trust-anchors-file", type=click.Path(dir_okay=False, path_type=Path),
                 help="PEM trust anchors [default: generated]."),
    click.option("--identity-issuer-certificate-file", type=click.Path(dir_okay=False, path_type=Path),
                 help="PEM issuer certificate, signed by a trust anchor [default: generated]."),
    click.option("--identity-issuer-key-file", type=click.Path(dir_okay=False, path_type=Path),
                 help="PEM private key of the issuer [default: generated]."),
    click.option("-f", "--values", "values_files", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
                 help="A values file (Linkerd's keys); repeatable, later files win."),
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                 help="Set a value (a.b=1, lists a[0]=x, commas separate several; \\, escapes); repeatable."),
    click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True),
]


def _with_values_options(command: Any) -> Any:
    for option in reversed(_values_options):
        command = option(command)
    return command


def _issuer_scheme(external_flag: bool, values: Obj) -> tuple[bool, Obj]:
    """``--identity-external-issuer`` and ``identity.issuer.scheme: kubernetes.io/tls`` mean the same; record it."""
    external = external_flag or _get(values, "identity", "issuer", "scheme") == "kubernetes.io/tls"
    if external:
        values = apply_set(values, "identity.issuer.scheme=kubernetes.io/tls")
    return external, values


def _crds(values: Obj, output: str) -> None:
    emit(crds.render(values), output)


@click.command()
@click.option("--crds", "crds_only", is_flag=True, help="Print the CustomResourceDefinitions only (apply them first).")
@_with_values_options
def install(crds_only: bool, ha: bool, identity_external_issuer: bool, identity_trust_anchors_file: Path | None,
            identity_issuer_certificate_file: Path | None, identity_issuer_key_file: Path | None,
            values_files: tuple[Path, ...], sets: tuple[str, ...], output: str) -> None:
    """Print the manifests that install Tether on a Kubernetes cluster (for kubectl apply -f -).

    First `tether install --crds | kubectl apply -f -`, then `tether install | kubectl apply -f -`.
    """
    values = build_values(ha, None, values_files, sets)
    if crds_only:
        _crds(values, output)
        return
    identity_external_issuer, values = _issuer_scheme(identity_external_issuer, values)
    creds = credentials_from(values, identity_trust_anchors_file, identity_issuer_certificate_file,
                             identity_issuer_key_file)
    if identity_external_issuer and creds.issuer_key:
        raise CliError("--identity-external-issuer takes no issuer certificate or key: the cluster holds them")
    creds = complete_credentials(creds, values, identity_external_issuer, datetime.now(UTC))
    emit(render_all(values, creds, identity_external_issuer), output)


@click.command()
@click.option("--crds", "crds_only", is_flag=True, help="Print the CustomResourceDefinitions only.")
@click.option("--from", "previous", type=click.Path(dir_okay=False, path_type=Path),
              help="The previous install's objects: its saved output, or `kubectl get -n linkerd "
                   "secret/linkerd-identity-issuer configmap/linkerd-identity-trust-roots configmap/linkerd-config "
                   "secret/linkerd-destination-tls secret/linkerd-proxy-injector-k8s-tls secret/linkerd-policy-validator-k8s-tls "
                   "-o yaml` (- for stdin).")
@_with_values_options
def upgrade(crds_only: bool, previous: Path | None, ha: bool, identity_external_issuer: bool,
            identity_trust_anchors_file: Path | None, identity_issuer_certificate_file: Path | None,
            identity_issuer_key_file: Path | None, values_files: tuple[Path, ...], sets: tuple[str, ...],
            output: str) -> None:
    """Print the manifests of this version, keeping the issuer, trust anchors and values of the installed mesh."""
    kept, stored_values = previous_install(read_objects(previous)) if previous else (Credentials(anchors=""), None)
    values = build_values(ha, stored_values, values_files, sets)
    if crds_only:
        _crds(values, output)
        return
    identity_external_issuer, values = _issuer_scheme(identity_external_issuer, values)
    creds = credentials_from(values, identity_trust_anchors_file, identity_issuer_certificate_file,
                             identity_issuer_key_file, kept)
    if not creds.anchors or (not identity_external_issuer and not creds.issuer_key):
        raise CliError("upgrade keeps the existing issuer and trust anchors: give --from FILE with the previous "
                       "install's objects, or the --identity-trust-anchors-file, --identity-issuer-certificate-file "
                       "and --identity-issuer-key-file")
    creds = complete_credentials(creds, values, identity_external_issuer, datetime.now(UTC))
    emit(render_all(values, creds, identity_external_issuer), output)


@click.command()
@click.option("--namespace", "-L", "--linkerd-namespace", "namespace", default="linkerd", show_default=True,
              help="The control-plane namespace.")
@click.option("--keep-crds", is_flag=True, help="Leave the CustomResourceDefinitions (and so every mesh resource).")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
def uninstall(namespace: str, keep_crds: bool, output: str) -> None:
    """Print every object of the control plane (names only) for kubectl delete -f -.

    Deleting the CRDs deletes every ServiceProfile, Server and policy resource in the cluster.
    """
    values = apply_set(build_values(False, None, (), ()), f"controllerNamespace={namespace}")
    values = apply_set(values, "enablePodDisruptionBudget=true")  # name the budgets an --ha install made
    values = apply_set(values, "installGatewayAPI=false")  # Gateway API CRDs may be shared: never delete them
    creds = complete_credentials(Credentials(anchors=""), values, False, datetime.now(UTC))
    objects = render_all(values, creds, False)
    if not keep_crds:
        objects += crds.render(values)
    named = []
    for o in reversed(objects):  # the webhook first, the namespace and CRDs last
        metadata = {"name": o["metadata"]["name"]}
        if "namespace" in o["metadata"]:
            metadata["namespace"] = o["metadata"]["namespace"]
        named.append({"apiVersion": o["apiVersion"], "kind": o["kind"], "metadata": metadata})
    emit(named, output)
