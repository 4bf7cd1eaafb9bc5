"""The validating admission webhook of the policy resources: one rule set with ``tether apply``.

Kubernetes POSTs an AdmissionReview for every CREATE and UPDATE of a policy
resource (``linkerd-policy-validator-webhook-config``); the answer is the verdict
of ``tether.resources.model.parse``, the same function ``tether apply`` runs on
the local platform, so a manifest refused locally is refused on a cluster with
the same message naming the field.  Gateway API routes (HTTPRoute, GRPCRoute,
TLSRoute, TCPRoute) that do not parse are admitted with a warning, as Linkerd
does (other controllers may own them); those that read but break one of
Linkerd's rules (an EgressNetwork parent without a port, a TLSRoute or TCPRoute
with other than one rule: a ``PolicyRuleViolation``) are denied, as Linkerd's
``validate`` denies them.
Served over HTTPS on 9443 by ``tether.serving.webhook`` from the policy process.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from tether.resources import kinds
from tether.resources.errors import PolicyRuleViolation, ValidationError
from tether.resources.model import parse
from tether.serving.admission_review import MalformedReview, Reply, answer, malformed, parse_review

log = logging.getLogger(__name__)

# What the webhook configuration sends here (Linkerd's list), by (group, plural).
VALIDATED = {
    (kinds.AUTHORIZATION_POLICY.group, kinds.AUTHORIZATION_POLICY.plural),
    (kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.group, kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.plural),
    (kinds.POLICY_HTTP_ROUTE.group, kinds.POLICY_HTTP_ROUTE.plural),
    (kinds.NETWORK_AUTHENTICATION.group, kinds.NETWORK_AUTHENTICATION.plural),
    (kinds.MESH_TLS_AUTHENTICATION.group, kinds.MESH_TLS_AUTHENTICATION.plural),
    (kinds.SERVER_AUTHORIZATION.group, kinds.SERVER_AUTHORIZATION.plural),
    (kinds.SERVER.group, kinds.SERVER.plural),
    (kinds.EGRESS_NETWORK.group, kinds.EGRESS_NETWORK.plural),
    (kinds.GATEWAY_HTTP_ROUTE.group, kinds.GATEWAY_HTTP_ROUTE.plural),
    (kinds.GRPC_ROUTE.group, kinds.GRPC_ROUTE.plural),
    (kinds.TLS_ROUTE.group, kinds.TLS_ROUTE.plural),
    (kinds.TCP_ROUTE.group, kinds.TCP_ROUTE.plural),
}
_LENIENT_GROUP = kinds.GATEWAY_HTTP_ROUTE.group


class PolicyAdmission:
    """Answers AdmissionReviews; ``review`` never raises."""

    def __init__(self) -> None:
        self.allowed = 0
        self.denied = 0

    def review(self, body: bytes) -> Reply:
        try:
            review = parse_review(body)
        except MalformedReview as err:
            return malformed(err)
        request = review.request
        if request.get("operation") not in ("CREATE", "UPDATE"):
            return answer(review, {"allowed": True})
        obj = request.get("object")
        if not isinstance(obj, dict):
            return self._deny(review, "the request carries no object")
        resource = request.get("resource") if isinstance(request.get("resource"), dict) else {}
        group = str(resource.get("group") or (obj.get("apiVersion") or "").rpartition("/")[0])
        obj = copy.deepcopy(obj)
        namespace = request.get("namespace")
        metadata = obj.setdefault("metadata", {}) if isinstance(obj.get("metadata", {}), dict) else None
        if metadata is not None and isinstance(namespace, str) and namespace and not metadata.get("namespace"):
            metadata["namespace"] = namespace  # what the API server fills in before storing
        try:
            parse(obj)
        except ValidationError as err:
            if group == _LENIENT_GROUP and not isinstance(err, PolicyRuleViolation):
                self.allowed += 1
                return answer(review, {"allowed": True, "warnings": [f"linkerd-policy: {err}"[:500]]})
            return self._deny(review, str(err))
        except RecursionError:
            return self._deny(review, "the object is nested too deeply")
        self.allowed += 1
        return answer(review, {"allowed": True})

    def _deny(self, review: Any, message: str) -> Reply:
        self.denied += 1
        log.info("denied %s: %s", review.uid, message)
        return answer(review, {"allowed": False, "status": {"code": 400, "reason": "BadRequest",
                                                             "message": message}})

    def fallback(self, body: bytes, reason: str, message: str) -> Reply:
        """No verdict in time: admit with a warning (the webhook's failure policy is Ignore, as Linkerd's)."""
        try:
            review = parse_review(body)
        except MalformedReview as err:
            return malformed(err)
        return answer(review, {"allowed": True, "warnings": [f"linkerd-policy: not validated ({reason}): {message}"]})
