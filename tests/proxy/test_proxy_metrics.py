"""The metrics registry: Prometheus text, live byte counts, and label sets that stay bounded."""

from __future__ import annotations

from proxy_harness import parse_metrics

from tether.proxy.core import labels
from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core.metrics import MAX_SERIES, Registry, TcpMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Counts:
    def __init__(self) -> None:
        self.rx = 0
        self.tx = 0


def test_open_meters_count_live_and_closed_ones_fold_in() -> None:
    registry = Registry(retain_idle=600, clock=Clock())
    key = labels.accept_outbound(parse_socket_addr("10.0.0.1:80"))
    first, second = Counts(), Counts()
    m1 = registry.tcp.open(key, first)
    registry.tcp.open(key, second)
    first.rx, first.tx, second.rx = 10, 20, 5
    m1.close("ECONNRESET")
    m1.close("ECONNRESET")  # closing twice counts once
    second.rx = 7
    parsed = parse_metrics(registry.render())
    series = frozenset({("direction", "outbound"), ("peer", "src"), ("target_addr", "10.0.0.1:80"),
                        ("target_ip", "10.0.0.1"), ("target_port", "80"), ("tls", "no_identity"),
                        ("no_tls_reason", "loopback")})
    assert parsed["tcp_open_total"][series] == 2
    assert parsed["tcp_open_connections"][series] == 1
    assert parsed["tcp_read_bytes_total"][series] == 17
    assert parsed["tcp_write_bytes_total"][series] == 20
    assert parsed["tcp_close_total"][series | {("errno", "ECONNRESET")}] == 1
    assert registry.render().endswith("# EOF\n")


def test_idle_series_are_dropped_after_retain_idle_and_open_ones_kept() -> None:
    clock = Clock()
    tcp = TcpMetrics(clock, retain_idle=600)
    tcp.open('target="a"', Counts()).close()
    kept = tcp.open('target="b"', Counts())
    clock.now = 601
    out: list[str] = []
    tcp.render(out)
    assert set(tcp.snapshot()) == {'target="b"'}
    kept.close()
    clock.now = 1300
    tcp.render([])
    assert tcp.snapshot() == {}


def test_many_targets_stay_bounded() -> None:
    clock = Clock()
    tcp = TcpMetrics(clock, retain_idle=600, max_series=100)
    for n in range(1000):
        clock.now += 0.001
        tcp.open(f'target="{n}"', Counts()).close()
    assert len(tcp.snapshot()) <= 100
    assert 'target="999"' in tcp.snapshot()
    registry = Registry(retain_idle=600, clock=clock)
    errors = registry.counter("outbound_tcp_errors_total", "errors")
    for n in range(MAX_SERIES + 50):
        errors.inc(f'target="{n}"')
    assert len(errors.values) <= MAX_SERIES


def test_a_counter_adds_to_its_series_and_starts_a_new_one_at_the_amount() -> None:
    counter = Registry(retain_idle=600, clock=Clock()).counter("x_total", "x")
    counter.inc('a="1"')
    counter.inc('a="1"', 2)  # an existing series: added to in place
    counter.inc('a="2"', 0)  # a new one, at its amount (a sibling shown at 0)
    assert counter.values == {'a="1"': 3, 'a="2"': 0}


def test_label_values_are_escaped() -> None:
    assert labels.render(("sni", 'a"b\\c\nd')) == 'sni="a\\"b\\\\c\\nd"'
    assert labels.dst_labels({"zone": "z", "pod": "p"}) == 'dst_pod="p",dst_zone="z"'


def test_transfer_cost_counts_outbound_endpoint_bytes_by_zone_locality_and_survives_expiry() -> None:
    clock = Clock()
    tcp = TcpMetrics(clock, retain_idle=600)
    to_local = 'direction="outbound",peer="dst",authority="web:80",dst_zone_locality="local"'
    to_unknown = 'direction="outbound",peer="dst",authority="api:80",dst_pod="api-0"'
    local, unknown, accepted = Counts(), Counts(), Counts()
    meters = [tcp.open(to_local, local)]
    tcp.open(to_unknown, unknown).close()  # closed: its bytes were folded in when it ended (0 then)
    unknown_live = Counts()
    meters.append(tcp.open(to_unknown, unknown_live))
    tcp.open('direction="outbound",peer="src",target_addr="10.0.0.1:80"', accepted)  # the app's side: not counted
    local.tx, local.rx, unknown_live.tx, unknown_live.rx, accepted.rx = 100, 1000, 7, 70, 5000

    def cost() -> dict[str, int]:
        out: list[str] = []
        tcp.render(out)
        return {line.split("{")[1].split("}")[0]: int(line.rsplit(" ", 1)[1]) for line in out
                if line.startswith("outbound_tcp_transfer_cost_bytes_total{")}

    expected = {'op="Recv",zone_locality="Local"': 1000, 'op="Recv",zone_locality="Unknown"': 70,
                'op="Send",zone_locality="Local"': 100, 'op="Send",zone_locality="Unknown"': 7}
    assert cost() == expected
    for meter in meters:
        meter.close()
    clock.now = 601  # the series expire; the counter keeps what they counted
    assert cost() == expected and to_local not in tcp.snapshot()
