"""Servers, their authorizations, routes and rate limits, as a proxy receives them over mTLS."""

from __future__ import annotations

from pathlib import Path

from policy_helpers import (
    NS,
    Harness,
    Pki,
    grpc_route,
    http_route,
    mesh_tls,
    namespace,
    network_authn,
    pod,
    policy,
    ratelimit,
    sa_id,
    server,
    server_authz,
)

P = "policy.linkerd.io"
ALL = ["0.0.0.0/0", "::/0"]


async def test_the_oldest_matching_server_wins_and_conflicts_are_reported(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(),
                       server("b-new", created="2024-01-02T00:00:00Z", protocol="HTTP/2"),
                       server("a-old", created="2024-01-01T00:00:00Z", port="http", protocol="HTTP/1"),
                       server("other-port", port=9090, protocol="opaque")) as h:
        s = await h.get(8080)
        assert s["labels"] == {"group": P, "kind": "server", "name": "a-old"}  # by name of the port, older
        assert s["protocol"] == "http1"
        assert (await h.get(9090))["protocol"] == "opaque"
        assert h.metric("inbound_index_ignored", {"kind": "Server", "reason": "Conflicted"}) == 1
        watch = h.watch(8080)
        await watch.next()
        h.delete("srv", "a-old")  # the conflict resolves: the newer Server takes the port
        s = await watch.next()
        assert s["labels"]["name"] == "b-new" and s["protocol"] == "http2"
        h.delete("srv", "b-new")  # no Server: the default again
        assert (await watch.next())["labels"]["name"] == "all-unauthenticated"


async def test_a_server_with_no_authorizations_denies_and_access_policy_adds_a_default(
    workdir: Path, pki: Pki
) -> None:
    async with Harness(workdir, pki, namespace(), pod(), server("web")) as h:
        watch = h.watch(8080)
        s = await watch.next()
        assert s["authorizations"] == [] and s["protocol"] == "detect"
        h.apply(server("web", access_policy="all-authenticated"))
        s = await watch.next()
        assert s["authorizations"] == [{"ref": "default:all-authenticated", "networks": ALL,
                                        "authentication": "identities", "identities": [], "suffixes": ["*"]}]


async def test_authorization_policies_on_the_server_and_the_namespace(workdir: Path, pki: Pki) -> None:
    async with Harness(
        workdir, pki, namespace(), pod(), server("web"), server("other", app="other"),
        mesh_tls("ids", identities=[sa_id("vote"), "*.emojivoto.serviceaccount.identity.linkerd.cluster.local",
                                    "spiffe://cluster.local/ns/emojivoto/sa/vote"]),
        mesh_tls("refs", refs=[{"kind": "ServiceAccount", "name": "web"}, {"kind": "Namespace", "name": "prod"}]),
        network_authn("nets", [{"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}, {"cidr": "fd00::/8"}]),
        policy("on-server", (P, "Server", "web"), [(P, "MeshTLSAuthentication", "ids")]),
        policy("on-ns", ("", "Namespace", NS), [(P, "NetworkAuthentication", "nets"),
                                               (P, "MeshTLSAuthentication", "refs")]),
        policy("sa", (P, "Server", "web"), [("", "ServiceAccount", "admin")]),
        policy("elsewhere", (P, "Server", "other"), [(P, "NetworkAuthentication", "nets")]),
    ) as h:
        s = await h.get(8080)
        by_ref = {a["ref"]: a for a in s["authorizations"]}
        assert set(by_ref) == {"authorizationpolicy/on-server", "authorizationpolicy/on-ns", "authorizationpolicy/sa"}
        assert by_ref["authorizationpolicy/on-server"] == {
            "ref": "authorizationpolicy/on-server", "networks": ALL, "authentication": "identities",
            "identities": [sa_id("vote"), "spiffe://cluster.local/ns/emojivoto/sa/vote"],
            "suffixes": ["*.emojivoto.serviceaccount.identity.linkerd.cluster.local"]}
        assert by_ref["authorizationpolicy/on-ns"]["networks"] == ["10.0.0.0/8 except 10.9.0.0/16", "fd00::/8"]
        assert by_ref["authorizationpolicy/on-ns"]["identities"] == [sa_id("web")]
        assert by_ref["authorizationpolicy/on-ns"]["suffixes"] == [
            "*.prod.serviceaccount.identity.linkerd.cluster.local"]
        assert by_ref["authorizationpolicy/sa"]["identities"] == [sa_id("admin")]


async def test_a_policy_naming_a_missing_authentication_grants_nothing_until_it_exists(
    workdir: Path, pki: Pki
) -> None:
    async with Harness(workdir, pki, namespace(), pod(), server("web"),
                       policy("dangling", (P, "Server", "web"), [(P, "MeshTLSAuthentication", "missing")])) as h:
        watch = h.watch(8080)
        assert (await watch.next())["authorizations"] == []
        assert h.metric("inbound_index_ignored",
                        {"kind": "AuthorizationPolicy", "reason": "MissingAuthentication"}) == 1
        h.apply(mesh_tls("missing", identities=["*"]))  # an authentication anywhere re-evaluates every namespace
        s = await watch.next()
        assert [a["ref"] for a in s["authorizations"]] == ["authorizationpolicy/dangling"]
        assert s["authorizations"][0]["suffixes"] == ["*"]
        assert h.metric("inbound_index_ignored",
                        {"kind": "AuthorizationPolicy", "reason": "MissingAuthentication"}) is None


async def test_server_authorizations_by_name_and_selector(workdir: Path, pki: Pki) -> None:
    async with Harness(
        workdir, pki, namespace(), pod(), server("web", labels={"tier": "front"}),
        server_authz("anyone", {"unauthenticated": True}, server_name="web"),
        server_authz("meshed", {"meshTLS": {"unauthenticatedTLS": True}, "networks": [{"cidr": "10.0.0.0/8"}]},
                     selector={"tier": "front"}),
        server_authz("ids", {"meshTLS": {"identities": ["*"], "serviceAccounts": [
            {"name": "vote"}, {"name": "x", "namespace": "other"}]}}, server_name="web"),
        server_authz("not-us", {"unauthenticated": True}, selector={"tier": "back"}),
    ) as h:
        by_ref = {a["ref"]: a for a in (await h.get(8080))["authorizations"]}
        assert set(by_ref) == {"serverauthorization/anyone", "serverauthorization/meshed", "serverauthorization/ids"}
        # Without networks, a ServerAuthorization applies to the cluster networks.
        assert by_ref["serverauthorization/anyone"]["networks"][0] == "10.0.0.0/8"
        assert len(by_ref["serverauthorization/anyone"]["networks"]) == 5
        assert by_ref["serverauthorization/meshed"] == {
            "ref": "serverauthorization/meshed", "networks": ["10.0.0.0/8"], "authentication": "mtls"}
        assert by_ref["serverauthorization/ids"]["identities"] == [
            sa_id("vote"), "x.other.serviceaccount.identity.linkerd.cluster.local"]
        assert by_ref["serverauthorization/ids"]["suffixes"] == ["*"]


async def test_routes_on_a_server_carry_their_policies_and_replace_the_default_route(
    workdir: Path, pki: Pki
) -> None:
    rules = [{"matches": [{"path": {"type": "Exact", "value": "/api/vote"}, "method": "POST",
                           "headers": [{"name": "x-user", "value": "a"}]}],
              "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [
                  {"name": "x-from", "value": "tether"}]}}]}]
    async with Harness(
        workdir, pki, namespace(), pod(probes={"liveness": ("http", "/live")}), server("web"),
        mesh_tls("voters", identities=[sa_id("vote")]),
        http_route("vote", "web", rules, created="2024-01-02T00:00:00Z"),
        http_route("read", "web", gateway=True, created="2024-01-01T00:00:00Z"),
        http_route("orphan", "missing"),
        policy("vote-only", (P, "HTTPRoute", "vote"), [(P, "MeshTLSAuthentication", "voters")]),
    ) as h:
        s = await h.get(8080)
        assert s["authorizations"] == []  # route policies are not the server's
        routes = s["http_routes"]
        assert [r["ref"] for r in routes] == ["HTTPRoute/read", "HTTPRoute/vote"]  # oldest first
        vote = routes[1]
        assert vote["rules"] == [{"matches": [{"path": "exact:/api/vote", "method": "POST", "headers": ["x-user"]}],
                                  "filters": ["request_header_modifier"]}]
        assert [a["ref"] for a in vote["authorizations"]] == ["authorizationpolicy/vote-only"]
        assert routes[0]["authorizations"] == []
        assert h.metric("inbound_index_ignored", {"kind": "HTTPRoute", "reason": "NoMatchingParent"}) == 1

        watch = h.watch(8080)
        await watch.next()
        h.delete("httproutes.policy.linkerd.io", "vote")
        h.delete("httproutes.gateway.networking.k8s.io", "read")
        s = await watch.next()  # both deletes in one message or two; end with the default and probe routes
        while [r["ref"] for r in s["http_routes"]] != ["default:default", "default:probe"]:
            s = await watch.next()


async def test_grpc_servers_get_grpc_routes(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), server("web", protocol="gRPC"),
                       grpc_route("emoji", "web", "emojivoto.v1.EmojiService")) as h:
        s = await h.get(8080)
        assert s["protocol"] == "grpc"
        (route,) = s["grpc_routes"]
        assert route["ref"] == "GRPCRoute/emoji"
        assert route["rules"] == [{"matches": [{"service": "emojivoto.v1.EmojiService", "method": ""}],
                                   "filters": []}]


async def test_rate_limits_on_a_server_the_oldest_wins(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), server("web", protocol="HTTP/1"),
                       ratelimit("rl", "web", 100, identity=20, overrides=[(50, "vote")],
                                 created="2024-01-01T00:00:00Z"),
                       ratelimit("second", "web", 5, created="2024-01-02T00:00:00Z")) as h:
        s = await h.get(8080)
        assert s["ratelimit"] == {"ref": "HTTPLocalRateLimitPolicy/rl", "total": 100, "identity": 20,
                                  "overrides": [{"rps": 50, "identities": [sa_id("vote")]}]}
        watch = h.watch(8080)
        await watch.next()
        h.delete("httplocalratelimitpolicies", "rl")
        # As in Linkerd, the second counts once the status controller has written it Accepted (it was
        # RateLimitReasonAlreadyExists), not at once: first no rate limit, then the second's.
        assert "ratelimit" not in await watch.next()
        assert (await watch.next())["ratelimit"]["ref"] == "HTTPLocalRateLimitPolicy/second"


async def test_an_update_is_streamed_on_every_kind_of_change(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod()) as h:
        watch = h.watch(8080)
        assert (await watch.next())["labels"]["kind"] == "default"
        changes = [
            (server("web"), lambda s: s["labels"]["name"] == "web"),
            (server_authz("saz", {"unauthenticated": True}, server_name="web"),
             lambda s: [a["ref"] for a in s["authorizations"]] == ["serverauthorization/saz"]),
            (network_authn("n", [{"cidr": "10.0.0.0/8"}]), None),  # unreferenced: nothing to send
            # Another app's Server and a route on it: not re-decided, nothing sent (the next message is the next
            # check's).
            (server("api", app="api"), None),
            (http_route("api-r", "api"), None),
            (policy("ap", (P, "Server", "web"), [(P, "NetworkAuthentication", "n")]),
             lambda s: "authorizationpolicy/ap" in [a["ref"] for a in s["authorizations"]]),
            (network_authn("n", [{"cidr": "192.168.0.0/16"}]),
             lambda s: next(a for a in s["authorizations"] if a["ref"] == "authorizationpolicy/ap")["networks"]
             == ["192.168.0.0/16"]),
            (http_route("r", "web"), lambda s: [r["ref"] for r in s["http_routes"]] == ["HTTPRoute/r"]),
            (ratelimit("rl", "web", 10), lambda s: s["ratelimit"]["total"] == 10),
            (pod(annotations={"x": "y"}), None),  # nothing the policy reads
            (server("web", protocol="opaque"), lambda s: s["protocol"] == "opaque"),
        ]
        for obj, check in changes:
            h.apply(obj)
            if check is not None:
                assert check(await watch.next()), obj["kind"]
        h.delete("pod", "web-0")  # the pod goes: its streams end cleanly
        assert await watch.code() == __import__("grpc").StatusCode.OK
