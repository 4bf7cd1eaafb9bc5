"""The inbound request's logical service and profile route (proxy.md §8.4; ``core.inbound_profile_routes``,
``io.inbound_profiles``): ``l5d-dst-canonical``, else the URI's authority, else ``Host``; the first requests wait
for the service's first profile answer up to the initial timeout, later ones go on without.

The discovery is the proxy's own, without a control plane (it never answers by itself): the test feeds it a
``DestinationProfile`` as its stream would, and moves the clock.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from h2_fakes import FakeClock
from test_http_profiles import GET, method, profile, route

from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.commands import Connect, Wait
from tether.proxy.core.config import Backoff
from tether.proxy.core.http import Pick
from tether.proxy.core.inbound_profile_routes import InboundProfileRoutes
from tether.proxy.core.inbound_route_metrics import routed
from tether.proxy.core.profiles import Profile
from tether.proxy.core.routes import inbound_router
from tether.proxy.io.discovery import Discovery
from tether.proxy.io.inbound_profiles import InboundProfiles

SUFFIXES = ("svc.cluster.local.",)
WEB = "web.emojivoto.svc.cluster.local"


class Asked:
    """A source that has no profile, and keeps the names it was asked about."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def profile(self, key: str, port: int, *, waited: bool) -> Profile | None | Wait:
        self.asked.append((key, port))
        return None


def head(*headers: tuple[bytes, bytes], target: bytes = b"/x") -> RequestHead:
    return RequestHead(b"GET", target, headers)


@pytest.mark.parametrize(("request_", "want"), [
    (head((b"L5d-Dst-Canonical", f"{WEB}:8080".encode()), (b"host", b"other.svc.cluster.local")), (f"{WEB}:8080", 8080)),
    # A canonical name outside the suffixes names no profile, and nothing else is asked (linkerd2-proxy's rule).
    (head((b"l5d-dst-canonical", b"web.example.com:80"), (b"host", WEB.encode())), None),
    # One that does not parse (no port, an address) is passed over for the authority.
    (head((b"l5d-dst-canonical", WEB.encode()), (b"host", b"api.emojivoto.svc.cluster.local:9090")),
     ("api.emojivoto.svc.cluster.local:9090", 9090)),
    (head((b"l5d-dst-canonical", b"10.0.0.1:80"), (b"host", WEB.encode())), (f"{WEB}:80", 80)),
    (head((b"Host", f"Web.Emojivoto.svc.cluster.local.".encode())), (f"{WEB}:80", 80)),  # port 80 by default
    (head((b":authority", f"{WEB}:8080".encode()), (b"host", b"api.emojivoto.svc.cluster.local")),
     (f"{WEB}:8080", 8080)),  # HTTP/2: the URI's authority wins over a host header
    (head((b"host", b"api.emojivoto.svc.cluster.local"), target=f"http://user@{WEB}:8080/x?q".encode()),
     (f"{WEB}:8080", 8080)),  # HTTP/1 absolute form: the URI's authority
    (head((b"host", b"10.0.0.1:8080")), None),  # an address names no service
    (head((b"host", b"[::1]:8080")), None),
    (head((b"host", b"web:8080")), None),  # not under the suffixes
    (head((b"host", b"web.svc.cluster.local:http")), None),  # not a port
    (head(), None),
])
def test_the_logical_service_of_a_request(request_: RequestHead, want: tuple[str, int] | None) -> None:
    source = Asked()
    routes = InboundProfileRoutes(source, SUFFIXES)
    assert routes.route(request_) is None and routes.route(request_) is None  # the second from the kept parse
    assert source.asked == ([want, want] if want is not None else [])


@pytest.mark.parametrize(("request_", "authority"), [
    (head((b"l5d-dst-canonical", f"{WEB}:8080".encode()), (b"host", b"x.svc.cluster.local")), f"{WEB}:8080"),
    (head((b"host", f"{WEB}.".encode())), WEB),  # port 80 left out, as linkerd2-proxy's NameAddr::as_http_authority
    (head((b"host", b"web:8080")), "web:8080"),  # outside the profile suffixes: labelled all the same
    (head((b"l5d-dst-canonical", b"web.example.com:80"), (b"host", WEB.encode())), "web.example.com"),
    (head((b"host", b"10.0.0.1:8080")), ""),  # an address is no logical name: no label
    (head(), ""),
])
def test_the_authority_label_of_a_request_is_its_logical_name(request_: RequestHead, authority: str) -> None:
    routes = InboundProfileRoutes(Asked(), SUFFIXES)
    routes.route(head((b"host", b"before.svc.cluster.local:9")))
    routes.route(request_)
    assert routes.logical_authority == authority  # the last request's, never an earlier one's


def test_every_name_under_the_root_suffix() -> None:
    source = Asked()
    InboundProfileRoutes(source, (".",)).route(head((b"host", b"web:8080")))
    assert source.asked == [("web:8080", 8080)]


def _discovery() -> Discovery:
    return Discovery(context_token="", idle_timeout=60.0, backoff=Backoff(timedelta(seconds=1), timedelta(seconds=1),
                                                                          0.0), failfast=3.0, clock=lambda: 0.0)


def test_the_first_requests_wait_for_the_first_answer_until_the_initial_timeout() -> None:
    async def scenario() -> None:
        discovery, clock = _discovery(), FakeClock()
        profiles = InboundProfiles(discovery, idle_timeout=90.0, skip_timeout=0.5, clock=clock)
        try:
            first = profiles.profile(f"{WEB}:80", 80, waited=False)
            watch = discovery.profiles[f"{WEB}:80"]
            assert first == Wait(watch, 0.5)
            clock.now += 0.2
            assert profiles.profile(f"{WEB}:80", 80, waited=False) == Wait(watch, pytest.approx(0.3))
            assert profiles.profile(f"{WEB}:80", 80, waited=True) is None  # it waited once: it goes on
            clock.now += 0.3
            assert profiles.profile(f"{WEB}:80", 80, waited=False) is None  # the time is up: nobody waits now
            watch._apply(profile(route("r", method(GET))), True)
            watch.answered.set()  # as the stream does after each message
            found = profiles.profile(f"{WEB}:80", 80, waited=False)
            assert isinstance(found, Profile) and found.dst == f"{WEB}:80"
            assert found.default.metric_labels.startswith('direction="inbound"')  # the inbound profile
        finally:
            profiles.close()
            await discovery.close()

    asyncio.run(scenario())


def test_the_router_waits_once_then_routes_by_the_answer() -> None:
    async def scenario() -> None:
        discovery, clock = _discovery(), FakeClock()
        profiles = InboundProfiles(discovery, idle_timeout=90.0, skip_timeout=0.5, clock=clock)
        app = parse_socket_addr("10.0.0.5:8080")
        router = routed(inbound_router(app, 1.0, 'direction="inbound"'), authorized=None,
                        profiles=InboundProfileRoutes(profiles, SUFFIXES), metrics=None)
        try:
            steps = router(head((b"host", WEB.encode())))
            wait = steps.send(None)
            assert isinstance(wait, Wait) and wait.timeout == 0.5
            watch = discovery.profiles[f"{WEB}:80"]
            watch._apply(profile(route("r", method(GET))), True)
            watch.answered.set()
            with pytest.raises(StopIteration) as done:
                steps.send(watch.resolution)
            picked = done.value.value
            assert isinstance(picked, Pick) and isinstance(picked.connect, Connect) and picked.connect.addr == app
            assert picked.route is not None and picked.route.labels == 'rt_route="r"'
            # No profile for a request naming no service: the router's own pick, as it is.
            with pytest.raises(StopIteration) as plain:
                router(head((b"host", b"10.0.0.5:8080"))).send(None)
            assert plain.value.value.route is None
        finally:
            profiles.close()
            await discovery.close()

    asyncio.run(scenario())


def test_a_request_after_the_initial_timeout_goes_on_without_a_route() -> None:
    async def scenario() -> None:
        discovery, clock = _discovery(), FakeClock()
        profiles = InboundProfiles(discovery, idle_timeout=90.0, skip_timeout=0.5, clock=clock)
        router = routed(inbound_router(parse_socket_addr("10.0.0.5:8080"), 1.0, ""), authorized=None,
                        profiles=InboundProfileRoutes(profiles, SUFFIXES), metrics=None)
        try:
            steps = router(head((b"host", WEB.encode())))
            assert isinstance(steps.send(None), Wait)
            clock.now += 0.5
            with pytest.raises(StopIteration) as skipped:  # the wait timed out (the reply is discovery's Failed)
                steps.send(None)
            assert skipped.value.value.route is None
            with pytest.raises(StopIteration) as later:  # later requests do not wait at all
                router(head((b"host", WEB.encode()))).send(None)
            assert later.value.value.route is None
        finally:
            profiles.close()
            await discovery.close()

    asyncio.run(scenario())
