"""The inbound index decides once per change what every port of that change shares.

A flush (one per event-loop turn of changes) memoizes a namespace's sorted objects, each
AuthorizationPolicy's resolved authorization and each Server's whole policy: the pods a Server
selects receive the very same policy object, and the next change is decided afresh.
"""

from __future__ import annotations

import time
from typing import Any

from policy_helpers import NS, http_route, mesh_tls, namespace, pod, policy, sa_id, server

from tether.platform.watch import ResourceEvent
from tether.policy import PolicyConfig
from tether.policy.inbound.index import InboundIndex
from tether.policy.model import InboundServer
from tether.resources import kinds

P = "policy.linkerd.io"


def feed(index: InboundIndex, *objs: dict[str, Any]) -> None:
    for obj in objs:
        index.apply(kinds.lookup(obj["kind"] if obj["kind"] != "HTTPRoute" else "httproutes").key,
                    ResourceEvent("ADDED", obj, "1", time.monotonic()))


async def test_pods_of_one_server_share_one_decision_per_change() -> None:
    index = InboundIndex(PolicyConfig())
    feed(index, namespace(), pod("web-0"), pod("web-1", ip="10.1.0.11"), server("web"),
         mesh_tls("clients", identities=[sa_id("a")]), policy("p", (P, "Server", "web"), [(P, "MeshTLSAuthentication", "clients")]))
    index.flush()
    got: dict[str, list[InboundServer | None]] = {"web-0": [], "web-1": []}
    for name in got:
        index.subscribe(NS, name, 8080, lambda s, at, name=name: got[name].append(s))
    feed(index, mesh_tls("clients", identities=[sa_id("b")]))
    index.flush()
    first, second = got["web-0"][-1], got["web-1"][-1]
    assert first is second  # decided once for both pods
    assert first is not None and first.authorizations[0].identities[0].name == sa_id("b")
    feed(index, mesh_tls("clients", identities=[sa_id("c")]))
    index.flush()
    third = got["web-0"][-1]
    assert third is not first and third is not None
    assert third.authorizations[0].identities[0].name == sa_id("c")  # the next change is decided afresh
    assert hash(third) == hash(got["web-1"][-1]) and len(got["web-0"]) == 3


async def test_an_authentication_change_re_decides_only_the_namespaces_whose_policies_name_it() -> None:
    index = InboundIndex(PolicyConfig())
    cross = policy("p", (P, "Server", "web"), [(P, "MeshTLSAuthentication", "clients")], ns="third")
    cross["spec"]["requiredAuthenticationRefs"][0]["namespace"] = NS  # names NS's authentication
    feed(index, *(o for ns in (NS, "other", "third") for o in (namespace(ns), pod("web-0", ns=ns), server("web", ns=ns))),
         mesh_tls("clients", identities=[sa_id("a")]), mesh_tls("clients", identities=[sa_id("a")], ns="other"),
         policy("p", (P, "Server", "web"), [(P, "MeshTLSAuthentication", "clients")]),
         policy("p", (P, "Server", "web"), [(P, "MeshTLSAuthentication", "clients")], ns="other"), cross)
    index.flush()
    got: dict[str, list[InboundServer | None]] = {NS: [], "other": [], "third": []}
    for ns in got:
        index.subscribe(ns, "web-0", 8080, lambda s, at, ns=ns: got[ns].append(s))
    decided: list[str] = []
    compute = index.compute
    index.compute = lambda facts, port: decided.append(facts.namespace) or compute(facts, port)  # type: ignore[method-assign]
    feed(index, mesh_tls("clients", identities=[sa_id("b")]))  # NS's, named in NS and (across) in third
    index.flush()
    assert sorted(decided) == [NS, "third"]  # other's port is not re-decided: its policy names its own
    for ns in (NS, "third"):
        last = got[ns][-1]
        assert last is not None and last.authorizations[0].identities[0].name == sa_id("b")
    assert len(got["other"]) == 1  # only the first answer
    decided.clear()
    feed(index, mesh_tls("unused", identities=[sa_id("c")], ns="other"))  # named by no policy
    index.flush()
    assert decided == []


async def test_a_change_re_decides_only_the_ports_whose_answer_it_can_change() -> None:
    index = InboundIndex(PolicyConfig())
    feed(index, namespace(), pod("web-0"), pod("api-0", app="api", ip="10.1.0.12"),
         server("web", port=8080), server("admin", port=9090),
         mesh_tls("clients", identities=[sa_id("a")]))
    index.flush()
    got: dict[int, list[InboundServer | None]] = {8080: [], 9090: [], 7070: []}
    for port in got:  # 8080 and 9090 have a Server each; 7070 the default server
        index.subscribe(NS, "web-0", port, lambda s, at, port=port: got[port].append(s))
    decided: list[int] = []
    compute = index.compute
    index.compute = lambda facts, port: decided.append(port) or compute(facts, port)  # type: ignore[method-assign]

    def change(*objs: dict[str, Any]) -> list[int]:
        decided.clear()
        feed(index, *objs)
        index.flush()
        return sorted(decided)

    # Another app's Server, a policy and a route on it: no port of web-0 is re-decided.
    assert change(server("api", port=8080, app="api")) == []
    assert change(policy("api-p", (P, "Server", "api"), [(P, "MeshTLSAuthentication", "clients")])) == []
    assert change(http_route("api-r", "api")) == []
    # A policy on one Server re-decides that Server's port only; a Namespace-wide one every Server's port.
    assert change(policy("web-p", (P, "Server", "web"), [(P, "MeshTLSAuthentication", "clients")])) == [8080]
    assert change(policy("ns-p", ("", "Namespace", NS), [(P, "MeshTLSAuthentication", "clients")])) == [8080, 9090]
    # The authentication both name: what they target.
    assert change(mesh_tls("clients", identities=[sa_id("b")])) == [8080, 9090]
    # A new Server taking the default server's port; moved away, the port is re-decided again.
    assert change(server("late", port=7070)) == [7070]
    assert got[7070][-1] is not None and got[7070][-1].ref.name == "late"
    assert change(server("late", port=7071)) == [7070]
    assert got[7070][-1] is not None and got[7070][-1].ref.name == "all-unauthenticated"
    # A route re-decides its parent Server's ports, before and after it moves.
    assert change(http_route("r", "web")) == [8080]
    assert change(http_route("r", "admin")) == [8080, 9090]
    # A policy targeting that route: its parent's port.
    assert change(policy("r-p", (P, "HTTPRoute", "r"), [(P, "MeshTLSAuthentication", "clients")])) == [9090]
    # The pod itself: every port of it; the namespace: every port.
    assert change(pod("web-0", ip="10.1.0.13")) == [7070, 8080, 9090]
    assert change(namespace(annotations={"config.linkerd.io/default-inbound-policy": "deny"})) == [7070, 8080, 9090]
    assert got[7070][-1] is not None and got[7070][-1].ref.name == "deny"
