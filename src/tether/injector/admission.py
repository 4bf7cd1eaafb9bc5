"""AdmissionReview in, AdmissionReview out: the webhook's logic, sans-IO.

`Admission.review(body)` takes the bytes the API server POSTed and returns the HTTP status
and bytes to answer, never raising. A CREATE of a Pod runs the pure patch (`patch.inject`,
origin WEBHOOK) with the namespace's annotations from the `NamespaceAnnotations` seam, and
the difference between the pod and the patched pod goes back as a base64 RFC 6902 JSON
patch. Services get the annotation-only opaque-ports patch; anything else is allowed as is.
With an `OwnerLookup` the pod's owner label comes from the API (ReplicaSet -> Deployment,
Job -> CronJob) and, with an `EventRecorder`, its parent gets an ``Injected`` or
``InjectionSkipped`` Event (`tether.injector.owners`).

Errors, by whose fault (Linkerd answers its handler errors with HTTP 400):

- a body that is not an AdmissionReview (no request uid to answer to): HTTP 400 and the reason;
- a request the injector cannot handle (an object that does not parse, a failing namespace
  lookup, a bug, or `server`'s timeout via `Admission.fallback`): an AdmissionReview per the
  failure policy: ``Ignore`` (default) allows the pod unpatched with a warning the user sees;
  ``Fail`` denies it with the reason.

Caller: `server` (from a worker thread, with a deadline).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from tether.injector import jsonpatch
from tether.injector.config import MeshConfig
from tether.injector.decision import Origin
from tether.injector.metrics import InjectorMetrics
from tether.injector.namespaces import NamespaceAnnotations
from tether.injector.owners import EventRecorder, OwnerLookup, event_for, resolve
from tether.injector.patch import inject
from tether.resources.errors import ValidationError
from tether.serving.admission_review import MalformedReview, Reply, Review, answer, malformed, parse_review

FAILURE_POLICIES = ("Ignore", "Fail")
_MAX_WARNINGS = 5


class Admission:
    """Answers admission reviews. ``config`` is called per request, so a reloaded config applies."""

    def __init__(
        self,
        config: Callable[[], MeshConfig],
        namespaces: NamespaceAnnotations,
        *,
        metrics: InjectorMetrics | None = None,
        failure_policy: str = "Ignore",
        logger: logging.Logger | None = None,
        owners: OwnerLookup | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        if failure_policy not in FAILURE_POLICIES:
            raise ValueError(f"failure policy must be one of {', '.join(FAILURE_POLICIES)}")
        self._config = config
        self._namespaces = namespaces
        self._metrics = metrics or InjectorMetrics()
        self._failure_policy = failure_policy
        self._log = logger or logging.getLogger("tether.injector")
        self._owners = owners
        self._events = events

    @property
    def metrics(self) -> InjectorMetrics:
        return self._metrics

    def review(self, body: bytes) -> Reply:
        started = time.perf_counter()
        try:
            return self._review(body)
        finally:
            self._metrics.duration.observe(time.perf_counter() - started)

    def _review(self, body: bytes) -> Reply:
        try:
            review = parse_review(body)
        except MalformedReview as err:
            self._metrics.count_failure("malformed_request")
            self._log.warning("rejected a malformed admission request: %s", err)
            return malformed(err)
        request = review.request
        kind = (request.get("kind") or {}).get("kind") if isinstance(request.get("kind"), dict) else None
        if request.get("operation") != "CREATE" or kind not in ("Pod", "Service"):
            return answer(review, {"allowed": True})
        obj = request.get("object")
        namespace = request.get("namespace") if isinstance(request.get("namespace"), str) else ""
        if not isinstance(obj, dict):
            return self._failed(review, "invalid_object", "the request carries no object")
        resolved = resolve(obj, namespace, self._owners if kind == "Pod" else None)
        try:
            result = inject(
                obj, self._namespaces(namespace), self._config(), origin=Origin.WEBHOOK, namespace=namespace or None,
                owner=resolved.owner,
            )
            ops = jsonpatch.diff(obj, result.obj)
        except ValidationError as err:
            return self._failed(review, "invalid_object", f"{kind} does not parse: {err}")
        except Exception as err:  # the driver's catch-all: never let the API server wait on a bug
            self._log.exception("injection failed for %s %s/%s", kind, namespace, _name(obj))
            return self._failed(review, "internal_error", f"internal error: {type(err).__name__}: {err}")
        report = result.report
        self._metrics.count_request(report.owner_kind, namespace, report.annotation_at)
        skip_reason = report.skip_reasons[0].value if report.skip_reasons else ""
        self._metrics.count_response(
            report.owner_kind, namespace, report.annotation_at, skip=report.skipped, skip_reason=skip_reason
        )
        self._log.info(
            "%s %s/%s %s%s", kind.lower(), namespace, report.name, report.action,
            f": {'; '.join(report.reasons)}" if report.reasons else "",
        )  # fmt: skip
        if resolved.parent is not None and self._events is not None:
            self._events.record(resolved.parent, *event_for(report.action == "injected", report.reasons))
        response: dict[str, Any] = {"allowed": True}
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
        if report.warnings:
            response["warnings"] = [f"linkerd-proxy: {w}" for w in report.warnings[:_MAX_WARNINGS]]
        return answer(review, response)

    def fallback(self, body: bytes, reason: str, message: str) -> Reply:
        """The answer when the review could not be completed (``reason`` e.g. ``timeout``)."""
        try:
            review = parse_review(body)
        except MalformedReview as err:
            self._metrics.count_failure("malformed_request")
            return malformed(err)
        return self._failed(review, reason, message)

    def _failed(self, review: Review, reason: str, message: str) -> Reply:
        self._metrics.count_failure(reason)
        self._log.warning("admission %s not handled (%s): %s; policy %s", review.uid, reason, message,
                          self._failure_policy)  # fmt: skip
        if self._failure_policy == "Fail":
            return answer(
                review, {"allowed": False, "status": {"code": 500, "message": f"tether proxy injector: {message}"}}
            )
        return answer(
            review, {"allowed": True, "warnings": [f"tether proxy injector: {message}; admitted without the proxy"]}
        )


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return str(meta.get("name") or meta.get("generateName") or "")
