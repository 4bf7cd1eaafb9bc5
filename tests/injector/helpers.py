"""Builders of test objects, lookups into patched pods, and the kubelet's expansion of a container's
environment (downward API fields and ``$(VAR)`` references), for the injector tests."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
ANCHOR_FILE = DATA / "trust-anchor.crt"
WORKLOADS_FILE = DATA / "workloads.yaml"

def pod(
    name: str = "web-0",
    *,
    namespace: str | None = "shop",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    ports: tuple[int | tuple[str, int], ...] = (8080,),
    **spec: Any,
) -> dict[str, Any]:
    """A Pod with one container ``app`` exposing ``ports`` (a number, or ``(name, number)``)."""
    container_ports = [
        {"containerPort": p} if isinstance(p, int) else {"name": p[0], "containerPort": p[1]} for p in ports
    ]
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    container: dict[str, Any] = {"name": "app", "image": "example.com/app:1.0"}
    if container_ports:
        container["ports"] = container_ports
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container], **spec}}


def deployment(name: str = "web", *, annotations: Mapping[str, str] | None = None, **pod_kw: Any) -> dict[str, Any]:
    template = pod(name, namespace=None, annotations=annotations, labels={"app": name}, **pod_kw)
    del template["metadata"]["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }


def template_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "Pod":
        return obj  # type: ignore[return-value]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]
    return obj["spec"]["template"]


def container(containers: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(c for c in containers if c["name"] == name)


def env_of(c: Mapping[str, Any]) -> dict[str, Any]:
    """name -> value (or the fieldRef path) of a container's environment."""
    return {e["name"]: e.get("value", e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")) for e in c["env"]}


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def kubelet_env(c: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, str]:
    """The environment the kubelet gives ``c``: fieldRefs from ``fields``, ``$(VAR)`` of earlier vars expanded."""
    env: dict[str, str] = {}
    for item in c["env"]:
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
            continue

        def expand(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            return env.get(match.group(1), match.group(0))

        env[item["name"]] = _REF.sub(expand, item.get("value", ""))
    return env


POD_FIELDS = {
    "metadata.name": "web-7d9c-x2x4q",
    "metadata.namespace": "shop",
    "metadata.uid": "0b5ec2c4-5d9c-4e0d-9f55-2f7b0a4c1a11",
    "status.podIP": "10.42.0.7",
    "status.podIPs": "10.42.0.7",
    "spec.nodeName": "node-1",
    "spec.serviceAccountName": "web",
}
