"""The destination's Prometheus metrics, named after Linkerd's destination controller where it has one.

One ``DestinationMetrics`` per service instance (its own registry, so tests and
several instances in one process never collide).  The watchers update the
subscriber, update and size series; the streams update sent, overflow and lag;
the admin server exposes ``registry`` on ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Propagation is expected in milliseconds; the tail buckets catch stalls.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _CacheSizes(Collector):
    """``<kind>_cache_size{cluster="local"}``, read from the index at scrape time."""

    def __init__(self, sizes: Callable[[], dict[str, int]]) -> None:
        self._sizes = sizes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for kind, size in sorted(self._sizes().items()):
            family = GaugeMetricFamily(
                f"{kind}_cache_size", f"Number of {kind} objects in the index", labels=["cluster"]
            )
            family.add_metric(["local"], size)
            yield family


class EndpointGauges:
    """The ``endpoints_*`` series of one group of ``Get`` streams: those of one Service port and hostname on one
    node, as Linkerd labels them per ``filteredListenerGroup`` (``cluster`` is always ``local``: this cluster)."""

    __slots__ = ("_metrics", "_labels")

    def __init__(self, metrics: DestinationMetrics, namespace: str, service: str, port: int, hostname: str | None,
                 nodename: str) -> None:
        self._metrics = metrics
        self._labels = ("local", namespace, service, str(port), hostname or "", nodename)

    def set(self, *, subscribers: int, pods: int, exists: bool) -> None:
        metrics = self._metrics
        metrics.endpoints_subscribers.labels(*self._labels).set(subscribers)
        metrics.endpoints_pods.labels(*self._labels).set(pods)
        metrics.endpoints_exists.labels(*self._labels).set(1 if exists else 0)

    def updated(self) -> None:
        """The group was sent a change."""
        self._metrics.endpoints_updates.labels(*self._labels).inc()

    def forget(self) -> None:
        """The group's last stream left: its series go, as in Linkerd."""
        metrics = self._metrics
        for series in (metrics.endpoints_subscribers, metrics.endpoints_pods, metrics.endpoints_exists,
                       metrics.endpoints_updates):
            try:
                series.remove(*self._labels)
            except KeyError:
                pass


class DestinationMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        group_labels = ["cluster", "namespace", "service", "port", "hostname", "nodename"]
        self.endpoints_subscribers = Gauge(
            "endpoints_subscribers", "Get streams subscribed to a service port", group_labels, registry=r
        )
        self.endpoints_updates = Counter(
            "endpoints_updates", "Endpoint changes published for a service port", group_labels, registry=r
        )
        self.endpoints_pods = Gauge("endpoints_pods", "Ready endpoints sent for a subscribed service port",
                                    group_labels, registry=r)
        self.endpoints_exists = Gauge("endpoints_exists", "Whether a subscribed service exists (1) or not (0)",
                                      group_labels, registry=r)
        self.endpointslice_invalid_entries = Counter(
            "endpointslice_invalid_entries", "EndpointSlice entries skipped: bad addresses or ports",
            ["namespace"], registry=r)
        # Written by the ExternalWorkload controller this process runs on Kubernetes (tether.platform.problems).
        self.externalworkload_rejected = Counter(
            "externalworkload_rejected", "ExternalWorkloads left out of every EndpointSlice, once per set of "
            "problems (as its Warning Event), by reason", ["namespace", "reason"], registry=r)
        self.profile_subscribers = Gauge(
            "profile_subscribers", "GetProfile streams watching a ServiceProfile name", ["namespace", "profile"],
            registry=r,
        )
        self.profile_updates = Counter(
            "profile_updates", "ServiceProfile changes published", ["namespace", "profile"], registry=r
        )
        self.service_subscribers = Gauge(
            "service_subscribers", "Streams watching a service's opaque ports", ["namespace", "name"], registry=r
        )
        self.workload_subscribers = Gauge("workload_subscribers", "GetProfile streams watching an IP:port",
                                          registry=r)
        self.workload_updates = Counter("workload_updates", "Changes published for watched IP:ports", registry=r)
        self.endpoint_updates_queue_overflow = Counter(
            "endpoint_updates_queue_overflow", "Get streams ended because their queue overflowed", ["service"],
            registry=r,
        )
        self.profile_updates_queue_overflow = Counter(
            "profile_updates_queue_overflow", "GetProfile streams ended because their queue overflowed",
            ["fqn", "port"], registry=r,
        )
        self.endpoint_profile_updates_queue_overflow = Counter(
            "endpoint_profile_updates_queue_overflow",
            "GetProfile (endpoint) streams ended because their queue overflowed", registry=r,
        )
        self.updates_sent = Counter(
            "destination_updates_sent", "Messages written to client streams", ["kind"], registry=r
        )
        self.streams = Gauge("destination_streams", "Open client streams", ["method"], registry=r)
        self.delivery_lag = Histogram(
            "destination_delivery_lag_seconds",
            "From the platform event that changed an input to the stream write carrying the change",
            ["kind"], buckets=LAG_BUCKETS, registry=r,
        )

    def watch_index(self, sizes: Callable[[], dict[str, int]]) -> None:
        """Expose the index sizes (called once the index exists)."""
        self.registry.register(_CacheSizes(sizes))
