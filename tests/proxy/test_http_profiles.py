"""ServiceProfile routes in the proxy: translation from ``DestinationProfile``, matching, classification, the split."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import pytest

from tether.api import destination_pb2 as pb
from tether.api import http_types_pb2
from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core.config import Backoff
from tether.proxy.core import profiles
from tether.proxy.core.profiles import Backend, Profile, Route, Split, request_path
from tether.proxy.core.retries import RetryBudget
from tether.proxy.io.discovery import Discovery
from tether.proxy.core.profile_translation import translate

DST = "web.emojivoto.svc.cluster.local:80"
GET = http_types_pb2.HttpMethod(registered=http_types_pb2.HttpMethod.GET)
POST = http_types_pb2.HttpMethod(registered=http_types_pb2.HttpMethod.POST)


def clock() -> float:
    return 0.0


def path(regex: str) -> pb.RequestMatch:
    return pb.RequestMatch(path=pb.PathMatch(regex=regex))


def method(m: http_types_pb2.HttpMethod) -> pb.RequestMatch:
    return pb.RequestMatch(method=m)


def all_(*ms: pb.RequestMatch) -> pb.RequestMatch:
    return pb.RequestMatch(all=pb.RequestMatch.Seq(matches=ms))


def any_(*ms: pb.RequestMatch) -> pb.RequestMatch:
    return pb.RequestMatch(any=pb.RequestMatch.Seq(matches=ms))


def not_(m: pb.RequestMatch) -> pb.RequestMatch:
    return pb.RequestMatch(**{"not": m})


def status(low: int, high: int = 0) -> pb.ResponseMatch:
    return pb.ResponseMatch(status=pb.HttpStatusRange(min=low, max=high))


def route(name: str, condition: pb.RequestMatch | None, **kwargs: object) -> pb.Route:
    r = pb.Route(**kwargs) if condition is None else pb.Route(condition=condition, **kwargs)
    r.metrics_labels["route"] = name
    return r


def profile(*routes: pb.Route, budget: pb.RetryBudget | None = None,
            overrides: tuple[tuple[str, int], ...] = ()) -> pb.DestinationProfile:
    message = pb.DestinationProfile(fully_qualified_name="web.emojivoto.svc.cluster.local", routes=routes)
    message.retry_budget.CopyFrom(budget or pb.RetryBudget(retry_ratio=0.2, min_retries_per_second=10,
                                                           ttl=timedelta(seconds=10)))
    for authority, weight in overrides:
        message.dst_overrides.add(authority=authority, weight=weight)
    return message


def build(message: pb.DestinationProfile) -> Profile:
    got = translate(message, DST, clock, lambda authority: f"balancer of {authority}")
    assert got is not None
    return got


def name_of(p: Profile, method_: bytes, target: bytes) -> str:
    return p.route_for(method_, target).labels


# -- matching ---------------------------------------------------------------------------------------------------


def test_first_matching_route_wins_and_the_default_route_catches_the_rest() -> None:
    p = build(profile(
        route("books", all_(method(GET), path("/books/[^/]*"))),
        route("any-book", path("/books/.*")),
        route("vote", all_(method(POST), any_(path("/a"), path("/b")), not_(method(GET)))),
    ))
    assert name_of(p, b"GET", b"/books/12") == 'rt_route="books"'
    assert name_of(p, b"POST", b"/books/12") == 'rt_route="any-book"'
    assert name_of(p, b"GET", b"/books/12/pages") == 'rt_route="any-book"'
    assert name_of(p, b"POST", b"/b") == 'rt_route="vote"'
    assert name_of(p, b"PUT", b"/b") == ""  # the default route: no rt_ labels
    assert p.route_for(b"PUT", b"/b") is p.default
    assert p.default.metric_labels == f'direction="outbound",dst="{DST}"'
    assert p.routes[0].metric_labels == f'direction="outbound",dst="{DST}",rt_route="books"'


def test_path_regex_is_anchored_and_sees_only_the_path() -> None:
    p = build(profile(route("exact", path("/api/v1")), route("prefixed", path("^/x.*"))))
    assert name_of(p, b"GET", b"/api/v1") == 'rt_route="exact"'
    assert name_of(p, b"GET", b"/api/v1?verbose=1") == 'rt_route="exact"'
    assert name_of(p, b"GET", b"/api/v12") == ""
    assert name_of(p, b"GET", b"/v0/api/v1") == ""
    assert name_of(p, b"GET", b"http://web:80/api/v1?x") == 'rt_route="exact"'  # absolute-form
    assert name_of(p, b"GET", b"/xyz") == 'rt_route="prefixed"'


def test_anchoring_is_linkerds_without_a_group() -> None:
    # Linkerd formats ^{regex}$, so a top-level alternation is anchored on its outer ends only.
    assert profiles.anchored(" /a|/b ") == "^/a|/b$"
    assert profiles.anchored("^/a$") == "^/a$"
    p = build(profile(route("alt", path("/a|/b"))))
    assert name_of(p, b"GET", b"/a/anything") == 'rt_route="alt"'


@pytest.mark.parametrize("target,want", [
    (b"/a/b?c=d", "/a/b"), (b"/", "/"), (b"http://h/x/y?z", "/x/y"), (b"http://h", "/"), (b"*", "*"),
    (b"h:443", ""), (b"/caf%C3%A9", "/caf%C3%A9"),
])
def test_request_path(target: bytes, want: str) -> None:
    assert request_path(target) == want


def test_unusable_conditions_drop_their_route() -> None:
    p = build(profile(
        route("no condition", None),
        route("bad regex", path("/(")),
        route("no method", pb.RequestMatch(method=http_types_pb2.HttpMethod())),
        route("not bad", not_(path("/("))),
        route("ok", method(GET)),
    ))
    assert [r.labels for r in p.routes] == ['rt_route="ok"', ""]


def test_unregistered_methods_match_by_name() -> None:
    p = build(profile(route("purge", method(http_types_pb2.HttpMethod(unregistered="PURGE")))))
    assert name_of(p, b"PURGE", b"/") == 'rt_route="purge"'
    assert name_of(p, b"GET", b"/") == ""


def test_an_empty_all_matches_everything_and_an_empty_any_nothing() -> None:
    p = build(profile(route("never", any_()), route("always", all_())))
    assert name_of(p, b"GET", b"/x") == 'rt_route="always"'


def test_metrics_labels_are_sorted_prefixed_and_escaped() -> None:
    r = pb.Route(condition=method(GET))
    r.metrics_labels["route"] = 'GET "/x"'
    r.metrics_labels["a-b"] = "1"
    p = build(profile(r))
    assert p.routes[0].labels == 'rt_a_b="1",rt_route="GET \\"/x\\""'


# -- the inbound side ---------------------------------------------------------------------------------------------


def test_the_inbound_profile_counts_inbound_and_never_retries_nor_splits() -> None:
    p = build(profile(route("r", method(GET), is_retryable=True, timeout=timedelta(seconds=2)),
                      overrides=(("web-v2.emojivoto.svc.cluster.local:80", 1),)))
    assert p.routes[0].budget is not None and p.split
    inbound = profiles.inbound_profile(p)
    assert [r.metric_labels for r in inbound.routes] == [
        f'direction="inbound",dst="{DST}",rt_route="r"', f'direction="inbound",dst="{DST}"']
    assert inbound.routes[0].budget is None and inbound.routes[0].timeout == 2.0
    assert not inbound.split and inbound.budget is None


@pytest.mark.parametrize(("value", "suffixes", "want"), [
    (b"Web.emojivoto.svc.cluster.local.:80", ("svc.cluster.local.",), (DST, 80)),
    (b"web.emojivoto.svc.cluster.local:80", ("cluster.local",), (DST, 80)),
    (b"web.emojivoto.svc.cluster.local:80", ("example.com.",), None),  # not a profile suffix
    (b"web.example.com:8080", (".",), ("web.example.com:8080", 8080)),  # "." : every name
    (b"web.emojivoto.svc.cluster.local", ("svc.cluster.local.",), None),  # no port
    (b"10.0.0.1:80", (".",), None),  # an address names no profile
    (b"web.emojivoto.svc.cluster.local:0", ("svc.cluster.local.",), None),
    (b"xsvc.cluster.local:80", ("svc.cluster.local.",), None),  # a suffix is whole labels
])
def test_canonical_name(value: bytes, suffixes: tuple[str, ...], want: tuple[str, int] | None) -> None:
    assert profiles.canonical_name(value, suffixes) == want


# -- classification ---------------------------------------------------------------------------------------------


def classes(*pairs: tuple[pb.ResponseMatch, bool]) -> Route:
    r = route("r", method(GET))
    for condition, failure in pairs:
        r.response_classes.add(condition=condition, is_failure=failure)
    return build(profile(r)).routes[0]


def test_default_classification_is_5xx_failure() -> None:
    r = classes()
    assert [r.is_failure(s) for s in (200, 404, 499, 500, 503, 599)] == [False] * 3 + [True] * 3


def test_the_first_matching_class_decides() -> None:
    r = classes((status(500, 502), False), (status(400, 599), True))
    assert not r.is_failure(500)
    assert r.is_failure(404)
    assert r.is_failure(503)
    assert not r.is_failure(200)
    assert r.is_failure(504)


def test_class_conditions_nest() -> None:
    r = classes((pb.ResponseMatch(all=pb.ResponseMatch.Seq(matches=[
        status(200, 299), pb.ResponseMatch(**{"not": status(204)})])), True))
    assert r.is_failure(200) and r.is_failure(299)
    assert not r.is_failure(204)  # not 204 fails; the default then says success
    r = classes((pb.ResponseMatch(any=pb.ResponseMatch.Seq(matches=[status(429), status(503)])), True),
                (status(500, 599), False))
    assert r.is_failure(429) and r.is_failure(503) and not r.is_failure(500)


def test_one_bound_is_a_single_status() -> None:
    assert classes((status(404), True)).is_failure(404)
    assert not classes((status(404), True)).is_failure(405)
    assert classes((status(0, 418), True)).is_failure(418)


def test_unusable_classes_are_dropped() -> None:
    empty_all = pb.ResponseMatch(all=pb.ResponseMatch.Seq())
    r = classes((empty_all, False), (status(0, 0), False), (pb.ResponseMatch(), False), (status(1000), False))
    assert r.classes == ()
    assert r.is_failure(500)


# -- timeouts, retries ------------------------------------------------------------------------------------------


def test_timeouts_and_retries_per_route() -> None:
    p = build(profile(
        route("slow", method(GET), timeout=timedelta(milliseconds=250), is_retryable=True),
        route("plain", method(POST)),
    ))
    slow, plain, default = p.routes
    assert slow.timeout == 0.25 and plain.timeout is None and default.timeout is None
    assert isinstance(slow.budget, RetryBudget) and slow.budget is p.budget
    assert plain.budget is None and default.budget is None
    assert (slow.budget.ttl, slow.budget.min_per_second, slow.budget.withdraw_amount) == (10.0, 10, 5)


@pytest.mark.parametrize("budget", [
    pb.RetryBudget(retry_ratio=0.2, min_retries_per_second=10),  # no ttl
    pb.RetryBudget(retry_ratio=0.2, ttl=timedelta(seconds=61)),
    pb.RetryBudget(retry_ratio=0.2, ttl=timedelta(milliseconds=500)),
    pb.RetryBudget(retry_ratio=1001.0, ttl=timedelta(seconds=10)),
])
def test_a_retryable_route_without_a_usable_budget_does_not_retry(budget: pb.RetryBudget) -> None:
    p = build(profile(route("r", method(GET), is_retryable=True), budget=budget))
    assert p.routes[0].budget is None


# -- the traffic split ------------------------------------------------------------------------------------------


def test_dst_overrides_become_a_weighted_split() -> None:
    asked: list[str] = []
    message = profile(overrides=(("web-v1.emojivoto.svc.cluster.local:80", 9000),
                                 ("web-v2.emojivoto.svc.cluster.local:80", 1000),
                                 ("web-v3.emojivoto.svc.cluster.local:80", 0),
                                 ("no-port.emojivoto.svc.cluster.local", 5)))
    p = translate(message, DST, clock, lambda a: asked.append(a) or f"balancer {a}")
    assert p is not None and len(p.routes) == 1  # only the default route
    # Only the kept backends were resolved: a weight of 0 (or an unusable authority) costs no watch.
    assert asked == ["web-v1.emojivoto.svc.cluster.local:80", "web-v2.emojivoto.svc.cluster.local:80"]
    assert [b.balancer for b in p.split.backends] == [f"balancer {a}" for a in asked]
    rng = random.Random(7)
    counts = {a: 0 for a in asked}
    for _ in range(10_000):
        counts[p.split.choose(rng.random()).authority] += 1
    assert 8700 < counts[asked[0]] < 9300


def test_split_edges() -> None:
    split = Split([Backend("a:1", 1), Backend("b:1", 3)])
    assert split.choose(0.0).authority == "a:1"
    assert split.choose(0.2499).authority == "a:1"
    assert split.choose(0.25).authority == "b:1"
    assert split.choose(0.9999).authority == "b:1"
    assert not Split([Backend("a:1", 0)])


def test_no_routes_and_no_split_is_no_profile() -> None:
    assert translate(profile(), DST, clock, lambda a: pytest.fail("no backend to resolve")) is None
    assert translate(profile(route("bad", path("/("))), DST, clock, lambda a: None) is None


def test_choose_among_the_ready_backends() -> None:
    a, b, c = Backend("a:1", 1), Backend("b:1", 3), Backend("c:1", 6)
    split = Split([a, b, c])
    assert split.choose_among(0.0, [b, c]) is b
    assert split.choose_among(0.34, [b, c]) is c
    assert split.choose_among(0.999, [a]) is a


# -- discovery: one translation per update, the split's services leased -------------------------------------------


def test_profile_updates_translate_once_and_lease_the_split_services() -> None:
    async def scenario() -> None:
        discovery = Discovery(context_token="", idle_timeout=60.0,
                              backoff=Backoff(timedelta(seconds=1), timedelta(seconds=1), 0.0),
                              failfast=3.0, clock=lambda: 0.0)
        watch = discovery.profile(parse_socket_addr("10.0.0.1:80"))
        try:
            v1, v2 = "web-v1.emojivoto.svc.cluster.local:80", "web-v2.emojivoto.svc.cluster.local:80"
            watch._apply(profile(route("r", method(GET)), overrides=((v1, 1), (v2, 1))), True)
            first = watch.resolution
            assert first.profile is not None and first.watch is watch
            assert first.authority == DST and first.balancer is discovery.services[DST].balancer
            assert [b.balancer for b in first.profile.split.backends] == [discovery.services[v1].balancer,
                                                                         discovery.services[v2].balancer]
            assert discovery.services[v1]._refs == 1
            # The next update names v1 only: v2's lease goes (its watch idles out later), v1's is kept.
            watch._apply(profile(overrides=((v1, 1),)), False)
            assert discovery.services[v1]._refs == 1 and discovery.services[v2]._refs == 0
            assert watch.resolution.profile is not None and watch.resolution.profile is not first.profile
            # Opaque: HTTP routes are ignored; no routes and no split: no profile at all.
            opaque = profile(route("r", method(GET)))
            opaque.opaque_protocol = True
            watch._apply(opaque, False)
            assert watch.resolution.profile is None and discovery.services[v1]._refs == 0
            watch._apply(profile(), False)
            assert watch.resolution.profile is None
        finally:
            watch.release()
            await discovery.close()

    asyncio.run(scenario())
