"""``request_total``/``response_total``/``response_latency_ms`` (core.http_metrics.HttpMetrics): the response's
lookup and latency observation are made inline (no call per response); both branches of the lookup are here,
and the histogram each response lands in (the series kept from the request: test_http1_fast_paths.py)."""

from __future__ import annotations

from proxy_harness import parse_metrics, samples

from tether.proxy.core.http_metrics import BUCKETS, HttpMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rendered(metrics: HttpMetrics):  # type: ignore[no-untyped-def]
    out: list[str] = []
    metrics.render(out)
    return parse_metrics("\n".join(out))


def test_a_response_looked_up_touches_its_series_and_a_new_one_is_made() -> None:
    clock = Clock()
    metrics = HttpMetrics(clock, retain_idle=10.0)
    metrics.request('direction="inbound"')
    clock.now = 8.0
    metrics.response('direction="inbound"', 200, True, 3)  # found, not kept: touched now
    metrics.response('direction="outbound"', 504, False, 7, "failfast")  # none yet: made
    clock.now = 15.0  # 15 s after the request, 7 after the response: kept (retain 10 s)
    parsed = rendered(metrics)
    assert samples(parsed, "request_total", direction="inbound") == [({"direction": "inbound"}, 1.0)]
    assert {labels["direction"]: v for labels, v in samples(parsed, "response_total")} == \
        {"inbound": 1.0, "outbound": 1.0}
    clock.now = 30.0
    assert not samples(rendered(metrics), "response_total")  # idle past retain_idle: dropped


def test_each_response_lands_in_its_statuss_latency_bucket() -> None:
    metrics = HttpMetrics(Clock(), retain_idle=600.0)
    labels = 'direction="outbound"'
    series = metrics.request(labels)
    metrics.response(labels, 200, True, 3, series=series)
    metrics.response(labels, 200, True, 3)
    metrics.response(labels, 200, True, 45)
    metrics.response(labels, 503, False, 99999)  # past the last bucket: +Inf only
    parsed = rendered(metrics)

    def bucket(status: str, le: str) -> float:
        return samples(parsed, "response_latency_ms_bucket", status_code=status, le=le)[0][1]

    assert (bucket("200", "2"), bucket("200", "3"), bucket("200", "40"), bucket("200", "50")) == (0, 2, 2, 3)
    assert (bucket("503", str(BUCKETS[-1])), bucket("503", "+Inf")) == (0, 1)
    assert samples(parsed, "response_latency_ms_sum", status_code="200")[0][1] == 51
    assert samples(parsed, "response_latency_ms_count", status_code="503")[0][1] == 1
