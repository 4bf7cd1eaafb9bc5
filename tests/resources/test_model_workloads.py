"""The core kinds and workloads: Namespace, ServiceAccount, Service, Pod, Deployment, ExternalWorkload."""

import pytest

from tether.resources.core import ServicePort
from tether.resources.model import parse
from tether.resources.selectors import LabelSelector
from tether.resources.workloads import ContainerPort, EnvVar, HttpGet, WorkloadMeshTLS, WorkloadPort

POD = ("Pod", "web-5f9c7d8b6-x2x1z")


def test_namespace_and_service_account(manifest, edits):
    namespace = parse(manifest("Namespace", "emojivoto"))
    assert namespace.annotations == {"linkerd.io/inject": "enabled"}
    assert namespace.spec.finalizers == ()
    sa = parse(edits.set(manifest("ServiceAccount", "web"), "automountServiceAccountToken", False))
    assert sa.spec.automount_service_account_token is False
    assert parse(manifest("ServiceAccount", "web")).spec.automount_service_account_token is None


def test_service_ports_selector_and_defaults(manifest, edits):
    service = parse(manifest("Service", "web-svc")).spec
    assert service.ports == (ServicePort(port=80, target_port=8080, name="http"),)
    assert service.selector == LabelSelector.parse("app=web-svc")
    assert service.selector.matches({"app": "web-svc", "version": "v11"})
    assert (service.type, service.cluster_ip, service.is_headless, service.internal_traffic_policy) == (
        "ClusterIP",
        None,
        False,
        "Cluster",
    )
    assert service.port_by_number(80).name == "http"
    assert service.port_by_number(8080) is None


def test_service_target_port_defaults_to_port_and_may_be_named(manifest, edits):
    obj = edits.set(
        manifest("Service", "web-svc"),
        "spec.ports",
        [
            {"name": "http", "port": 80, "targetPort": "http", "appProtocol": "kubernetes.io/h2c"},
            {"name": "admin", "port": 9990, "protocol": "TCP"},
        ],
    )
    ports = parse(obj).spec.ports
    assert [(p.port, p.target_port, p.app_protocol) for p in ports] == [(80, "http", "kubernetes.io/h2c"), (9990, 9990, None)]


def test_a_service_without_selector_selects_no_pods(manifest, edits):
    obj = edits.delete(manifest("Service", "web-svc"), "spec.selector")
    assert not parse(obj).spec.selector.matches({"app": "web-svc"})


def test_headless_and_external_name_services_need_no_ports(manifest, edits):
    headless = edits.delete(edits.set(manifest("Service", "web-svc"), "spec.clusterIP", "None"), "spec.ports")
    assert parse(headless).spec.is_headless
    external = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "db", "namespace": "emojivoto"},
        "spec": {"type": "ExternalName", "externalName": "db.example.com"},
    }
    assert parse(external).spec.external_name == "db.example.com"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.ports", None, "spec.ports: required"),
        ("spec.ports[0].port", "80", "spec.ports[0].port: expected an integer"),
        ("spec.ports[0].port", 0, "spec.ports[0].port: must be between 1 and 65535"),
        ("spec.ports[0].targetPort", 8080.0, "spec.ports[0].targetPort: expected an integer or a string"),
        ("spec.ports[0].targetPort", "HTTP", "spec.ports[0].targetPort: 'HTTP' must contain only lower case letters, digits and '-'"),
        ("spec.ports[0].targetPort", "http-web-frontend", "spec.ports[0].targetPort: 'http-web-frontend' must be no more than 15 characters"),
        ("spec.ports[0].targetPort", "8080", "spec.ports[0].targetPort: '8080' must contain at least one letter"),
        ("spec.ports[0].protocol", "HTTP", "spec.ports[0].protocol: unsupported value 'HTTP' (supported: TCP, UDP, SCTP)"),
        ("spec.clusterIP", "10.96.0.300", "spec.clusterIP: '10.96.0.300' must be 'None', empty, or an IP address"),
        ("spec.type", "Internal", "spec.type: unsupported value 'Internal' (supported: ClusterIP, NodePort, LoadBalancer, ExternalName)"),
        ("spec.selector", {"app": 7}, "spec.selector[app]: expected a string"),
        ("spec.ports", [{"port": 80}, {"name": "b", "port": 81}], "spec.ports[0].name: required when a Service has more than one port"),
        ("spec.ports", [{"name": "a", "port": 80}, {"name": "a", "port": 81}], "spec.ports[1].name: duplicate port name 'a'"),
        ("spec.ports", [{"name": "a", "port": 80}, {"name": "b", "port": 80}], "spec.ports[1].port: duplicate port 80/TCP"),
    ],
)
def test_service_errors(manifest, edits, path, value, expected, parse_error):
    obj = manifest("Service", "web-svc")
    obj = edits.change(obj, path, value)
    assert parse_error(obj) == f"Service web-svc: {expected}"


def test_external_name_service_requires_external_name(parse_error):
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"}, "spec": {"type": "ExternalName"}}
    assert parse_error(obj) == "Service db: spec.externalName: required"


def test_pod_spec_and_status(manifest):
    pod = parse(manifest(*POD))
    spec, status = pod.spec, pod.status
    assert spec.service_account_name == "web"
    assert spec.node_name == "node-1"
    [app] = spec.containers
    assert app.name == "web-svc"
    assert app.command == ("/usr/local/bin/emojivoto-web",)
    assert app.working_dir == "/usr/src/app"
    assert app.env == (EnvVar("WEB_PORT", "8080"),)
    assert app.ports == (ContainerPort(8080, "http", "TCP"),)
    assert app.readiness_probe.http_get == HttpGet(port="http", path="/healthz")
    assert app.liveness_probe.tcp_socket_port == "http"
    assert spec.ports_named("http") == (ContainerPort(8080, "http"),)
    assert spec.ports_named("linkerd-admin") == ()  # sidecar ports are not the workload's
    init, proxy = spec.init_containers
    assert init.args[:2] == ("--incoming-proxy-port", "4143")
    assert proxy.restart_policy == "Always"
    assert proxy.env[0] == EnvVar("_pod_ip", field_path="status.podIP")
    assert (proxy.startup_probe.period_seconds, proxy.startup_probe.failure_threshold) == (1, 120)
    assert (proxy.readiness_probe.initial_delay_seconds, proxy.readiness_probe.timeout_seconds) == (2, 1)
    assert (status.phase, status.pod_ip, status.host_ip) == ("Running", "10.42.0.17", "192.168.49.2")
    assert status.pod_ips == ("10.42.0.17", "fd00:10:42::11")
    assert status.ready


def test_pod_defaults_without_status(manifest, edits):
    obj = edits.delete(edits.delete(manifest(*POD), "status"), "spec.serviceAccountName")
    pod = parse(obj)
    assert pod.spec.service_account_name == "default"
    assert (pod.status.phase, pod.status.pod_ip, pod.status.ready) == (None, None, False)
    assert parse(edits.set(obj, "spec.serviceAccount", "legacy")).spec.service_account_name == "legacy"


def test_pod_is_not_ready_until_its_ready_condition_is_true(manifest, edits):
    obj = edits.set(manifest(*POD), "status.conditions[1].status", "False")
    assert not parse(obj).status.ready


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.containers", [], "spec.containers: must not be empty"),
        ("spec.containers[0].image", None, "spec.containers[0].image: required"),
        ("spec.containers[0].name", "web_svc", "spec.containers[0].name: 'web_svc' must be a DNS-1123 label: lower case letters, digits and '-', starting and ending with a letter or digit"),
        ("spec.containers[0].name", "linkerd-proxy", "spec.initContainers[1].name: duplicate container name 'linkerd-proxy'"),
        ("spec.containers[0].ports[0].containerPort", 70000, "spec.containers[0].ports[0].containerPort: must be between 1 and 65535"),
        ("spec.containers[0].ports[0].name", "web-http-frontend", "spec.containers[0].ports[0].name: 'web-http-frontend' must be no more than 15 characters"),
        ("spec.containers[0].ports", [{"containerPort": 1, "name": "a"}, {"containerPort": 2, "name": "a"}], "spec.containers[0].ports[1].name: duplicate port name 'a'"),
        ("spec.containers[0].env[0].value", 8080, "spec.containers[0].env[0].value: expected a string"),
        ("spec.containers[0].readinessProbe.httpGet.port", None, "spec.containers[0].readinessProbe.httpGet.port: required"),
        ("spec.containers[0].readinessProbe.periodSeconds", 0, "spec.containers[0].readinessProbe.periodSeconds: must be at least 1"),
        ("spec.initContainers[1].restartPolicy", "Never", "spec.initContainers[1].restartPolicy: unsupported value 'Never' (supported: Always)"),
        ("spec.hostNetwork", "true", "spec.hostNetwork: expected a boolean"),
        ("status.podIP", "10.42.0", "status.podIP: '10.42.0' must be an IP address"),
        ("status.podIPs[1]", {}, "status.podIPs[1].ip: required"),
        ("status.phase", "Started", "status.phase: unsupported value 'Started' (supported: Pending, Running, Succeeded, Failed, Unknown)"),
        ("status.conditions[0].status", True, "status.conditions[0].status: expected a string"),
        ("spec", None, "spec: required"),
    ],
)
def test_pod_errors(manifest, edits, path, value, expected, parse_error):
    obj = manifest(*POD)
    obj = edits.change(obj, path, value)
    assert parse_error(obj) == f"Pod web-5f9c7d8b6-x2x1z: {expected}"


def test_deployment_template_and_selector(manifest):
    deployment = parse(manifest("Deployment.apps", "web"))
    spec = deployment.spec
    assert spec.replicas == 1
    assert spec.selector == LabelSelector.parse("app=web-svc,version=v11")
    assert spec.template.metadata.labels == {"app": "web-svc", "version": "v11"}
    assert spec.template.metadata.annotations == {"config.linkerd.io/proxy-log-level": "debug"}
    assert spec.template.spec.service_account_name == "web"
    assert spec.template.spec.containers[0].env[-1] == EnvVar("POD_IP", field_path="status.podIP")
    assert deployment.status.ready_replicas == 0


def test_deployment_status(manifest, edits):
    obj = edits.set(manifest("Deployment.apps", "web"), "status", {"observedGeneration": 2, "replicas": 3, "readyReplicas": 2, "availableReplicas": 2, "updatedReplicas": 3})
    status = parse(obj).status
    assert (status.observed_generation, status.replicas, status.ready_replicas, status.available_replicas, status.updated_replicas) == (2, 3, 2, 2, 3)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.selector", None, "spec.selector: required"),
        ("spec.selector", {}, "spec.selector: must not be empty"),
        ("spec.template.metadata.labels", {"app": "other"}, "spec.template.metadata.labels: does not match spec.selector"),
        ("spec.template.metadata", None, "spec.template.metadata.labels: does not match spec.selector"),
        ("spec.template.spec.restartPolicy", "Never", "spec.template.spec.restartPolicy: must be Always for a Deployment"),
        ("spec.replicas", -1, "spec.replicas: must be at least 0"),
        ("spec.template.spec.containers[0].ports[0].containerPort", "8080", "spec.template.spec.containers[0].ports[0].containerPort: expected an integer"),
    ],
)
def test_deployment_errors(manifest, edits, path, value, expected, parse_error):
    obj = manifest("Deployment.apps", "web")
    obj = edits.change(obj, path, value)
    assert parse_error(obj) == f"Deployment web: {expected}"


def test_external_workload(manifest, edits):
    workload = parse(manifest("ExternalWorkload.workload.linkerd.io", "legacy-vm"))
    assert workload.spec.mesh_tls == WorkloadMeshTLS("spiffe://root.linkerd.cluster.local/legacy-vm", "legacy-vm.cluster.local")
    assert workload.spec.ports == (WorkloadPort(8080, "http", "TCP"),)
    assert workload.spec.workload_ips == ("192.0.2.10",)
    assert workload.status.condition("Ready").is_true
    assert workload.status.condition("Healthy") is None


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.meshTLS", None, "spec.meshTLS: required"),
        ("spec.meshTLS.serverName", "", "spec.meshTLS.serverName: must not be empty"),
        ("spec.workloadIPs", [{"ip": "192.0.2.10"}, {"ip": "192.0.2.11"}], "spec.workloadIPs: must have at most 1 item"),
        ("spec.workloadIPs[0].ip", "vm-1", "spec.workloadIPs[0].ip: 'vm-1' must be an IP address"),
        ("spec.ports[0].protocol", "SCTP", "spec.ports[0].protocol: unsupported value 'SCTP' (supported: TCP, UDP)"),
    ],
)
def test_external_workload_errors(manifest, edits, path, value, expected, parse_error):
    obj = manifest("ExternalWorkload.workload.linkerd.io", "legacy-vm")
    obj = edits.change(obj, path, value)
    assert parse_error(obj) == f"ExternalWorkload legacy-vm: {expected}"
