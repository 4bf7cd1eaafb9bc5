"""The AdmissionReview envelope: read the request the API server POSTs, write the response it expects.

Shared by the proxy injector's mutating webhook and the policy controller's
validating webhook, which differ only in what they decide.  Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = JSON


class MalformedReview(ValueError):
    """The body is not an AdmissionReview we can answer (the API server's or a caller's fault)."""


@dataclass(frozen=True, slots=True)
class Review:
    api_version: str
    uid: str
    request: Mapping[str, Any]


def parse_review(body: bytes) -> Review:
    try:
        review = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise MalformedReview(f"body is not JSON: {err}") from None
    if not isinstance(review, dict):
        raise MalformedReview("body is not a JSON object")
    api_version = review.get("apiVersion")
    if review.get("kind") != "AdmissionReview" or api_version not in REVIEW_VERSIONS:
        raise MalformedReview(
            f"expected kind AdmissionReview, apiVersion {' or '.join(REVIEW_VERSIONS)}; "
            f"got kind {review.get('kind')!r}, apiVersion {api_version!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("AdmissionReview request has no uid")
    return Review(api_version, uid, request)


def malformed(err: MalformedReview) -> Reply:
    return Reply(400, f"malformed admission request: {err}\n".encode(), TEXT)


def answer(review: Review, response: dict[str, Any]) -> Reply:
    body = {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": {"uid": review.uid, **response}}
    return Reply(200, json.dumps(body).encode())
