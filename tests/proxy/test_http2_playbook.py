"""Playbooks for the push-driven HTTP/2 core (``core.http2_proxy``): client frames in, what it asks of its sink out.

Each test is one conversation on one client connection, frame by frame
(``tests/proxy/h2_playbook.py``): full duplex, a client's reset cancelling
the upstream stream, rapid reset, REFUSED_STREAM, the windows and a full
write buffer, a gRPC error, keep-alive, an upgraded stream downgraded to
HTTP/1 for the app.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from h2.errors import ErrorCodes
from h2_fakes import FakeClock
from h2_playbook import (
    CallLater,
    Checkin,
    Checkout,
    Close,
    Connect,
    ConnectFailed,
    Connected,
    Count,
    Data,
    Do,
    Down,
    Fire,
    GoAway,
    H2Playbook,
    Headers,
    Ping,
    Rst,
    SendDown,
    SendUp,
    SendUpBytes,
    Up,
    UpBytes,
    Wait,
    Waited,
    Window,
    Writable,
)
from test_http2_proxy import ADDRS, GET, GRPC, LABELS, Router, http_settings

from tether.proxy.codec.http2 import Http2Params
from tether.proxy.core.balancer import FULL
from tether.proxy.core.balancer_queue import Queue
from tether.proxy.core import errors
from tether.proxy.core.http import HttpSettings
from tether.proxy.core.http_metrics import HttpMetrics

POST = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"web"), (b":path", b"/up")]
OK = [(b":status", b"200")]


def test_a_stream_goes_up_and_its_response_comes_back_full_duplex() -> None:
    router = Router(ADDRS[:1])
    assert (H2Playbook(router, http_settings())
            >> Down(Headers(1, POST))
            << Connect(ADDRS[0])
            >> Down(Data(1, b"early"))  # held: the connection is not there yet
            >> Connected()
            << SendUp(0, Headers(1, POST), Data(1, b"early"))
            >> Up(0, Headers(1, OK), Data(1, b"first"))  # the response begins before the request ends
            << SendDown(Headers(1, OK), Data(1, b"first"))
            >> Down(Data(1, b"more", end=True))
            << SendUp(0, Data(1, b"more", end=True))
            >> Up(0, Data(1, b"", end=True))
            << SendDown(Data(1, b"", end=True)))
    assert router.log == ["rtt", "release"]


def test_a_client_reset_cancels_the_upstream_stream_at_once() -> None:
    router = Router(ADDRS[:1])
    assert (H2Playbook(router, http_settings())
            >> Down(Headers(1, GET, end=True), Headers(3, GET, end=True))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, GET, end=True), Headers(3, GET, end=True))
            >> Down(Rst(1, ErrorCodes.CANCEL))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL))  # the upstream's work is cancelled; stream 3 goes on
            >> Up(0, Headers(3, OK, end=True))
            << SendDown(Headers(3, OK, end=True)))
    assert router.log.count("release") == 2


def test_rapid_reset_is_answered_with_enhance_your_calm_and_nothing_goes_up() -> None:
    """HEADERS + RST_STREAM pairs in one read (CVE-2023-44487): no stream starts; past 20, GOAWAY."""
    router = Router(ADDRS[:1])
    pairs = [f for sid in range(1, 43, 2) for f in (Headers(sid, GET, end=True), Rst(sid, ErrorCodes.CANCEL))]
    assert (H2Playbook(router, http_settings())
            >> Down(*pairs)
            << Count("outbound_http_errors_total", 'error="rapid reset"')
            << SendDown(GoAway(ErrorCodes.ENHANCE_YOUR_CALM, 41))
            << Close())
    assert router.requests == []


def test_resets_before_the_response_count_against_the_bound_and_answers_take_one_off() -> None:
    router = Router(ADDRS[:1])
    book = (H2Playbook(router, http_settings())
            >> Down(Headers(1, GET, end=True))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, GET, end=True)))
    for sid in range(3, 43, 2):  # 20 streams reset after they went up: at the bound, not past it
        book = (book >> Down(Headers(sid, GET, end=True)) << SendUp(0, Headers(sid, GET, end=True))
                >> Down(Rst(sid, ErrorCodes.CANCEL)) << SendUp(0, Rst(sid, ErrorCodes.CANCEL)))
    book = (book >> Up(0, Headers(1, OK, end=True))  # an answer: one off the count
            << SendDown(Headers(1, OK, end=True))
            >> Down(Headers(43, GET, end=True)) << SendUp(0, Headers(43, GET, end=True))
            >> Down(Rst(43, ErrorCodes.CANCEL)) << SendUp(0, Rst(43, ErrorCodes.CANCEL))
            >> Down(Headers(45, GET, end=True)) << SendUp(0, Headers(45, GET, end=True))
            >> Down(Rst(45, ErrorCodes.CANCEL))
            << Count("outbound_http_errors_total", 'error="rapid reset"')
            << SendDown(GoAway(ErrorCodes.ENHANCE_YOUR_CALM, 45))
            << Checkin(0, reuse=False)  # its upstream connections go with it
            << Close())
    assert book


def test_a_refused_stream_is_sent_again_once_then_the_refusal_reaches_the_client() -> None:
    """REFUSED_STREAM before any response: not processed (RFC 9113 §8.7), so safe to send again."""
    router = Router(ADDRS[:1])
    settings = http_settings()
    assert (H2Playbook(router, settings)
            >> Down(Headers(1, GET, end=True))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, GET, end=True))
            >> Up(0, Rst(1, ErrorCodes.REFUSED_STREAM))
            << SendUp(0, Headers(3, GET, end=True))  # a new pick, a new stream
            >> Up(0, Rst(3, ErrorCodes.REFUSED_STREAM))
            << SendDown(Rst(1, ErrorCodes.REFUSED_STREAM)))
    assert len(router.requests) == 2
    assert settings.metrics is not None and settings.metrics.snapshot()[LABELS].requests == 1


def test_request_data_goes_up_within_the_upstreams_window_only() -> None:
    body = b"x" * 25
    assert (H2Playbook(Router(ADDRS[:1]), http_settings())
            >> Down(Headers(1, POST))
            << Connect(ADDRS[0])
            >> Connected(window=10)
            << SendUp(0, Headers(1, POST))
            >> Down(Data(1, body))
            << SendUp(0, Data(1, body[:10]))  # the rest is held, not acknowledged to the client
            >> Up(0, Window(1, 10))
            << SendUp(0, Data(1, body[10:20]))
            >> Down(Data(1, b"", end=True))
            >> Up(0, Window(1, 100))
            << SendUp(0, Data(1, body[20:], end=True)))  # the end rides on the last data


def test_response_data_waits_while_the_clients_write_buffer_is_full() -> None:
    assert (H2Playbook(Router(ADDRS[:1]), http_settings())
            >> Down(Headers(1, GET, end=True))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, GET, end=True))
            >> Writable(None, False)
            >> Up(0, Headers(1, OK), Data(1, b"held"), Data(1, b"", end=True))
            << SendDown(Headers(1, OK))  # the head goes; the data waits (and is not acknowledged upstream)
            >> Writable(None, True)
            << SendDown(Data(1, b"held", end=True)))


def test_a_grpc_call_whose_endpoints_cannot_be_reached_is_answered_unavailable() -> None:
    error = errors.connect_failed(ADDRS[2], False, "i/o", "ECONNREFUSED")
    assert (H2Playbook(Router(ADDRS), http_settings())
            >> Down(Headers(1, GRPC, end=True))
            << Connect(ADDRS[0])
            >> ConnectFailed()
            << Connect(ADDRS[1])
            >> ConnectFailed()
            << Connect(ADDRS[2])
            >> ConnectFailed()
            << Count("outbound_http_errors_total", 'error="i/o"')
            << SendDown(Headers(1, [(b":status", b"200"), *errors.grpc_headers(error)], end=True)))


def test_a_silent_client_gets_a_ping_and_without_an_answer_goaway() -> None:
    clock = FakeClock()
    settings = HttpSettings("inbound", clock, HttpMetrics(lambda: 0.0, 600), h2_keep_alive=(10.0, 5.0))

    def later(seconds: float) -> Do:
        def move() -> None:
            clock.now += seconds
        return Do(move)

    assert (H2Playbook(Router(ADDRS[:1]), settings)
            << CallLater(10.0)
            >> later(4)
            >> Down(Ping())  # a byte from the client: the interval starts again
            << SendDown(Ping(ack=True))
            >> later(6)
            >> Fire()
            << CallLater(4.0)  # silent for 6 s only
            >> later(4)
            >> Fire()
            << CallLater(5.0)
            << SendDown(Ping())
            >> Down(Ping(ack=True))  # it answered
            << CallLater(10.0)
            >> later(10)
            >> Fire()
            << CallLater(5.0)
            << SendDown(Ping())
            >> later(5)
            >> Fire()
            << SendDown(GoAway(ErrorCodes.NO_ERROR, 0))
            << Close())


def test_an_upgraded_stream_goes_to_the_app_as_http1_and_comes_back_as_http2() -> None:
    """l5d-orig-proto (a linkerd2-proxy upgraded an HTTP/1 request for the hop between proxies): downgraded."""
    upgraded = [*POST, (b"l5d-orig-proto", b"HTTP/1.1"), (b"content-length", b"5")]
    assert (H2Playbook(Router(ADDRS[:1]), http_settings("inbound"), downgrade=True)
            >> Down(Headers(1, upgraded), Data(1, b"he"))
            << Checkout(ADDRS[0])
            >> Connected()
            << SendUpBytes(0, b"POST /up HTTP/1.1\r\nhost: web\r\ncontent-length: 5\r\n\r\nhe")
            >> Down(Data(1, b"llo", end=True))  # full duplex over HTTP/1 too
            << SendUpBytes(0, b"llo")
            >> UpBytes(0, b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
            << Checkin(0, reuse=True)  # back to the pool HTTP/1 requests share
            << SendDown(Headers(1, [(b":status", b"201"), (b"content-length", b"2"),
                                    (b"l5d-orig-proto", b"HTTP/1.1")]),
                        Data(1, b"ok", end=True)))


def test_a_routes_timeout_answers_deadline_exceeded_and_cancels_the_upstream_stream() -> None:
    from test_http2_profiles import GRPC as CALL, Router as ProfileRouter, http_settings as profile_settings, profile

    error = errors.response_timeout(0.3)
    assert (H2Playbook(ProfileRouter(ADDRS[:1], profile(timeout=0.3)), profile_settings(FakeClock()))
            >> Down(Headers(1, CALL, end=True))
            << CallLater(0.3)  # the route's timeout, from the stream's start
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, [*CALL, (b"l5d-dst-canonical", b"names:9090")], end=True))
            >> Fire()
            << Count("outbound_http_errors_total", 'error="response timeout"')
            << SendDown(Headers(1, [(b":status", b"200"), *errors.grpc_headers(error)], end=True))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL))  # the connection stays; only the stream ends
            # Too late: nothing for the client, and nothing to the server either -- frames on a stream we reset
            # are ignored (RFC 9113 §5.1), they may have been in flight.
            >> Up(0, Headers(1, OK, end=True)))


POLICY_GET = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"web"), (b":path", b"/r")]


def policy_playbook(annotations: dict[str, str], clock: FakeClock, metrics: Any = None) -> H2Playbook:
    """An outbound HTTP/2 connection whose requests follow an HTTPRoute with ``annotations`` (the policy
    controller's own message, as tests/proxy/test_client_policy.py builds it) to one endpoint, cp.UP."""
    import test_client_policy as cp

    from tether.proxy.core.routes import outbound_router

    policy = cp.policy_of(cp.http_route("r", "web", [{}], annotations=annotations),
                          balancers=cp.Balancers({cp.WEB: "10.0.0.7"}))
    router = outbound_router(cp.ORIG, cp.Resolution(authority=cp.WEB), local_ips=frozenset(), connect_timeout=1.0,
                             queue=Queue(), loop_addrs=frozenset(), draw=lambda: 0.0,
                             policies=cp.PolicyWatch(policy), policy_metrics=metrics)
    return H2Playbook(router, HttpSettings("outbound", clock, None, strip_proxy_errors=True))


def later(clock: FakeClock, seconds: float) -> Do:
    def move() -> None:
        clock.now += seconds
    return Do(move)


def test_a_per_attempt_timeout_resets_the_slow_stream_and_retries_after_the_backoff() -> None:
    """A client policy rule's retry.linkerd.io/timeout on an HTTP/2 stream, as on an HTTP/1 request."""
    import test_client_policy as cp

    annotations = {"retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "1", "retry.linkerd.io/timeout": "300ms"}
    assert (policy_playbook(annotations, FakeClock())
            >> Down(Headers(1, POLICY_GET, end=True))
            << Connect(cp.UP)
            >> Connected()
            << CallLater(0.3)  # the per-attempt timeout
            << SendUp(0, Headers(1, POLICY_GET, end=True))
            >> Fire()
            << CallLater(0.025)  # the backoff (25 ms, draw 0: no jitter)
            << SendUp(0, Rst(1, ErrorCodes.CANCEL))  # the slow attempt is dropped
            >> Fire()
            << SendUp(0, Headers(3, POLICY_GET, end=True))  # the last attempt has no per-attempt timeout
            >> Up(0, Headers(3, OK, end=True))
            << SendDown(Headers(1, OK, end=True)))


def test_a_retry_gets_its_own_full_per_attempt_timeout() -> None:
    """The per-attempt timeout runs from the attempt's start (its upstream stream), not the client stream's:
    325 ms after the stream began, its second attempt still has all of its 300 ms, and answers within them."""
    import test_client_policy as cp

    clock = FakeClock()
    annotations = {"retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "2", "retry.linkerd.io/timeout": "300ms"}
    assert (policy_playbook(annotations, clock)
            >> Down(Headers(1, POLICY_GET, end=True))
            << Connect(cp.UP)
            >> Connected()
            << CallLater(0.3)
            << SendUp(0, Headers(1, POLICY_GET, end=True))
            >> later(clock, 0.3)
            >> Fire()
            << CallLater(0.025)  # the backoff
            << SendUp(0, Rst(1, ErrorCodes.CANCEL))
            >> later(clock, 0.025)
            >> Fire()
            << CallLater(0.3)  # a retry is left: the second attempt's own timeout, whole
            << SendUp(0, Headers(3, POLICY_GET, end=True))
            >> later(clock, 0.2)  # 525 ms after the stream began, 200 ms into this attempt
            >> Up(0, Headers(3, OK, end=True))
            << SendDown(Headers(1, OK, end=True)))


def test_an_idle_timeout_resets_a_response_on_which_nothing_moves() -> None:
    """timeout.linkerd.io/idle on an HTTP/2 stream: each frame either way starts it over; a stream with none
    for that long is reset (INTERNAL_ERROR, as hyper resets a stream whose body failed in linkerd2-proxy's
    stream-timeouts), the upstream stream cancelled, the connection kept."""
    import test_client_policy as cp

    from tether.proxy.core.metrics import Registry
    from tether.proxy.core.policy_metrics import PolicyMetrics

    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    assert (policy_playbook({"timeout.linkerd.io/idle": "1s"}, clock, PolicyMetrics(registry))
            >> Down(Headers(1, POLICY_GET, end=True))
            << CallLater(1.0)  # the idle timeout, for the stream's whole life
            << Connect(cp.UP)
            >> Connected()
            << SendUp(0, Headers(1, POLICY_GET, end=True))
            >> Up(0, Headers(1, OK))
            << SendDown(Headers(1, OK))
            >> later(clock, 0.6)
            >> Up(0, Data(1, b"hel"))  # a frame: the timer is pushed back
            << SendDown(Data(1, b"hel"))
            >> later(clock, 0.4)
            >> Fire()
            << CallLater(0.6)
            >> later(clock, 0.6)
            >> Fire()  # nothing since the data: the stream is reset
            << SendDown(Rst(1, ErrorCodes.INTERNAL_ERROR))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL)))
    assert (f'outbound_http_route_request_statuses_total{{{cp.PARENT},{cp.ROUTE},hostname="",http_status="200",'
            f'error="IDLE_TIMEOUT"}} 1') in registry.render()


@pytest.mark.parametrize("reply, status, label", [(None, b"504", "failfast"), (FULL, b"503", "loadshed")])
def test_failfast_and_load_shed_are_route_errors_without_a_status(reply: Any, status: bytes, label: str) -> None:
    """A client policy route whose backend has no endpoint: the request waits in the balancer's queue and the
    proxy answers it (504 at the failfast timeout, 503 when the queue is full). linkerd2-proxy's route metrics
    see that error below them: ``error="FAIL_FAST"`` / ``"LOAD_SHED"`` and no status (HTTP/1 and the legacy
    route_response_total: test_http1_proxy.py)."""
    import test_client_policy as cp

    from tether.proxy.core.metrics import Registry
    from tether.proxy.core.policy_metrics import PolicyMetrics
    from tether.proxy.core.routes import outbound_router

    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    balancers = cp.Balancers({cp.WEB: "10.0.0.7"})
    policy = cp.policy_of(cp.http_route("r", "web", [{}]), balancers=balancers)
    for balancer in balancers.by_path.values():
        balancer.reset([])
    router = outbound_router(cp.ORIG, cp.Resolution(authority=cp.WEB), local_ips=frozenset(), connect_timeout=1.0,
                             queue=Queue(), loop_addrs=frozenset(), draw=lambda: 0.0,
                             policies=cp.PolicyWatch(policy), policy_metrics=PolicyMetrics(registry))
    metrics = HttpMetrics(clock, 600.0)
    book = H2Playbook(router, HttpSettings("outbound", clock, metrics, strip_proxy_errors=True))
    error = (errors.failfast if reply is None else errors.queue_full)(cp.WEB)
    assert (book
            >> Down(Headers(1, POLICY_GET, end=True))
            << Wait()
            >> Waited(reply)
            << Count("outbound_http_errors_total", f'error="{label}"')
            << SendDown(Headers(1, [(b":status", status), (b"content-length", b"0"),
                                    (b"l5d-proxy-error", error.message.encode())], end=True)))
    name = {"failfast": "FAIL_FAST", "loadshed": "LOAD_SHED"}[label]
    assert (f'outbound_http_route_request_statuses_total{{{cp.PARENT},{cp.ROUTE},hostname="",http_status="",'
            f'error="{name}"}} 1') in registry.render()


GRPC_CALL = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"web"), (b":path", b"/r"),
             (b"content-type", b"application/grpc")]
GRPC_HEAD = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def grpc_call_headed(annotations: dict[str, str], clock: FakeClock) -> H2Playbook:
    """A gRPC call on a client policy route with ``annotations`` (one of them a 1 s timer), up to its
    response head relayed to the client."""
    import test_client_policy as cp

    return (policy_playbook(annotations, clock)
            >> Down(Headers(1, GRPC_CALL, end=True))
            << CallLater(1.0)
            << Connect(cp.UP)
            >> Connected()
            << SendUp(0, Headers(1, GRPC_CALL, end=True))
            >> Up(0, Headers(1, GRPC_HEAD))
            << SendDown(Headers(1, GRPC_HEAD)))


def test_an_idle_grpc_response_ends_with_deadline_exceeded_trailers() -> None:
    """A gRPC response on which nothing moves for the idle timeout ends as Linkerd ends a gRPC response that
    failed after its head: trailers with DEADLINE_EXCEEDED, the upstream stream cancelled."""
    clock = FakeClock()
    assert (grpc_call_headed({"timeout.linkerd.io/idle": "1s"}, clock)
            >> later(clock, 1.0)
            >> Fire()
            << SendDown(Headers(1, [(b"grpc-status", b"4"), (b"grpc-message", b"HTTP stream idle for 1s")],
                                end=True))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL)))


def test_an_idle_stream_before_its_response_head_gets_504() -> None:
    """Idle before the response head: Linkerd's non-fatal policy timeout (504 with l5d-proxy-error, not retried);
    the upstream stream is cancelled, the client's connection and the endpoint's stay."""
    import test_client_policy as cp

    clock = FakeClock()
    annotations = {"timeout.linkerd.io/idle": "1s", "retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "1"}
    assert (policy_playbook(annotations, clock)
            >> Down(Headers(1, POLICY_GET, end=True))
            << CallLater(1.0)
            << Connect(cp.UP)
            >> Connected()
            << SendUp(0, Headers(1, POLICY_GET, end=True))
            >> later(clock, 1.0)
            >> Fire()
            << Count("outbound_http_errors_total", 'error="response timeout"')
            << SendDown(Headers(1, [(b":status", b"504"), (b"content-length", b"0"),
                                    (b"l5d-proxy-error", b"HTTP stream idle for 1s")], end=True))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL))
            >> Down(Headers(3, POLICY_GET, end=True))  # the next stream goes up the same connection
            << CallLater(1.0)
            << SendUp(0, Headers(3, POLICY_GET, end=True)))


def test_an_endpoints_keep_alive_pings_it_and_a_silent_one_is_dropped() -> None:
    """Discovery's keep-alive for an endpoint (WeightedAddr.http2, in Connect.h2_keep_alive): a PING once the
    endpoint has been silent for the interval; no answer within the timeout and the connection is closed,
    its streams failed."""
    from tether.proxy.core import commands as cmd
    from tether.proxy.core.http import Pick

    clock = FakeClock()
    settings = HttpSettings("outbound", clock, HttpMetrics(lambda: 0.0, 600), error_labels=LABELS)

    def router(request: object) -> Generator[cmd.Command, Any, Pick]:
        return Pick(cmd.Connect(ADDRS[0], None, 1.0, "x", h2_keep_alive=(10.0, 3.0, True)), None, LABELS, b"web")
        yield

    def later(seconds: float) -> Do:
        def move() -> None:
            clock.now += seconds
        return Do(move)

    assert (H2Playbook(router, settings)  # type: ignore[arg-type]
            >> Down(Headers(1, GET, end=True))
            << Connect(ADDRS[0])
            >> Connected()
            << CallLater(10.0)  # the endpoint's keep-alive starts with its connection
            << SendUp(0, Headers(1, GET, end=True))
            >> Up(0, Headers(1, OK, end=True))
            << SendDown(Headers(1, OK, end=True))
            >> later(10)
            >> Fire()
            << CallLater(3.0)
            << SendUp(0, Ping())
            >> Up(0, Ping(ack=True))  # it answered
            << CallLater(10.0)
            >> Down(Headers(3, GRPC, end=True))
            << SendUp(0, Headers(3, GRPC, end=True))
            >> later(10)
            >> Fire()
            << CallLater(3.0)
            << SendUp(0, Ping())
            >> later(3)
            >> Fire()  # no answer: the connection goes, and the stream on it fails
            << Checkin(0, reuse=False)
            << Count("outbound_http_errors_total", 'error="i/o"')
            << SendDown(Headers(3, [(b":status", b"200"), *errors.grpc_headers(errors.io_error(ADDRS[0]))],
                                end=True)))


def test_each_data_frame_is_counted_in_the_routes_frame_size_histograms() -> None:
    """outbound_http_route_request_frame_size_bytes and ..._backend_response_frame_size_bytes on HTTP/2: each
    DATA frame, the client's on the route, the backend's relayed ones on its backend (buckets 128, 1024, 10240)."""
    import test_client_policy as cp

    from tether.proxy.core.metrics import Registry
    from tether.proxy.core.policy_metrics import PolicyMetrics

    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    post = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"web"), (b":path", b"/r")]
    assert (policy_playbook({}, clock, PolicyMetrics(registry))
            >> Down(Headers(1, post))
            << Connect(cp.UP)
            >> Down(Data(1, b"a" * 100))  # held: the connection is not there yet
            >> Connected()
            << SendUp(0, Headers(1, post), Data(1, b"a" * 100))
            >> Down(Data(1, b"b" * 2000, end=True))
            << SendUp(0, Data(1, b"b" * 2000, end=True))
            >> Up(0, Headers(1, OK), Data(1, b"c" * 20))
            << SendDown(Headers(1, OK), Data(1, b"c" * 20))
            >> Up(0, Data(1, b"d" * 280, end=True))
            << SendDown(Data(1, b"d" * 280, end=True)))  # the end with the data, as it came
    lines = registry.render().splitlines()
    request = f'outbound_http_route_request_frame_size_bytes_bucket{{{cp.PARENT},{cp.ROUTE},hostname=""'
    assert [line for line in lines if line.startswith(request)] == [
        f'{request},le="128.0"}} 1', f'{request},le="1024.0"}} 1', f'{request},le="10240.0"}} 2',
        f'{request},le="+Inf"}} 2']
    backend = f"outbound_http_route_backend_response_frame_size_bytes_bucket{{{cp.PARENT},{cp.ROUTE},backend_"
    assert [line.rpartition(",")[2] for line in lines if line.startswith(backend)] == [
        'le="128.0"} 1', 'le="1024.0"} 2', 'le="10240.0"} 2', 'le="+Inf"} 2']


def test_padding_is_given_back_when_it_comes_and_data_once_written_on() -> None:
    """Padding (RFC 9113 §6.1) counts against the windows but goes nowhere: the core gives it back at once, each
    way, and the data once written to the other side; a frame without padding gives back nothing before that
    (the codec raises a window once half of it is given back: 500 bytes of these)."""
    small = Http2Params(stream_window=1000)
    assert (H2Playbook(Router(ADDRS[:1]), http_settings(h2_server=small, h2_client=small))
            >> Down(Headers(1, POST))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, POST))
            >> Down(Data(1, b"a" * 100, pad=199))  # 300 of the window: 200 given back at once, 100 once sent
            << SendUp(0, Data(1, b"a" * 100))
            >> Down(Data(1, b"b" * 100, pad=199))  # 200 + 100 + 200 given back: the client's window raised
            << SendDown(Window(1, 500))
            << SendUp(0, Data(1, b"b" * 100))
            >> Up(0, Headers(1, OK), Data(1, b"c" * 100, pad=199))
            << SendDown(Headers(1, OK), Data(1, b"c" * 100))
            >> Up(0, Data(1, b"d" * 100, pad=199), Data(1, b"e" * 100, pad=199))
            << SendDown(Data(1, b"d" * 100), Data(1, b"e" * 100))
            << SendUp(0, Window(1, 500)))  # the same upstream: 200 + 100 + 200 given back


def test_a_stream_waits_for_a_free_stream_at_the_endpoint_and_goes_up_when_one_is_over() -> None:
    """An endpoint's MAX_CONCURRENT_STREAMS holds new streams back until one of its streams is over; a stream over
    with none waiting opens nothing."""
    assert (H2Playbook(Router(ADDRS[:1]), http_settings())
            >> Down(Headers(1, GET, end=True))
            << Connect(ADDRS[0])
            >> Connected(streams=1)
            << SendUp(0, Headers(1, GET, end=True))
            >> Down(Headers(3, GET, end=True), Headers(5, GET, end=True))  # both wait: one stream at a time
            >> Up(0, Headers(1, OK, end=True))
            << SendDown(Headers(1, OK, end=True))
            << SendUp(0, Headers(3, GET, end=True))  # stream 1 is over: 3 goes up, 5 still waits
            >> Up(0, Headers(3, OK), Data(3, b"three", end=True))
            << SendDown(Headers(3, OK), Data(3, b"three", end=True))
            << SendUp(0, Headers(5, GET, end=True))
            >> Up(0, Headers(5, OK, end=True))
            << SendDown(Headers(5, OK, end=True)))


def test_a_downgraded_request_and_its_response_lose_their_hop_by_hop_headers() -> None:
    """Downgraded (l5d-orig-proto): TE and l5d-orig-proto are not the app's, a Host that came is kept, a body that
    came whole gets its Content-Length; the response loses the headers its Connection names."""
    upgraded = [*POST, (b"l5d-orig-proto", b"HTTP/1.1"), (b"host", b"web:80"), (b"te", b"trailers")]
    assert (H2Playbook(Router(ADDRS[:1]), http_settings("inbound"), downgrade=True)
            >> Down(Headers(1, upgraded), Data(1, b"hello", end=True))
            << Checkout(ADDRS[0])
            >> Connected()
            << SendUpBytes(0, b"POST /up HTTP/1.1\r\nhost: web:80\r\ncontent-length: 5\r\n\r\nhello")
            >> UpBytes(0, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\n"
                          b"X-Kept: 2\r\n\r\nok")
            << Checkin(0, reuse=False)
            << SendDown(Headers(1, [(b":status", b"200"), (b"content-length", b"2"), (b"x-kept", b"2"),
                                    (b"l5d-orig-proto", b"HTTP/1.1")]),
                        Data(1, b"ok", end=True)))


def test_a_downgraded_request_whose_body_is_still_coming_goes_chunked() -> None:
    upgraded = [*POST, (b"l5d-orig-proto", b"HTTP/1.1")]
    assert (H2Playbook(Router(ADDRS[:1]), http_settings("inbound"), downgrade=True)
            >> Down(Headers(1, upgraded), Data(1, b"he"))
            << Checkout(ADDRS[0])
            >> Connected()
            << SendUpBytes(0, b"POST /up HTTP/1.1\r\nhost: web\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhe\r\n")
            >> Down(Data(1, b"llo", end=True))
            << SendUpBytes(0, b"3\r\nllo\r\n0\r\n\r\n")
            >> UpBytes(0, b"HTTP/1.1 204 No Content\r\n\r\n")
            << Checkin(0, reuse=True)
            << SendDown(Headers(1, [(b":status", b"204"), (b"l5d-orig-proto", b"HTTP/1.1")]), Data(1, b"", end=True)))


def test_a_stream_moves_only_as_the_transition_table_says() -> None:
    """The core moves a stream by ``TRANSITIONS.get((phase, step)) or _illegal(stream, step)``, written inline: so
    every phase in the table must be true (an Enum member is, unless it says otherwise), and a step the table
    does not have raises, naming the stream, the step and the phase."""
    from tether.proxy.codec.common import LocalProtocolError
    from tether.proxy.core.http2_proxy import TRANSITIONS, Phase, Step, _illegal, _Stream

    assert all(TRANSITIONS.values())
    stream = _Stream(7, {b":method": b"GET"}, [], 0.0)
    stream.phase = Phase.OVER
    assert TRANSITIONS.get((stream.phase, Step.HEAD)) is None
    with pytest.raises(LocalProtocolError, match="HTTP/2 stream 7: head while over"):
        stream.phase = TRANSITIONS.get((stream.phase, Step.HEAD)) or _illegal(stream, Step.HEAD)


def test_what_came_before_the_upstream_stream_follows_its_head_and_nothing_else_does() -> None:
    """A request's end (with trailers, no body) that came while connecting follows its head at once; a request
    still open with nothing yet sends its head alone, and its data as it comes."""
    trailers = [(b"x-checksum", b"0")]
    assert (H2Playbook(Router(ADDRS[:1]), http_settings())
            >> Down(Headers(1, POST), Headers(1, trailers, end=True), Headers(3, POST))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, POST), Headers(1, trailers, end=True), Headers(3, POST))
            >> Down(Data(3, b"later", end=True))
            << SendUp(0, Data(3, b"later", end=True)))


def test_downgraded_requests_take_turns_on_a_pooled_connection_and_its_codec() -> None:
    """A pooled HTTP/1 connection keeps its codec from one downgraded request to the next (made ready for its next
    cycle, as the HTTP/1 layer does); bytes the app sent past a response are not the next response: the
    connection's next request starts on a new codec."""
    upgraded = [*GET, (b"l5d-orig-proto", b"HTTP/1.1")]
    request = b"GET / HTTP/1.1\r\nhost: web\r\n\r\n"

    def response(sid: int, body: bytes) -> SendDown:
        return SendDown(Headers(sid, [(b":status", b"200"), (b"content-length", b"1"),
                                      (b"l5d-orig-proto", b"HTTP/1.1")]), Data(sid, body, end=True))

    assert (H2Playbook(Router(ADDRS[:1]), http_settings("inbound"), downgrade=True)
            >> Down(Headers(1, upgraded, end=True))
            << Checkout(ADDRS[0])
            >> Connected()
            << SendUpBytes(0, request)
            >> UpBytes(0, b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na")
            << Checkin(0, reuse=True)
            << response(1, b"a")
            >> Down(Headers(3, upgraded, end=True))
            << Checkout(ADDRS[0], pooled=True)
            << SendUpBytes(0, request)
            >> UpBytes(0, b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nbHTTP/1.1 500 Stray\r\n\r\n")
            << Checkin(0, reuse=True)
            << response(3, b"b")
            >> Down(Headers(5, upgraded, end=True))
            << Checkout(ADDRS[0], pooled=True)
            << SendUpBytes(0, request)
            >> UpBytes(0, b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nc")
            << Checkin(0, reuse=True)
            << response(5, b"c"))


def test_a_grpc_status_in_a_response_head_is_counted_and_so_is_one_a_route_adds() -> None:
    """A gRPC call's status: the one a trailers-only response head carries; else the trailers'; and one a route's
    response header modifier added to a head that had none."""
    from test_http2_proxy import responses

    from tether.proxy.core.http import Pick

    class Responding(Router):  # a client policy route adding grpc-status to every response head
        def __call__(self, request: Any) -> Generator[Any, Any, Any]:
            pick = yield from super().__call__(request)
            if isinstance(pick, Pick):
                pick.respond = lambda headers: (*headers, (b"grpc-status", b"7"))
            return pick

    head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    settings = http_settings()
    assert (H2Playbook(Router(ADDRS[:1]), settings)
            >> Down(Headers(1, GRPC, end=True), Headers(3, GRPC, end=True))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, GRPC, end=True), Headers(3, GRPC, end=True))
            >> Up(0, Headers(1, [*head, (b"grpc-status", b"14")], end=True))
            << SendDown(Headers(1, [*head, (b"grpc-status", b"14")], end=True))
            >> Up(0, Headers(3, head), Data(3, b"msg"), Headers(3, [(b"grpc-status", b"0")], end=True))
            << SendDown(Headers(3, head), Data(3, b"msg"), Headers(3, [(b"grpc-status", b"0")], end=True)))
    assert responses(settings) == {
        'status_code="200",classification="failure",grpc_status="14",error=""': 1,
        'status_code="200",classification="success",grpc_status="0",error=""': 1,
    }
    settings = http_settings()
    assert (H2Playbook(Responding(ADDRS[:1]), settings)
            >> Down(Headers(1, GRPC, end=True))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, GRPC, end=True))
            >> Up(0, Headers(1, head, end=True))
            << SendDown(Headers(1, [*head, (b"grpc-status", b"7")], end=True)))
    assert responses(settings) == {'status_code="200",classification="failure",grpc_status="7",error=""': 1}


def test_response_data_goes_at_once_unless_its_own_end_is_next_in_the_read() -> None:
    """Response data is flushed as it comes, except when its own stream's end (its trailers) is the next frame of
    the read: then both go in one flush. Another stream's trailers next hold nothing back."""
    trailers = [(b"grpc-status", b"0")]
    assert (H2Playbook(Router(ADDRS[:1]), http_settings())
            >> Down(Headers(1, GRPC, end=True), Headers(3, GRPC, end=True))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, GRPC, end=True), Headers(3, GRPC, end=True))
            >> Up(0, Headers(1, OK), Headers(3, OK), Data(1, b"one"), Headers(3, trailers, end=True))
            << SendDown(Headers(1, OK), Headers(3, OK), Data(1, b"one"), Headers(3, trailers, end=True))
            >> Up(0, Data(1, b"last"), Headers(1, trailers, end=True))
            << SendDown(Data(1, b"last"), Headers(1, trailers, end=True)))
