"""The identity service's Prometheus metrics, in a registry of its own.

Updated by ``tether.identity.server`` (Certify outcomes) and ``tether.identity.issuer_source``
(issuer loads); served on ``/metrics`` by ``tether.admin``.  ``issuer_cert_ttl_seconds``
keeps Linkerd's name so existing dashboards and checks read it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge

from tether.identity.errors import Reason


class IdentityMetrics:
    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.registry = CollectorRegistry()
        self._clock = clock
        self._issuer_expiry: float | None = None
        self.certificates_issued = Counter(
            "identity_certificates_issued", "Leaf certificates issued by Certify.", registry=self.registry
        )
        self.certify_failures = Counter(
            "identity_certify_failures", "Certify calls refused, by reason.", ["reason"], registry=self.registry
        )
        for reason in Reason:  # so every reason shows as 0 before it first happens
            self.certify_failures.labels(reason.label)
        self.issuer_expiry = Gauge(
            "identity_issuer_expiry_timestamp_seconds",
            "When the loaded issuer (or its chain) expires, as a Unix timestamp.",
            registry=self.registry,
        )
        Gauge(
            "issuer_cert_ttl_seconds", "Seconds until the loaded issuer expires.", registry=self.registry
        ).set_function(self._issuer_ttl)
        self.issuer_reloads = Counter(
            "identity_issuer_reloads", "Issuers loaded from disk, the first one included.", registry=self.registry
        )
        self.issuer_reload_failures = Counter(
            "identity_issuer_reload_failures",
            "Issuer files that changed but could not be loaded (the previous issuer was kept).",
            registry=self.registry,
        )

    def issuer_loaded(self, not_after: datetime) -> None:
        self._issuer_expiry = not_after.timestamp()
        self.issuer_expiry.set(self._issuer_expiry)
        self.issuer_reloads.inc()

    def _issuer_ttl(self) -> float:
        if self._issuer_expiry is None:
            return 0.0
        return self._issuer_expiry - self._clock().timestamp()
