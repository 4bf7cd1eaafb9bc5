"""Where each resource type lives on the Kubernetes API: group, version, plural, and the URL paths.

``tether.platform.kubernetes.watch`` asks ``api_resource(type_key)`` for the list
and watch paths of a type key (``ResourceType.key`` from ``tether.resources.kinds``,
e.g. ``"Pod"`` or ``"Server.policy.linkerd.io"``).  Every type of the resource model
is served at its preferred version; the few types the model does not parse but
controllers still read or write on Kubernetes (Endpoints, Nodes, Events, the owner kinds of
pods) are added here; Nodes, ReplicaSets and Jobs are watched as metadata only (``ApiResource.metadata_only``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from tether.resources import kinds


@dataclass(frozen=True, slots=True)
class ApiResource:
    """One resource type as the API server serves it."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    # A CRD that may be missing (Gateway API's): its 404 lists as an empty collection, as Linkerd watches
    # these routes only where their CRDs are installed.
    optional: bool = False
    # Watched as metadata only (PartialObjectMetadata), as Linkerd's metadata informers watch it: the
    # objects handed on carry ``metadata`` and no ``spec`` or ``status``.
    metadata_only: bool = False

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def key(self) -> str:
        return self.kind if not self.group else f"{self.kind}.{self.group}"

    def collection_path(self, namespace: str | None = None) -> str:
        """``/api/v1/pods``, ``/api/v1/namespaces/ns/pods``, ``/apis/g/v/namespaces/ns/plural``."""
        root = "/api/v1" if not self.group else f"/apis/{self.group}/{self.version}"
        if namespace and self.namespaced:
            return f"{root}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{root}/{self.plural}"


ENDPOINTS = ApiResource("", "v1", "endpoints", "Endpoints")
# The destination needs only a Node's labels (its zone): metadata only, as Linkerd watches Nodes.
NODE = ApiResource("", "v1", "nodes", "Node", namespaced=False, metadata_only=True)
TOKEN_REVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
# The kinds a pod's owner reference may name (the injector looks them up for its labels and Events).  The
# destination watches ReplicaSets and Jobs for their own owner (a pod's Deployment or CronJob): metadata only.
OWNER_KINDS = (
    ApiResource("apps", "v1", "replicasets", "ReplicaSet", metadata_only=True),
    ApiResource("apps", "v1", "statefulsets", "StatefulSet"),
    ApiResource("apps", "v1", "daemonsets", "DaemonSet"),
    ApiResource("batch", "v1", "jobs", "Job", metadata_only=True),
    ApiResource("batch", "v1", "cronjobs", "CronJob"),
    ApiResource("", "v1", "replicationcontrollers", "ReplicationController"),
)

_EXTRA = (ENDPOINTS, NODE, *OWNER_KINDS)


def _from_model(rtype: kinds.ResourceType) -> ApiResource:
    return ApiResource(rtype.group, rtype.versions[0], rtype.plural, rtype.kind, rtype.namespaced,
                       optional=rtype.group == kinds.GRPC_ROUTE.group)


API_RESOURCES: dict[str, ApiResource] = {r.key: r for r in (*map(_from_model, kinds.REGISTRY), *_EXTRA)}
EVENT = API_RESOURCES[kinds.EVENT.key]


class UnknownResourceType(KeyError):
    """A type key that names no resource the Kubernetes platform can watch."""


def api_resource(type_key: str) -> ApiResource:
    try:
        return API_RESOURCES[type_key]
    except KeyError:
        known = ", ".join(sorted(API_RESOURCES))
        raise UnknownResourceType(f"no Kubernetes resource for type key {type_key!r} (known: {known})") from None
