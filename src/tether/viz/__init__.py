"""Tether's viz: the proxies' metrics turned into golden metrics per workload (``tether stat``).

Linkerd's viz extension asks Prometheus; Tether's local platform has no
Prometheus, so viz scrapes each meshed pod's proxy admin port itself
(``<pod IP>:4191/metrics``), keeps the last scrapes and computes rates over a
window, the way ``linkerd viz stat`` reads the same series through PromQL
(control-plane reference §9): inbound ``response_total`` by classification,
``response_latency_ms_bucket`` for p50/p95/p99, ``tcp_open_connections`` and
``tcp_{read,write}_bytes_total`` with ``peer="src"``, and the ``tls`` label
for which connections are mTLS.

Modules, bottom up:

- ``exposition``: the Prometheus text format, parsed (pure);
- ``proxy_metrics``: one scrape of one proxy reduced to the counters stat
  needs, in Linkerd's metric names (pure);
- ``window``: the difference of two scrapes, histogram quantiles, and the sum
  over a workload's pods (pure);
- ``workloads``: which pods make up each deployment, namespace or pod, from
  the store's objects (pure);
- ``scrape``: fetching ``/metrics`` from many pods at once (I/O);
- ``stat``: ``StatCollector``, the loop's state: scrape, keep history, rows;
- ``render``: rows as table cells and JSON.

Callers: ``tether.cli.stat_cmd``.  viz sits beside the controllers and the
proxy: it reads the store and talks to proxies over HTTP, and imports neither.
"""
