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
