"""Status written by the policy controller into the local store: routes, rate limits, EgressNetworks.

Each test drives one reconciliation at a time (``StatusController.reconcile``) once
the indexes hold the change, and reads the stored objects back (the loop as it runs:
``test_status_loop``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from policy_helpers import NS, Harness, Pki, eventually, http_route, namespace, pod, ratelimit, server

from tether.policy.status import CONTROLLER_NAME, LocalStatusWriter, StatusController, merged_status
from tether.resources import kinds


def service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}}


def service_route(name: str, parent: str, backend: str) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": parent, "port": 80}],
                     "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}}


def conditions(h: Harness, type_key: str, name: str) -> dict[str, tuple[str, str]]:
    obj = h.store.get(type_key, NS, name) or {}
    status = obj.get("status") or {}
    found = status.get("conditions") or next(
        (p["conditions"] for p in status.get("parents", []) if p.get("controllerName") == CONTROLLER_NAME), [])
    return {c["type"]: (c["status"], c["reason"]) for c in found}


def controller(h: Harness) -> StatusController:
    s = h.service
    writer = LocalStatusWriter(h.store.path)
    h.on_exit(writer.close)
    return StatusController(s.index, lambda: s.outbound_index.services, lambda: s.outbound_index.egress_networks,
                            writer, s.metrics)


async def settle(h: Harness, ctl: StatusController, indexed: Callable[[], bool]) -> int:
    """Wait until the indexes hold the change, then reconcile once; return how many statuses were written."""
    await eventually(indexed)
    return await ctl.reconcile()


async def test_inbound_routes_are_accepted_by_an_existing_server_only(workdir: Path, pki: Pki) -> None:
    route_key = kinds.POLICY_HTTP_ROUTE.key
    async with Harness(workdir, pki, namespace(), pod(), http_route("r", "web")) as h:
        ctl = controller(h)
        assert await ctl.reconcile() == 1
        assert conditions(h, route_key, "r")["Accepted"] == ("False", "NoMatchingParent")
        h.apply(server("web"))
        assert await settle(h, ctl, lambda: "web" in h.service.index.objects[kinds.SERVER.key].get(NS, {})) == 1
        assert conditions(h, route_key, "r")["Accepted"] == ("True", "Accepted")
        parents = h.store.get(route_key, NS, "r")["status"]["parents"]
        assert parents[0]["parentRef"] == {"group": "policy.linkerd.io", "kind": "Server", "name": "web"}
        assert conditions(h, route_key, "r")["ResolvedRefs"] == ("True", "ResolvedRefs")
        assert await ctl.reconcile() == 0  # nothing changed: nothing is written again
        assert h.metric("resource_status_patches_total", {"kind": "HTTPRoute"}) == 2


async def test_outbound_routes_report_missing_parents_and_backends(workdir: Path, pki: Pki) -> None:
    key = kinds.GATEWAY_HTTP_ROUTE.key
    services = lambda: h.service.outbound_index.services  # noqa: E731
    async with Harness(workdir, pki, namespace(), service("web"), service_route("split", "web", "gone")) as h:
        ctl = controller(h)
        await ctl.reconcile()
        assert conditions(h, key, "split") == {"Accepted": ("True", "Accepted"),
                                               "ResolvedRefs": ("False", "BackendNotFound")}
        h.apply(service("gone"))
        assert await settle(h, ctl, lambda: (NS, "gone") in services()) == 1
        assert conditions(h, key, "split")["ResolvedRefs"] == ("True", "ResolvedRefs")
        h.delete("svc", "web")
        assert await settle(h, ctl, lambda: (NS, "web") not in services()) == 1
        assert conditions(h, key, "split")["Accepted"] == ("False", "NoMatchingParent")


async def test_rate_limits_one_per_server_and_a_target_that_exists(workdir: Path, pki: Pki) -> None:
    key = kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.key
    async with Harness(workdir, pki, namespace(), server("web"),
                       ratelimit("first", "web", 10, created="2024-01-01T00:00:00Z"),
                       ratelimit("second", "web", 10, created="2024-01-02T00:00:00Z"),
                       ratelimit("orphan", "nope", 10)) as h:
        assert await controller(h).reconcile() == 3
        assert conditions(h, key, "orphan")["Accepted"] == ("False", "NoMatchingTarget")
        assert conditions(h, key, "first")["Accepted"] == ("True", "Accepted")
        assert conditions(h, key, "second")["Accepted"] == ("False", "RateLimitReasonAlreadyExists")


def test_other_controllers_parents_are_kept_and_transition_times_only_move_on_change() -> None:
    theirs = {"parentRef": {"kind": "Gateway", "name": "gw"}, "controllerName": "example.com/gateway",
              "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}
    ours = {"parentRef": {"group": "policy.linkerd.io", "kind": "Server", "name": "web"},
            "controllerName": CONTROLLER_NAME,
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""}]}
    first = merged_status({"parents": [theirs]}, {"parents": [ours]}, "2026-01-01T00:00:00Z")
    assert first is not None and first["parents"][0] == theirs
    assert first["parents"][1]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert merged_status(first, {"parents": [ours]}, "2026-01-02T00:00:00Z") is None
    denied = {**ours, "conditions": [{"type": "Accepted", "status": "False", "reason": "NoMatchingParent",
                                      "message": "gone"}]}
    second = merged_status(first, {"parents": [denied]}, "2026-01-03T00:00:00Z")
    assert second is not None
    assert second["parents"][1]["conditions"][0]["lastTransitionTime"] == "2026-01-03T00:00:00Z"
