"""An outbound route counts once its status says its parent accepted it, as in Linkerd.

Linkerd's outbound index (``policy-controller/k8s/index/src/outbound/index/http.rs``,
``route_accepted_by_resource_port`` and ``route_accepted_by_service``; the same for gRPC, TLS and TCP
routes) reads ``status.parents`` back: for a parentRef with a port, an entry of that kind and name with
that port (or none) and ``Accepted: True``; without a port, such an entry for a Service of that name.
The status controller's rule decides that status (``tests/policy/test_status.py``).
"""

from __future__ import annotations

from typing import Any

from outbound_helpers import CONFIG, NS, event, http_route, service, type_key

from tether.policy.outbound import OutboundIndex
from tether.policy.outbound.index import ServiceTarget

WEB = "web.emojivoto.svc.cluster.local:80"


def entry(*, kind: str = "Service", name: str = "web", port: int | None = 80, accepted: str = "True",
          controller: str = "linkerd.io/policy-controller") -> dict[str, Any]:
    ref: dict[str, Any] = {"group": "core" if kind == "Service" else "policy.linkerd.io", "kind": kind,
                           "namespace": NS, "name": name}
    if port is not None:
        ref["port"] = port
    return {"parentRef": ref, "controllerName": controller,
            "conditions": [{"type": "Accepted", "status": accepted, "reason": "Accepted"}]}


def routed(index: OutboundIndex) -> list[str]:
    target = index.service_target(WEB, NS)
    assert isinstance(target, ServiceTarget)
    return [route.name for route in index.state(target).http_routes]


def put(index: OutboundIndex, obj: dict[str, Any], *parents: dict[str, Any] | None) -> None:
    """``obj`` as the watch delivers it, with exactly these status entries (none: no status at all)."""
    if parents:
        obj = {**obj, "status": {"parents": list(parents)}}
    index.apply(type_key(obj), event(obj, "MODIFIED"))


def test_a_route_on_a_service_port_applies_once_its_status_accepts_it() -> None:
    index = OutboundIndex(CONFIG)
    put(index, service("web", "10.96.0.10"))
    route = http_route("r", "web", [{}])  # parentRef web:80
    put(index, route)
    assert routed(index) == []  # the Service exists, but nothing has accepted the route yet
    for parent in (entry(accepted="False"), entry(port=81), entry(name="api"), entry(kind="EgressNetwork")):
        put(index, route, parent)
        assert routed(index) == [], parent
    put(index, route, entry(port=None))  # an entry without a port accepts on every port
    assert routed(index) == ["r"]
    put(index, route, entry(controller="example.com/other"))  # Linkerd does not check who wrote it
    assert routed(index) == ["r"]


def test_a_route_on_a_whole_service_needs_a_service_entry_by_name() -> None:
    index = OutboundIndex(CONFIG)
    put(index, service("web", "10.96.0.10"))
    route = http_route("r", "web", [{}], port=None)
    put(index, route, entry(accepted="False", port=None))
    assert routed(index) == []
    put(index, route, entry(port=8080))  # any port of that Service's entry
    assert routed(index) == ["r"]
