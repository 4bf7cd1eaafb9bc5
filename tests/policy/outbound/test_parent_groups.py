"""A parentRef's ``group``, written and read back the same way, as Linkerd's on a cluster.

Linkerd's code takes a missing or empty group as ``core`` (``k8s/api/src/policy.rs`` ``targets_kind``;
``outbound/index/http.rs`` reading ``status.parents`` back), but on a cluster a group is never missing: the
CRDs default it (``parentRefs`` and ``status.parents[].parentRef``) to the route's group --
``policy.linkerd.io`` in Linkerd's HTTPRoute, ``gateway.networking.k8s.io`` in Gateway API's routes -- and
Tether's model applies the same defaults.  So ``{kind: Service}`` without a group names no Service (Gateway
API wants ``group: ""`` or ``core`` for one), ``{kind: EgressNetwork}`` or ``{kind: Server}`` without a group
does in a policy.linkerd.io HTTPRoute, and ``""`` is ``core``.  Linkerd's inbound index reads a Server's
entry by kind alone (``inbound/routes.rs``, ``from_http_parent_status``).  Each case: the status the controller
writes for the route's parentRef, then whether the indexes apply the route with that status -- and with an
entry someone else wrote without a group.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from outbound_helpers import CONFIG, EGRESS_NS, NS, egress_network, service

from tether.platform.watch import ResourceEvent
from tether.policy.inbound.index import InboundIndex
from tether.policy.outbound import OutboundIndex
from tether.policy.status import CONTROLLER_NAME, desired_statuses, merged_status
from tether.resources import kinds

POLICY = "policy.linkerd.io/v1beta3"
GATEWAY = "gateway.networking.k8s.io/v1"
SERVICE_PARENT = {"kind": "Service", "name": "web", "port": 80}
EGRESS_PARENT = {"kind": "EgressNetwork", "name": "out", "namespace": EGRESS_NS, "port": 443}
SERVER_PARENT = {"kind": "Server", "name": "web"}


def _route(api: str, parent: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": api, "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": NS},
                           "spec": {"parentRefs": [parent], "rules": [{}]}}
    if status is not None:
        obj["status"] = status
    return obj


def _key(api: str) -> str:
    return (kinds.POLICY_HTTP_ROUTE if api == POLICY else kinds.GATEWAY_HTTP_ROUTE).key


def _event(obj: dict[str, Any]) -> ResourceEvent:
    return ResourceEvent("ADDED", obj, "1", time.monotonic())


def _indexes(*objs: dict[str, Any]) -> tuple[InboundIndex, OutboundIndex]:
    inbound, outbound = InboundIndex(CONFIG), OutboundIndex(CONFIG)
    for obj in objs:
        key = _key(obj["apiVersion"]) if obj["kind"] == "HTTPRoute" else {
            "Service": kinds.SERVICE.key, "EgressNetwork": kinds.EGRESS_NETWORK.key,
            "Server": kinds.SERVER.key}[obj["kind"]]
        if key != kinds.SERVER.key:
            outbound.apply(key, _event(obj))
        if key not in (kinds.SERVICE.key, kinds.EGRESS_NETWORK.key):
            inbound.apply(key, _event(obj))
    inbound.flush()
    return inbound, outbound


def _server() -> dict[str, Any]:
    return {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server", "metadata": {"name": "web", "namespace": NS},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": 8080}}


_OBJECTS = (service("web", "10.96.0.10"), {**egress_network("out", "Allow", [{"cidr": "1.2.3.0/24"}]), "status": {
    "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}}, _server())


def _written(api: str, parent: dict[str, Any]) -> dict[str, Any]:
    """The route's one parent entry as the status controller writes it."""
    inbound, outbound = _indexes(*_OBJECTS, _route(api, parent))
    desired = desired_statuses(inbound, outbound.services, outbound.egress_networks)[(_key(api), NS, "r")]
    status = merged_status(None, desired, "2026-01-01T00:00:00Z")
    assert status is not None
    [entry] = status["parents"]
    return entry


def _applies(api: str, parent: dict[str, Any], status: dict[str, Any]) -> bool:
    """Whether the index of the parent's side applies the route with this status."""
    inbound, outbound = _indexes(*_OBJECTS, _route(api, parent, status))
    if parent["kind"] == "Server":
        route = inbound.objects[_key(api)][NS]["r"]
        return "web" in route.accepted_by and "web" in inbound.route_server_names(route)
    if parent["kind"] == "Service":
        state = outbound.state(outbound.service_target(f"web.{NS}.svc.cluster.local:80", NS))
    else:
        state = outbound.state(outbound.address_target("1.2.3.4", 443, NS))
    return [r.name for r in state.routes] == ["r"]


@pytest.mark.parametrize(("api", "parent", "group", "reason"), [
    (GATEWAY, {**SERVICE_PARENT, "group": ""}, "core", "Accepted"),
    (POLICY, {**SERVICE_PARENT, "group": "core"}, "core", "Accepted"),
    # No group: the route's (the CRD's default), so no Service.
    (GATEWAY, SERVICE_PARENT, "gateway.networking.k8s.io", "InvalidKind"),
    (POLICY, SERVICE_PARENT, "policy.linkerd.io", "InvalidKind"),
    (POLICY, EGRESS_PARENT, "policy.linkerd.io", "Accepted"),
    (GATEWAY, EGRESS_PARENT, "gateway.networking.k8s.io", "InvalidKind"),
    (GATEWAY, {**EGRESS_PARENT, "group": "policy.linkerd.io"}, "policy.linkerd.io", "Accepted"),
    (POLICY, SERVER_PARENT, "policy.linkerd.io", "Accepted"),
    (GATEWAY, SERVER_PARENT, "gateway.networking.k8s.io", "InvalidKind"),
])
def test_a_parent_is_written_with_the_group_it_is_read_with(api: str, parent: dict[str, Any], group: str,
                                                            reason: str) -> None:
    entry = _written(api, parent)
    assert entry["parentRef"]["group"] == group and entry["parentRef"]["kind"] == parent["kind"]
    assert entry["conditions"][0]["reason"] == reason
    if reason == "InvalidKind":
        # The message says why: the group, and what a parentRef without one means.
        assert f"{group}/{parent['kind']}" in entry["conditions"][0]["message"]
        assert "without group" in entry["conditions"][0]["message"]
    # Read back: what the controller wrote takes the route where it accepted it, and only there.
    assert _applies(api, parent, {"parents": [entry]}) == (reason == "Accepted")


@pytest.mark.parametrize(("api", "parent", "entry_group", "applies"), [
    # An entry without a group has the route's (as the CRD defaults it): not a Service's ...
    (GATEWAY, {**SERVICE_PARENT, "group": "core"}, None, False),
    (POLICY, {**SERVICE_PARENT, "group": "core"}, None, False),
    # ... an empty one is core's ...
    (GATEWAY, {**SERVICE_PARENT, "group": "core"}, "", True),
    # ... a policy.linkerd.io HTTPRoute's is an EgressNetwork's ...
    (POLICY, EGRESS_PARENT, None, True),
    (GATEWAY, {**EGRESS_PARENT, "group": "policy.linkerd.io"}, None, False),
    # ... and a Server's entry is read by its kind whatever its group, as Linkerd's inbound index reads it.
    (POLICY, SERVER_PARENT, None, True),
    (POLICY, SERVER_PARENT, "core", True),
])
def test_an_entry_without_a_group_is_read_as_the_crd_defaults_it(api: str, parent: dict[str, Any],
                                                                 entry_group: str | None, applies: bool) -> None:
    ref = {k: v for k, v in parent.items() if k != "group"}
    if entry_group is not None:
        ref["group"] = entry_group
    entry = {"parentRef": ref, "controllerName": CONTROLLER_NAME,
             "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}
    assert _applies(api, parent, {"parents": [entry]}) == applies
