"""The inbound index decides once per change what every port of that change shares.

A flush (one per event-loop turn of changes) memoizes a namespace's sorted objects, each
AuthorizationPolicy's resolved authorization and each Server's whole policy: the pods a Server
selects receive the very same policy object, and the next change is decided afresh.
"""

from __future__ import annotations

import time
from typing import Any

from policy_helpers import NS, mesh_tls, namespace, pod, policy, sa_id, server

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
