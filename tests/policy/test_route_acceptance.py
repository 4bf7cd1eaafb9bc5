"""An inbound route or rate limit counts once its status says this controller accepted it, as in Linkerd.

Linkerd's inbound index (``policy-controller/k8s/index/src/inbound/routes.rs``, ``accepted_by_server``;
``ratelimit_policy.rs``) reads ``status`` back: a route applies to a Server only when a
``status.parents`` entry of kind ``Server`` by that name, written by ``linkerd.io/policy-controller``,
has ``Accepted: True``; a rate limit when its ``Accepted`` condition is true.  The status controller's
rule (the Server exists) decides that status; the index does not apply the rule itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from policy_helpers import NS, Harness, Pki, http_route, namespace, pod, ratelimit, server

from tether.platform.watch import ResourceEvent
from tether.policy import PolicyConfig
from tether.policy.inbound.index import InboundIndex
from tether.policy.status import CONTROLLER_NAME, desired_statuses, merged_status
from tether.resources import kinds

P = "policy.linkerd.io"
ROUTE = "HTTPRoute/r"


def parent(name: str = "web", *, accepted: str = "True", kind: str = "Server",
           controller: str = CONTROLLER_NAME) -> dict[str, Any]:
    return {"parentRef": {"group": P, "kind": kind, "namespace": NS, "name": name}, "controllerName": controller,
            "conditions": [{"type": "Accepted", "status": accepted, "reason": "Accepted"}]}


def with_status(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "status": status}


def feed(index: InboundIndex, *objs: dict[str, Any]) -> None:
    for obj in objs:
        kind = {"HTTPRoute": "httproutes.policy.linkerd.io"}.get(obj["kind"], obj["kind"])
        index.apply(kinds.lookup(kind).key, ResourceEvent("MODIFIED", obj, "1", time.monotonic()))
    index.flush()


def route_names(index: InboundIndex) -> list[str]:
    return [route.ref.name for route in index.lookup(NS, "web-0", 8080).http_routes]


async def test_a_route_applies_only_where_its_status_says_this_controller_accepted_it() -> None:
    index = InboundIndex(PolicyConfig())
    route = http_route("r", "web")
    feed(index, namespace(), pod(), server("web", protocol="HTTP/1"), route)
    # The Server exists, so the status controller's rule accepts the route; without that status written, no.
    assert route_names(index) == ["default"]
    for status in (
        {"parents": [parent(controller="example.com/gateway")]},  # another controller's word does not count
        {"parents": [parent(accepted="False")]},
        {"parents": [parent(kind="Gateway")]},
        {"parents": [parent("api")]},  # accepted by another Server
        {"parents": [{**parent(), "conditions": [{"type": "ResolvedRefs", "status": "True", "reason": "R"}]}]},
    ):
        feed(index, with_status(route, status))
        assert route_names(index) == ["default"], status
    feed(index, with_status(route, {"parents": [parent(controller="example.com/gateway", accepted="False"),
                                                parent()]}))
    assert route_names(index) == ["r"]
    # The status stays Accepted while the spec no longer names the Server: Linkerd needs both.
    elsewhere = http_route("r", "api")
    feed(index, with_status(elsewhere, {"parents": [parent()]}))
    assert route_names(index) == ["default"]


async def test_a_rate_limit_applies_only_once_its_status_says_accepted() -> None:
    index = InboundIndex(PolicyConfig())
    limit = ratelimit("rl", "web", 10)
    feed(index, namespace(), pod(), server("web", protocol="HTTP/1"), limit)
    assert index.lookup(NS, "web-0", 8080).ratelimit is None
    refused = {"conditions": [{"type": "Accepted", "status": "False", "reason": "RateLimitReasonAlreadyExists"}]}
    feed(index, with_status(limit, refused))
    assert index.lookup(NS, "web-0", 8080).ratelimit is None
    feed(index, with_status(limit, {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}))
    got = index.lookup(NS, "web-0", 8080).ratelimit
    assert got is not None and got.name == "rl"


async def test_without_the_status_loop_a_stream_gets_the_route_when_its_status_is_written(
        workdir: Path, pki: Pki) -> None:
    # A replica that writes no status (on Kubernetes: one that does not hold the Lease) serves what the
    # statuses say: here nobody has written one yet.
    route = http_route("r", "web")
    async with Harness(workdir, pki, namespace(), pod(), server("web", protocol="HTTP/1"), route,
                       status_writer=None) as h:
        watch = h.watch(8080)
        assert [r["ref"] for r in (await watch.next())["http_routes"]] == ["default:default"]
        h.apply(with_status(route, {"parents": [parent()]}))  # what the status controller writes
        assert [r["ref"] for r in (await watch.next())["http_routes"]] == [ROUTE]
        h.apply(with_status(route, {"parents": [parent(accepted="False")]}))
        assert [r["ref"] for r in (await watch.next())["http_routes"]] == ["default:default"]


def test_conditions_this_controller_does_not_write_on_its_server_entries_are_logged_and_ignored(caplog) -> None:
    """As Linkerd's inbound index (``from_http_parent_status``): an entry under this controller's name with a
    condition type other than Accepted, or an Accepted neither True nor False, is logged by route, Server and
    condition, and that condition does not count; another controller's entry is skipped without a word."""
    index = InboundIndex(PolicyConfig())
    route = http_route("r", "web")
    feed(index, namespace(), pod(), server("web", protocol="HTTP/1"))
    caplog.set_level("WARNING", logger="tether.policy.inbound.facts")
    # What the status controller writes for a Server parent: Accepted alone, so nothing to warn of.
    inbound_status = desired_statuses(index_with(route), {}, {})[(kinds.POLICY_HTTP_ROUTE.key, NS, "r")]
    feed(index, with_status(route, merged_status(None, inbound_status, "2026-01-01T00:00:00Z")))
    assert route_names(index) == ["r"] and not caplog.records
    extra = {**parent(), "conditions": [*parent()["conditions"],
                                        {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs"}]}
    feed(index, with_status(route, {"parents": [extra]}))
    assert route_names(index) == ["r"]  # the Accepted condition still counts
    [record] = caplog.records
    assert record.levelname == "WARNING"
    assert ("HTTPRoute emojivoto/r: status.parents entry of Server web by linkerd.io/policy-controller has a "
            "condition this controller does not write: ResolvedRefs") in record.getMessage()
    caplog.clear()
    unknown = {**parent(), "conditions": [{"type": "Accepted", "status": "Unknown", "reason": "Pending"}]}
    feed(index, with_status(route, {"parents": [unknown]}))
    assert route_names(index) == ["default"]
    [record] = caplog.records
    assert "Server web" in record.getMessage() and "Accepted with status Unknown" in record.getMessage()
    caplog.clear()
    theirs = {**extra, "controllerName": "example.com/gateway"}
    feed(index, with_status(route, {"parents": [theirs, parent()]}))
    assert route_names(index) == ["r"] and not caplog.records


def index_with(*objs: dict[str, Any]) -> InboundIndex:
    index = InboundIndex(PolicyConfig())
    feed(index, namespace(), pod(), server("web", protocol="HTTP/1"), *objs)
    return index
