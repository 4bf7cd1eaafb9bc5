"""Builders of the objects the outbound policy tests apply, and an index fed through ResourceEvents."""

from __future__ import annotations

import time
from typing import Any

from tether.platform.watch import ResourceEvent
from tether.policy import PolicyConfig
from tether.policy.config import parse_networks
from tether.policy.outbound import OutboundIndex

NS = "emojivoto"
EGRESS_NS = "linkerd-egress"
CONFIG = PolicyConfig(cluster_networks=parse_networks("10.0.0.0/8,fd00::/8"), global_egress_network_namespace=EGRESS_NS)
TYPE_KEYS = {
    "Service": "Service",
    "Namespace": "Namespace",
    "EgressNetwork": "EgressNetwork.policy.linkerd.io",
    "HTTPRoute": "HTTPRoute.policy.linkerd.io",
    "GatewayHTTPRoute": "HTTPRoute.gateway.networking.k8s.io",
    "GRPCRoute": "GRPCRoute.gateway.networking.k8s.io",
    "TLSRoute": "TLSRoute.gateway.networking.k8s.io",
    "TCPRoute": "TCPRoute.gateway.networking.k8s.io",
}


def type_key(obj: dict[str, Any]) -> str:
    if obj["kind"] == "HTTPRoute" and obj["apiVersion"].startswith("gateway"):
        return TYPE_KEYS["GatewayHTTPRoute"]
    return TYPE_KEYS[obj["kind"]]


def event(obj: dict[str, Any], kind: str = "ADDED") -> ResourceEvent:
    return ResourceEvent(kind, obj, "1", time.monotonic())  # type: ignore[arg-type]


def accepted(obj: dict[str, Any]) -> dict[str, Any]:
    """A route as the status controller leaves it, each Service or EgressNetwork parent ``Accepted`` (the index
    reads acceptance back from ``status.parents``, as Linkerd's); another object, or one with a status, as given."""
    if obj["kind"] not in ("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute") or "status" in obj:
        return obj
    parents = [{"parentRef": {"group": ref.get("group") or "core", **{k: v for k, v in ref.items() if k != "group"}},
                "controllerName": "linkerd.io/policy-controller",
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}
               for ref in obj["spec"].get("parentRefs", []) if ref.get("kind") in ("Service", "EgressNetwork")]
    return {**obj, "status": {"parents": parents}}


def feed(index: OutboundIndex, *objs: dict[str, Any]) -> None:
    for obj in objs:
        index.apply(type_key(obj), event(accepted(obj)))


def remove(index: OutboundIndex, obj: dict[str, Any]) -> None:
    index.apply(type_key(obj), event(obj, "DELETED"))


def meta(name: str, ns: str | None = NS, annotations: dict[str, str] | None = None,
         created: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if ns is not None:
        out["namespace"] = ns
    if annotations:
        out["annotations"] = annotations
    if created:
        out["creationTimestamp"] = created
    return out


def service(name: str, ip: str, ports: list[dict[str, Any]] | None = None, ns: str = NS,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    ports = ports or [{"name": "http", "port": 80}]
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns, annotations),
            "spec": {"clusterIP": ip, "ports": ports, "selector": {"app": name}}}


def namespace(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(name, None, annotations)}


def http_route(name: str, parent: str, rules: list[dict[str, Any]], ns: str = NS, parent_ns: str | None = None,
               port: int | None = 80, annotations: dict[str, str] | None = None, gateway: bool = False,
               created: str | None = None, hostnames: list[str] | None = None,
               parent_kind: str = "Service") -> dict[str, Any]:
    ref: dict[str, Any] = {"name": parent, "kind": parent_kind,
                           "group": "core" if parent_kind == "Service" else "policy.linkerd.io"}
    if port is not None:
        ref["port"] = port
    if parent_ns is not None:
        ref["namespace"] = parent_ns
    spec: dict[str, Any] = {"parentRefs": [ref], "rules": rules}
    if hostnames:
        spec["hostnames"] = hostnames
    api = "gateway.networking.k8s.io/v1" if gateway else "policy.linkerd.io/v1beta3"
    return {"apiVersion": api, "kind": "HTTPRoute", "metadata": meta(name, ns, annotations, created), "spec": spec}


def grpc_route(name: str, parent: str, rules: list[dict[str, Any]], ns: str = NS, port: int | None = 80,
               annotations: dict[str, str] | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": parent, "kind": "Service", "group": "core"}
    if port is not None:
        ref["port"] = port
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
            "metadata": meta(name, ns, annotations), "spec": {"parentRefs": [ref], "rules": rules}}


def egress_network(name: str, policy: str, networks: list[dict[str, Any]] | None = None, ns: str = EGRESS_NS,
                   created: str | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"trafficPolicy": policy}
    if networks is not None:
        spec["networks"] = networks
    return {"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "EgressNetwork",
            "metadata": meta(name, ns, annotations, created), "spec": spec}


def backend(name: str, port: int = 80, weight: int | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "port": port, **extra}
    if weight is not None:
        out["weight"] = weight
    return out


def stream_route(kind: str, name: str, parent: str, backends: list[dict[str, Any]], ns: str = NS,
                 port: int | None = 80, parent_kind: str = "Service", hostnames: list[str] | None = None,
                 created: str | None = None) -> dict[str, Any]:
    """A TLSRoute or TCPRoute (``kind``) with its one rule."""
    ref: dict[str, Any] = {"name": parent, "kind": parent_kind,
                           "group": "core" if parent_kind == "Service" else "policy.linkerd.io"}
    if port is not None:
        ref["port"] = port
    spec: dict[str, Any] = {"parentRefs": [ref], "rules": [{"backendRefs": backends}]}
    if hostnames:
        spec["hostnames"] = hostnames
    return {"apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": kind,
            "metadata": meta(name, ns, None, created), "spec": spec}
