"""Prometheus metrics of the Kubernetes watches, in a registry of their own.

``KubernetesResourceWatcher`` updates them; a process serving them registers
``registry`` into its admin registry (``CollectorRegistry.register`` accepts a
registry as a collector), as ``tether.cli.platform_opts`` does for the destination.
The lag histogram measures, for each change received on a live watch, how long
after the change's own timestamp (the newest of ``creationTimestamp``,
``deletionTimestamp`` and ``managedFields[].time``) it reached us.  Those
timestamps have one-second resolution and come from the API server's clock, so
the histogram says "seconds behind", not milliseconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LAG_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)


class WatchMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "kube_watch_events", "Changes passed on to the controller, by resource and event type.",
            ["resource", "type"], registry=r,
        )
        self.lists = Counter(
            "kube_watch_lists", "Complete listings, by why they were made: start, gone (410), error (reconnect).",
            ["resource", "reason"], registry=r,
        )
        self.errors = Counter(
            "kube_watch_errors", "Failed lists and watches, by what failed: unreachable or the HTTP status.",
            ["resource", "error"], registry=r,
        )
        self.bookmarks = Counter("kube_watch_bookmarks", "Bookmarks received.", ["resource"], registry=r)
        self.lag = Histogram(
            "kube_watch_event_lag_seconds", "Seconds from a change's timestamp on the object to its arrival here.",
            ["resource"], buckets=LAG_BUCKETS, registry=r,
        )
        self.synced = Gauge(
            "kube_watch_synced", "1 while the watch holds a complete, current listing; 0 while relisting.",
            ["resource"], registry=r,
        )
        self.last_message = Gauge(
            "kube_watch_last_message_timestamp_seconds",
            "Unix time the last message (event or bookmark) arrived; its age shows a stalled watch.",
            ["resource"], registry=r,
        )
