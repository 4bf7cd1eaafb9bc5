"""Local pods meshed by the injector's one patch (``LocalMesher``), as the local pod controller runs it.

The same `inject` as the webhook (its decision table is tested in test_patch), under the local
platform's placement: control plane by the bridge gateway's IP, identity files per pod under the
run directory (expanded the way the local platform expands a container's environment), proxy-init
as root with the host's iptables, ``tether proxy``/``tether init`` as commands.
"""

from __future__ import annotations

from ipaddress import IPv4Network
from pathlib import Path

from tether.injector.local_platform import LocalMesher, mesh_config
from tether.platform.local import deployments
from tether.platform.local.config import LocalPlatformConfig
from tether.platform.local.containers import build_env

from .helpers import ANCHOR_FILE


def _mesher(tmp_path: Path) -> tuple[LocalMesher, LocalPlatformConfig]:
    config = LocalPlatformConfig(state_dir=tmp_path, prefix="tx1", bridge="tx1br", pod_cidr=IPv4Network("10.9.0.0/24"),
                                 service_cidr=IPv4Network("10.9.1.0/24"))
    config = config.with_changes(proxy_command=("tether", "proxy"), init_command=("tether", "init"))
    return LocalMesher(mesh_config(config, ANCHOR_FILE.read_text(), "0.1.0")), config


def _deployment() -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "apps", "uid": "u-1"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "web", "command": ["web"],
                                                       "ports": [{"name": "http", "containerPort": 8080},
                                                                 {"containerPort": 6379}]}]}}},
    }


def test_local_pods_get_the_webhooks_patch_placed_for_the_local_platform(tmp_path: Path) -> None:
    mesher, config = _mesher(tmp_path)
    pod = deployments.new_pod(_deployment(), "h", "web-h-abcde", "local")
    meshed = mesher(pod, {"linkerd.io/inject": "enabled", "config.linkerd.io/skip-outbound-ports": "443"})
    assert meshed.meshed and meshed.reason == ""
    assert meshed.event == ("Injected", "Linkerd sidecar proxy injected")  # recorded on the Deployment
    init, proxy = meshed.obj["spec"]["initContainers"]
    assert init["command"] == ["tether", "init"] and init["securityContext"]["runAsUser"] == 0
    assert "--firewall-bin-path" not in init["args"]  # the host's own iptables, as the platform's rules use
    assert init["args"][init["args"].index("--outbound-ports-to-ignore") + 1] == "443"
    assert proxy["command"] == ["tether", "proxy"]
    assert proxy["restartPolicy"] == "Always" and proxy["securityContext"]["runAsUser"] == 2102
    env = build_env(meshed.obj, proxy, {})
    host = str(config.host_ip)
    assert env["LINKERD2_PROXY_DESTINATION_SVC_ADDR"] == f"{host}:{config.ports.destination}"
    assert env["LINKERD2_PROXY_POLICY_SVC_ADDR"] == f"{host}:{config.ports.policy}"
    assert env["LINKERD2_PROXY_IDENTITY_SVC_ADDR"] == f"{host}:{config.ports.identity}"
    assert env["LINKERD2_PROXY_IDENTITY_TOKEN_FILE"] == str(config.layout.token_file("apps", "web-h-abcde"))
    assert env["LINKERD2_PROXY_IDENTITY_DIR"] == str(config.layout.identity_dir("apps", "web-h-abcde"))
    assert env["LINKERD2_PROXY_IDENTITY_LOCAL_NAME"] == "default.apps.serviceaccount.identity.linkerd.cluster.local"
    annotations = meshed.obj["metadata"]["annotations"]
    assert annotations["config.linkerd.io/skip-outbound-ports"] == "443"  # inherited from the namespace
    assert annotations["config.linkerd.io/opaque-ports"] == "6379"
    assert meshed.obj["metadata"]["labels"]["linkerd.io/proxy-deployment"] == "web"


def test_pods_not_asked_for_are_skipped_with_the_webhooks_reason(tmp_path: Path) -> None:
    mesher, _ = _mesher(tmp_path)
    pod = deployments.new_pod(_deployment(), "h", "web-h-abcde", "local")
    skipped = mesher(pod, {})
    assert not skipped.meshed and skipped.reason == "injection_enable_annotation_absent"
    reason, message = skipped.event or ("", "")
    assert reason == "InjectionSkipped" and message.startswith("Linkerd sidecar proxy injection skipped: ")
    assert "initContainers" not in skipped.obj["spec"]
    assert skipped.obj["metadata"]["annotations"]["config.linkerd.io/opaque-ports"] == "6379"
    assert mesher(pod, {"linkerd.io/inject": "bogus"}).reason == "invalid_inject_annotation_at_ns"
