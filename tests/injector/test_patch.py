"""The injection patch on a table of inputs: native and classic sidecars, CNI, inheritance from the
namespace, opaque and skip ports, the decision (already injected, disabled, host network...),
every workload kind, annotation values, and the reverse (uninject)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tether.injector import MeshConfig, Origin, inject, mark_for_injection, uninject
from tether.injector.annotations import trust_root_sha256
from tether.injector.decision import SkipReason
from tether.injector.sidecar import init_args
from tether.injector.workloads import Owner
from tether.resources.errors import ValidationError

from .helpers import container, deployment, env_of, pod, template_of

ENABLED = {"linkerd.io/inject": "enabled"}
C = "config.linkerd.io/"


def meshed(obj: dict[str, Any], config: MeshConfig, ns: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    result = inject(obj, ns if ns is not None else ENABLED, config, **kw)
    assert result.report.action == "injected", result.report
    return result.obj


def proxy_of(obj: dict[str, Any]) -> dict[str, Any]:
    spec = template_of(obj)["spec"]
    return container(spec.get("initContainers", []) + spec["containers"], "linkerd-proxy")


def init_of(obj: dict[str, Any]) -> dict[str, Any]:
    return container(template_of(obj)["spec"]["initContainers"], "linkerd-init")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# --- the shape of the patch ---------------------------------------------------------------------


def test_native_sidecar_by_default(config: MeshConfig) -> None:
    out = meshed(deployment(), config)
    spec = out["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["linkerd-init", "linkerd-proxy"]
    assert [c["name"] for c in spec["containers"]] == ["app"]
    proxy = spec["initContainers"][1]
    assert proxy["restartPolicy"] == "Always"
    assert proxy["image"] == f"{config.proxy_image}:{config.proxy_version}"
    assert proxy["startupProbe"] == {
        "httpGet": {"path": "/ready", "port": 4191},
        "initialDelaySeconds": 0,
        "periodSeconds": 1,
        "failureThreshold": 120,
        "timeoutSeconds": 1,
    }
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/live", "port": 4191}
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 4191}
    assert proxy["ports"] == [
        {"containerPort": 4143, "name": "linkerd-proxy"},
        {"containerPort": 4191, "name": "linkerd-admin"},
    ]
    assert "lifecycle" not in proxy
    assert proxy["securityContext"]["runAsUser"] == 2102
    assert proxy["securityContext"]["runAsNonRoot"] is True
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy["volumeMounts"] == [
        {"mountPath": "/var/run/linkerd/identity/end-entity", "name": "linkerd-identity-end-entity"},
        {"mountPath": "/var/run/secrets/tokens", "name": "linkerd-identity-token"},
    ]


def test_identity_volumes(config: MeshConfig) -> None:
    volumes = {v["name"]: v for v in meshed(deployment(), config)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["linkerd-identity-end-entity"] == {"name": "linkerd-identity-end-entity", "emptyDir": {"medium": "Memory"}}
    token = volumes["linkerd-identity-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token == {"audience": "identity.l5d.io", "expirationSeconds": 86400, "path": "linkerd-identity-token"}
    assert volumes["linkerd-proxy-init-xtables-lock"] == {"name": "linkerd-proxy-init-xtables-lock", "emptyDir": {}}


def test_labels_and_annotations(config: MeshConfig) -> None:
    template = meshed(deployment(), config)["spec"]["template"]
    assert template["metadata"]["labels"] == {
        "app": "web",
        "linkerd.io/control-plane-ns": "linkerd",
        "linkerd.io/workload-ns": "shop",
        "linkerd.io/proxy-deployment": "web",
    }
    annotations = template["metadata"]["annotations"]
    assert annotations["linkerd.io/created-by"] == f"tether/proxy-injector {config.version}"
    assert annotations["linkerd.io/proxy-version"] == config.proxy_version
    assert annotations["linkerd.io/trust-root-sha256"] == trust_root_sha256(config.trust_anchors_pem)
    assert annotations["linkerd.io/inject"] == "enabled"  # inherited from the namespace, recorded


def test_init_container_runs_tether_init(config: MeshConfig) -> None:
    init = init_of(meshed(deployment(), config))
    assert init["command"] == ["tether", "init"]
    assert init["args"] == [
        "--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save",
        "--ipv6=false",
        "--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
        "--inbound-ports-to-ignore", "4190,4191,4567,4568",
        "--outbound-ports-to-ignore", "4567,4568",
    ]  # fmt: skip
    assert init["securityContext"]["capabilities"] == {"add": ["NET_ADMIN", "NET_RAW"]}
    assert init["securityContext"]["runAsUser"] == 65534
    assert init["volumeMounts"] == [{"mountPath": "/run", "name": "linkerd-proxy-init-xtables-lock"}]


@pytest.mark.parametrize(
    "annotations",
    [
        {"config.alpha.linkerd.io/proxy-enable-native-sidecar": "false"},
        {"config.beta.linkerd.io/proxy-enable-native-sidecar": "false"},
        {C + "proxy-enable-native-sidecar": "false"},
        # stable wins over alpha
        {C + "proxy-enable-native-sidecar": "false", "config.alpha.linkerd.io/proxy-enable-native-sidecar": "true"},
    ],
)
def test_legacy_sidecar(config: MeshConfig, annotations: dict[str, str]) -> None:
    out = meshed(deployment(annotations=annotations), config)
    spec = out["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["linkerd-init"]
    assert [c["name"] for c in spec["containers"]] == ["linkerd-proxy", "app"]
    proxy = spec["containers"][0]
    assert "restartPolicy" not in proxy and "startupProbe" not in proxy
    assert proxy["lifecycle"]["postStart"]["exec"]["command"] == ["tether", "await", "--timeout=2m", "--port=4191"]
    assert out["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "app"


def test_alpha_native_true_is_not_overridden_when_alone(config: MeshConfig) -> None:
    out = meshed(deployment(annotations={"config.alpha.linkerd.io/proxy-enable-native-sidecar": "true"}), config)
    assert proxy_of(out)["restartPolicy"] == "Always"


def test_native_sidecar_off_by_config(config: MeshConfig) -> None:
    out = meshed(deployment(), config.replace(native_sidecar=False))
    assert out["spec"]["template"]["spec"]["containers"][0]["name"] == "linkerd-proxy"


def test_legacy_without_await_appends_and_wait_before_exit(config: MeshConfig) -> None:
    annotations = {
        C + "proxy-enable-native-sidecar": "false",
        C + "proxy-await": "disabled",
        "config.alpha.linkerd.io/proxy-wait-before-exit-seconds": "7",
    }
    out = meshed(deployment(annotations=annotations), config)
    spec = out["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["app", "linkerd-proxy"]
    assert spec["containers"][1]["lifecycle"] == {"preStop": {"exec": {"command": ["/bin/sleep", "7"]}}}
    assert "kubectl.kubernetes.io/default-container" not in out["spec"]["template"]["metadata"]["annotations"]


def test_native_without_await_has_no_startup_probe(config: MeshConfig) -> None:
    out = meshed(deployment(annotations={C + "proxy-await": "disabled"}), config)
    assert "startupProbe" not in proxy_of(out)


def test_cni_mode_uses_the_network_validator(config: MeshConfig) -> None:
    out = meshed(deployment(), config.replace(cni_enabled=True))
    spec = out["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["linkerd-network-validator", "linkerd-proxy"]
    validator = spec["initContainers"][0]
    assert validator["command"] == ["tether", "network-validator"]
    assert flag(validator["args"], "--connect-addr") == "1.1.1.1:20001"
    assert flag(validator["args"], "--listen-addr") == "0.0.0.0:4140"
    assert flag(validator["args"], "--timeout") == "10s"
    assert "linkerd-proxy-init-xtables-lock" not in {v["name"] for v in spec["volumes"]}


def test_existing_init_containers_run_after_the_proxy(config: MeshConfig) -> None:
    obj = deployment()
    obj["spec"]["template"]["spec"]["initContainers"] = [{"name": "setup", "image": "busybox"}]
    names = [c["name"] for c in meshed(obj, config)["spec"]["template"]["spec"]["initContainers"]]
    assert names == ["linkerd-init", "linkerd-proxy", "setup"]


def test_input_is_not_changed(config: MeshConfig) -> None:
    obj = deployment(annotations={C + "proxy-log-level": "debug"})
    before = copy.deepcopy(obj)
    meshed(obj, config)
    assert obj == before


# --- every workload kind ------------------------------------------------------------------------

KIND_OWNER = {
    "Deployment": ("deployment", "web"),
    "StatefulSet": ("statefulset", "db"),
    "DaemonSet": ("daemonset", "agent"),
    "ReplicaSet": ("replicaset", "cache"),
    "ReplicationController": ("replicationcontroller", "legacy"),
    "Job": ("job", "migrate"),
    "CronJob": ("cronjob", "report"),
    "Pod": None,
}


@pytest.mark.parametrize("kind", list(KIND_OWNER))
def test_every_workload_kind(config: MeshConfig, workloads: dict[str, dict[str, Any]], kind: str) -> None:
    result = inject(workloads[kind], {}, config, origin=Origin.CLI)
    assert result.report.action == "injected"
    template = template_of(result.obj)
    assert [c["name"] for c in template["spec"]["initContainers"]] == ["linkerd-init", "linkerd-proxy"]
    labels = template["metadata"]["labels"]
    owner = KIND_OWNER[kind]
    if owner is None:
        assert not any(k.startswith("linkerd.io/proxy-") for k in labels)
    else:
        assert labels[f"linkerd.io/proxy-{owner[0]}"] == owner[1]
    # Outside the template, nothing changed.
    stripped = copy.deepcopy(result.obj)
    original = copy.deepcopy(workloads[kind])
    if kind == "Pod":
        stripped["spec"], original["spec"] = None, None
        stripped["metadata"], original["metadata"] = None, None
    elif kind == "CronJob":
        stripped["spec"]["jobTemplate"]["spec"]["template"] = original["spec"]["jobTemplate"]["spec"]["template"] = None
    else:
        stripped["spec"]["template"] = original["spec"]["template"] = None
    assert stripped == original


@pytest.mark.parametrize("kind", ["Service", "ConfigMap", "Namespace"])
def test_other_kinds_are_not_workloads(config: MeshConfig, workloads: dict[str, dict[str, Any]], kind: str) -> None:
    result = inject(workloads[kind], {}, config, origin=Origin.CLI)
    assert result.report.skip_reasons == (SkipReason.UNSUPPORTED_RESOURCE,)
    assert result.obj == workloads[kind] and not result.changed


def test_pod_owner_from_its_replicaset(config: MeshConfig) -> None:
    obj = pod(labels={"pod-template-hash": "7d9c5b"}, annotations=ENABLED)
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9c5b", "uid": "u1", "controller": True}
    ]
    labels = meshed(obj, config, ns={})["metadata"]["labels"]
    assert labels["linkerd.io/proxy-deployment"] == "web"
    obj["metadata"]["ownerReferences"][0].update(kind="Job", name="migrate-1")
    assert meshed(obj, config, ns={})["metadata"]["labels"]["linkerd.io/proxy-job"] == "migrate-1"
    given = meshed(obj, config, ns={}, owner=Owner("cronjob", "migrate"))
    assert given["metadata"]["labels"]["linkerd.io/proxy-cronjob"] == "migrate"


def test_namespace_from_the_request_when_the_object_has_none(config: MeshConfig) -> None:
    out = meshed(pod(namespace=None), config, namespace="emojivoto")
    assert out["metadata"]["labels"]["linkerd.io/workload-ns"] == "emojivoto"


# --- the decision ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ns_value", "pod_value", "expected"),
    [
        (None, None, SkipReason.INJECT_ANNOTATION_ABSENT),
        (None, "enabled", None),
        (None, "ingress", None),
        (None, "disabled", SkipReason.INJECT_DISABLED),
        ("enabled", None, None),
        ("ingress", None, None),
        ("enabled", "disabled", SkipReason.INJECT_DISABLED),
        ("disabled", None, SkipReason.INJECT_ANNOTATION_ABSENT),
        ("disabled", "enabled", None),
        ("bogus", "enabled", SkipReason.INVALID_AT_NAMESPACE),
        ("enabled", "yes", SkipReason.INVALID_AT_WORKLOAD),
    ],
)
def test_webhook_inject_annotation_truth_table(
    config: MeshConfig, ns_value: str | None, pod_value: str | None, expected: SkipReason | None
) -> None:
    obj = pod(annotations={"linkerd.io/inject": pod_value} if pod_value else None, ports=())
    ns = {"linkerd.io/inject": ns_value} if ns_value else {}
    result = inject(obj, ns, config, origin=Origin.WEBHOOK)
    if expected is None:
        assert result.report.action == "injected"
    else:
        assert result.report.skip_reasons == (expected,)
        assert result.obj == obj


@pytest.mark.parametrize(("pod_value", "injected"), [(None, True), ("enabled", True), ("disabled", False)])
def test_cli_injects_unless_the_workload_opts_out(config: MeshConfig, pod_value: str | None, injected: bool) -> None:
    obj = deployment(annotations={"linkerd.io/inject": pod_value} if pod_value else None)
    result = inject(obj, {"linkerd.io/inject": "disabled"}, config, origin=Origin.CLI)
    assert (result.report.action == "injected") is injected
    if not injected:
        assert result.report.skip_reasons == (SkipReason.INJECT_DISABLED,)
        assert result.obj == obj


def test_already_injected_is_left_alone(config: MeshConfig) -> None:
    once = meshed(deployment(), config)
    result = inject(once, ENABLED, config)
    assert result.report.skip_reasons == (SkipReason.SIDECAR_EXISTS,)
    assert result.obj == once and not result.changed


@pytest.mark.parametrize(
    "spec_change",
    [
        {"containers": [{"name": "istio-proxy", "image": "x"}, {"name": "app", "image": "y"}]},
        {"containers": [{"name": "app", "image": "y"}, {"name": "p", "image": "cr.l5d.io/linkerd/proxy:edge-25.1.1"}]},
        {"initContainers": [{"name": "linkerd-init", "image": "x"}]},
        {"initContainers": [{"name": "i", "image": "cr.l5d.io/linkerd/proxy-init:v2.4.0"}]},
    ],
)
def test_other_proxies_count_as_a_sidecar(config: MeshConfig, spec_change: dict[str, Any]) -> None:
    obj = pod()
    obj["spec"].update(spec_change)
    assert inject(obj, ENABLED, config).report.skip_reasons == (SkipReason.SIDECAR_EXISTS,)


def test_host_network_is_refused_with_a_reason(config: MeshConfig) -> None:
    result = inject(deployment(hostNetwork=True), ENABLED, config, origin=Origin.CLI)
    assert result.report.skip_reasons == (SkipReason.HOST_NETWORK,)
    assert "hostNetwork" in result.report.summary
    assert result.report.summary.startswith('deployment "web" skipped: ')


def test_all_reasons_are_reported(config: MeshConfig) -> None:
    obj = pod(annotations={"linkerd.io/inject": "disabled"}, hostNetwork=True)
    reasons = inject(obj, {}, config).report.skip_reasons
    assert reasons == (SkipReason.HOST_NETWORK, SkipReason.INJECT_DISABLED)


def test_automount_off_needs_token_projection(config: MeshConfig) -> None:
    obj = pod(automountServiceAccountToken=False)
    assert inject(obj, ENABLED, config).report.action == "injected"
    result = inject(obj, ENABLED, config.replace(token_projection=False))
    assert result.report.skip_reasons == (SkipReason.AUTOMOUNT_DISABLED,)


def test_without_token_projection_the_proxy_reads_the_mounted_token(config: MeshConfig) -> None:
    out = meshed(pod(), config.replace(token_projection=False))
    env = env_of(proxy_of(out))
    assert env["LINKERD2_PROXY_IDENTITY_TOKEN_FILE"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert "linkerd-identity-token" not in {v["name"] for v in out["spec"]["volumes"]}


def test_malformed_template_raises_at_its_path(config: MeshConfig) -> None:
    obj = deployment()
    obj["spec"]["template"]["spec"]["containers"] = "app"
    with pytest.raises(ValidationError) as err:
        inject(obj, ENABLED, config)
    assert err.value.path == "spec.template.spec.containers"
    del obj["spec"]["template"]
    with pytest.raises(ValidationError, match="required") as err:
        inject(obj, ENABLED, config)
    assert err.value.path == "spec.template"


# --- annotations: inheritance and values ------------------------------------------------------------


def test_namespace_annotations_are_inherited(config: MeshConfig) -> None:
    ns = {
        **ENABLED,
        C + "proxy-log-level": "debug",
        C + "skip-outbound-ports": "3306",
        C + "proxy-cpu-ratio-limit": "0.5",  # pod-only: not inherited
        "other.example.com/x": "y",
    }
    out = meshed(deployment(), config, ns=ns)
    annotations = out["spec"]["template"]["metadata"]["annotations"]
    assert annotations[C + "proxy-log-level"] == "debug"
    assert annotations[C + "skip-outbound-ports"] == "3306"
    assert C + "proxy-cpu-ratio-limit" not in annotations and "other.example.com/x" not in annotations
    env = env_of(proxy_of(out))
    assert env["LINKERD2_PROXY_LOG"].startswith("debug,")
    assert "LINKERD2_PROXY_CORES_MAX_RATIO" not in env
    assert flag(init_of(out)["args"], "--outbound-ports-to-ignore") == "3306"


def test_workload_annotations_win_over_the_namespace(config: MeshConfig) -> None:
    obj = deployment(annotations={C + "proxy-log-level": "trace"})
    out = meshed(obj, config, ns={**ENABLED, C + "proxy-log-level": "debug"})
    assert out["spec"]["template"]["metadata"]["annotations"][C + "proxy-log-level"] == "trace"
    assert env_of(proxy_of(out))["LINKERD2_PROXY_LOG"].startswith("trace,")


def test_additional_env_merges_by_name(config: MeshConfig) -> None:
    cfg = config.replace(additional_env=({"name": "A", "value": "helm"}, {"name": "B", "value": "helm"}))
    ns = {**ENABLED, C + "proxy-additional-env": json.dumps([{"name": "B", "value": "ns"}, {"name": "C", "value": "ns"}])}
    obj = deployment(annotations={C + "proxy-additional-env": json.dumps([{"name": "C", "value": "pod"}])})
    env = env_of(proxy_of(meshed(obj, cfg, ns=ns)))
    assert (env["A"], env["B"], env["C"]) == ("helm", "ns", "pod")


def test_additional_env_replaces_a_standard_variable(config: MeshConfig) -> None:
    obj = deployment(annotations={C + "proxy-additional-env": '[{"name": "LINKERD2_PROXY_LOG", "value": "off"}]'})
    names = [e["name"] for e in proxy_of(meshed(obj, config))["env"]]
    assert names.count("LINKERD2_PROXY_LOG") == 1
    assert env_of(proxy_of(meshed(obj, config)))["LINKERD2_PROXY_LOG"] == "off"


@pytest.mark.parametrize(
    ("annotations", "variable", "value"),
    [
        ({C + "proxy-outbound-connect-timeout": "2s"}, "LINKERD2_PROXY_OUTBOUND_CONNECT_TIMEOUT", "2000ms"),
        ({C + "proxy-inbound-connect-timeout": "1m30s"}, "LINKERD2_PROXY_INBOUND_CONNECT_TIMEOUT", "90000ms"),
        ({C + "proxy-outbound-discovery-cache-unused-timeout": "1m"}, "LINKERD2_PROXY_OUTBOUND_DISCOVERY_IDLE_TIMEOUT", "60s"),
        ({C + "proxy-inbound-discovery-cache-unused-timeout": "2h"}, "LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT", "7200s"),
        ({C + "proxy-disable-outbound-protocol-detect-timeout": "true"}, "LINKERD2_PROXY_OUTBOUND_DETECT_TIMEOUT", "365d"),
        ({C + "proxy-disable-inbound-protocol-detect-timeout": "true"}, "LINKERD2_PROXY_INBOUND_DETECT_TIMEOUT", "365d"),
        ({C + "shutdown-grace-period": "30s"}, "LINKERD2_PROXY_SHUTDOWN_GRACE_PERIOD", "30000ms"),
        ({C + "default-inbound-policy": "deny"}, "LINKERD2_PROXY_INBOUND_DEFAULT_POLICY", "deny"),
        ({C + "access-log": "json"}, "LINKERD2_PROXY_ACCESS_LOG", "json"),
        ({C + "proxy-admin-shutdown": "enabled"}, "LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED", "true"),
        ({C + "proxy-log-format": "json"}, "LINKERD2_PROXY_LOG_FORMAT", "json"),
        ({C + "proxy-log-http-headers": "insecure"}, "LINKERD2_PROXY_LOG", "warn,linkerd=info,hickory=error"),
        ({C + "enable-external-profiles": "true"}, "LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES", "."),
        ({C + "enable-gateway": "true"}, "LINKERD2_PROXY_INBOUND_GATEWAY_SUFFIXES", "svc.cluster.local."),
        ({C + "proxy-metrics-hostname-labels": "true"}, "LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS", "true"),
        ({C + "proxy-require-identity-inbound-ports": "8080"}, "LINKERD2_PROXY_INBOUND_PORTS_REQUIRE_IDENTITY", "8080"),
        ({C + "proxy-cpu-ratio-limit": "0.5"}, "LINKERD2_PROXY_CORES_MAX_RATIO", "0.5"),
        ({C + "proxy-cpu-request": "1500m"}, "LINKERD2_PROXY_CORES_MIN", "2"),
        ({C + "proxy-cpu-limit": "3"}, "LINKERD2_PROXY_CORES_MAX", "3"),
        ({"linkerd.io/inject": "ingress"}, "LINKERD2_PROXY_INGRESS_MODE", "true"),
        ({C + "admin-port": "5191"}, "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "0.0.0.0:5191"),
        ({C + "control-port": "5190"}, "LINKERD2_PROXY_CONTROL_LISTEN_ADDR", "0.0.0.0:5190"),
        ({C + "inbound-port": "5143"}, "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "0.0.0.0:5143"),
        ({C + "outbound-port": "5140"}, "LINKERD2_PROXY_OUTBOUND_LISTEN_ADDRS", "127.0.0.1:5140"),
    ],
)
def test_annotation_sets_the_proxy_environment(
    config: MeshConfig, annotations: dict[str, str], variable: str, value: str
) -> None:
    env = env_of(proxy_of(meshed(deployment(annotations=annotations), config)))
    assert env[variable] == value


def test_proxy_container_annotations(config: MeshConfig) -> None:
    annotations = {
        C + "proxy-image": "registry.example.com/tether",
        C + "proxy-version": "9.9.9",
        C + "image-pull-policy": "Always",
        C + "proxy-uid": "3000",
        C + "proxy-gid": "3001",
        C + "proxy-cpu-request": "100m",
        C + "proxy-memory-limit": "250Mi",
        C + "proxy-ephemeral-storage-request": "1Gi",
        C + "admin-port": "5191",
        C + "inbound-port": "5143",
        C + "outbound-port": "5140",
        C + "enable-debug-sidecar": "true",
    }
    out = meshed(deployment(annotations=annotations), config)
    proxy = proxy_of(out)
    assert proxy["image"] == "registry.example.com/tether:9.9.9"
    assert proxy["imagePullPolicy"] == "Always"
    assert proxy["securityContext"]["runAsUser"] == 3000 and proxy["securityContext"]["runAsGroup"] == 3001
    assert proxy["resources"] == {"requests": {"cpu": "100m", "ephemeral-storage": "1Gi"}, "limits": {"memory": "250Mi"}}
    assert proxy["ports"] == [{"containerPort": 5143, "name": "linkerd-proxy"}, {"containerPort": 5191, "name": "linkerd-admin"}]
    assert proxy["livenessProbe"]["httpGet"]["port"] == 5191
    assert out["spec"]["template"]["metadata"]["annotations"]["linkerd.io/proxy-version"] == "9.9.9"
    args = init_of(out)["args"]
    assert (flag(args, "--incoming-proxy-port"), flag(args, "--outgoing-proxy-port")) == ("5143", "5140")
    assert (flag(args, "--proxy-uid"), flag(args, "--proxy-gid")) == ("3000", "3001")
    assert flag(args, "--inbound-ports-to-ignore") == "4190,5191,4567,4568"
    debug = out["spec"]["template"]["spec"]["containers"][-1]
    assert debug["name"] == "linkerd-debug" and debug["image"] == "cr.l5d.io/linkerd/debug:9.9.9"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (C + "proxy-uid", "root"),
        (C + "admin-port", "70000"),
        (C + "proxy-cpu-limit", "lots"),
        (C + "default-inbound-policy", "allow"),
        (C + "proxy-outbound-connect-timeout", "2 s"),
        (C + "skip-inbound-ports", "http"),
        (C + "proxy-additional-env", "{not json"),
        (C + "proxy-await", "yes"),
        (C + "proxy-cpu-ratio-limit", "2"),
    ],
)
def test_invalid_values_are_ignored_with_a_warning(config: MeshConfig, key: str, value: str) -> None:
    result = inject(deployment(annotations={key: value}), ENABLED, config)
    assert result.report.action == "injected"
    assert any(key in w for w in result.report.warnings), result.report.warnings
    baseline = inject(deployment(), ENABLED, config).obj
    assert proxy_of(result.obj) == proxy_of(baseline)


def test_close_wait_timeout_is_reported_as_unsupported(config: MeshConfig) -> None:
    result = inject(deployment(annotations={C + "close-wait-timeout": "1m"}), ENABLED, config)
    assert any("close-wait-timeout" in w for w in result.report.warnings)


def test_udp_ports_get_a_cli_warning(config: MeshConfig) -> None:
    obj = deployment()
    obj["spec"]["template"]["spec"]["containers"][0]["ports"].append({"containerPort": 53, "protocol": "UDP"})
    assert any("UDP" in w for w in inject(obj, {}, config, origin=Origin.CLI).report.warnings)


# --- ports ----------------------------------------------------------------------------------------------


def test_default_opaque_ports_the_pod_exposes_are_annotated(config: MeshConfig) -> None:
    out = meshed(pod(ports=(8080, 3306, 6379)), config)
    assert out["metadata"]["annotations"][C + "opaque-ports"] == "3306,6379"
    env = env_of(proxy_of(out))
    assert env["LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION"] == "25,587,3306,4444,5432,6379,9300,11211"
    assert env["LINKERD2_PROXY_INBOUND_PORTS"] == "3306,6379,8080"


def test_no_opaque_annotation_when_no_default_port_is_exposed(config: MeshConfig) -> None:
    assert C + "opaque-ports" not in meshed(pod(ports=(8080,)), config)["metadata"]["annotations"]


def test_opaque_ports_annotation_resolves_port_names(config: MeshConfig) -> None:
    obj = pod(ports=(("db", 5433), 8080), annotations={C + "opaque-ports": "db, 9000-9010,25"})
    out = meshed(obj, config)
    assert out["metadata"]["annotations"][C + "opaque-ports"] == "db, 9000-9010,25"  # as the user wrote it
    env = env_of(proxy_of(out))
    assert env["LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION"] == "5433,9000-9010,25"


def test_opaque_ports_inherited_from_the_namespace(config: MeshConfig) -> None:
    out = meshed(pod(ports=(3306,)), config, ns={**ENABLED, C + "opaque-ports": "4000"})
    assert out["metadata"]["annotations"][C + "opaque-ports"] == "4000"
    assert env_of(proxy_of(out))["LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION"] == "4000"


def test_inbound_ports_include_numeric_probe_ports_string_sorted(config: MeshConfig) -> None:
    obj = pod(ports=(8080, 10000))
    obj["spec"]["containers"][0]["livenessProbe"] = {"httpGet": {"path": "/", "port": 9090}}
    obj["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/", "port": "http"}}
    assert env_of(proxy_of(meshed(obj, config)))["LINKERD2_PROXY_INBOUND_PORTS"] == "10000,8080,9090"


def test_skip_ports_and_subnets(config: MeshConfig) -> None:
    annotations = {
        C + "skip-inbound-ports": "25,8080-8090",
        C + "skip-outbound-ports": "443, 5432",
        C + "skip-subnets": "10.0.0.0/8,fd00::/8",
    }
    args = init_of(meshed(deployment(annotations=annotations), config))["args"]
    assert flag(args, "--inbound-ports-to-ignore") == "4190,4191,25,8080-8090"
    assert flag(args, "--outbound-ports-to-ignore") == "443,5432"
    assert flag(args, "--subnets-to-ignore") == "10.0.0.0/8,fd00::/8"


def test_empty_skip_outbound_ports_clears_the_default(config: MeshConfig) -> None:
    cfg = config.replace(proxy_init=config.proxy_init.__class__(ignore_outbound_ports=""))
    assert flag(init_of(meshed(deployment(), cfg))["args"], "--outbound-ports-to-ignore") == ""


def test_control_plane_pods_skip_the_api_server_ports(config: MeshConfig) -> None:
    obj = pod(labels={"linkerd.io/control-plane-component": "destination"})
    assert flag(init_of(meshed(obj, config))["args"], "--outbound-ports-to-ignore") == "4567,4568,443,6443"


def test_ipv6_listeners(config: MeshConfig) -> None:
    out = meshed(pod(), config.replace(disable_ipv6=False))
    env = env_of(proxy_of(out))
    assert env["LINKERD2_PROXY_INBOUND_LISTEN_ADDR"] == "[::]:4143"
    assert env["LINKERD2_PROXY_OUTBOUND_LISTEN_ADDRS"] == "127.0.0.1:4140,[::1]:4140"
    assert "--ipv6=false" not in init_of(out)["args"]


def test_init_args_match_the_settings(config: MeshConfig) -> None:
    # init_args is what the container runs; the container test above pins the full list.
    from tether.injector import annotations as a
    from tether.injector.sidecar import resolve

    obj = pod()
    reader = a.AnnotationReader({})
    settings = resolve(config, reader, obj["spec"], pod_annotations={}, namespace_annotations={}, mode="enabled",
                       control_plane_pod=False)  # fmt: skip
    assert init_args(settings) == init_of(meshed(obj, config))["args"]


# --- the webhook's annotation-only patches --------------------------------------------------------------


def test_pod_not_injected_still_gets_opaque_ports(config: MeshConfig) -> None:
    result = inject(pod(ports=(5432,)), {}, config, origin=Origin.WEBHOOK)
    assert result.report.skipped and result.changed
    assert result.obj["metadata"]["annotations"] == {C + "opaque-ports": "5432"}
    assert result.obj["spec"] == pod(ports=(5432,))["spec"]
    # the CLI leaves skipped objects untouched
    assert not inject(pod(ports=(5432,), annotations={"linkerd.io/inject": "disabled"}), {}, config,
                      origin=Origin.CLI).changed  # fmt: skip


def test_service_opaque_ports(config: MeshConfig, workloads: dict[str, dict[str, Any]]) -> None:
    service = workloads["Service"]
    service["spec"]["ports"] = [
        {"name": "mysql", "port": 3306},
        {"name": "pg", "port": 15432, "targetPort": 5432},
        {"name": "named", "port": 6379, "targetPort": "redis"},
        {"name": "http", "port": 80, "targetPort": 8080},
    ]
    result = inject(service, {}, config, origin=Origin.WEBHOOK)
    assert result.obj["metadata"]["annotations"] == {C + "opaque-ports": "3306,15432"}
    inherited = inject(service, {C + "opaque-ports": "80"}, config, origin=Origin.WEBHOOK)
    assert inherited.obj["metadata"]["annotations"] == {C + "opaque-ports": "80"}
    service["metadata"]["annotations"] = {C + "opaque-ports": "1"}
    assert not inject(service, {}, config, origin=Origin.WEBHOOK).changed


# --- tether inject without --manual ------------------------------------------------------------------------


def test_mark_for_injection_only_adds_the_annotation(workloads: dict[str, dict[str, Any]]) -> None:
    result = mark_for_injection(workloads["Deployment"])
    expected = copy.deepcopy(workloads["Deployment"])
    expected["spec"]["template"]["metadata"]["annotations"] = {"linkerd.io/inject": "enabled"}
    assert result.obj == expected and result.report.action == "injected"
    ingress = mark_for_injection(workloads["Deployment"], ingress=True, overrides={C + "proxy-log-level": "debug"})
    assert ingress.obj["spec"]["template"]["metadata"]["annotations"] == {
        "linkerd.io/inject": "ingress",
        C + "proxy-log-level": "debug",
    }


def test_mark_for_injection_skips_like_inject(config: MeshConfig) -> None:
    assert mark_for_injection(deployment(hostNetwork=True)).report.skip_reasons == (SkipReason.HOST_NETWORK,)
    injected = meshed(deployment(), config)
    assert mark_for_injection(injected).report.skip_reasons == (SkipReason.SIDECAR_EXISTS,)


# --- uninject -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
def test_uninject_reverses_inject(config: MeshConfig, workloads: dict[str, dict[str, Any]], native: bool) -> None:
    for kind in ("Deployment", "DaemonSet", "ReplicationController", "Job", "CronJob", "Pod"):
        original = workloads[kind]
        injected = inject(original, {}, config.replace(native_sidecar=native), origin=Origin.CLI).obj
        result = uninject(injected)
        assert result.report.action == "uninjected"
        assert result.obj == original, kind


def test_uninject_keeps_config_annotations_and_disabled(config: MeshConfig) -> None:
    obj = deployment(annotations={C + "proxy-log-level": "debug"})
    injected = meshed(obj, config)
    out = uninject(injected).obj
    assert out["spec"]["template"]["metadata"]["annotations"] == {C + "proxy-log-level": "debug"}
    disabled = deployment(annotations={"linkerd.io/inject": "disabled", "linkerd.io/created-by": "x"})
    kept = uninject(disabled).obj["spec"]["template"]["metadata"]["annotations"]
    assert kept == {"linkerd.io/inject": "disabled"}


def test_uninject_of_a_plain_workload_is_a_skip(workloads: dict[str, dict[str, Any]]) -> None:
    result = uninject(workloads["StatefulSet"])
    assert result.report.skipped and not result.changed and result.obj == workloads["StatefulSet"]
    assert uninject(workloads["ConfigMap"]).report.skipped
