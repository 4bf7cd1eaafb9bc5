"""The pure parts of ``tether stat``: the text parser, the proxy counters, rates, quantiles, workloads, rows."""

from __future__ import annotations

import math

import pytest

from demo.samples import WEB_ID, latency_counts, proxy_text
from tether.viz import render
from tether.viz.exposition import parse
from tether.viz.proxy_metrics import PodCounters
from tether.viz.scrape import Scraped
from tether.viz.stat import StatCollector
from tether.viz.window import activity, golden, histogram_quantile
from tether.viz.workloads import DEPLOYMENT, NAMESPACE, POD, deployment_of, select

# -- exposition ------------------------------------------------------------------------------------------------


def test_parse_reads_names_labels_values_and_skips_comments() -> None:
    exp = parse('# HELP a A.\n# TYPE a counter\na 1\nb{x="1",y="two"} 2.5 1700000000000\n\n'
                'c{le="+Inf"} +Inf\nd NaN\ne -Inf\n# EOF\n')
    assert [(s.name, dict(s.labels)) for s in exp.samples] == [
        ("a", {}), ("b", {"x": "1", "y": "two"}), ("c", {"le": "+Inf"}), ("d", {}), ("e", {})]
    values = [s.value for s in exp.samples]
    assert values[:3] == [1.0, 2.5, math.inf] and math.isnan(values[3]) and values[4] == -math.inf
    assert exp.errors == []


def test_parse_unescapes_label_values_and_allows_commas_and_braces_inside() -> None:
    (s,) = parse('m{a="x\\"y",b="back\\\\slash",c="line\\nnext",d="{,}",} 3\n').samples
    assert dict(s.labels) == {"a": 'x"y', "b": "back\\slash", "c": "line\nnext", "d": "{,}"}
    assert s.value == 3


@pytest.mark.parametrize("line", ['m{a="x} 1', "m{a=x} 1", "m 1 2 3", "m", 'm{="x"} 1', "1m 2", "m abc",
                                  'm{a="x"}1'])
def test_parse_skips_malformed_lines_and_reports_their_numbers(line: str) -> None:
    exp = parse(f"ok 1\n{line}\nok 2\n")
    assert [s.value for s in exp.samples] == [1, 2]
    assert exp.errors == [2]


def test_parse_reads_a_whole_proxy_document() -> None:
    exp = parse(proxy_text(ok=9, failed=1))
    assert exp.errors == []
    assert {"request_total", "response_total", "response_latency_ms_bucket", "tcp_open_total",
            "tcp_open_connections", "process_start_time_seconds"} <= exp.names


# -- the counters of one scrape ----------------------------------------------------------------------------------


def test_counters_read_inbound_requests_and_tcp_only_and_leave_the_admin_port_out() -> None:
    c = PodCounters.from_exposition(parse(proxy_text(ok=9, failed=1, latencies_ms=[1] * 8 + [15, 250],
                                                     open_mtls=2, open_plain=1, opened_mtls=5, opened_plain=2,
                                                     read=100, written=2000, admin_requests=77)))
    assert c.has_requests
    assert (c.success, c.failure) == (9, 1)  # the 77 admin-port responses are not counted
    assert c.latency[1.0] == 8 and c.latency[20.0] == 9 and c.latency[math.inf] == 10
    assert (c.tcp_open, c.tcp_open_mtls, c.tcp_opened, c.tcp_opened_mtls) == (3, 2, 7, 5)
    assert (c.read_bytes, c.write_bytes) == (100, 2000)  # peer="src" only; not the app side, not outbound
    assert c.clients == {("true", WEB_ID): 2, ("no_identity", "no_tls_from_remote"): 1}
    assert c.start_time == 1700000000.0


def test_counters_of_a_proxy_with_transport_metrics_only() -> None:
    c = PodCounters.from_exposition(parse(proxy_text(requests=False, open_mtls=1, opened_mtls=4)))
    assert not c.has_requests
    assert (c.success, c.failure, c.latency) == (0, 0, {})
    assert (c.tcp_open, c.tcp_opened_mtls) == (1, 4)


# -- rates, quantiles, sums -------------------------------------------------------------------------------------


def _counters(**kw: object) -> PodCounters:
    return PodCounters.from_exposition(parse(proxy_text(**kw)))  # type: ignore[arg-type]


def test_activity_is_the_increase_between_two_scrapes() -> None:
    old = _counters(ok=10, failed=0, opened_mtls=2, read=1000, written=5000, latencies_ms=[1] * 10)
    new = _counters(ok=28, failed=2, opened_mtls=3, read=1500, written=9000, latencies_ms=[1] * 10 + [7] * 20)
    a = activity(old, new, 10.0)
    assert (a.seconds, a.success, a.failure, a.tcp_opened_mtls) == (10.0, 18, 2, 1)
    assert (a.read_bytes, a.write_bytes) == (500, 4000)
    assert a.latency[5.0] == 0 and a.latency[10.0] == 20 and a.latency[math.inf] == 20


def test_activity_after_a_restart_counts_from_zero() -> None:
    old = _counters(ok=500, start=1700000000.0)
    new = _counters(ok=12, start=1700000900.0)
    assert activity(old, new, 5.0).success == 12
    # A counter that went down without a new start time is a reset too (Prometheus' rule).
    assert activity(_counters(ok=500), _counters(ok=3), 5.0).success == 3


def test_a_single_scrape_knows_gauges_but_no_rates() -> None:
    a = activity(None, _counters(ok=10, open_mtls=2), 0.0)
    g = golden([a])
    assert g.tcp_open == 2 and g.mtls == 1.0
    assert g.rps is None and g.success_rate is None and g.read_rate is None


def test_histogram_quantile_interpolates_as_prometheus_does() -> None:
    buckets = {1.0: 10.0, 2.0: 20.0, 5.0: 40.0, math.inf: 40.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(2.0)
    assert histogram_quantile(0.25, buckets) == pytest.approx(1.0)
    assert histogram_quantile(0.75, buckets) == pytest.approx(2 + 3 * (30 - 20) / 20)
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.4)  # the first bucket starts at 0
    # A rank in the +Inf bucket gives the highest finite bound.
    assert histogram_quantile(0.99, {1.0: 1.0, 10.0: 2.0, math.inf: 100.0}) == 10.0
    assert histogram_quantile(0.5, {1.0: 0.0, math.inf: 0.0}) is None
    assert histogram_quantile(0.5, {}) is None
    # Non-monotonic counts (a reset between scrapes) are made monotonic first.
    assert histogram_quantile(0.5, {1.0: 4.0, 2.0: 3.0, math.inf: 4.0}) == pytest.approx(0.5)


def test_golden_sums_pods_like_stat_sums_by_owner() -> None:
    a = activity(_counters(ok=0, latencies_ms=[]), _counters(ok=18, failed=2, latencies_ms=[1] * 20,
                                                             open_mtls=1, written=100), 10.0)
    b = activity(_counters(ok=0, latencies_ms=[]), _counters(ok=10, failed=0, latencies_ms=[30] * 10,
                                                             open_mtls=2, open_plain=1, written=300), 5.0)
    g = golden([a, b])
    assert g.success_rate == pytest.approx(28 / 30)
    assert g.rps == pytest.approx(20 / 10 + 10 / 5)
    p50, p95, p99 = g.latency_ms
    assert p50 == pytest.approx(1 * (15 / 20))  # rank 15 of 30: inside the first bucket (0..1 ms, 20 of them)
    assert 20 < p95 <= 30 and 20 < p99 <= 30
    assert g.tcp_open == 4 and g.mtls == pytest.approx(3 / 4)
    assert g.write_rate == pytest.approx(100 / 10 + 300 / 5)


def test_golden_without_requests_in_the_window_has_no_request_columns() -> None:
    same = _counters(ok=5, opened_mtls=3, open_mtls=0)
    g = golden([activity(same, same, 5.0)])
    assert (g.success_rate, g.rps, g.latency_ms) == (None, None, (None, None, None))
    assert g.tcp_open == 0 and g.mtls is None  # nothing open, nothing opened in the window: unknown
    fresh = golden([activity(_counters(opened_mtls=3, opened_plain=1, open_mtls=0),
                             _counters(opened_mtls=6, opened_plain=2, open_mtls=0), 5.0)])
    assert fresh.mtls == pytest.approx(3 / 4)  # of the connections opened in the window


def test_golden_of_no_pod_is_unknown() -> None:
    g = golden([])
    assert g.tcp_open is None and g.rps is None and g.mtls is None


# -- workloads --------------------------------------------------------------------------------------------------


def _pod(name: str, deploy: str | None, *, ns: str = "emojivoto", meshed: bool = True, phase: str = "Running",
         ip: str | None = "10.0.0.9") -> dict:
    labels = {"app": deploy or name}
    meta: dict = {"name": name, "namespace": ns, "labels": labels}
    if deploy:
        labels["pod-template-hash"] = "abc12"
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{deploy}-abc12",
                                    "controller": True}]
    if meshed:
        labels["linkerd.io/control-plane-ns"] = "linkerd"
    return {"metadata": meta, "status": {"phase": phase, "podIP": ip}}


def _deploy(name: str, ns: str = "emojivoto") -> dict:
    return {"metadata": {"name": name, "namespace": ns}}


def test_pods_belong_to_the_deployment_of_their_replicaset() -> None:
    assert deployment_of(_pod("web-abc12-x", "web")) == "web"
    assert deployment_of(_pod("my-app-abc12-x", "my-app")) == "my-app"
    assert deployment_of(_pod("bare", None)) is None
    odd = _pod("x", "web")
    odd["metadata"]["labels"]["pod-template-hash"] = "zzz"
    assert deployment_of(odd) is None


def test_select_groups_pods_by_deployment_counts_meshed_and_keeps_empty_deployments() -> None:
    pods = [_pod("web-abc12-a", "web"), _pod("web-abc12-b", "web", meshed=False),
            _pod("web-abc12-c", "web", phase="Succeeded"), _pod("emoji-abc12-a", "emoji", phase="Pending", ip=None),
            _pod("bare", None)]
    found = select(DEPLOYMENT, pods, deployments=[_deploy("web"), _deploy("emoji"), _deploy("idle")])
    assert [(w.name, w.meshed, w.total) for w in found] == [("emoji", 1, 1), ("idle", 0, 0), ("web", 1, 2)]
    web = found[-1]
    assert [p.name for p in web.pods if p.scrapable] == ["web-abc12-a"]
    assert [w.name for w in select(DEPLOYMENT, pods, deployments=[_deploy("web"), _deploy("emoji")],
                                   names=["web"])] == ["web"]


def test_select_pods_and_namespaces() -> None:
    pods = [_pod("a", None), _pod("b", None, ns="other", meshed=False)]
    assert [(w.namespace, w.name) for w in select(POD, pods)] == [("emojivoto", "a"), ("other", "b")]
    spaces = select(NAMESPACE, pods, namespaces=[{"metadata": {"name": "empty"}}])
    assert [(w.name, w.meshed, w.total) for w in spaces] == [("emojivoto", 1, 1), ("empty", 0, 0), ("other", 0, 1)]


# -- the collector and the rows ----------------------------------------------------------------------------------


class _FakeProxies:
    """A scraper over canned documents: ``texts[key]`` is the list of documents served in turn."""

    def __init__(self, texts: dict[str, list[str]], failing: set[str] = frozenset()) -> None:
        self.texts = texts
        self.failing = failing
        self.calls: list[dict[str, str]] = []

    def __call__(self, targets: dict[str, str]) -> dict[str, Scraped]:
        self.calls.append(dict(targets))
        out = {}
        for key in targets:
            if key in self.failing:
                out[key] = Scraped(None, "connection refused")
            else:
                docs = self.texts[key]
                out[key] = Scraped(PodCounters.from_exposition(parse(docs.pop(0) if len(docs) > 1 else docs[0])))
        return out


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_collector_computes_rates_between_polls_over_the_window() -> None:
    pods = [_pod("web-abc12-a", "web", ip="10.0.0.2"), _pod("web-abc12-b", "web", ip="10.0.0.3"),
            _pod("vote-bot-abc12-a", "vote-bot", ip="10.0.0.4")]
    deployments = [_deploy("web"), _deploy("vote-bot")]
    proxies = _FakeProxies({
        "emojivoto/web-abc12-a": [proxy_text(ok=0, latencies_ms=[]), proxy_text(ok=19, failed=1),
                                  proxy_text(ok=38, failed=2)],
        "emojivoto/web-abc12-b": [proxy_text(ok=0, latencies_ms=[]), proxy_text(ok=20),
                                  proxy_text(ok=40)],
        "emojivoto/vote-bot-abc12-a": [proxy_text(requests=False, open_mtls=0, opened_mtls=0)],
    })
    clock = _Clock()
    collector = StatCollector(lambda: select(DEPLOYMENT, pods, deployments=deployments), 10.0,
                              scraper=proxies, clock=clock)
    first = {r.workload.name: r for r in collector.poll()}
    assert first["web"].golden.rps is None and first["web"].golden.tcp_open == 2
    assert proxies.calls[0] == {"emojivoto/web-abc12-a": "10.0.0.2", "emojivoto/web-abc12-b": "10.0.0.3",
                                "emojivoto/vote-bot-abc12-a": "10.0.0.4"}
    clock.now += 10
    rows = {r.workload.name: r for r in collector.poll()}
    web = rows["web"].golden
    assert web.rps == pytest.approx(4.0) and web.success_rate == pytest.approx(39 / 40)
    assert rows["vote-bot"].golden.rps is None and rows["vote-bot"].golden.tcp_open == 0
    # A sliding window: the next poll 5 s later still measures from the baseline at least 10 s old.
    clock.now += 5
    web = {r.workload.name: r for r in collector.poll()}["web"].golden
    assert web.rps == pytest.approx(80 / 15)


def test_collector_names_pods_it_cannot_scrape_and_forgets_pods_that_left() -> None:
    pods = [_pod("web-abc12-a", "web", ip="10.0.0.2"), _pod("web-abc12-b", "web", ip="10.0.0.3")]
    proxies = _FakeProxies({"emojivoto/web-abc12-a": [proxy_text(ok=1)]}, failing={"emojivoto/web-abc12-b"})
    collector = StatCollector(lambda: select(DEPLOYMENT, pods, deployments=[_deploy("web")]), 10.0,
                              scraper=proxies, clock=_Clock())
    (row,) = collector.poll()
    assert row.errors == ("web-abc12-b: connection refused",)
    assert row.golden.tcp_open == 1
    pods.pop(0)
    collector.poll()
    assert "emojivoto/web-abc12-a" not in collector._history


def test_rows_render_like_linkerd_stat() -> None:
    pods = [_pod("web-abc12-a", "web", ip="10.0.0.2")]
    proxies = _FakeProxies({"emojivoto/web-abc12-a": [
        proxy_text(ok=0, latencies_ms=[], open_mtls=1, opened_mtls=1, written=0),
        proxy_text(ok=37, failed=3, latencies_ms=[1] * 30 + [8] * 8 + [45] * 2, open_mtls=1, opened_mtls=1,
                   written=4000)]})
    clock = _Clock()
    collector = StatCollector(lambda: select(DEPLOYMENT, pods, deployments=[_deploy("web"), _deploy("idle")]),
                              10.0, scraper=proxies, clock=clock)
    collector.poll()
    clock.now += 10
    rows = collector.poll()
    grid = render.table(rows, all_namespaces=False, wide=True)
    assert grid[0] == ["NAME", "MESHED", "SUCCESS", "RPS", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99",
                       "TCP_CONN", "MTLS", "READ_BYTES/SEC", "WRITE_BYTES/SEC", "CLIENTS"]
    assert grid[1] == ["idle", "0/0", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"]
    assert grid[2][:9] == ["web", "1/1", "92.50%", "4.0rps", "0.7ms", "10ms", "48ms", "1", "100%"]
    assert grid[2][9:] == ["0.0B/s", "400.0B/s", "web.emojivoto"]
    text = render.plain(render.table(rows, all_namespaces=True, wide=False))
    assert text.splitlines()[0].split() == ["NAMESPACE", "NAME", "MESHED", "SUCCESS", "RPS", "LATENCY_P50",
                                            "LATENCY_P95", "LATENCY_P99", "TCP_CONN", "MTLS"]
    doc = render.as_json(rows[1])
    assert doc["meshed"] == "1/1" and doc["success"] == pytest.approx(0.925) and doc["rps"] == pytest.approx(4.0)
    assert doc["tcp_open_connections"] == 1 and doc["mtls"] == 1.0
    assert doc["clients"] == [{"tls": "true", "identity": WEB_ID, "open": 1}]


def test_latency_counts_helper_matches_the_proxys_buckets() -> None:
    counts = latency_counts([0.5, 3, 3, 700])
    assert counts["1"] == 1 and counts["3"] == 3 and counts["500"] == 3 and counts["1000"] == 4
    assert counts["+Inf"] == 4


def test_counters_read_what_the_proxys_http_metrics_render() -> None:
    """Tether's own proxy (once it records HTTP) renders what viz parses: the same names, labels and buckets."""
    http_metrics = pytest.importorskip("tether.proxy.core.http_metrics")
    clock = _Clock()
    metrics = http_metrics.HttpMetrics(clock, retain_idle=600.0)
    inbound = (f'direction="inbound",target_addr="10.0.0.2:8080",target_ip="10.0.0.2",target_port="8080",'
               f'tls="true",client_id="{WEB_ID}"')
    admin = 'direction="inbound",target_addr="10.0.0.2:4191",target_ip="10.0.0.2",target_port="4191",tls="disabled"'
    for latency, status in ((0, 200), (3, 200), (7, 200), (250, 500)):
        metrics.request(inbound)
        metrics.response(inbound, status, status < 500, latency)
    metrics.request(admin)
    metrics.response(admin, 200, True, 1)
    out: list[str] = []
    metrics.render(out)
    exp = parse("\n".join(out))
    assert exp.errors == []
    c = PodCounters.from_exposition(exp)
    assert c.has_requests and (c.success, c.failure) == (3, 1)
    assert c.latency[1.0] == 1 and c.latency[10.0] == 3 and c.latency[300.0] == 4 and c.latency[math.inf] == 4
