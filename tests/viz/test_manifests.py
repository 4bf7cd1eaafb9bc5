"""Viz's Prometheus on Kubernetes: the manifests validate against Kubernetes 1.35; both configurations pass promtool.

Offline: ``kubernetes-validate`` holds the 1.35 schemas; ``promtool`` (Debian's
prometheus package) checks the configurations as Prometheus would load them.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from click.testing import CliRunner

from tether.cli.main import cli
from tether.resources.model import parse
from tether.viz import allow_scrapes, manifests, scrape_config

KUBERNETES_VERSION = "1.35"
TLS = manifests.WebhookTls("ca", "crt", "key")
PROMTOOL = shutil.which("promtool")


def _objects(*args: str) -> list[dict]:
    result = CliRunner().invoke(cli, ["viz", "install", "--platform", "kubernetes", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.output) if d]


def validate(doc: dict) -> None:
    """Against Kubernetes 1.35's schemas; Linkerd's policy resources (CRDs the schemas lack) as Tether's store
    validates them on apply, by Linkerd's CRD rules."""
    if doc["apiVersion"].startswith("policy.linkerd.io/"):
        parse(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_object_validates_against_kubernetes_1_35() -> None:
    docs = _objects("--viz-namespace", "viz", "--prometheus-image", "example.org/prometheus:v3")
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                         "ConfigMap", "Service", "Deployment", "NetworkAuthentication",
                                         "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Secret", "Service",
                                         "Deployment", "MutatingWebhookConfiguration",
                                         "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ClusterRole",
                                         "ClusterRoleBinding", "RoleBinding", "Role", "RoleBinding", "Secret", "Service",
                                         "Deployment", "APIService",
                                         "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment"]
    for doc in docs:
        validate(doc)
    deployment = docs[6]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "example.org/prometheus:v3"
    assert deployment["metadata"]["namespace"] == "viz"
    assert deployment["spec"]["template"]["metadata"]["annotations"]["linkerd.io/inject"] == "enabled"
    json_docs = json.loads(CliRunner().invoke(cli, ["viz", "install", "--platform", "kubernetes", "-o", "json"]).output)
    assert [d["kind"] for d in json_docs] == [d["kind"] for d in docs]


def test_the_tap_injector_s_webhook_reaches_its_service_with_its_ca() -> None:
    docs = _objects("--viz-namespace", "viz")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    hook = by_kind["MutatingWebhookConfiguration", "linkerd-tap-injector-webhook-config"]["webhooks"][0]
    assert hook["clientConfig"]["service"] == {"name": "tap-injector", "namespace": "viz", "path": "/"}
    assert hook["failurePolicy"] == "Ignore" and hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(hook["clientConfig"]["caBundle"]))
    secret = by_kind["Secret", "tap-injector-k8s-tls"]
    crt = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert crt.issuer == ca.subject
    ca.public_key().verify(crt.signature, crt.tbs_certificate_bytes, ec.ECDSA(crt.signature_hash_algorithm))
    names = crt.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "tap-injector.viz.svc" in names
    container = by_kind["Deployment", "tap-injector"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["viz", "tap-injector"] and "--viz-namespace=viz" in container["args"]
    role = by_kind["ClusterRole", "linkerd-viz-tap-injector"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]


def test_the_cluster_config_is_linkerd_s_with_kubernetes_discovery() -> None:
    config = yaml.safe_load(next(d for d in manifests.render(tap_injector_tls=TLS, tap_tls=TLS) if d["kind"] == "ConfigMap")["data"]["prometheus.yml"])
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["linkerd-proxy"]["kubernetes_sd_configs"] == [{"role": "pod"}]
    assert jobs["linkerd-proxy"]["relabel_configs"] == scrape_config.proxy_relabel_configs("linkerd")
    assert jobs["linkerd-controller"]["kubernetes_sd_configs"][0]["namespaces"]["names"] == ["linkerd", "linkerd-viz"]


def test_local_only_flags_are_refused_for_kubernetes() -> None:
    result = CliRunner().invoke(cli, ["viz", "install", "--platform", "kubernetes", "--prometheus-port", "1"])
    assert result.exit_code == 2 and "--prometheus-port: not used with --platform kubernetes" in result.output
    bad = CliRunner().invoke(cli, ["viz", "install", "--platform", "kubernetes", "--viz-namespace", "Bad_NS"])
    assert bad.exit_code == 2 and "--viz-namespace" in bad.output


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian's prometheus package)")
@pytest.mark.parametrize("where", ["kubernetes", "local"])
def test_promtool_accepts_the_configuration(where: str, tmp_path: Path) -> None:
    if where == "kubernetes":
        text = next(d for d in manifests.render(tap_injector_tls=TLS, tap_tls=TLS) if d["kind"] == "ConfigMap")["data"]["prometheus.yml"]
    else:
        (tmp_path / "sd").mkdir()
        text = yaml.safe_dump(scrape_config.prometheus_config(str(tmp_path / "sd"), "127.0.0.1:9090",
                                                               control_plane_ns="linkerd"))
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    result = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    if where == "kubernetes" and "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        pytest.skip("this promtool is built without Kubernetes discovery (Debian's is)")
    assert result.returncode == 0, result.stdout + result.stderr


def test_tap_is_served_behind_its_apiservice_with_its_ca_and_the_identity_token() -> None:
    docs = _objects("--viz-namespace", "viz")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    service = by_kind["APIService", "v1alpha1.tap.linkerd.io"]["spec"]
    assert service["group"] == "tap.linkerd.io" and service["version"] == "v1alpha1"
    assert service["service"] == {"name": "tap", "namespace": "viz"}
    ca = x509.load_pem_x509_certificate(base64.b64decode(service["caBundle"]))
    crt = x509.load_pem_x509_certificate(base64.b64decode(by_kind["Secret", "tap-k8s-tls"]["data"]["tls.crt"]))
    ca.public_key().verify(crt.signature, crt.tbs_certificate_bytes, ec.ECDSA(crt.signature_hash_algorithm))
    names = crt.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "tap.viz.svc" in names
    assert by_kind["Service", "tap"]["spec"]["ports"] == [{"name": "apiserver", "port": 443, "targetPort": "apiserver"}]
    pod = by_kind["Deployment", "tap"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["args"][:2] == ["viz", "tap-apiserver"] and "--viz-namespace=viz" in container["args"]
    token = next(v for v in pod["spec"]["volumes"] if v["name"] == "linkerd-identity-token")
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "identity.l5d.io"
    assert "--token-file=/var/run/secrets/tokens/linkerd-identity-token" in container["args"]
    assert pod["spec"]["serviceAccountName"] == "tap" and pod["metadata"]["annotations"]["linkerd.io/inject"] == "disabled"
    # Its RBAC: reviews of users' taps, the workloads it resolves, the front-proxy settings, the trust roots.
    rules = by_kind["ClusterRole", "linkerd-viz-tap"]["rules"]
    assert {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]} in rules
    reader = by_kind["RoleBinding", "linkerd-viz-tap-auth-reader"]
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    roots = by_kind["Role", "linkerd-viz-tap-trust-roots"]
    assert roots["metadata"]["namespace"] == "linkerd" and roots["rules"][0]["resourceNames"] == [
        "linkerd-identity-trust-roots"]
    assert by_kind["ClusterRole", "linkerd-viz-tap-admin"]["rules"] == [
        {"apiGroups": ["tap.linkerd.io"], "resources": ["*"], "verbs": ["watch"]}]


def test_the_dashboard_reads_the_cluster_and_taps_through_the_apiservice() -> None:
    docs = _objects("--viz-namespace", "viz")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    pod = by_kind["Deployment", "web"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["args"][:2] == ["viz", "dashboard"]
    assert {"--platform=kubernetes", "--show=url", "--address=0.0.0.0",
            "--prometheus-url=http://prometheus.viz.svc.cluster.local:9090"} <= set(container["args"])
    assert pod["spec"]["serviceAccountName"] == "web" and pod["metadata"]["annotations"]["linkerd.io/inject"] == "enabled"
    assert container["readinessProbe"] == {"tcpSocket": {"port": 8084}}
    rules = by_kind["ClusterRole", "linkerd-viz-web"]["rules"]
    assert {"apiGroups": ["tap.linkerd.io"], "resources": ["*"], "verbs": ["watch"]} in rules
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in rules)  # read-only
    assert by_kind["Service", "web"]["spec"]["ports"] == [{"name": "http", "port": 8084, "targetPort": "http"}]
    # The mesh's names (the identities the pods page shows) are the control plane's defaults here...
    assert {"--control-plane-ns=linkerd", "--trust-domain=cluster.local",
            "--cluster-domain=cluster.local"} <= set(container["args"])


def test_the_mesh_s_names_come_from_the_install_flags() -> None:
    docs = _objects("--viz-namespace", "viz", "--control-plane-ns", "mesh-system", "--trust-domain", "example.org",
                    "--cluster-domain", "corp.internal")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    web = by_kind["Deployment", "web"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--control-plane-ns=mesh-system", "--trust-domain=example.org", "--cluster-domain=corp.internal",
            "--prometheus-url=http://prometheus.viz.svc.corp.internal:9090"} <= set(web)
    tap = by_kind["Deployment", "tap"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--control-plane-ns=mesh-system" in tap and "--trust-domain=example.org" in tap
    assert by_kind["Role", "linkerd-viz-tap-trust-roots"]["metadata"]["namespace"] == "mesh-system"
    # Bad names are refused by flag; local-only flags with kubernetes and the reverse too.
    for flag, value in (("--trust-domain", "Not_A_Domain"), ("--control-plane-ns", "a.b"),
                        ("--cluster-domain", "-x")):
        result = CliRunner().invoke(cli, ["viz", "install", "--platform", "kubernetes", flag, value])
        assert result.exit_code == 2 and flag in result.output and "Traceback" not in result.output
    local = CliRunner().invoke(cli, ["viz", "install", "--trust-domain", "example.org"])
    assert local.exit_code == 2 and "--trust-domain: not used with --platform local" in local.output


def _allow_scrapes(*args: str) -> list[dict]:
    result = CliRunner().invoke(cli, ["viz", "allow-scrapes", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.output) if d]


def test_allow_scrapes_prints_linkerds_objects_for_viz_on_kubernetes() -> None:
    docs = _allow_scrapes("--platform", "kubernetes", "--namespace", "emojivoto", "--viz-namespace", "viz")
    for doc in docs:
        validate(doc)
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert list(by_name) == [("Server", "proxy-admin"), ("HTTPRoute", "proxy-metrics"), ("HTTPRoute", "proxy-probes"),
                             ("AuthorizationPolicy", "prometheus-scrape"), ("AuthorizationPolicy", "proxy-probes")]
    assert all(d["metadata"]["namespace"] == "emojivoto" for d in docs)
    server = by_name["Server", "proxy-admin"]["spec"]
    assert (server["port"], server["proxyProtocol"]) == ("linkerd-admin", "HTTP/1")
    scrape = by_name["AuthorizationPolicy", "prometheus-scrape"]["spec"]
    assert scrape["targetRef"]["name"] == "proxy-metrics"
    assert scrape["requiredAuthenticationRefs"] == [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "viz"}]
    probes = by_name["AuthorizationPolicy", "proxy-probes"]["spec"]
    assert probes["requiredAuthenticationRefs"] == [
        {"kind": "NetworkAuthentication", "group": "policy.linkerd.io", "name": "kubelet", "namespace": "viz"}]
    # The kubelet authentication they name comes with viz install, in the viz namespace.
    installed = {(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in _objects("--viz-namespace", "viz")
                 if "namespace" in d["metadata"]}
    assert ("NetworkAuthentication", "kubelet", "viz") in installed
    json_docs = json.loads(CliRunner().invoke(cli, ["viz", "allow-scrapes", "--platform", "kubernetes", "-n", "emojivoto",
                                                    "-o", "json"]).output)
    assert [d["kind"] for d in json_docs] == [d["kind"] for d in docs]


def test_allow_scrapes_on_the_local_platform_authenticates_the_hosts_address() -> None:
    import ipaddress

    docs = allow_scrapes.local("emojivoto", ipaddress.IPv4Address("10.197.0.1"), "0.1.0")
    for doc in docs:
        parse(doc)
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert by_name["NetworkAuthentication", "prometheus"]["spec"]["networks"] == [{"cidr": "10.197.0.1/32"}]
    assert by_name["AuthorizationPolicy", "prometheus-scrape"]["spec"]["requiredAuthenticationRefs"] == [
        {"kind": "NetworkAuthentication", "group": "policy.linkerd.io", "name": "prometheus"}]
    assert ("NetworkAuthentication", "kubelet") in by_name and ("Server", "proxy-admin") in by_name


def test_allow_scrapes_refuses_bad_flags_by_name(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["viz", "allow-scrapes", "-n", "Bad_NS"])
    assert result.exit_code == 2 and "--namespace" in result.output and "Traceback" not in result.output
    result = runner.invoke(cli, ["viz", "allow-scrapes", "-n", "ns", "--viz-namespace", "viz"])
    assert result.exit_code == 2 and "--viz-namespace: not used with --platform local" in result.output
    result = runner.invoke(cli, ["viz", "allow-scrapes", "-n", "ns"], env={"TETHER_HOME": str(tmp_path)})
    assert result.exit_code == 1 and "no local platform" in result.output
    assert runner.invoke(cli, ["viz", "allow-scrapes"]).exit_code == 2  # --namespace is required
