"""The tap injector's webhook: an AdmissionReview in, an AdmissionReview answering with `tap_injector`'s patch out.

Sans-IO.  ``parse`` reads the API server's ``admission.k8s.io/v1``
AdmissionReview (a pod being created) and says which namespace's annotations
the answer needs; ``answer`` applies ``tap_injector.patch`` and shapes the
response: allowed always (the tap injector only adds), with a base64 JSONPatch
when the pod gets tap.  A pod the rule skips is allowed unchanged; the reason
goes to the log.  When its namespace could not be read the pod is allowed
unchanged with a warning naming the namespace, as the webhook's ``Ignore``
failure policy would have it, rather than failing the pod's creation.

Callers: ``tap_webhook_server``; tests.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.viz import tap_injector

API_VERSION = "admission.k8s.io/v1"


class MalformedReview(ValueError):
    """The body is not an AdmissionReview for a pod (HTTP 400 with this message)."""


@dataclass(frozen=True, slots=True)
class Review:
    uid: str
    namespace: str
    pod: Mapping[str, Any]

    @property
    def pod_name(self) -> str:
        meta = self.pod.get("metadata") or {}
        return str(meta.get("name") or meta.get("generateName") or "?")


def parse(body: bytes) -> Review:
    try:
        review = json.loads(body)
    except ValueError as exc:
        raise MalformedReview(f"the body is not JSON: {exc}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview" \
            or review.get("apiVersion") != API_VERSION:
        raise MalformedReview(f"expected kind AdmissionReview, apiVersion {API_VERSION}")
    request = review.get("request")
    if not isinstance(request, dict) or not request.get("uid"):
        raise MalformedReview("AdmissionReview has no request uid")
    kind = request.get("kind") or {}
    if kind.get("kind") != "Pod":
        raise MalformedReview(f"request.kind: expected Pod, got {kind.get('kind')!r}")
    pod = request.get("object")
    if not isinstance(pod, dict):
        raise MalformedReview("request.object: expected the pod")
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace")
    if not namespace:
        raise MalformedReview("request.namespace: missing")
    return Review(str(request["uid"]), str(namespace), pod)


def answer(review: Review, namespace_annotations: Mapping[str, str] | None, identity: str,
           namespace_error: str = "") -> tuple[dict[str, Any], str]:
    """The AdmissionReview response, and what was done in words for the log.

    ``namespace_annotations`` None means the namespace could not be read
    (``namespace_error`` says why): the pod passes unchanged, with a warning.
    """
    response: dict[str, Any] = {"uid": review.uid, "allowed": True}
    if namespace_annotations is None:
        why = f"tap not enabled: cannot read namespace {review.namespace}: {namespace_error}"
        response["warnings"] = [why]
    else:
        ops = tap_injector.patch(review.pod, namespace_annotations, identity)
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
            why = "tap enabled"
        else:
            why = f"tap not enabled: {tap_injector.decide(review.pod, namespace_annotations).reason}"
    return ({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response},
            f"{review.namespace}/{review.pod_name}: {why}")
