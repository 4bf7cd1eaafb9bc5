"""The dashboard's JSON endpoints: what the page asks, answered by the metrics API and the platform's objects.

| path | answer |
|---|---|
| ``/api/namespaces`` | every namespace's stat row |
| ``/api/stat?kind=deployment&namespace=NS`` | stat rows of a kind (deployment, pod, service) in a namespace |
| ``/api/edges?namespace=NS`` | edges between deployments touching the namespace |
| ``/api/routes?namespace=NS&resource=deploy/web`` | per-route rows of the resource's ServiceProfiles, as the namespace's clients see them |
| ``/api/pods?namespace=NS`` | pods: meshed, identity, phase, whether tap is enabled |
| ``/api/tap?namespace=NS&resource=deploy/web`` | live tap, as server-sent events (``tap_events``), through the tap server (on Kubernetes, the API server's tap APIService) |

Every answer is ``{"window": "1m", "items": [...]}`` or, when Prometheus or
the question fails, ``{"error": "..."}`` with HTTP 502 or 400.  Nothing here
changes state.  Callers: ``tether.viz.dashboard.server``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from tether.naming import InvalidName, WorkloadIdentity
from tether.viz import metrics_api as api
from tether.viz import tables
from tether.viz.prometheus import Prometheus, PrometheusError
from tether.viz.tap_injector import TAP_ENV
from tether.viz.targets import DEPLOYMENT, NAMESPACE, POD, SERVICE, Target, TargetError, parse_one
from tether.viz.workloads import MESHED_LABEL, PROXY_CONTAINER

if TYPE_CHECKING:
    from tether.platform.kubernetes.client import ClientSettings



class BadQuery(ValueError):
    """A query parameter the dashboard cannot use; the message names it."""


TAP_MAX_RPS = 10.0  # the dashboard's live tap shows a sample, as Linkerd's does


class Views:
    def __init__(self, prometheus: Prometheus, objects: api.Objects, mesh: api.Mesh, window: str = "1m",
                 tap_address: str | None = None, tap_api: ClientSettings | None = None) -> None:
        self.prometheus = prometheus
        self.tap_address = tap_address  # the local tap server's TapByResource (gRPC)
        self.tap_api = tap_api  # or, on Kubernetes, the API server's tap APIService (tap_apiclient)
        self.objects = objects
        self.mesh = mesh
        self.window = window
        self.seconds = api.window_seconds(window)
        self.routes: dict[str, Callable[[Mapping[str, str]], list[dict[str, Any]]]] = {
            "/api/namespaces": self.namespaces,
            "/api/stat": self.stat,
            "/api/edges": self.edges,
            "/api/routes": self.top_routes,
            "/api/pods": self.pods,
        }

    def answer(self, path: str, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        view = self.routes.get(path)
        if view is None:
            return 404, {"error": f"no such endpoint {path}"}
        try:
            return 200, {"window": self.window, "items": view(query)}
        except PrometheusError as err:
            return 502, {"error": str(err)}
        except (BadQuery, TargetError, ValueError, LookupError) as err:
            return 400, {"error": str(err)}

    @staticmethod
    def _namespace(query: Mapping[str, str]) -> str:
        ns = query.get("namespace", "default")
        if not ns:
            raise BadQuery("namespace: empty")
        return ns

    def namespaces(self, query: Mapping[str, str]) -> list[dict[str, Any]]:
        rows = api.stat_summary(self.prometheus, self.objects, Target(NAMESPACE, None), self.window, mesh=self.mesh)
        return [tables.row_json(r, self.seconds) for r in rows]

    def stat(self, query: Mapping[str, str]) -> list[dict[str, Any]]:
        kind = query.get("kind", DEPLOYMENT)
        if kind not in (DEPLOYMENT, POD, SERVICE):
            raise BadQuery(f"kind: {kind!r} is not deployment, pod or service")
        rows = api.stat_summary(self.prometheus, self.objects, Target(kind, self._namespace(query)), self.window,
                                mesh=self.mesh)
        return [tables.row_json(r, self.seconds) for r in rows]

    def edges(self, query: Mapping[str, str]) -> list[dict[str, Any]]:
        found = api.edges(self.prometheus, self.objects, DEPLOYMENT, self._namespace(query), self.mesh)
        return [tables.edge_json(e) for e in found]

    def top_routes(self, query: Mapping[str, str]) -> list[dict[str, Any]]:
        resource = query.get("resource")
        if not resource:
            raise BadQuery("resource: name one, such as deploy/web")
        ns = self._namespace(query)
        target = parse_one(resource, ns)
        try:
            # The clients' side: their proxies record each route, with and without retries.
            rows = api.top_routes(self.prometheus, self.objects, Target(NAMESPACE, None, ns), self.window, to=target,
                                  mesh=self.mesh)
        except LookupError:
            return []
        return [tables.row_json(r, self.seconds) for r in rows]

    def pods(self, query: Mapping[str, str]) -> list[dict[str, Any]]:
        ns = self._namespace(query)
        out = []
        for pod in sorted(self.objects.list("Pod", ns), key=lambda p: p["metadata"]["name"]):
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            meshed = MESHED_LABEL in (meta.get("labels") or {})
            proxy = next((c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
                          if c.get("name") == PROXY_CONTAINER), None)
            env = {e.get("name"): e.get("value") for e in (proxy or {}).get("env") or ()}
            identity = ""
            if meshed:
                try:
                    identity = WorkloadIdentity(spec.get("serviceAccountName") or "default", ns,
                                                self.mesh.control_plane_ns, self.mesh.trust_domain).dns_name
                except InvalidName:
                    identity = ""
            out.append({
                "name": meta.get("name"), "namespace": ns,
                "phase": (pod.get("status") or {}).get("phase") or "",
                "ip": (pod.get("status") or {}).get("podIP") or "",
                "deployment": (meta.get("labels") or {}).get("linkerd.io/proxy-deployment") or "",
                "meshed": meshed, "identity": identity, "tap": bool(env.get(TAP_ENV)),
            })
        return out

    async def tap_events(self, query: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """Live tap of ``resource``: ``{"line": ...}`` per event, or one ``{"error": ...}`` and the end."""
        import grpc

        from tether.api import viz_tap_pb2, viz_tap_pb2_grpc

        if self.tap_address is None and self.tap_api is None:
            yield {"error": "no tap server: run `tether viz install`"}
            return
        try:
            target = parse_one(query.get("resource") or "", self._namespace(query))
        except (TargetError, BadQuery) as err:
            yield {"error": str(err)}
            return
        request = viz_tap_pb2.TapByResourceRequest(maxRps=TAP_MAX_RPS)
        request.target.resource.CopyFrom(viz_tap_pb2.Resource(namespace=target.namespace or "", type=target.kind,
                                                              name=target.name))
        if query.get("path"):
            request.match.http.path = query["path"]
        if self.tap_api is not None:
            from tether.viz import tap_apiclient

            try:
                async for event in tap_apiclient.events(self.tap_api, request):
                    yield {"line": tables.tap_line(event), "kind": event.http.WhichOneof("event")}
            except tap_apiclient.TapApiError as err:
                yield {"error": str(err)}
            return
        assert self.tap_address is not None
        async with grpc.aio.insecure_channel(self.tap_address) as channel:
            try:
                async for event in viz_tap_pb2_grpc.TapStub(channel).TapByResource(request):
                    yield {"line": tables.tap_line(event), "kind": event.http.WhichOneof("event")}
            except grpc.aio.AioRpcError as err:
                yield {"error": err.details() or err.code().name}
