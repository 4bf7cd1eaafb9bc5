"""The outbound router with profiles, without sockets: route matching, the split, live updates, l5d-dst-override."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from tether.proxy.core.balancer_queue import Queue
from tether.proxy.core import commands as cmd
from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import Pick
from tether.proxy.core.profiles import Backend, Method, Profile, Route, Split
from tether.proxy.core.routes import OVERRIDE_ROUTE, outbound_router, parse_override
from tether.proxy.core.balancer import Balancer
from tether.proxy.core.resolution import Resolution
from tether.proxy.core.endpoint import Endpoint
from tether.proxy.codec.http1 import RequestHead

WEB = "web.emojivoto.svc.cluster.local:80"
V1 = "web-v1.emojivoto.svc.cluster.local:80"
V2 = "web-v2.emojivoto.svc.cluster.local:80"
ORIG = SocketAddr(parse_ip("10.96.0.10"), 80)


def balancer(*ips: str) -> Balancer:
    b = Balancer(failfast=3.0, clock=lambda: 0.0)
    b.reset([Endpoint(SocketAddr(parse_ip(ip), 8080)) for ip in ips])
    return b


class Watch:
    """Stands for a ProfileWatch: its latest resolution, answered."""

    def __init__(self, resolution: Resolution | None = None) -> None:
        self.resolution = resolution
        self.ready = True


def router(resolution: Resolution, draw: float = 0.0, **kwargs: Any) -> Any:
    return outbound_router(ORIG, resolution, local_ips=frozenset(), connect_timeout=1.0, queue=Queue(),
                           loop_addrs=frozenset(), draw=lambda: draw, **kwargs)


def ask(route: Any, request: RequestHead, replies: list[Any] = ()) -> tuple[Pick | ProxyError, list[cmd.Command]]:
    gen: Generator[cmd.Command, Any, Pick | ProxyError] = route(request)
    seen: list[cmd.Command] = []
    answers = list(replies)
    reply: Any = None
    while True:
        try:
            seen.append(gen.send(reply))
        except StopIteration as stop:
            return stop.value, seen
        reply = answers.pop(0)


def web_profile(split: Split = Split([])) -> Profile:
    return Profile(WEB, [Route(Method(b"POST"), labels='rt_route="post"', timeout=1.0)], split)


def test_without_a_profile_no_route_is_set() -> None:
    pick, seen = ask(router(Resolution(balancer=balancer("10.1.0.1"), authority=WEB)), RequestHead(b"GET", b"/"))
    assert isinstance(pick, Pick) and pick.route is None and seen == []
    assert 'authority="web.emojivoto.svc.cluster.local:80"' in pick.labels


def test_the_request_takes_its_route_and_the_service_balancer() -> None:
    profile = web_profile()
    r = router(Resolution(balancer=balancer("10.1.0.1"), authority=WEB, profile=profile))
    post, _ = ask(r, RequestHead(b"POST", b"/x"))
    get, _ = ask(r, RequestHead(b"GET", b"/x"))
    assert isinstance(post, Pick) and post.route is profile.routes[0]
    assert isinstance(get, Pick) and get.route is profile.default
    assert post.connect.addr == SocketAddr(parse_ip("10.1.0.1"), 8080)


def test_the_split_draws_a_backend_and_labels_its_endpoints_with_it() -> None:
    split = Split([Backend(V1, 1, balancer("10.2.0.1")), Backend(V2, 3, balancer("10.3.0.1"))])
    resolution = Resolution(balancer=balancer(), authority=WEB, profile=web_profile(split))
    low, _ = ask(router(resolution, draw=0.1), RequestHead(b"GET", b"/"))
    high, _ = ask(router(resolution, draw=0.9), RequestHead(b"GET", b"/"))
    assert isinstance(low, Pick) and low.connect.addr.ip == parse_ip("10.2.0.1")
    assert f'authority="{V1}"' in low.labels
    assert isinstance(high, Pick) and high.connect.addr.ip == parse_ip("10.3.0.1")
    assert low.authority == WEB.encode()  # Host for a request without one: the logical service


def test_a_backend_without_endpoints_gives_its_share_to_the_others() -> None:
    split = Split([Backend(V1, 1, balancer()), Backend(V2, 1, balancer("10.3.0.1"))])
    pick, seen = ask(router(Resolution(balancer=balancer(), authority=WEB, profile=web_profile(split)), draw=0.0),
                     RequestHead(b"GET", b"/"))
    assert seen == [] and isinstance(pick, Pick) and pick.connect.addr.ip == parse_ip("10.3.0.1")


def test_no_endpoint_anywhere_is_failfast_with_the_route() -> None:
    profile = web_profile()
    pick, seen = ask(router(Resolution(balancer=balancer(), authority=WEB, profile=profile)),
                     RequestHead(b"POST", b"/"), [None])
    assert [type(c).__name__ for c in seen] == ["Wait"]
    assert isinstance(pick, ProxyError) and pick.status == 504 and pick.route is profile.routes[0]


def test_a_profile_update_applies_to_the_next_request_on_the_same_connection() -> None:
    first = Resolution(balancer=balancer("10.1.0.1"), authority=WEB)
    watch = Watch(first)
    r = router(Resolution(balancer=first.balancer, authority=WEB, watch=watch))  # type: ignore[arg-type]
    before, _ = ask(r, RequestHead(b"POST", b"/"))
    profile = web_profile()
    watch.resolution = Resolution(balancer=first.balancer, authority=WEB, profile=profile)
    after, _ = ask(r, RequestHead(b"POST", b"/"))
    assert isinstance(before, Pick) and before.route is None
    assert isinstance(after, Pick) and after.route is profile.routes[0]


# -- l5d-dst-override (ingress mode) ------------------------------------------------------------------------------


def overriding(targets: dict[str, Resolution]) -> tuple[Any, list[str]]:
    asked: list[str] = []

    def named(authority: str, port: int) -> Watch:
        asked.append(authority)
        return Watch(targets.get(authority, Resolution()))

    return router(Resolution(balancer=balancer("10.1.0.1"), authority=WEB), named=named), asked


def with_override(value: bytes) -> RequestHead:
    return RequestHead(b"GET", b"/", ((b"host", b"web"), (b"L5D-Dst-Override", value)))


def test_the_override_names_the_target_in_ingress_mode() -> None:
    r, asked = overriding({V1: Resolution(balancer=balancer("10.2.0.1"), authority=V1)})
    pick, _ = ask(r, with_override(V1.encode()))
    assert asked == [V1]
    assert isinstance(pick, Pick) and pick.connect.addr.ip == parse_ip("10.2.0.1")
    assert pick.strip_override and pick.route is OVERRIDE_ROUTE
    plain, _ = ask(r, RequestHead(b"GET", b"/"))  # no header: the original destination's service
    assert isinstance(plain, Pick) and plain.connect.addr.ip == parse_ip("10.1.0.1") and not plain.strip_override


def test_the_override_target_brings_its_own_profile() -> None:
    profile = web_profile()
    r, _ = overriding({V1: Resolution(balancer=balancer("10.2.0.1"), authority=V1, profile=profile)})
    pick, _ = ask(r, RequestHead(b"POST", b"/", ((b"l5d-dst-override", V1.encode()),)))
    assert isinstance(pick, Pick) and pick.route is profile.routes[0] and pick.strip_override


def test_bad_or_unknown_overrides_are_errors() -> None:
    r, _ = overriding({})
    bad, _ = ask(r, with_override(b"not a name:80"))
    assert isinstance(bad, ProxyError) and bad.status == 400
    unknown, _ = ask(r, with_override(b"nowhere.emojivoto.svc.cluster.local"))
    assert isinstance(unknown, ProxyError) and unknown.status == 502


def test_the_header_is_not_read_in_sidecar_mode() -> None:
    r = router(Resolution(balancer=balancer("10.1.0.1"), authority=WEB))
    pick, _ = ask(r, with_override(V1.encode()))
    assert isinstance(pick, Pick) and pick.connect.addr.ip == parse_ip("10.1.0.1") and not pick.strip_override


@pytest.mark.parametrize("value,want", [
    (b"web.ns.svc.cluster.local:8080", ("web.ns.svc.cluster.local:8080", 8080)),
    (b"Web.NS.", ("web.ns:80", 80)),
    (b"10.0.0.1:90", ("10.0.0.1:90", 90)),
    (b"[::1]:81", ("[::1]:81", 81)),
    (b"web:0", None), (b"web:x", None), (b"", None), (b"a b", None), (b"caf\xc3\xa9", None),
])
def test_parse_override(value: bytes, want: tuple[str, int] | None) -> None:
    assert parse_override(value) == want
