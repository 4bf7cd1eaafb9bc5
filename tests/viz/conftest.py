"""Fixtures for viz's tests: the local platform's (from ``tests/up``), torn down and checked even on failure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from up.conftest import clean_host, new_platform
from up.uplab import wait_for
from viz.promlab import NS, FakeProxy, PrometheusProcess, deployment, meshed_pod, web_metrics

__all__ = ["clean_host", "new_platform"]


@pytest.fixture(scope="package")  # one Prometheus for the modules that read it: each start waited ~10 s for scrapes
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusProcess, list[dict[str, Any]]]]:
    web = FakeProxy(web_metrics)
    idle = FakeProxy(lambda n: "process_start_time_seconds 1700000000\n")
    objs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        deployment("web", NS), deployment("emoji", NS),
        meshed_pod("web-5d8f7c9b4-abcde", NS, "web", web.port, service_account="web"),
        meshed_pod("emoji-5d8f7c9b4-fghij", NS, "emoji", idle.port, service_account="emoji"),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "emoji", "namespace": NS},
         "spec": {"selector": {"app": "emoji"}, "ports": [{"port": 8080}]}},
        {"apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
         "metadata": {"name": "emoji.emojivoto.svc.cluster.local", "namespace": NS},
         "spec": {"routes": [{"name": "GET /list", "condition": {"method": "GET", "pathRegex": "/list"}}]}},
    ]
    prom = PrometheusProcess(tmp_path_factory.mktemp("prom"), [o for o in objs if o["kind"] == "Pod"])
    try:
        # Enough scrapes of web that increase()'s extrapolation and the rounding of small counts stay small.
        wait_for("eight scrapes of web", lambda: web.scrapes >= 8)
        wait_for("web's series in Prometheus",
                 lambda: prom.client.query('count_over_time(response_total{deployment="web"}[1m])'))
        yield prom, objs
    finally:
        prom.stop()
        web.close()
        idle.close()
