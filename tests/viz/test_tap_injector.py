"""The tap injector's rule: which pods get tap, and the JSON patch, applied with a real RFC 6902 implementation."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from tether.viz.tap import why_not_tappable
from tether.viz.tap_injector import DISABLE_TAP, TAP_ENABLED, TAP_ENV, decide, patch, tap_identity
from viz.promlab import meshed_pod

IDENTITY = tap_identity()


def _apply(pod: dict[str, Any], ns_annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return jsonpatch.apply_patch(copy.deepcopy(pod), patch(pod, ns_annotations or {}, IDENTITY))


def test_the_tap_identity_is_linkerd_s() -> None:
    assert IDENTITY == "tap.linkerd-viz.serviceaccount.identity.linkerd.cluster.local"
    assert tap_identity("viz", "mesh", "example.org") == "tap.viz.serviceaccount.identity.mesh.example.org"


@pytest.mark.parametrize("sidecar", ["native", "classic"])
def test_a_meshed_pod_gets_the_variable_and_the_annotation(sidecar: str) -> None:
    pod = meshed_pod("web-1", "emojivoto", "web", 4191)
    if sidecar == "classic":
        pod["spec"]["containers"].append(pod["spec"]["initContainers"].pop(1))
    patched = _apply(pod)
    field = "initContainers" if sidecar == "native" else "containers"
    proxy = next(c for c in patched["spec"][field] if c["name"] == "linkerd-proxy")
    assert proxy["env"] == [{"name": TAP_ENV, "value": IDENTITY}]
    assert patched["metadata"]["annotations"] == {TAP_ENABLED: "true"}
    assert patched["status"]["podIP"] and why_not_tappable(patched) is None  # what the tap server then accepts
    assert patch(patched, {}, IDENTITY) == []  # once is enough
    assert decide(patched, {}).reason == f"its proxy already has {TAP_ENV}"


def test_existing_env_and_annotations_are_kept() -> None:
    pod = meshed_pod("web-1", "emojivoto", "web", 4191)
    pod["metadata"]["annotations"] = {"a/b": "c"}
    pod["spec"]["initContainers"][1]["env"] = [{"name": "X", "value": "1"}]
    patched = _apply(pod)
    assert patched["metadata"]["annotations"] == {"a/b": "c", TAP_ENABLED: "true"}
    assert [e["name"] for e in patched["spec"]["initContainers"][1]["env"]] == ["X", TAP_ENV]


def test_disabled_or_unmeshed_pods_are_left_alone_with_a_reason() -> None:
    pod = meshed_pod("web-1", "emojivoto", "web", 4191)
    assert decide(pod, {DISABLE_TAP: "true"}).reason == f"its namespace is annotated {DISABLE_TAP}"
    assert patch(pod, {DISABLE_TAP: "true"}, IDENTITY) == []
    pod["metadata"]["annotations"] = {DISABLE_TAP: "true"}
    assert decide(pod, {}).reason == f"the pod is annotated {DISABLE_TAP}"
    plain = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "app"}]}}
    assert not decide(plain, {}).inject and "not meshed" in decide(plain, {}).reason


# -- the local platform's injection: the proxy injector, then the tap injector while viz is installed ---------


def test_the_local_platform_s_pods_get_tap_while_viz_is_installed(tmp_path) -> None:  # noqa: ANN001
    from ipaddress import IPv4Network

    from injector.helpers import ANCHOR_FILE
    from tether.injector.local_platform import LocalMesher, mesh_config
    from tether.platform.local import deployments
    from tether.platform.local.config import LocalPlatformConfig
    from tether.viz import local

    config = LocalPlatformConfig(state_dir=tmp_path, prefix="tx1", bridge="tx1br", pod_cidr=IPv4Network("10.9.0.0/24"),
                                 service_cidr=IPv4Network("10.9.1.0/24"), trust_domain="example.org")
    mesher = LocalMesher(mesh_config(config, ANCHOR_FILE.read_text(), "0.1.0"), later=[local.tap_admission(config)])
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "web", "namespace": "apps", "uid": "u-1"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                           "template": {"metadata": {"labels": {"app": "web"}},
                                        "spec": {"containers": [{"name": "web", "image": "web"}]}}}}
    pod = deployments.new_pod(deployment, "h", "web-h-abcde", "local")
    inject = {"linkerd.io/inject": "enabled"}

    def tap_env(meshed: Any) -> list[str]:
        proxy = next(c for c in meshed.obj["spec"]["initContainers"] if c["name"] == "linkerd-proxy")
        return [e["value"] for e in proxy["env"] if e["name"] == TAP_ENV]

    before = mesher(pod, inject)
    assert before.meshed and tap_env(before) == [] and TAP_ENABLED not in before.obj["metadata"].get("annotations", {})
    local.layout(config).root.mkdir(parents=True)
    local.layout(config).settings.write_text("{}")  # viz installed
    meshed = mesher(pod, inject)
    assert tap_env(meshed) == ["tap.linkerd-viz.serviceaccount.identity.linkerd.example.org"]
    assert meshed.obj["metadata"]["annotations"][TAP_ENABLED] == "true"
    disabled = mesher(pod, {**inject, DISABLE_TAP: "true"})
    assert disabled.meshed and tap_env(disabled) == []
    unmeshed = mesher(pod, {})
    assert not unmeshed.meshed and unmeshed.obj == pod  # nothing for the tap injector to do either
