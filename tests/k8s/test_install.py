"""``tether install``/``upgrade``/``uninstall``: what they print, validated offline.

Every object is checked with ``kubernetes-validate`` against the Kubernetes 1.35
OpenAPI schemas it ships (strict: unknown fields are errors); no API server is
involved.  Custom resources (the repo's examples) are checked against the
``openAPIV3Schema`` of the CRDs ``install --crds`` prints, with ``jsonschema``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from cryptography import x509

from tether.cli.install_cmd import apply_set
from tether.cli.main import cli
from tether.identity import pem, pki
from tether.injector.config import MeshConfig
from tether.resources import kinds

KUBERNETES_VERSION = "1.35.0"
REPO = Path(__file__).resolve().parents[2]
MESH_GROUPS = ("linkerd.io", "policy.linkerd.io", "workload.linkerd.io")


def tether(*args: str, ok: bool = True) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code != 0, result.output
    return result.output


def objects(*args: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(tether(*args)) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def secret_text(secret: dict[str, Any], key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def validate_all(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc}") from None


@pytest.mark.parametrize("args", [
    ("install",),
    ("install", "--ha"),
    ("install", "--crds"),
    ("install", "--crds", "--set", "installGatewayAPI=true"),
    ("install", "--set", "controllerNamespace=mesh", "--set", "identityTrustDomain=example.org"),
])
def test_every_printed_object_validates_against_kubernetes_1_35(args: tuple[str, ...]) -> None:
    docs = objects(*args)
    assert docs
    validate_all(docs)


def test_json_output_is_a_list_that_validates() -> None:
    listed = json.loads(tether("install", "-o", "json"))
    assert listed["kind"] == "List"
    validate_all(listed["items"])


def test_the_control_plane_has_every_part() -> None:
    docs = objects("install")
    got = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert got >= {
        ("Namespace", "linkerd"),
        ("ServiceAccount", "linkerd-identity"), ("ServiceAccount", "linkerd-destination"),
        ("ServiceAccount", "linkerd-proxy-injector"),
        ("ClusterRole", "linkerd-linkerd-identity"), ("ClusterRoleBinding", "linkerd-linkerd-destination"),
        ("Secret", "linkerd-identity-issuer"), ("ConfigMap", "linkerd-identity-trust-roots"),
        ("ConfigMap", "linkerd-config"), ("Secret", "linkerd-destination-tls"),
        ("Secret", "linkerd-proxy-injector-k8s-tls"),
        ("Deployment", "linkerd-identity"), ("Deployment", "linkerd-destination"),
        ("Deployment", "linkerd-proxy-injector"),
        ("Service", "linkerd-identity"), ("Service", "linkerd-identity-headless"), ("Service", "linkerd-dst"),
        ("Service", "linkerd-dst-headless"), ("Service", "linkerd-proxy-injector"),
        ("MutatingWebhookConfiguration", "linkerd-proxy-injector-webhook-config"),
        ("ServiceAccount", "linkerd-policy"), ("ClusterRole", "linkerd-linkerd-policy"),
        ("Deployment", "linkerd-policy"), ("Service", "linkerd-policy"), ("Service", "linkerd-policy-validator"),
        ("Secret", "linkerd-policy-validator-k8s-tls"),
        ("ValidatingWebhookConfiguration", "linkerd-policy-validator-webhook-config"),
    }
    assert not any(d["kind"] == "PodDisruptionBudget" for d in docs)
    policy = container(find(docs, "Deployment", "linkerd-policy"))
    assert policy["args"][:3] == ["policy", "serve", "--platform=kubernetes"]
    assert "--server-tls-cert=/var/run/linkerd/policy-validator-tls/tls.crt" in policy["args"]
    validator = find(docs, "ValidatingWebhookConfiguration", "linkerd-policy-validator-webhook-config")
    assert validator["webhooks"][0]["clientConfig"]["service"]["name"] == "linkerd-policy-validator"
    assert "servers" in validator["webhooks"][0]["rules"][0]["resources"]
    identity_role = find(docs, "ClusterRole", "linkerd-linkerd-identity")
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]} in identity_role["rules"]
    for name in ("linkerd-identity", "linkerd-destination", "linkerd-proxy-injector"):
        deployment = find(docs, "Deployment", name)
        c = container(deployment)
        assert c["command"] == ["tether"]
        assert {"livenessProbe", "readinessProbe", "resources"} <= set(c)
        assert c["resources"]["requests"]["memory"]
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == name
        if name != "linkerd-proxy-injector":
            assert "--platform=kubernetes" in c["args"]
    assert container(find(docs, "Deployment", "linkerd-identity"))["args"][:2] == ["identity", "serve"]


def test_generated_identity_credentials_chain_to_the_anchors() -> None:
    docs = objects("install")
    anchors = pem.parse_certificates(find(docs, "ConfigMap", "linkerd-identity-trust-roots")["data"]["ca-bundle.crt"].encode(), "anchors")
    issuer_secret = find(docs, "Secret", "linkerd-identity-issuer")
    issuer = pem.parse_certificates(secret_text(issuer_secret, "crt.pem").encode(), "issuer")
    assert [v.problem for v in pki.chain_verdicts(issuer, anchors)] == [None]
    pki.check_ca_pair(issuer[0], pem.parse_private_key(secret_text(issuer_secret, "key.pem").encode(), "key"))
    assert pki.subject_cn(issuer[0]) == "identity.linkerd.cluster.local"

    destination = pem.parse_certificates(secret_text(find(docs, "Secret", "linkerd-destination-tls"), "tls.crt").encode(), "dst")
    assert [v.problem for v in pki.chain_verdicts(destination, anchors)] == [None, None]
    sans = destination[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["linkerd-destination.linkerd.serviceaccount.identity.linkerd.cluster.local"]

    webhook = find(docs, "MutatingWebhookConfiguration", "linkerd-proxy-injector-webhook-config")["webhooks"][0]
    ca = pem.parse_certificates(base64.b64decode(webhook["clientConfig"]["caBundle"]), "caBundle")
    serving = pem.parse_certificates(secret_text(find(docs, "Secret", "linkerd-proxy-injector-k8s-tls"), "tls.crt").encode(), "inj")
    assert [v.problem for v in pki.chain_verdicts(serving, ca)] == [None]
    names = serving[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "linkerd-proxy-injector.linkerd.svc" in names
    assert webhook["clientConfig"]["service"] == {"name": "linkerd-proxy-injector", "namespace": "linkerd", "path": "/",
                                                  "port": 443}
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["objectSelector"]["matchExpressions"][0]["key"] == "linkerd.io/control-plane-component"


def test_linkerd_config_holds_the_values_without_private_keys_and_the_injector_reads_them() -> None:
    docs = objects("install", "--set", "proxy.logLevel=debug")
    text = find(docs, "ConfigMap", "linkerd-config")["data"]["values"]
    assert "PRIVATE KEY" not in text
    values = yaml.safe_load(text)
    mesh = MeshConfig.from_values(values)
    anchors = find(docs, "ConfigMap", "linkerd-identity-trust-roots")["data"]["ca-bundle.crt"]
    assert mesh.trust_anchors_pem == anchors
    assert (mesh.control_plane_ns, mesh.log_level, mesh.proxy_image) == ("linkerd", "debug", "ghcr.io/tether-mesh/tether")


def test_ha_raises_replicas_and_adds_anti_affinity_and_budgets() -> None:
    docs = objects("install", "--ha")
    for component in ("identity", "destination", "proxy-injector"):
        deployment = find(docs, "Deployment", f"linkerd-{component}")
        assert deployment["spec"]["replicas"] == 3
        affinity = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        required = affinity["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert required["topologyKey"] == "kubernetes.io/hostname"
        assert required["labelSelector"]["matchLabels"]["linkerd.io/control-plane-component"] == component
        budget = find(docs, "PodDisruptionBudget", f"linkerd-{component}")
        assert budget["spec"]["maxUnavailable"] == 1
    assert find(docs, "MutatingWebhookConfiguration", "linkerd-proxy-injector-webhook-config")["webhooks"][0]["failurePolicy"] == "Fail"


def test_values_files_and_set_override_defaults_in_order(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("clusterDomain: example.org\ncontrollerReplicas: 5\nproxy:\n  logLevel: trace\n")
    docs = objects("install", "-f", str(values), "--set", "controllerReplicas=2",
                   "--set", "clusterNetworks=10.0.0.0/8\\,192.168.0.0/16")
    destination = find(docs, "Deployment", "linkerd-destination")
    assert destination["spec"]["replicas"] == 2  # --set wins over -f
    assert "--cluster-domain=example.org" in container(destination)["args"]
    stored = yaml.safe_load(find(docs, "ConfigMap", "linkerd-config")["data"]["values"])
    assert stored["proxy"]["logLevel"] == "trace"
    assert stored["clusterNetworks"] == "10.0.0.0/8,192.168.0.0/16"
    assert stored["proxy"]["ports"]["inbound"] == 4143  # the rest of the map stays


def test_set_syntax() -> None:
    assert apply_set({}, "a.b=1,c=true,d=x,e=null") == {"a": {"b": 1}, "c": True, "d": "x", "e": None}
    assert apply_set({"a": {"keep": 1}}, "a.l[1].n=v") == {"a": {"keep": 1, "l": [{}, {"n": "v"}]}}
    assert apply_set({}, "podAnnotations.example\\.com/x=y") == {"podAnnotations": {"example.com/x": "y"}}
    assert tether("install", "--set", "novalue", ok=False)
    assert "controllerReplicas" in tether("install", "--set", "controllerReplicas=zero", ok=False)


def test_given_credentials_are_used_and_checked(tmp_path: Path) -> None:
    first = objects("install")
    anchors = tmp_path / "ca.crt"
    anchors.write_text(find(first, "ConfigMap", "linkerd-identity-trust-roots")["data"]["ca-bundle.crt"])
    issuer = find(first, "Secret", "linkerd-identity-issuer")
    (tmp_path / "issuer.crt").write_text(secret_text(issuer, "crt.pem"))
    (tmp_path / "issuer.key").write_text(secret_text(issuer, "key.pem"))
    files = ["--identity-trust-anchors-file", str(anchors), "--identity-issuer-certificate-file",
             str(tmp_path / "issuer.crt"), "--identity-issuer-key-file", str(tmp_path / "issuer.key")]
    again = objects("install", *files)
    assert find(again, "Secret", "linkerd-identity-issuer")["data"] == issuer["data"]

    other = objects("install")  # another mesh's anchors: the issuer does not chain to them
    anchors.write_text(find(other, "ConfigMap", "linkerd-identity-trust-roots")["data"]["ca-bundle.crt"])
    assert "does not chain to the trust anchors" in tether("install", *files, ok=False)
    assert "without the issuer" in tether("install", "--identity-trust-anchors-file", str(anchors), ok=False)


def test_external_issuer(tmp_path: Path) -> None:
    assert "needs the trust anchors" in tether("install", "--identity-external-issuer", ok=False)
    anchors = tmp_path / "ca.crt"
    anchors.write_text(find(objects("install"), "ConfigMap", "linkerd-identity-trust-roots")["data"]["ca-bundle.crt"])
    docs = objects("install", "--identity-external-issuer", "--identity-trust-anchors-file", str(anchors))
    validate_all(docs)
    kinds_names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Secret", "linkerd-identity-issuer") not in kinds_names  # the cluster's, e.g. from cert-manager
    assert ("Secret", "linkerd-destination-tls") not in kinds_names
    args = container(find(docs, "Deployment", "linkerd-identity"))["args"]
    assert "--issuer-cert=/var/run/linkerd/identity/issuer/tls.crt" in args
    assert find(docs, "ConfigMap", "linkerd-identity-trust-roots")["data"]["ca-bundle.crt"] == anchors.read_text()
    stored = yaml.safe_load(find(docs, "ConfigMap", "linkerd-config")["data"]["values"])
    assert stored["identity"]["issuer"]["scheme"] == "kubernetes.io/tls"

    previous = tmp_path / "previous.yaml"  # an upgrade stays external without being told again
    previous.write_text(yaml.safe_dump_all(docs))
    upgraded = objects("upgrade", "--from", str(previous))
    assert not any(d["kind"] == "Secret" and d["metadata"]["name"] == "linkerd-identity-issuer" for d in upgraded)


def test_upgrade_keeps_issuer_anchors_certificates_and_values(tmp_path: Path) -> None:
    previous = tmp_path / "previous.yaml"
    previous.write_text(tether("install", "--set", "controllerReplicas=2", "--set", "proxy.logLevel=debug"))
    before = [d for d in yaml.safe_load_all(previous.read_text()) if d]
    docs = objects("upgrade", "--from", str(previous), "--set", "proxy.logFormat=json")
    validate_all(docs)
    for kind, name in [("Secret", "linkerd-identity-issuer"), ("ConfigMap", "linkerd-identity-trust-roots"),
                       ("Secret", "linkerd-destination-tls"), ("Secret", "linkerd-proxy-injector-k8s-tls")]:
        assert find(docs, kind, name).get("data") == find(before, kind, name).get("data"), name
    assert find(docs, "Deployment", "linkerd-destination")["spec"]["replicas"] == 2
    stored = yaml.safe_load(find(docs, "ConfigMap", "linkerd-config")["data"]["values"])
    assert (stored["proxy"]["logLevel"], stored["proxy"]["logFormat"]) == ("debug", "json")

    # What kubectl prints for the objects that matter works as well as the saved output.
    listed = {"apiVersion": "v1", "kind": "List", "items": [
        find(before, "Secret", "linkerd-identity-issuer"), find(before, "ConfigMap", "linkerd-identity-trust-roots"),
        find(before, "ConfigMap", "linkerd-config")]}
    (tmp_path / "kubectl.yaml").write_text(yaml.safe_dump(listed))
    docs = objects("upgrade", "--from", str(tmp_path / "kubectl.yaml"))
    assert find(docs, "Secret", "linkerd-identity-issuer")["data"] == find(before, "Secret", "linkerd-identity-issuer")["data"]
    assert "keeps the existing issuer" in tether("upgrade", ok=False)
    upgrade_crds = objects("upgrade", "--crds", "--from", str(previous))
    assert {d["kind"] for d in upgrade_crds} == {"CustomResourceDefinition"}


def test_uninstall_names_everything_for_deletion() -> None:
    docs = objects("uninstall")
    assert docs[0]["kind"] == "CustomResourceDefinition" or docs[0]["kind"] == "MutatingWebhookConfiguration"
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert names.index(("MutatingWebhookConfiguration", "linkerd-proxy-injector-webhook-config")) < names.index(
        ("Namespace", "linkerd"))
    assert names.index(("ValidatingWebhookConfiguration", "linkerd-policy-validator-webhook-config")) < names.index(
        ("Namespace", "linkerd"))
    assert ("Deployment", "linkerd-policy") in names and ("Service", "linkerd-policy") in names
    assert ("CustomResourceDefinition", "servers.policy.linkerd.io") in names
    assert ("PodDisruptionBudget", "linkerd-destination") in names
    assert all(set(d) == {"apiVersion", "kind", "metadata"} for d in docs)
    assert all("data" not in d for d in docs)
    kept = objects("uninstall", "--keep-crds")
    assert not any(d["kind"] == "CustomResourceDefinition" for d in kept)


# -- CRDs -------------------------------------------------------------------------------------------------


def crds_by_kind(*extra: str) -> dict[str, dict[str, Any]]:
    return {d["spec"]["names"]["kind"] + "." + d["spec"]["group"]: d for d in objects("install", "--crds", *extra)}


def test_a_crd_for_every_mesh_kind_of_the_resource_model() -> None:
    crds = crds_by_kind()
    mesh = [t for t in kinds.REGISTRY if t.group in MESH_GROUPS]
    assert set(crds) == {t.key for t in mesh}
    assert len(mesh) == 10
    for rtype in mesh:
        crd = crds[rtype.key]
        assert crd["metadata"]["name"] == f"{rtype.plural}.{rtype.group}"
        assert [v["name"] for v in crd["spec"]["versions"]] == list(rtype.versions)
        assert [v["storage"] for v in crd["spec"]["versions"]] == [True] + [False] * (len(rtype.versions) - 1)
        assert crd["spec"]["names"].get("shortNames", []) == list(rtype.short_names)
    with_gateway = crds_by_kind("--set", "installGatewayAPI=true")
    assert {kinds.GATEWAY_HTTP_ROUTE.key, kinds.GRPC_ROUTE.key, kinds.TLS_ROUTE.key, kinds.TCP_ROUTE.key} <= set(
        with_gateway)
    tls = with_gateway[kinds.TLS_ROUTE.key]
    assert tls["metadata"]["annotations"]["gateway.networking.k8s.io/channel"] == "experimental"
    schema = tls["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    egress = {"apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "TLSRoute", "metadata": {},
              "spec": {"hostnames": ["httpbin.org"], "rules": [{"backendRefs": [{"name": "e", "kind": "EgressNetwork"}]}],
                       "parentRefs": [{"name": "e", "kind": "EgressNetwork", "port": 443}]}}
    jsonschema.validate(egress, schema)


def _structural_problems(schema: dict[str, Any], path: str) -> list[str]:
    problems = []
    if "type" not in schema and not schema.get("x-kubernetes-int-or-string") and not schema.get(
            "x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: no type")
    for name, sub in (schema.get("properties") or {}).items():
        problems += _structural_problems(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        problems += _structural_problems(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += _structural_problems(schema["additionalProperties"], f"{path}{{}}")
    for keyword in ("oneOf", "anyOf", "allOf"):
        for branch in schema.get(keyword, ()):
            if "type" in branch or "properties" in branch:
                problems.append(f"{path}.{keyword}: types belong outside value validations")
    return problems


def test_crd_schemas_are_structural() -> None:
    for key, crd in crds_by_kind("--set", "installGatewayAPI=true").items():
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            assert _structural_problems(schema, key) == []
            jsonschema.Draft7Validator.check_schema(schema)


def custom_resources() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((REPO / "examples").rglob("*.yaml")) + sorted((REPO / "tests/resources/manifests").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return [d for d in docs if d.get("apiVersion", "").split("/")[0] in (*MESH_GROUPS, "gateway.networking.k8s.io")]


def schema_for(crds: dict[str, dict[str, Any]], obj: dict[str, Any]) -> dict[str, Any]:
    group, _, version = obj["apiVersion"].rpartition("/")
    crd = crds[f"{obj['kind']}.{group}"]
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]


def test_the_repository_examples_validate_against_the_crds() -> None:
    crds = crds_by_kind("--set", "installGatewayAPI=true")
    resources = custom_resources()
    assert {r["kind"] for r in resources} >= {"Server", "ServiceProfile", "AuthorizationPolicy",
                                              "MeshTLSAuthentication", "HTTPRoute"}
    for obj in resources:
        errors = [e.message for e in jsonschema.Draft7Validator(schema_for(crds, obj)).iter_errors(obj)]
        assert errors == [], f"{obj['kind']}/{obj['metadata']['name']}: {errors}"


@pytest.mark.parametrize(("obj", "why"), [
    ({"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server", "metadata": {"name": "s"},
      "spec": {"port": 80}}, "needs a pod or external workload selector"),
    ({"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server", "metadata": {"name": "s"},
      "spec": {"port": 80, "podSelector": {}, "proxyProtocol": "HTTP/3"}}, "unknown protocol"),
    ({"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "EgressNetwork", "metadata": {"name": "e"},
      "spec": {"networks": [{"cidr": "0.0.0.0/0"}]}}, "trafficPolicy is required"),
    ({"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "NetworkAuthentication", "metadata": {"name": "n"},
      "spec": {"networks": []}}, "at least one network"),
    ({"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "HTTPLocalRateLimitPolicy", "metadata": {"name": "r"},
      "spec": {"targetRef": {"kind": "Server", "name": "s"}, "total": {"requestsPerSecond": 0}}}, "rps > 0"),
    ({"apiVersion": "workload.linkerd.io/v1beta1", "kind": "ExternalWorkload", "metadata": {"name": "w"},
      "spec": {"meshTLS": {"identity": "spiffe://x"}}}, "serverName is required"),
])
def test_invalid_custom_resources_are_refused_by_the_schemas(obj: dict[str, Any], why: str) -> None:
    errors = list(jsonschema.Draft7Validator(schema_for(crds_by_kind(), obj)).iter_errors(obj))
    assert errors, why
