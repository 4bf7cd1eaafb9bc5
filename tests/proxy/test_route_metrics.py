"""The ServiceProfile route families (proxy.md §9.2): names, labels, shapes, and their place in /metrics."""

from __future__ import annotations

from proxy_harness import parse_metrics, samples

from tether.proxy.core.http_metrics import HttpMetrics

RT = 'direction="outbound",dst="web.emojivoto.svc.cluster.local:80",rt_route="GET /books"'


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def render(metrics: HttpMetrics) -> str:
    out: list[str] = []
    metrics.render(out)
    return "\n".join(out)


def test_nothing_is_printed_before_a_route_is_used() -> None:
    assert "route_" not in render(HttpMetrics(Clock(), 600.0))


def test_route_families_follow_the_endpoint_ones() -> None:
    metrics = HttpMetrics(Clock(), 600.0)
    metrics.request('direction="outbound"')
    routes = metrics.routes
    routes.request(RT, retryable=True)  # a request: a 503, retried, then a 200
    routes.retryable(RT, withdrew=True)
    routes.actual_response(RT, 503, False)
    routes.response(RT, 200, True, 12)
    routes.request(RT, retryable=True)  # another: a 503 the budget could not retry, then a timeout
    routes.retryable(RT, withdrew=False)
    routes.response(RT, 0, False, 1000, "timeout", actual=False)
    text = render(metrics)
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert names == ["request_total", "response_latency_ms", "response_total", "route_request_total",
                     "route_response_latency_ms", "route_response_total", "route_retryable_total",
                     "route_actual_request_total", "route_actual_response_total"]
    parsed = parse_metrics(text)
    want = {"direction": "outbound", "dst": "web.emojivoto.svc.cluster.local:80", "rt_route": "GET /books"}
    assert samples(parsed, "route_request_total", **want) == [(want, 2)]
    assert sorted((labels.get("status_code", ""), labels["classification"], labels["error"], v)
                  for labels, v in samples(parsed, "route_response_total", **want)) == [
        ("", "failure", "timeout", 1), ("200", "success", "", 1)]
    assert samples(parsed, "route_response_latency_ms_count", status_code="200") == [
        ({**want, "status_code": "200"}, 1)]
    assert samples(parsed, "route_response_latency_ms_sum", **want)  # the timeout's, without status_code
    assert sorted(v for _, v in samples(parsed, "route_retryable_total", **want)) == [1, 2]
    assert samples(parsed, "route_retryable_total", skipped="no_budget") == [({**want, "skipped": "no_budget"}, 1)]
    assert samples(parsed, "route_actual_request_total", **want) == [(want, 3)]
    assert sorted((labels["status_code"], v) for labels, v in samples(parsed, "route_actual_response_total")) == [
        ("200", 1), ("503", 1)]
    assert "route_actual_response_latency" not in text  # attempts have no latency family, as in Linkerd


def test_route_series_expire_when_idle() -> None:
    clock = Clock()
    metrics = HttpMetrics(clock, 600.0)
    metrics.routes.request(RT)
    clock.now = 601.0
    assert "route_" not in render(metrics)
