"""The policy controller's Prometheus metrics (one registry per instance).

``inbound_index_*`` and ``outbound_index_*`` (objects indexed, ports or
targets watched, recomputations that changed a policy, things ignored by reason), ``resource_status_*`` (status
writes), ``grpc_server_*`` (per RPC, ``tether.serving.grpc_metrics``) and the
stream counters shared with destination's shape (``policy_streams``,
``policy_updates_queue_overflow_total``, ``policy_delivery_lag_seconds``).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tether.serving.grpc_metrics import GrpcServerMetrics

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# What each index watches: the series name and its help.
_WATCHED = {
    "inbound": ("inbound_index_watched_ports", "Pod ports with an open policy watch"),
    "outbound": ("outbound_index_watched_targets", "Outbound targets (per client namespace) with an open policy watch"),
}


class _IndexCollector(Collector):
    """Read from an index (``side`` inbound or outbound) at scrape time: sizes, watches, updates, what is ignored."""

    def __init__(self, side: str, sizes: Callable[[], dict[str, int]], watched: Callable[[], int],
                 updates: Callable[[], int], problems: Callable[[], list[tuple[str, str]]]) -> None:
        self._side = side
        self._sizes, self._watched, self._updates, self._problems = sizes, watched, updates, problems

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        side = self._side
        sizes = GaugeMetricFamily(f"{side}_index_size", f"Objects in the {side} index", labels=["kind"])
        for kind, size in sorted(self._sizes().items()):
            sizes.add_metric([kind], size)
        yield sizes
        yield GaugeMetricFamily(*_WATCHED[side], value=self._watched())
        yield CounterMetricFamily(f"{side}_index_updates", "Policies recomputed to a new value",
                                  value=self._updates())
        ignored = GaugeMetricFamily(
            f"{side}_index_ignored", "Resources the index ignores now (conflicts, dangling references, bad routes)",
            labels=["kind", "reason"])
        for (kind, reason), count in sorted(Tally(self._problems()).items()):
            ignored.add_metric([kind, reason], count)
        yield ignored


class PolicyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.grpc = GrpcServerMetrics(r)
        self.streams = Gauge("policy_streams", "Open client streams", ["method"], registry=r)
        self.queue_overflow = Counter("policy_updates_queue_overflow", "Streams ended because their queue overflowed",
                                      ["method"], registry=r)
        self.delivery_lag = Histogram(
            "policy_delivery_lag_seconds",
            "From the platform event that changed a policy to the stream write carrying it",
            ["method"], buckets=LAG_BUCKETS, registry=r)
        self.status_patches = Counter("resource_status_patches", "Status writes, by kind", ["kind"], registry=r)
        self.status_errors = Counter("resource_status_errors", "Status writes that failed, by kind", ["kind"],
                                     registry=r)
        self.status_timeouts = Counter("resource_status_patch_timeouts",
                                       "Status writes given up after --patch-timeout-ms, by kind", ["kind"], registry=r)

    def watch_index(self, sizes: Callable[[], dict[str, int]], watched: Callable[[], int], updates: Callable[[], int],
                    problems: Callable[[], list[tuple[str, str]]], side: str = "inbound") -> None:
        self.registry.register(_IndexCollector(side, sizes, watched, updates, problems))
