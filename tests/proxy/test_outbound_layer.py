"""The outbound layer's decisions, driven without sockets: discovery, detection, endpoint choice, mTLS, header."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pytest
from layer_helpers import drive, kinds, replies

from tether.proxy.core import commands as cmd
from tether.proxy.codec.addrs import SocketAddr, parse_socket_addr
from tether.proxy.core.balancer import Balancer
from tether.proxy.core.resolution import Resolution
from tether.proxy.core.endpoint import Endpoint
from tether.proxy.core.outbound import OutboundSettings, outbound
from tether.proxy.codec import detect
from tether.proxy.codec.transport_header import SessionProtocol, TransportHeader, TransportHeaderDecoder, encode

SVC = parse_socket_addr("10.96.0.10:7000")
POD = parse_socket_addr("10.1.0.5:7000")
SERVER_ID = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
TRANSPORT = "transport.l5d.io/v1"


def settings(**overrides: object) -> OutboundSettings:
    base = dict(detect_timeout=10.0, connect_timeout=1.0, failfast=3.0,
                profile_networks=(ipaddress.ip_network("10.0.0.0/8"),), local_ips=frozenset(),
                own_addrs=frozenset({parse_socket_addr("127.0.0.1:4140")}), refuse_loopback=True)
    base.update(overrides)
    return OutboundSettings(**base)  # type: ignore[arg-type]


@dataclass
class FakeWatch:
    released: int = 0

    def release(self) -> None:
        self.released += 1

    async def wait(self, timeout: float) -> object:  # pragma: no cover - the driver's business
        raise NotImplementedError


class FakeDiscovery:
    def __init__(self) -> None:
        self.watch = FakeWatch()
        self.asked: list[SocketAddr] = []

    def profile(self, addr: SocketAddr) -> FakeWatch:
        self.asked.append(addr)
        return self.watch


def meshed(addr: SocketAddr = POD, **kwargs: object) -> Endpoint:
    base = dict(server_id=SERVER_ID, sni=SERVER_ID, opaque_transport_port=4143)
    base.update(kwargs)
    return Endpoint(addr, **base)  # type: ignore[arg-type]


def balancer_with(*endpoints: Endpoint) -> Balancer:
    balancer = Balancer(failfast=3.0, clock=lambda: 100.0)
    balancer.add(endpoints)
    return balancer


def pick(balancer: Balancer):  # type: ignore[no-untyped-def]
    return lambda command: balancer.pick()


def test_loops_and_loopback_targets_are_refused() -> None:
    for target, overrides in ((parse_socket_addr("127.0.0.1:4140"), {}),
                              (parse_socket_addr("127.0.0.1:8080"), {}),
                              (parse_socket_addr("127.0.0.1:4140"), {"refuse_loopback": False})):
        seen = drive(outbound(target, settings(**overrides), FakeDiscovery()), replies({}))  # type: ignore[arg-type]
        assert kinds(seen) == ["SetLabels", "Refuse"] and seen[-1] == cmd.Refuse("loop")
    # Without iptables a loopback target is fine unless it is one of our listeners.
    seen = drive(outbound(parse_socket_addr("127.0.0.9:8080"), settings(refuse_loopback=False, profile_networks=()),
                          None),
                 replies({cmd.Detect: detect.Opaque(), cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    assert kinds(seen) == ["SetLabels", "Detect", "Connect", "Forward"]


def test_outside_the_profile_networks_the_original_destination_is_used_as_is() -> None:
    discovery = FakeDiscovery()
    target = parse_socket_addr("192.168.1.1:443")
    seen = drive(outbound(target, settings(), discovery),  # type: ignore[arg-type]
                 replies({cmd.Detect: detect.Http1(), cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    assert discovery.asked == []
    connect = seen[2]
    assert isinstance(connect, cmd.Connect)
    assert (connect.addr, connect.tls) == (target, None)
    assert 'no_tls_reason="not_provided_by_service_discovery"' in connect.labels
    assert seen[0] == cmd.SetLabels('direction="outbound",peer="src",target_addr="192.168.1.1:443",'
                                    'target_ip="192.168.1.1",target_port="443",tls="no_identity",'
                                    'no_tls_reason="loopback"')


def test_discovery_failures_and_detection_outcomes() -> None:
    discovery = FakeDiscovery()
    seen = drive(outbound(SVC, settings(), discovery),  # type: ignore[arg-type]
                 replies({cmd.Wait: cmd.Failed("discovery unavailable")}))
    assert seen[-1] == cmd.Refuse("discovery unavailable") and discovery.watch.released == 1
    seen = drive(outbound(SVC, settings(), discovery),  # type: ignore[arg-type]
                 replies({cmd.Wait: Resolution(), cmd.Detect: detect.Closed()}))
    assert seen[-1] == cmd.Refuse("closed before detection") and discovery.watch.released == 2
    # A detection timeout carries on as opaque.
    seen = drive(outbound(SVC, settings(), discovery),  # type: ignore[arg-type]
                 replies({cmd.Wait: Resolution(), cmd.Detect: detect.ReadTimeout(),
                          cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    assert kinds(seen) == ["SetLabels", "Wait", "Detect", "Connect", "Forward"]
    # Opaque targets are never detected: a server-speaks-first protocol does not wait.
    seen = drive(outbound(SVC, settings(), discovery),  # type: ignore[arg-type]
                 replies({cmd.Wait: Resolution(opaque=True), cmd.Connect: cmd.Connected(None, 0.001),
                          cmd.Forward: None}))
    assert "Detect" not in kinds(seen)


@pytest.mark.parametrize(("verdict", "protocol"), [(detect.Opaque(), None), (detect.Http1(), SessionProtocol.HTTP1),
                                                   (detect.Http2(), SessionProtocol.HTTP2)])
def test_meshed_endpoint_gets_mtls_and_a_transport_header(verdict: detect.Verdict,
                                                          protocol: SessionProtocol | None) -> None:
    balancer = balancer_with(meshed())
    seen = drive(outbound(SVC, settings(), FakeDiscovery()),  # type: ignore[arg-type]
                 replies({cmd.Wait: [Resolution(balancer=balancer, authority="web:7000"), pick(balancer)],
                          cmd.Detect: verdict, cmd.Connect: cmd.Connected(TRANSPORT, 0.002), cmd.Forward: None}))
    assert kinds(seen) == ["SetLabels", "Wait", "Detect", "Wait", "Connect", "Send", "Forward"]
    connect, send = seen[4], seen[5]
    assert isinstance(connect, cmd.Connect) and isinstance(send, cmd.Send)
    assert connect.addr == SocketAddr(POD.ip, 4143)
    assert connect.tls == cmd.ClientTls(server_id=SERVER_ID, sni=SERVER_ID, alpn=True)
    assert f'server_id="{SERVER_ID}"' in connect.labels and 'authority="web:7000"' in connect.labels
    answer = TransportHeaderDecoder().receive_data(send.data)
    assert answer.header == TransportHeader(port=7000, protocol=protocol)  # type: ignore[union-attr]
    assert balancer.pick().estimate >= 0.002  # type: ignore[union-attr]


def test_no_header_without_alpn_and_no_session_protocol_for_opaque_endpoints() -> None:
    balancer = balancer_with(meshed(opaque=True))
    seen = drive(outbound(SVC, settings(), FakeDiscovery()),  # type: ignore[arg-type]
                 replies({cmd.Wait: [Resolution(balancer=balancer), pick(balancer)], cmd.Detect: detect.Http1(),
                          cmd.Connect: cmd.Connected(TRANSPORT, 0.002), cmd.Forward: None}))
    send = seen[5]
    assert isinstance(send, cmd.Send) and send.data == encode(TransportHeader(port=7000))
    balancer = balancer_with(meshed())
    seen = drive(outbound(SVC, settings(), FakeDiscovery()),  # type: ignore[arg-type]
                 replies({cmd.Wait: [Resolution(balancer=balancer), pick(balancer)], cmd.Detect: detect.Http1(),
                          cmd.Connect: cmd.Connected(None, 0.002), cmd.Forward: None}))
    assert "Send" not in kinds(seen)


def test_local_and_unmeshed_endpoints_are_plaintext() -> None:
    for endpoint, reason, local in ((meshed(), "loopback", frozenset({POD.ip})),
                                    (Endpoint(POD), "not_provided_by_service_discovery", frozenset())):
        balancer = balancer_with(endpoint)
        seen = drive(outbound(SVC, settings(local_ips=local), FakeDiscovery()),  # type: ignore[arg-type]
                     replies({cmd.Wait: [Resolution(balancer=balancer), pick(balancer)], cmd.Detect: detect.Opaque(),
                              cmd.Connect: cmd.Connected(None, 0.002), cmd.Forward: None}))
        connect = seen[4]
        assert isinstance(connect, cmd.Connect)
        assert (connect.addr, connect.tls) == (POD, None)
        assert f'no_tls_reason="{reason}"' in connect.labels
        assert "Send" not in kinds(seen)


def test_failed_connects_try_again_then_refuse_with_the_last_error() -> None:
    balancer = balancer_with(meshed())
    slot = balancer.pick()
    seen = drive(outbound(SVC, settings(), FakeDiscovery()),  # type: ignore[arg-type]
                 replies({cmd.Wait: [Resolution(balancer=balancer)] + [pick(balancer)] * 3, cmd.Detect: detect.Opaque(),
                          cmd.Connect: [cmd.Failed("i/o", "ECONNREFUSED"), cmd.Failed("connect timeout"),
                                        cmd.Failed("unexpected server identity")]}))
    assert kinds(seen).count("Connect") == 3
    assert seen[-1] == cmd.Refuse("unexpected server identity")
    assert slot is not None and slot.failures == 3 and slot.in_flight == 0


def test_failfast_and_loop_targets() -> None:
    balancer = balancer_with(meshed())
    seen = drive(outbound(SVC, settings(), FakeDiscovery()),  # type: ignore[arg-type]
                 replies({cmd.Wait: [Resolution(balancer=balancer), None], cmd.Detect: detect.Opaque()}))
    assert seen[-1] == cmd.Refuse("failfast")
    # An endpoint that is one of our own listeners is never connected to.
    own = SocketAddr(POD.ip, 4143)
    seen = drive(outbound(SVC, settings(own_addrs=frozenset({own})), FakeDiscovery()),  # type: ignore[arg-type]
                 replies({cmd.Wait: Resolution(endpoint=meshed()), cmd.Detect: detect.Opaque()}))
    assert "Connect" not in kinds(seen) and seen[-1] == cmd.Refuse("loop")


def test_the_watch_is_released_when_the_driver_abandons_the_layer() -> None:
    discovery = FakeDiscovery()
    layer = outbound(SVC, settings(), discovery)  # type: ignore[arg-type]
    assert isinstance(next(layer), cmd.SetLabels)
    assert isinstance(layer.send(None), cmd.Wait)
    layer.close()
    assert discovery.watch.released == 1
