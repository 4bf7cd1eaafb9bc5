"""Linkerd's own policy tutorials, inbound and outbound, their manifests unchanged (``tutorials/*.yaml``, each
naming its source).

Each manifest is admitted by the rule set ``tether apply`` and the validating webhook share, applied
in the tutorial's order to a store with stand-ins for the tutorial's workloads (the pods and Services
its demo app would create), and the policy controller answers what a proxy receives over mTLS: the
inbound ``Server`` of the protected pod port, or the outbound policy of the client's target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from outbound_grpc_helpers import Harness, next_policy
from policy_helpers import Pki, pod

from tether.api import outbound_pb2 as pb
from tether.policy.admission import VALIDATED, PolicyAdmission
from tether.resources.loading import load_text

TUTORIALS = Path(__file__).parent / "tutorials"
ALL = ["0.0.0.0/0", "::/0"]


def tutorial(name: str) -> list[dict[str, Any]]:
    """The tutorial's documents, in order, each admitted as ``tether apply`` and the webhook admit it."""
    docs = load_text((TUTORIALS / name).read_text(), name)
    admission = PolicyAdmission()
    for doc in docs:
        group, _, version = doc["apiVersion"].rpartition("/")
        plural = doc["kind"].lower() + ("es" if doc["kind"].endswith("s") else "s")
        if (group, plural) in VALIDATED:
            answer = json.loads(admission.review(json.dumps({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u", "operation": "CREATE", "namespace": doc["metadata"]["namespace"],
                            "object": doc, "resource": {"group": group, "version": version, "resource": plural}},
            }).encode()).body)["response"]
            assert answer["allowed"] and "warnings" not in answer, (name, doc["metadata"]["name"], answer)
    return docs


def service(name: str, ns: str, port: int, app: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": app or name}, "ports": [{"port": port}]}}


def ns(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def sa(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.serviceaccount.identity.linkerd.cluster.local"


def http_routes(policy: pb.OutboundPolicy) -> dict[str, Any]:
    return {r.metadata.resource.name: r for r in policy.protocol.detect.http1.routes if r.metadata.resource.name}


def backends(rule: Any) -> list[tuple[str, int]]:
    return [(b.backend.backend.metadata.resource.name, b.weight) for b in rule.backends.random_available.backends]


async def test_restricting_access_only_web_calls_voting(workdir: Path, pki: Pki) -> None:
    voting = pod("voting-0", ns="emojivoto", app="voting-svc", sa="voting", ports=[("grpc", 8080)])
    async with Harness(workdir, pki, ns("emojivoto"), voting, *tutorial("restricting-access.yaml")) as h:
        s = await h.get(8080, "voting-0", "emojivoto")
        assert s["labels"] == {"group": "policy.linkerd.io", "kind": "server", "name": "voting-grpc"}
        assert s["protocol"] == "grpc"
        [authz] = s["authorizations"]
        assert (authz["ref"], authz["authentication"], authz["identities"]) == (
            "serverauthorization/voting-grpc", "identities", [sa("web", "emojivoto")])


async def test_per_route_policy_on_the_authors_server(workdir: Path, pki: Pki) -> None:
    authors = pod("authors-0", ns="booksapp", app="authors", sa="authors", ports=[("service", 7001)])
    authors["metadata"]["labels"]["project"] = "booksapp"
    async with Harness(workdir, pki, ns("booksapp"), authors, *tutorial("per-route-policy.yaml")) as h:
        s = await h.get(7001, "authors-0", "booksapp")
        assert s["labels"]["name"] == "authors-server" and s["authorizations"] == []  # deny but per route
        routes = {r["ref"]: r for r in s["http_routes"]}
        assert set(routes) == {"HTTPRoute/authors-get-route", "HTTPRoute/authors-probe-route",
                               "HTTPRoute/authors-modify-route"}
        get, probe, modify = (routes[f"HTTPRoute/authors-{n}-route"] for n in ("get", "probe", "modify"))
        # A path match without a type is a prefix match (the Gateway API's default).
        assert get["rules"][0]["matches"] == [{"path": "prefix:/authors.json", "method": "GET"},
                                              {"path": "prefix:/authors/", "method": "GET"}]
        assert [(a["ref"], a["identities"]) for a in get["authorizations"]] == [
            ("authorizationpolicy/authors-get-policy", [sa("books", "booksapp"), sa("webapp", "booksapp")])]
        assert [(a["ref"], a["authentication"], a["networks"]) for a in probe["authorizations"]] == [
            ("authorizationpolicy/authors-probe-policy", "unauthenticated", ALL)]
        assert [m["method"] for m in modify["rules"][0]["matches"]] == ["DELETE", "PUT", "POST"]
        assert [(a["ref"], a["identities"]) for a in modify["authorizations"]] == [
            ("authorizationpolicy/authors-modify-policy", [sa("webapp", "booksapp")])]


async def test_dynamic_request_routing_by_header(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, ns("test"), service("backend-a-podinfo", "test", 9898),
                       service("backend-b-podinfo", "test", 9898),
                       *tutorial("dynamic-request-routing.yaml")) as h:
        policy = await h.get_outbound("backend-a-podinfo.test.svc.cluster.local:9898", ns="test")
        router = http_routes(policy)["backend-router"]
        by_header, default = router.rules
        [match] = by_header.matches
        assert [(m.name, m.exact) for m in match.headers] == [("x-request-id", b"alternative")]
        assert backends(by_header) == [("backend-b-podinfo", 1)]
        assert not default.matches or not default.matches[0].headers
        assert backends(default) == [("backend-a-podinfo", 1)]


async def test_traffic_shifting_a_canary_then_all_to_v2(workdir: Path, pki: Pki) -> None:
    docs = tutorial("traffic-shifting.yaml")
    *canary, final = docs
    async with Harness(workdir, pki, *canary) as h:
        target = "bb.traffic-shift-demo.svc.cluster.local:8080"
        watch = h.watch_outbound(target, ns="traffic-shift-demo")
        first = await next_policy(watch)
        assert backends(http_routes(first)["bb-route"].rules[0]) == [("bb", 90), ("bb-v2", 10)]
        h.apply(final)
        shifted = await next_policy(watch)
        assert backends(http_routes(shifted)["bb-route"].rules[0]) == [("bb-v2", 100)]
        watch.cancel()


async def test_rate_limiting_per_identity_with_an_override(workdir: Path, pki: Pki) -> None:
    server_doc, first, override = tutorial("rate-limiting.yaml")
    web = pod("web-0", ns="emojivoto", app="web-svc", sa="web", ports=[("http", 8080)])
    async with Harness(workdir, pki, ns("emojivoto"), web, server_doc, first) as h:
        watch = h.watch(8080, "web-0", "emojivoto")
        s = await watch.next()
        assert s["labels"]["name"] == "web-http" and s["protocol"] == "http1"
        assert [a["ref"] for a in s["authorizations"]] == ["default:all-unauthenticated"]
        limit = s["ratelimit"]
        assert (limit["identity"], limit["total"], limit["overrides"]) == (4, None, [])  # no total: per identity only
        h.apply(override)
        s = await watch.next()
        assert s["ratelimit"]["overrides"] == [{"rps": 6, "identities": [sa("default", "emojivoto")]}]


async def test_books_routes_then_retries_and_a_timeout_by_annotation(workdir: Path, pki: Pki) -> None:
    routes = tutorial("books-routes.yaml")
    async with Harness(workdir, pki, ns("booksapp"), service("books", "booksapp", 7002), *routes) as h:
        target = "books.booksapp.svc.cluster.local:7002"
        policy = await h.get_outbound(target, ns="booksapp")
        assert set(http_routes(policy)) == {"books-list", "books-create", "books-delete"}
        create = http_routes(policy)["books-create"]
        assert not create.rules[0].HasField("retry")
        # The tutorial's `kubectl annotate httproutes.gateway.networking.k8s.io/books-create ...`, in turn.
        [doc] = [d for d in routes if d["metadata"]["name"] == "books-create"]
        annotations = doc["metadata"].setdefault("annotations", {})
        for key, value in (("retry.linkerd.io/http", "5xx"), ("retry.linkerd.io/limit", "3"),
                           ("timeout.linkerd.io/request", "15ms")):
            annotations[key] = value
            h.apply(doc)
        watch = h.watch_outbound(target, ns="booksapp")
        create = http_routes(await next_policy(watch))["books-create"]
        rule = create.rules[0]
        assert rule.retry.max_retries == 3 and rule.retry.conditions.status_ranges[0].start == 500
        assert rule.timeouts.request.ToMilliseconds() == 15
        watch.cancel()


async def test_egress_all_traffic_with_routes_and_tls_routes(workdir: Path, pki: Pki) -> None:
    docs = tutorial("egress.yaml")  # the TLSRoutes included: admitted, and served on port 443
    first_tls = next(i for i, d in enumerate(docs) if d["kind"] == "TLSRoute")
    async with Harness(workdir, pki, ns("egress-test"), *docs[: first_tls + 1]) as h:
        # The tutorial's first TLSRoute: SNI httpbin.org to the original destination, then the
        # EgressNetwork's own allow route for every other name (Linkerd's tls.rs).
        policy = await h.get_outbound(addr=("34.117.59.81", 443), ns="egress-test")
        assert policy.protocol.WhichOneof("kind") == "tls"
        tls_egress, allow = policy.protocol.tls.routes
        assert (tls_egress.metadata.resource.kind, tls_egress.metadata.resource.name) == ("TLSRoute", "tls-egress")
        assert [m.exact for m in tls_egress.snis] == ["httpbin.org"]
        [rule] = tls_egress.rules
        [weighted] = rule.backends.random_available.backends
        assert not weighted.backend.filters
        forward = weighted.backend.backend.forward.addr
        assert (forward.ip.ipv4, forward.port) == (0x22753B51, 443)
        assert allow.metadata.default == "tls-egress-allow" and not allow.snis and not allow.rules[0].filters
        watch = h.watch_outbound(addr=("34.117.59.81", 443), ns="egress-test")
        assert (await next_policy(watch)) == policy
        h.apply(*docs[first_tls + 1:])
        # The tutorial's second TLSRoute replaces the first: no hostnames, every SNI.
        policy = await next_policy(watch)
        assert [r.metadata.resource.name or r.metadata.default for r in policy.protocol.tls.routes] == [
            "tls-egress", "tls-egress-allow"]
        assert not policy.protocol.tls.routes[0].snis
        watch.cancel()
        # unencrypted-http came in the same apply as that TLSRoute, after it: it counts once the index has
        # read back its Accepted status, which may be an update or two later (each bounded by WAIT).
        watch = h.watch_outbound(addr=("34.117.59.81", 80), ns="egress-test")
        policy = await next_policy(watch)
        while set(http_routes(policy)) != {"httpbin-get", "unencrypted-http"}:
            assert set(http_routes(policy)) <= {"httpbin-get", "unencrypted-http"}, set(http_routes(policy))
            policy = await next_policy(watch)
        watch.cancel()
        assert (policy.metadata.resource.kind, policy.metadata.resource.name) == (
            "EgressNetwork", "all-egress-traffic")
        routes = http_routes(policy)
        [get_rule] = routes["httpbin-get"].rules
        assert get_rule.matches[0].path.prefix == "/get"
        assert backends(routes["unencrypted-http"].rules[0]) == [("internal-egress", 1)]
