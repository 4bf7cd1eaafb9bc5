"""Everything ``tether inject`` prints validates against the Kubernetes 1.35 OpenAPI schemas (strict: no unknown
fields), with ``kubernetes-validate``, which ships the schemas and works offline. No API server runs here,
so this is the check that the patch is a pod Kubernetes would accept, not proof that it runs."""

from __future__ import annotations

from typing import Any

import pytest

from tether.injector import MeshConfig, Origin, inject, mark_for_injection, uninject
from tether.injector.manifests import transform_text
from tether.resources.loading import load_text

from .helpers import WORKLOADS_FILE, pod

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")

KUBERNETES = "1.35"
C = "config.linkerd.io/"

VARIANTS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "native": ({}, {}),
    "legacy": ({"config.alpha.linkerd.io/proxy-enable-native-sidecar": "false"}, {}),
    "legacy-no-await": ({C + "proxy-enable-native-sidecar": "false", C + "proxy-await": "disabled",
                         "config.alpha.linkerd.io/proxy-wait-before-exit-seconds": "5"}, {}),  # fmt: skip
    "cni": ({}, {"cni_enabled": True}),
    "ipv6-no-projection": ({}, {"disable_ipv6": False, "token_projection": False}),
    "tuned": (
        {
            C + "proxy-cpu-request": "100m", C + "proxy-cpu-limit": "1", C + "proxy-memory-limit": "250Mi",
            C + "proxy-ephemeral-storage-request": "10Mi", C + "proxy-uid": "3000", C + "proxy-gid": "3000",
            C + "enable-debug-sidecar": "true", C + "skip-subnets": "10.0.0.0/8", C + "opaque-ports": "mysql",
            C + "proxy-additional-env": '[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]',
        },
        {},
    ),
}


def _validate(obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as err:
        path = ".".join(str(p) for p in err.path)
        pytest.fail(f"{obj['kind']} {obj['metadata'].get('name')}: {path}: {err.message}")


def _set_annotations(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    if obj["kind"] == "Pod":
        template = obj
    elif obj["kind"] == "CronJob":
        template = obj["spec"]["jobTemplate"]["spec"]["template"]
    elif "template" in obj.get("spec", {}):
        template = obj["spec"]["template"]
    else:
        return obj
    template.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
    return obj


def test_the_schemas_are_there_offline_and_strict(config: MeshConfig) -> None:
    assert kubernetes_validate.validate(pod(), KUBERNETES, strict=True) == KUBERNETES
    bad = inject(pod(), {"linkerd.io/inject": "enabled"}, config).obj
    bad["spec"]["initContainers"][1]["restartPolicy"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)
    bad["spec"]["initContainers"][1]["restartPolicy"] = "Always"
    bad["spec"]["initContainers"][1]["sidecar"] = True  # an unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_manual_inject_output_validates(config: MeshConfig, variant: str) -> None:
    annotations, changes = VARIANTS[variant]
    cfg = config.replace(**changes)

    def transform(obj: dict[str, Any]):  # noqa: ANN202
        return inject(_set_annotations(obj, annotations), {}, cfg, origin=Origin.CLI)

    output = transform_text(WORKLOADS_FILE.read_text(), str(WORKLOADS_FILE), transform)
    assert sum(r.report.action == "injected" for r in output.reports) == 8
    for obj in load_text(output.text, "out"):
        _validate(obj)


def test_default_inject_and_uninject_output_validates(config: MeshConfig) -> None:
    marked = transform_text(WORKLOADS_FILE.read_text(), "w", mark_for_injection)
    for obj in load_text(marked.text, "out"):
        _validate(obj)
    injected = transform_text(WORKLOADS_FILE.read_text(), "w", lambda o: inject(o, {}, config, origin=Origin.CLI))
    for obj in load_text(transform_text(injected.text, "w", uninject).text, "out"):
        _validate(obj)


def test_webhook_pod_validates(config: MeshConfig) -> None:
    obj = pod(ports=(("http", 8080), 3306))
    obj["spec"]["initContainers"] = [{"name": "setup", "image": "busybox"}]
    _validate(inject(obj, {"linkerd.io/inject": "enabled"}, config, origin=Origin.WEBHOOK).obj)
