"""The tap APIService's rules (Linkerd viz's ``v1alpha1.tap.linkerd.io``): routes, front-proxy identity, the SubjectAccessReview, framing.

On Kubernetes ``linkerd viz tap`` POSTs a ``TapByResourceRequest`` to the API
server at ``/apis/tap.linkerd.io/v1alpha1/watch/namespaces/<ns>/<type>s/<name>/tap``
(a namespace: ``.../watch/namespaces/<ns>/tap``); the API server
authenticates the user and proxies the request to the tap server over TLS,
presenting its front-proxy client certificate and naming the user in the
request headers.  Here:

- ``RequestHeaderAuth.from_configmap`` reads ``kube-system/extension-apiserver-authentication``:
  the CA of the front-proxy certificates, the names they may carry
  (``requestheader-allowed-names``; none listed: any), and the headers naming
  the user, groups and extra attributes;
- ``RequestHeaderAuth.user`` checks the client certificate's names and reads
  the user from the headers;
- ``parse_route`` reads the path as Linkerd's router does, and
  ``expected_path`` is the path the request body names (they must agree);
- ``access_review`` is the SubjectAccessReview Linkerd sends: verb ``watch``
  on ``<type>s`` subresource ``tap`` of the named object in group
  ``tap.linkerd.io`` version ``v1alpha1``, for that user and groups (and their
  extra attributes); ``review_verdict`` reads the answer;
- ``frame`` is Linkerd's ``protohttp`` framing: each message after its length
  as 4 bytes, little-endian; errors go in the ``linkerd-error`` header with the
  message framed as Linkerd's ``ApiError`` (one string, field 1).

Sans-IO.  Callers: ``tap_apiservice_server``; tests.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from google.protobuf import wrappers_pb2

from tether.api import viz_tap_pb2

GROUP = "tap.linkerd.io"
VERSION = "v1alpha1"
PREFIX = f"/apis/{GROUP}/{VERSION}/watch/namespaces/"
CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
ERROR_HEADER = "linkerd-error"
CONTENT_TYPE = "application/octet-stream"
RBAC_URL = "https://linkerd.io/tap-rbac"
# The resource types tap serves, as Linkerd's router lists them (plural, as in the path).
RESOURCES = ("pods", "replicationcontrollers", "services", "daemonsets", "deployments", "replicasets",
             "statefulsets", "jobs", "cronjobs")


class ApiServiceError(Exception):
    """A request the APIService refuses; ``status`` is the HTTP status it answers."""

    status = 400


class Unauthenticated(ApiServiceError):
    status = 401


class Forbidden(ApiServiceError):
    status = 403


class NotFound(ApiServiceError):
    status = 404


@dataclass(frozen=True, slots=True)
class Route:
    namespace: str
    resource: str  # plural: "deployments", or "namespaces" for a whole namespace
    name: str  # "" for a namespace (Linkerd's SubjectAccessReview then names no object)


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def parse_route(path: str) -> Route:
    if not path.startswith(PREFIX) or not path.endswith("/tap"):
        raise NotFound(f"no such path: {path}")
    parts = path[len(PREFIX):-len("/tap")].split("/")
    if len(parts) == 1 and parts[0]:
        return Route(parts[0], "namespaces", "")
    if len(parts) == 3 and all(parts) and parts[1] in RESOURCES:
        return Route(parts[0], parts[1], parts[2])
    raise NotFound(f"no such path: {path} (tap serves {PREFIX}<ns>/tap and {PREFIX}<ns>/<type>s/<name>/tap, "
                   f"type one of {', '.join(RESOURCES)})")


def expected_path(request: viz_tap_pb2.TapByResourceRequest) -> str:
    """The path a request body names (Linkerd's ``TapReqToURL``)."""
    resource = request.target.resource
    if resource.type == "namespace":
        return f"{PREFIX}{resource.name}/tap"
    return f"{PREFIX}{resource.namespace}/{resource.type}s/{resource.name}/tap"


def _strings(data: Mapping[str, str], key: str) -> list[str]:
    text = data.get(key) or ""
    if not text:
        return []
    try:
        values = json.loads(text)
    except ValueError:
        values = None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"extension-apiserver-authentication: {key} is not a JSON list of strings: {text!r}")
    return values


@dataclass(frozen=True, slots=True)
class RequestHeaderAuth:
    client_ca_pem: str
    allowed_names: tuple[str, ...]
    username_headers: tuple[str, ...]
    group_headers: tuple[str, ...]
    extra_prefixes: tuple[str, ...]

    @classmethod
    def from_configmap(cls, configmap: Mapping[str, Any]) -> RequestHeaderAuth:
        """From ``kube-system/extension-apiserver-authentication``; `ValueError` names what is missing."""
        data = configmap.get("data") or {}
        ca = data.get("requestheader-client-ca-file") or ""
        if not ca.strip():
            raise ValueError("extension-apiserver-authentication has no requestheader-client-ca-file: "
                             "the API server has no front-proxy CA (--requestheader-client-ca-file)")
        usernames = _strings(data, "requestheader-username-headers")
        if not usernames:
            raise ValueError("extension-apiserver-authentication has no requestheader-username-headers")
        return cls(ca, tuple(_strings(data, "requestheader-allowed-names")), tuple(usernames),
                   tuple(_strings(data, "requestheader-group-headers")),
                   tuple(_strings(data, "requestheader-extra-headers-prefix")))

    def user(self, peer_names: Sequence[str], headers: Mapping[str, str] | Any) -> User:
        """The user the front proxy names; ``peer_names``: the verified client certificate's CN and SANs.

        ``headers`` is case-insensitive and may repeat keys (``getall``), as an HTTP server's are.
        """
        if self.allowed_names and not set(self.allowed_names) & set(peer_names):
            raise Unauthenticated(f"the client certificate ({', '.join(peer_names) or 'no names'}) is not one of "
                                  f"requestheader-allowed-names ({', '.join(self.allowed_names)})")
        name = next((headers[h] for h in self.username_headers if headers.get(h)), "")
        if not name:
            raise Unauthenticated(f"no user named in {', '.join(self.username_headers)}")
        groups = tuple(g for h in self.group_headers for g in _all(headers, h))
        extra: dict[str, tuple[str, ...]] = {}
        for key in headers:
            for prefix in self.extra_prefixes:
                if key.lower().startswith(prefix.lower()):
                    extra.setdefault(unquote(key[len(prefix):]).lower(), tuple(_all(headers, key)))
        return User(name, groups, extra)


def _all(headers: Any, key: str) -> list[str]:
    return list(headers.getall(key, [])) if hasattr(headers, "getall") else (
        [headers[key]] if key in headers else [])


def access_review(route: Route, user: User) -> dict[str, Any]:
    """The SubjectAccessReview: may ``user`` watch ``<resource>/tap`` of the named object?"""
    attributes = {"namespace": route.namespace, "verb": "watch", "group": GROUP, "version": VERSION,
                  "resource": route.resource, "subresource": "tap"}
    if route.name:
        attributes["name"] = route.name
    spec: dict[str, Any] = {"resourceAttributes": attributes, "user": user.name, "groups": list(user.groups)}
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra.items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def review_verdict(route: Route, user: User, answer: Mapping[str, Any]) -> None:
    """Raise `Forbidden` unless the API server allowed it."""
    status = answer.get("status") or {}
    if status.get("allowed") is True:
        return
    target = f"{route.resource}/{route.name}" if route.name else f"namespace {route.namespace}"
    why = status.get("reason") or status.get("evaluationError") or "denied"
    raise Forbidden(f"tap authorization failed (user {user.name!r} may not watch {route.resource}/tap in group "
                    f"{GROUP} for {target} in namespace {route.namespace}: {why}), visit {RBAC_URL} "
                    "for more information")


def frame(message: bytes) -> bytes:
    return struct.pack("<I", len(message)) + message


def error_body(message: str) -> bytes:
    """Linkerd's ``ApiError{error}``: one string in field 1, the wire form of ``StringValue``."""
    return frame(wrappers_pb2.StringValue(value=message).SerializeToString())


def error_message(frame_body: bytes) -> str:
    """The message of an ``ApiError`` frame's body (what `error_body` framed)."""
    return wrappers_pb2.StringValue.FromString(frame_body).value


def read_frames(buffer: bytearray) -> list[bytes]:
    """Take every whole frame off the front of ``buffer`` (a client reading the stream)."""
    out = []
    while len(buffer) >= 4:
        (size,) = struct.unpack_from("<I", buffer)
        if len(buffer) < 4 + size:
            break
        out.append(bytes(buffer[4:4 + size]))
        del buffer[:4 + size]
    return out
