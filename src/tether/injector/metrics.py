"""The webhook's Prometheus metrics, on its own registry (served on the admin port's ``/metrics``).

Names follow Linkerd's injector so existing dashboards read them:
``proxy_inject_admission_requests_total`` and ``proxy_inject_admission_responses_total``
(``skip="false"`` counts injections; ``skip_reason`` says why a pod was not injected), plus
Tether's ``proxy_inject_admission_failures_total{reason}`` for requests the webhook could not
handle (malformed, invalid object, internal error, timeout) and a latency histogram.
Caller: `admission` records; `server` exposes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_LABELS = ("owner_kind", "namespace", "annotation_at")


class InjectorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "proxy_inject_admission_requests",
            "Admission requests for objects the injector considers (pods and services).",
            _LABELS,
            registry=self.registry,
        )
        self.responses = Counter(
            "proxy_inject_admission_responses",
            "Admission responses: skip=false is an injection, else skip_reason says why not.",
            (*_LABELS, "skip", "skip_reason"),
            registry=self.registry,
        )
        self.failures = Counter(
            "proxy_inject_admission_failures",
            "Requests the injector could not handle; answered per the failure policy.",
            ("reason",),
            registry=self.registry,
        )
        self.duration = Histogram(
            "proxy_inject_admission_duration_seconds",
            "Time to answer one admission request.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )

    def count_request(self, owner_kind: str, namespace: str, annotation_at: str) -> None:
        self.requests.labels(owner_kind, namespace, annotation_at).inc()

    def count_response(
        self, owner_kind: str, namespace: str, annotation_at: str, *, skip: bool, skip_reason: str = ""
    ) -> None:
        self.responses.labels(owner_kind, namespace, annotation_at, "true" if skip else "false", skip_reason).inc()

    def count_failure(self, reason: str) -> None:
        self.failures.labels(reason).inc()
