"""Tap in the proxy: match trees, limits, events (pure), and the Observe server over real mTLS with a client from tap.proto.

The server is ``tether.proxy.io.tap_server`` with a certificate from a
throwaway PKI; clients are grpcio channels presenting the tap identity,
another identity, or no certificate.  Requests are reported to the registry
as the HTTP layers report them (``Taps.begin`` and the stream's events).
"""

from __future__ import annotations

import asyncio
import ipaddress
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from tether.api import http_types_pb2, net_pb2, tap_pb2, tap_pb2_grpc
from tether.proxy.core.tap import EVENT_BUFFER, INBOUND, OUTBOUND, MatchError, TapRequest, Taps, compile_match, new_tap
from tether.proxy.io.tap_server import UNAUTHORIZED, TapServer
from viz.pkilab import Pki, server_context

M = tap_pb2.ObserveRequest.Match


def req(path: str = "/a", *, method: str = "GET", authority: str = "web.ns.svc.cluster.local:80",
        source: tuple[str, int] = ("10.0.0.5", 40000), destination: tuple[str, int] = ("10.0.0.9", 8080),
        direction: int = INBOUND, **kw: Any) -> TapRequest:
    return TapRequest(direction, source, destination, method, "http", authority, path, **kw)


def _ip(text: str) -> net_pb2.IPAddress:
    return net_pb2.IPAddress(ipv4=int(ipaddress.IPv4Address(text)))


# -- match trees ----------------------------------------------------------------------------------


def test_http_matches() -> None:
    by_path = compile_match(M(http=M.Http(path=M.Http.StringMatch(prefix="/api"))))
    assert by_path(req("/api/list")) and not by_path(req("/web"))
    exact = compile_match(M(http=M.Http(authority=M.Http.StringMatch(exact="web.ns.svc.cluster.local:80"))))
    assert exact(req()) and not exact(req(authority="other"))
    post = compile_match(M(http=M.Http(method=http_types_pb2.HttpMethod(registered=http_types_pb2.HttpMethod.POST))))
    assert post(req(method="post")) and not post(req(method="GET"))
    get = compile_match(M(http=M.Http(method=http_types_pb2.HttpMethod(registered=http_types_pb2.HttpMethod.GET))))
    assert get(req(method="GET"))  # GET is 0, still set inside the oneof
    https = compile_match(M(http=M.Http(scheme=http_types_pb2.Scheme(registered=http_types_pb2.Scheme.HTTPS))))
    assert not https(req())


def test_tcp_and_label_matches_and_combinators() -> None:
    net = compile_match(M(source=M.Tcp(netmask=M.Tcp.Netmask(ip=_ip("10.0.0.0"), mask=24))))
    assert net(req()) and not net(req(source=("10.0.1.5", 1)))
    ports = compile_match(M(destination=M.Tcp(ports=M.Tcp.PortRange(min=8000, max=8080))))
    assert ports(req()) and not ports(req(destination=("10.0.0.9", 9090)))
    one = compile_match(M(destination=M.Tcp(ports=M.Tcp.PortRange(min=8080))))
    assert one(req()) and not one(req(destination=("10.0.0.9", 8081)))
    label = compile_match(M(destination_label=M.Label(key="deployment", value="web")))
    assert label(req(destination_labels={"deployment": "web"})) and not label(req())
    route = compile_match(M(route_label=M.Label(key="route", value="list")))
    assert route(req(route_labels={"route": "list"}))
    both = compile_match(M(all=M.Seq(matches=[M(http=M.Http(path=M.Http.StringMatch(prefix="/a"))),
                                              M(**{"not": M(http=M.Http(path=M.Http.StringMatch(exact="/a/x")))})])))
    assert both(req("/a/y")) and not both(req("/a/x")) and not both(req("/b"))
    assert compile_match(M(all=M.Seq()))(req()) and not compile_match(M(any=M.Seq()))(req())


@pytest.mark.parametrize(("match", "message"), [
    (M(), "match: no condition set"),
    (M(all=M.Seq(matches=[M()])), r"match.all\[0\]: no condition set"),
    (M(destination=M.Tcp(ports=M.Tcp.PortRange(min=9, max=3))), "is not a port range"),
    (M(source=M.Tcp()), "neither netmask nor ports"),
    (M(http=M.Http(path=M.Http.StringMatch())), "neither exact nor prefix"),
])
def test_malformed_matches_are_named(match: Any, message: str) -> None:
    with pytest.raises(MatchError, match=message):
        compile_match(match)


# -- the registry ---------------------------------------------------------------------------------


def test_no_tap_costs_one_test_and_returns_nothing() -> None:
    assert Taps(base=7).begin(req(), 0.0) is None


def test_limit_counts_requests_and_events_follow_the_stream() -> None:
    taps = Taps(base=7)
    woken: list[int] = []
    tap = new_tap(tap_pb2.ObserveRequest(limit=2, match=M(http=M.Http(path=M.Http.StringMatch(prefix="/a")))),
                  lambda: woken.append(1))
    taps.add(tap)
    assert taps.begin(req("/b"), 0.0) is None  # not matched: not counted
    first = taps.begin(req("/a/1", headers=[(b"x-id", b"1")]), 1.0)
    second = taps.begin(req("/a/2", direction=OUTBOUND), 1.5)
    assert first is not None and second is not None
    assert taps.begin(req("/a/3"), 2.0) is None  # over the limit
    first.response_init(200, [(b"content-type", b"text/plain")], 1.25)
    first.response_end(2.0, response_bytes=42, trailers=[(b"grpc-status", b"0")])
    assert not tap.finished  # the second request is still open
    second.response_end(3.0, reset_code=2)
    assert tap.finished
    kinds = [e.http.WhichOneof("event") for e in tap.events]
    assert kinds == ["request_init", "request_init", "response_init", "response_end", "response_end"]
    init, init2, rsp, end, end2 = tap.events
    assert init.http.request_init.path == "/a/1" and init.proxy_direction == INBOUND
    assert init.http.request_init.id.base == 7 and init.http.request_init.id.stream == 1
    assert init2.proxy_direction == OUTBOUND and init2.http.request_init.id.stream == 2
    assert not init.http.request_init.HasField("headers")  # extraction not asked for
    assert rsp.http.response_init.http_status == 200
    assert rsp.http.response_init.since_request_init.ToNanoseconds() == 250_000_000
    assert end.http.response_end.response_bytes == 42
    assert end.http.response_end.since_response_init.ToNanoseconds() == 750_000_000
    assert end2.http.response_end.eos.reset_error_code == 2
    assert init.source.port == 40000 and init.destination.port == 8080
    assert woken


def test_headers_are_extracted_when_asked_and_events_are_bounded() -> None:
    taps = Taps(base=1)
    extract = tap_pb2.ObserveRequest.Extract(http=tap_pb2.ObserveRequest.Extract.Http(
        headers=tap_pb2.ObserveRequest.Extract.Http.Headers()))
    with_headers = new_tap(tap_pb2.ObserveRequest(limit=EVENT_BUFFER + 10, extract=extract), lambda: None)
    plain = new_tap(tap_pb2.ObserveRequest(limit=1), lambda: None)
    taps.add(with_headers)
    taps.add(plain)
    stream = taps.begin(req(headers=[(b"x-id", b"1")]), 0.0)
    assert stream is not None
    stream.response_end(1.0, grpc_status=0, trailers=[(b"grpc-status", b"0")])
    init = with_headers.events[0].http.request_init
    assert [(h.name, h.value) for h in init.headers.headers] == [("x-id", b"1")]
    assert with_headers.events[1].http.response_end.trailers.headers[0].name == "grpc-status"
    assert not plain.events[0].http.request_init.HasField("headers")
    for i in range(EVENT_BUFFER + 5):
        taps.begin(req(f"/{i}"), 0.0)
    assert len(with_headers.events) == EVENT_BUFFER and with_headers.dropped > 0


def test_limit_must_be_positive() -> None:
    with pytest.raises(MatchError, match="limit: must be greater than 0"):
        new_tap(tap_pb2.ObserveRequest(limit=0), lambda: None)


# -- the server over mTLS -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki() -> Pki:
    return Pki()


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


async def _server(pki: Pki, taps: Taps) -> tuple[TapServer, str]:
    proxy_id, key, chain = pki.leaf("web", "emojivoto")
    tap_id = pki.leaf("tap", "linkerd-viz")[0]
    server = TapServer(taps, tap_id, lambda: server_context(key, chain, pki.anchors_pem))
    await server.start("127.0.0.1", 0)
    return server, proxy_id


def _channel(pki: Pki, server: TapServer, proxy_id: str, client: tuple[str, bytes, bytes] | None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.anchors_pem,
                                               private_key=client[1] if client else None,
                                               certificate_chain=client[2] if client else None)
    return grpc.aio.secure_channel(f"127.0.0.1:{server.port}", credentials,
                                   options=[("grpc.ssl_target_name_override", proxy_id)])


def test_observe_streams_the_matching_requests_to_the_tap_identity(pki: Pki) -> None:
    async def body() -> None:
        taps = Taps(base=99)
        server, proxy_id = await _server(pki, taps)
        async with _channel(pki, server, proxy_id, pki.leaf("tap", "linkerd-viz")) as channel:
            call = tap_pb2_grpc.TapStub(channel).Observe(tap_pb2.ObserveRequest(
                limit=2, match=M(http=M.Http(path=M.Http.StringMatch(prefix="/api")))))
            events: list[tap_pb2.TapEvent] = []

            async def read() -> None:
                async for event in call:
                    events.append(event)

            reader = asyncio.create_task(read())
            await server.wait_for_taps(1)
            loop = asyncio.get_running_loop()
            for path in ("/web", "/api/a", "/api/b", "/api/c"):
                stream = taps.begin(req(path), loop.time())
                if stream is not None:
                    stream.response_init(200, [], loop.time())
                    stream.response_end(loop.time(), response_bytes=5)
            await reader  # the stream ends once two requests were reported and answered
            paths = [e.http.request_init.path for e in events if e.http.WhichOneof("event") == "request_init"]
            assert paths == ["/api/a", "/api/b"]
            assert [e.http.WhichOneof("event") for e in events].count("response_end") == 2
            assert await call.code() == grpc.StatusCode.OK
        assert taps.taps == []  # the finished tap is gone: no cost on the request path any more
        await server.stop()

    _run(body)


def test_the_server_advertises_the_http2_settings_it_is_given(pki: Pki) -> None:
    """The control listener follows the inbound server's HTTP/2 settings (proxy.md §2.2; the proxy passes
    ``config.inbound.server_h2``): its SETTINGS frame carries them, not the defaults."""
    import ssl

    import hyperframe.frame as hf

    from tether.proxy.codec.http2 import Http2Params

    params = Http2Params(stream_window=131_072, connection_window=2 << 20, max_concurrent_streams=7,
                         max_frame_size=32_768, max_header_list_size=40_000)

    async def body() -> None:
        proxy_id, key, chain = pki.leaf("web", "emojivoto")
        server = TapServer(Taps(base=1), pki.leaf("tap", "linkerd-viz")[0],
                           lambda: server_context(key, chain, pki.anchors_pem), params)
        await server.start("127.0.0.1", 0)
        try:
            client = ssl.create_default_context(cadata=pki.anchors_pem.decode())
            client.set_alpn_protocols(["h2"])
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client,
                                                           server_hostname=proxy_id)
            writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + hf.SettingsFrame(0).serialize())
            frame, length = hf.Frame.parse_frame_header(memoryview(await reader.readexactly(9)))
            frame.parse_body(memoryview(await reader.readexactly(length)))
            writer.close()
        finally:
            await server.stop()
        assert isinstance(frame, hf.SettingsFrame) and "ACK" not in frame.flags
        assert frame.settings[hf.SettingsFrame.INITIAL_WINDOW_SIZE] == 131_072
        assert frame.settings[hf.SettingsFrame.MAX_CONCURRENT_STREAMS] == 7
        assert frame.settings[hf.SettingsFrame.MAX_FRAME_SIZE] == 32_768
        assert frame.settings[hf.SettingsFrame.MAX_HEADER_LIST_SIZE] == 40_000

    _run(body)


@pytest.mark.parametrize("who", ["another identity", "no certificate"])
def test_other_clients_are_unauthenticated(pki: Pki, who: str) -> None:
    async def body() -> None:
        taps = Taps(base=1)
        server, proxy_id = await _server(pki, taps)
        client = pki.leaf("web", "emojivoto") if who == "another identity" else None
        async with _channel(pki, server, proxy_id, client) as channel:
            call = tap_pb2_grpc.TapStub(channel).Observe(tap_pb2.ObserveRequest(limit=1))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
            # Both reach the server (a certificate is asked for, not required) and get linkerd2-proxy's answer.
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and err.value.details() == UNAUTHORIZED
        assert taps.taps == []
        await server.stop()

    _run(body)


def test_bad_requests_are_invalid_arguments(pki: Pki) -> None:
    async def body() -> None:
        server, proxy_id = await _server(pki, Taps(base=1))
        async with _channel(pki, server, proxy_id, pki.leaf("tap", "linkerd-viz")) as channel:
            stub = tap_pb2_grpc.TapStub(channel)
            for request, message in ((tap_pb2.ObserveRequest(limit=0), "limit"),
                                     (tap_pb2.ObserveRequest(limit=1, match=M()), "no condition set")):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stub.Observe(request):
                        pass
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()
            # Bytes that are no ObserveRequest, and a method the server does not have.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_stream("/io.linkerd.proxy.tap.Tap/Observe")(b"\xff\xff\xff").read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ObserveRequest" in err.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_stream("/io.linkerd.proxy.tap.Tap/Watch")(b"").read()
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        await server.stop()

    _run(body)


def test_a_client_that_stops_reading_holds_events_in_the_tap_not_the_server(pki: Pki) -> None:
    """io.grpc_server sends only as the client's flow-control window allows. The proxy's own gRPC client hands
    window back only as its caller takes messages: while it takes none, the server holds at most HIGH_WATER
    bytes, the tap its 400 events, and drops the rest (counted); once it reads again, every event not dropped
    arrives, in order."""
    import ssl

    from tether.proxy.io.grpc_client import Channel
    from tether.proxy.io.grpc_server import HIGH_WATER
    from tether.proxy.io.tap_server import OBSERVE

    async def body() -> None:
        taps = Taps(base=1)
        server, proxy_id = await _server(pki, taps)
        _, key, chain = pki.leaf("tap", "linkerd-viz")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False  # the channel checks the server's name itself
        context.load_verify_locations(cadata=pki.anchors_pem.decode())
        context.set_alpn_protocols(["h2"])
        with tempfile.NamedTemporaryFile() as pem_file:
            pem_file.write(chain + key)
            pem_file.flush()
            context.load_cert_chain(pem_file.name)
        channel = Channel(f"127.0.0.1:{server.port}", ssl_context=context, server_name=proxy_id)
        extract = tap_pb2.ObserveRequest.Extract(http=tap_pb2.ObserveRequest.Extract.Http(
            headers=tap_pb2.ObserveRequest.Extract.Http.Headers()))
        stream = channel.server_stream(OBSERVE, tap_pb2.ObserveRequest(limit=100_000, extract=extract),
                                       tap_pb2.TapEvent)
        first = asyncio.create_task(anext(stream))
        await server.wait_for_taps(1)
        (tap,) = taps.taps
        loop = asyncio.get_running_loop()
        big = ((b"x-padding", b"p" * 1000),)  # each event about 1 KB
        taps.begin(req("/0", headers=big), loop.time())
        assert (await first).http.request_init.path == "/0"
        sent = 1
        for batch in range(30):  # 3,000 more, the loop turning between batches so the server sends what it may
            for _ in range(100):
                taps.begin(req(f"/{sent}", headers=big), loop.time())
                sent += 1
            for _ in range(5):
                await asyncio.sleep(0)
            (conn,) = server.grpc.connections
            assert conn.endpoint.buffered(next(iter(conn.calls))) <= HIGH_WATER + 2048
        assert len(tap.events) == 400 and tap.dropped > 0
        received = [event async for event in _take(stream, sent - 1 - tap.dropped)]
        paths = [int(e.http.request_init.path[1:]) for e in received]
        assert paths == sorted(paths) and len(paths) == sent - 1 - tap.dropped and paths[0] == 1
        await stream.aclose()
        await channel.close()
        await server.wait_for_no_taps()  # leaving the call closed the tap
        await server.stop()

    _run(body)


async def _take(stream: Any, n: int) -> Any:
    for _ in range(n):
        yield await asyncio.wait_for(anext(stream), 10)


def test_grpc_message_framing() -> None:
    """codec.grpc_framing, shared by the proxy's gRPC client and its tap server: messages from any split of
    the bytes; a compressed or oversized one refused with the status the call ends with."""
    from tether.proxy.codec.grpc_framing import FramingError, MessageReader, frame

    wire = frame(b"one") + frame(b"") + frame(b"three")
    reader = MessageReader(max_message=16)
    got = [m for i in range(len(wire)) for m in reader.feed(wire[i:i + 1])]
    assert got == [b"one", b"", b"three"] and reader.partial == 0
    assert reader.feed(frame(b"four")[:6]) == [] and reader.partial == 6
    for bad, code in ((b"\x01" + frame(b"x")[1:], 13), (frame(b"x" * 17), 8)):
        with pytest.raises(FramingError) as err:
            MessageReader(max_message=16).feed(bad)
        assert err.value.code == code


def test_a_client_that_goes_away_closes_its_tap(pki: Pki) -> None:
    async def body() -> None:
        taps = Taps(base=1)
        server, proxy_id = await _server(pki, taps)
        async with _channel(pki, server, proxy_id, pki.leaf("tap", "linkerd-viz")) as channel:
            call = tap_pb2_grpc.TapStub(channel).Observe(tap_pb2.ObserveRequest(limit=100))
            reader = asyncio.create_task(call.read())
            await server.wait_for_taps(1)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
        await server.wait_for_no_taps()
        assert taps.begin(req(), 0.0) is None
        await server.stop()

    _run(body)


# -- the HTTP layers' hook (core.http.StreamObserver) ------------------------------------------------------


def test_the_observer_turns_the_layers_calls_into_events() -> None:
    from tether.proxy.codec.http1 import RequestHead
    from tether.proxy.core.http import StreamObserver
    from tether.proxy.core.tap import TapObserver

    now = [10.0]
    taps = Taps(base=5)
    observer: StreamObserver = TapObserver(taps, OUTBOUND, lambda: now[0])
    head = RequestHead(b"GET", b"/api/list", ((b"host", b"emoji.emojivoto.svc.cluster.local:8080"), (b"x-id", b"7")))
    labels = ('direction="outbound",peer="dst",authority="emoji.emojivoto.svc.cluster.local:8080",'
              'target_addr="10.0.0.9:8080",target_ip="10.0.0.9",target_port="8080",tls="true",'
              'server_id="emoji.emojivoto.serviceaccount.identity.linkerd.cluster.local",dst_deployment="emoji",'
              'dst_namespace="emojivoto"')
    first, second = object(), object()
    observer.request(first, head, labels, ("10.0.0.4", 40001))  # no tap open: nothing kept
    assert taps.begin(req(), 0.0) is None
    extract = tap_pb2.ObserveRequest.Extract(http=tap_pb2.ObserveRequest.Extract.Http(
        headers=tap_pb2.ObserveRequest.Extract.Http.Headers()))
    tap = new_tap(tap_pb2.ObserveRequest(limit=5, extract=extract, match=M(
        destination_label=M.Label(key="deployment", value="emoji"))), lambda: None)
    taps.add(tap)
    observer.request(second, head, labels, ("10.0.0.4", 40002))
    now[0] = 10.004
    observer.response(second, 200, ((b":status", b"200"), (b"Content-Type", b"application/json")))
    now[0] = 10.005
    observer.end(second, 200, None, response_bytes=1234, trailers=((b"X-Checksum", b"abc"),))
    observer.end(first, 200, None)  # never tapped: nothing
    init, rsp, end = tap.events
    r = init.http.request_init
    assert (r.path, r.authority, init.proxy_direction) == ("/api/list", "emoji.emojivoto.svc.cluster.local:8080", OUTBOUND)
    assert [(h.name, h.value) for h in r.headers.headers][1] == ("x-id", b"7")
    assert init.destination.port == 8080 and init.destination_meta.labels["deployment"] == "emoji"
    assert init.destination_meta.labels["tls"] == "true"
    assert (init.source.ip.ipv4, init.source.port) == (0x0A000004, 40002)  # the connection's client
    assert rsp.http.response_init.http_status == 200
    # The response's headers, asked for: names lower-cased, no HTTP/2 pseudo-headers.
    assert [(h.name, h.value) for h in rsp.http.response_init.headers.headers] == [
        ("content-type", b"application/json")]
    assert rsp.http.response_init.since_request_init.ToNanoseconds() == pytest.approx(4_000_000, abs=1000)
    assert end.http.response_end.since_response_init.ToNanoseconds() == pytest.approx(1_000_000, abs=1000)
    assert end.http.response_end.since_request_init.ToNanoseconds() == pytest.approx(5_000_000, abs=1000)
    # The body's bytes and the trailers (asked for, names lower-cased); no gRPC status, no reset.
    assert end.http.response_end.response_bytes == 1234
    assert [(h.name, h.value) for h in end.http.response_end.trailers.headers] == [("x-checksum", b"abc")]
    assert end.http.response_end.eos.WhichOneof("end") is None


def test_an_answer_without_a_relayed_response_still_ends_the_stream() -> None:
    from tether.proxy.codec.http1 import RequestHead
    from tether.proxy.core.tap import TapObserver, parse_labels

    taps = Taps(base=1)
    tap = new_tap(tap_pb2.ObserveRequest(limit=1), lambda: None)
    taps.add(tap)
    observer = TapObserver(taps, INBOUND, lambda: 1.0)
    stream = object()
    observer.request(stream, RequestHead(b"POST", b"/x", ((b"host", b"web"),)),
                     'direction="inbound",target_addr="10.0.0.2:8080",tls="true",client_id="a\\"b"', None)
    observer.end(stream, 503, None, trailers=((b"x-t", b"1"),))  # e.g. load shed: the proxy's own answer
    assert [e.http.WhichOneof("event") for e in tap.events] == ["request_init", "response_init", "response_end"]
    assert tap.events[1].http.response_init.http_status == 503
    assert tap.events[0].source_meta.labels["client_id"] == 'a"b'
    assert (tap.events[0].source.ip.ipv4, tap.events[0].source.port) == (0, 0)  # no client address given
    assert not tap.events[1].http.response_init.headers.headers  # not asked for
    assert not tap.events[2].http.response_end.trailers.headers  # nor trailers
    # A stream reset: its code is the end of stream (no gRPC status to say it).
    reset_stream = object()
    tap2 = new_tap(tap_pb2.ObserveRequest(limit=1), lambda: None)
    taps.add(tap2)
    observer.request(reset_stream, RequestHead(b"GET", b"/y", ((b"host", b"web"),)),
                     'direction="inbound",target_addr="10.0.0.2:8080"', None)
    observer.end(reset_stream, None, None, reset_code=7)  # REFUSED_STREAM
    end = tap2.events[-1].http.response_end
    assert end.eos.WhichOneof("end") == "reset_error_code" and end.eos.reset_error_code == 7
    assert tap.finished
    assert parse_labels('a="x\\\\y",b=""') == {"a": "x\\y", "b": ""}
