"""Random sequences of Services, routes, EgressNetworks and Namespaces (good and bad) never break the outbound index.

After every change each watched target still resolves and encodes, watchers
hear exactly the changes, and every message keeps the proxy API's "at least
one" rules (routes have rules, retries have conditions, failure accrual has a
backoff, weighted backends have a backend), so no proxy rejects a policy.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from outbound_helpers import (
    CONFIG,
    NS,
    backend,
    egress_network,
    feed,
    grpc_route,
    http_route,
    namespace,
    remove,
    service,
)

from tether.api import outbound_pb2 as pb
from tether.policy.outbound import OutboundIndex
from tether.policy.outbound.index import TargetNotFound
from tether.policy.outbound.translator import encode

NAMES = ("web", "api", "ghost")
NAMESPACES = (NS, "other", "linkerd-egress")
ANNOTATIONS = st.dictionaries(
    st.sampled_from([
        "retry.linkerd.io/http", "retry.linkerd.io/grpc", "retry.linkerd.io/limit", "retry.linkerd.io/timeout",
        "timeout.linkerd.io/request", "timeout.linkerd.io/response", "balancer.linkerd.io/failure-accrual",
        "balancer.linkerd.io/failure-accrual-consecutive-max-penalty", "config.linkerd.io/opaque-ports",
        "balancer.alpha.linkerd.io/penalize-failures",
        "balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold",
    ]),
    st.sampled_from(["5xx", "unavailable", "3", "0", "1s", "1.5s", "consecutive", "unified", "bogus", "80",
                     "true", "0.5", "-1s", "500-400"]),
    max_size=4,
)


def _service(name: str, ns: str, ports: list[int], annotations: dict[str, str]) -> dict[str, Any]:
    ip = f"10.96.{NAMES.index(name)}.{NAMESPACES.index(ns) + 1}"
    return service(name, ip, [{"name": f"p{p}", "port": p, **({"appProtocol": "http"} if p == 81 else {})}
                              for p in ports], ns=ns, annotations=annotations)


services = st.builds(_service, st.sampled_from(NAMES), st.sampled_from(NAMESPACES),
                     st.lists(st.sampled_from([80, 81, 3306]), min_size=1, max_size=3, unique=True), ANNOTATIONS)
backends = st.lists(st.builds(lambda n, w, ns: backend(n, weight=w, namespace=ns), st.sampled_from(NAMES),
                              st.integers(0, 5), st.sampled_from(NAMESPACES)), max_size=2)
rules = st.lists(st.fixed_dictionaries({"backendRefs": backends}, optional={
    "timeouts": st.sampled_from([{"request": "1s"}, {"backendRequest": "1s"}, {"request": "0s"}])}), max_size=2)
http_routes = st.builds(
    lambda name, parent, rs, ns, port, ann, gw: http_route(name, parent, rs, ns=ns, parent_ns=NS, port=port,
                                                           annotations=ann, gateway=gw),
    st.sampled_from(["r1", "r2"]), st.sampled_from(NAMES), rules, st.sampled_from(NAMESPACES),
    st.sampled_from([80, 81, None]), ANNOTATIONS, st.booleans())
grpc_routes = st.builds(lambda name, parent, rs, ann: grpc_route(name, parent, rs, annotations=ann),
                        st.sampled_from(["g1"]), st.sampled_from(NAMES), rules, ANNOTATIONS)
egress = st.builds(
    lambda name, policy, nets, ns: egress_network(name, policy, nets, ns=ns),
    st.sampled_from(["e1", "e2"]), st.sampled_from(["Allow", "Deny"]),
    st.sampled_from([None, [{"cidr": "1.2.3.0/24"}], [{"cidr": "0.0.0.0/0", "except": ["1.0.0.0/8"]}]]),
    st.sampled_from(NAMESPACES))
namespaces = st.builds(lambda ann: namespace(NS, ann), ANNOTATIONS)
objects = st.one_of(services, http_routes, grpc_routes, egress, namespaces)
steps = st.lists(st.tuples(st.booleans(), objects), min_size=1, max_size=10)


def _check(policy: pb.OutboundPolicy) -> None:
    kind = policy.protocol.WhichOneof("kind")
    assert kind is not None
    sub = getattr(policy.protocol, kind)
    groups = [sub.http1, sub.http2, sub.opaque] if kind == "detect" else [sub]
    for group in groups:
        if hasattr(group, "failure_accrual") and group.HasField("failure_accrual"):
            accrual = group.failure_accrual
            assert getattr(accrual, accrual.WhichOneof("kind")).HasField("backoff")
        assert group.routes, "every protocol has a route"
        for route in group.routes:
            assert route.rules, "every route has a rule"
            for rule in route.rules:
                assert rule.backends.WhichOneof("kind") is not None
                if hasattr(rule, "retry") and rule.HasField("retry"):
                    assert rule.retry.HasField("conditions")
                if rule.backends.WhichOneof("kind") == "random_available":
                    assert all(b.backend.HasField("backend") for b in rule.backends.random_available.backends)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_random_changes_never_break_a_policy(changes: list[tuple[bool, dict[str, Any]]]) -> None:
    index = OutboundIndex(CONFIG)
    targets = [index.service_target(f"{n}.{NS}.svc.cluster.local:{p}", source)
               for n in NAMES for p in (80, 81) for source in NAMESPACES[:2]]
    heard: dict[object, list[object]] = {t: [] for t in targets}
    for target in targets:
        index.subscribe(target, lambda state, at, t=target: heard[t].append(state))
    addresses = [("1.2.3.4", 443), ("8.8.8.8", 53), ("10.96.0.1", 80), ("10.96.1.1", 8080)]
    for delete, obj in changes:
        if delete:
            remove(index, obj)
        else:
            feed(index, obj)
        index.problems()  # never raises
        for target in targets:
            state = index.state(target)
            assert not heard[target] or heard[target][-1] == state
            _check(encode(target, state, CONFIG))
        for ip, port in addresses:
            try:
                target = index.address_target(ip, port, NS)
            except TargetNotFound:
                continue
            _check(encode(target, index.state(target), CONFIG))
