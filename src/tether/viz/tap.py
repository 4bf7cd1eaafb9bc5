"""The tap controller (Linkerd viz's tap component): ``TapByResource`` resolved to the proxies' ``Observe`` calls.

A ``TapByResourceRequest`` names a resource (``deployment/web`` in a
namespace, a pod, a namespace).  ``tappable_pods`` resolves it to its pods and
keeps the meshed, running ones whose proxy has tap enabled (the
``LINKERD2_PROXY_TAP_SVC_NAME`` variable the tap injector adds); when none is
left, ``NoTappablePods`` names each pod and why (not meshed, not running, tap
disabled).  ``max_rps`` (default 100) is divided among the pods, at least 1
each.  ``observe_request`` translates the viz match (HTTP scheme, method,
authority exact, path prefix; destinations as destination labels) into the
proxy's ``ObserveRequest.Match``.

``TapController.tap`` then calls every pod's proxy at ``<pod IP>:4190`` over
mTLS -- presenting the tap identity's certificate and checking the pod's own
identity -- in one-second windows of at most the pod's share of requests, and
merges their events into one stream.  ``TapService`` serves that as
``linkerd2.tap.Tap/TapByResource``.

Callers: ``tether viz tap-server`` and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from tether.api import http_types_pb2, tap_pb2, tap_pb2_grpc, viz_tap_pb2, viz_tap_pb2_grpc
from tether.api.addresses import InvalidAddress, from_tcp_address
from tether.naming import InvalidName, WorkloadIdentity
from tether.viz.metrics_api import Mesh, Objects
from tether.viz.tap_injector import DISABLE_TAP, TAP_ENV
from tether.viz.targets import DEPLOYMENT, NAMESPACE, POD, TargetError, kind_of
from tether.viz.workloads import MESHED_LABEL, PROXY_CONTAINER, pod_info, select

log = logging.getLogger(__name__)

DEFAULT_MAX_RPS = 100.0
TAP_PORT = 4190
WINDOW_S = 1.0
M = tap_pb2.ObserveRequest.Match
VM = viz_tap_pb2.TapByResourceRequest.Match


class TapError(Exception):
    """A tap request the controller cannot serve; ``code`` is the gRPC status it maps to."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NoTappablePods(TapError):
    code = grpc.StatusCode.NOT_FOUND


@dataclass(frozen=True, slots=True)
class TapTarget:
    namespace: str
    name: str
    ip: str
    identity: str


@dataclass(frozen=True, slots=True)
class TapCredentials:
    """The tap identity's key and chain, and the anchors proxies' certificates chain to (PEM)."""

    key_pem: bytes
    chain_pem: bytes
    anchors_pem: bytes


def _proxy_env(pod: Mapping[str, Any]) -> dict[str, str]:
    spec = pod.get("spec") or {}
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if container.get("name") == PROXY_CONTAINER:
            return {e.get("name", ""): e.get("value") or "" for e in container.get("env") or ()}
    return {}


def why_not_tappable(pod: Mapping[str, Any]) -> str | None:
    """None when the pod can be tapped, else the reason (Linkerd's words where it has them)."""
    meta = pod.get("metadata") or {}
    if MESHED_LABEL not in (meta.get("labels") or {}):
        return "not meshed (no linkerd-proxy)"
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return f"not running (phase {status.get('phase') or 'unknown'})"
    annotations = meta.get("annotations") or {}
    if annotations.get(DISABLE_TAP) == "true":
        return f"tap disabled ({DISABLE_TAP})"
    if not _proxy_env(pod).get(TAP_ENV):
        return f"tap not enabled (its proxy has no {TAP_ENV})"
    return None


def _pods_of(objects: Objects, kind: str, namespace: str, name: str) -> list[Mapping[str, Any]]:
    if kind == NAMESPACE:
        return objects.list("Pod", name or namespace)
    pods = objects.list("Pod", namespace)
    if kind == POD:
        return [p for p in pods if not name or p["metadata"]["name"] == name]
    if kind == DEPLOYMENT:
        workloads = select(DEPLOYMENT, pods, deployments=objects.list("Deployment", namespace),
                           names=[name] if name else [])
        members = {p.name for w in workloads for p in w.pods}
        return [p for p in pods if p["metadata"]["name"] in members]
    raise TapError(f"tap takes deployments, pods or namespaces, not {kind}s")


def tappable_pods(objects: Objects, resource: viz_tap_pb2.Resource, mesh: Mesh) -> list[TapTarget]:
    try:
        kind = kind_of(resource.type)
    except TargetError as err:
        raise TapError(str(err)) from None
    namespace = resource.namespace or "default"
    pods = _pods_of(objects, kind, namespace, resource.name)
    what = f"{kind}/{resource.name}" if resource.name else f"{kind}s"
    if not pods:
        raise NoTappablePods(f"no pods found for {what} in namespace {namespace}")
    out, refused = [], []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        reason = why_not_tappable(pod)
        name = pod["metadata"]["name"]
        if reason:
            refused.append(f"{name}: {reason}")
            continue
        sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        ns = pod["metadata"].get("namespace") or namespace
        try:
            identity = WorkloadIdentity(sa, ns, mesh.control_plane_ns, mesh.trust_domain).dns_name
        except InvalidName as err:
            refused.append(f"{name}: {err}")
            continue
        out.append(TapTarget(ns, name, pod["status"]["podIP"], identity))
    if not out:
        raise NoTappablePods(f"no pods to tap for {what} in namespace {namespace}: " + "; ".join(refused))
    return out


Peers = Mapping[str, Mapping[str, str]]  # a pod's IP -> the labels its events' peer gets (``peer_labels``)


def peer_labels(objects: Objects) -> Peers:
    """Each pod's IP -> what Linkerd's tap server adds to an event's source or destination metadata about the
    pod at that address: ``namespace``, ``pod``, ``serviceaccount`` and its owner (``deployment``)."""
    out: dict[str, dict[str, str]] = {}
    for pod in objects.list("Pod", None):
        info = pod_info(pod)
        if info.ip is None or info.phase not in ("Pending", "Running"):
            continue
        labels = {"namespace": info.namespace, "pod": info.name,
                  "serviceaccount": str((pod.get("spec") or {}).get("serviceAccountName") or "default")}
        if info.deployment:
            labels["deployment"] = info.deployment
        out[info.ip] = labels
    return out


def hydrate(event: tap_pb2.TapEvent, peers: Peers) -> tap_pb2.TapEvent:
    """``event`` with each peer's pod labels added (the proxy's own labels win, as they are what it saw)."""
    for address, meta in ((event.source, event.source_meta), (event.destination, event.destination_meta)):
        try:
            ip = from_tcp_address(address)[0]
        except (InvalidAddress, ValueError):
            continue
        for key, value in (peers.get(ip) or {}).items():
            if key not in meta.labels:
                meta.labels[key] = value
    return event


def per_pod_limit(max_rps: float, pods: int) -> int:
    """Each pod's share of ``max_rps`` requests per second, at least 1."""
    rps = max_rps if max_rps > 0 else DEFAULT_MAX_RPS
    return max(1, int(rps / max(1, pods)))


def _http_match(http: viz_tap_pb2.TapByResourceRequest.Match.Http) -> M:
    kind = http.WhichOneof("match")
    if kind == "scheme":
        registered = {"http": http_types_pb2.Scheme.HTTP, "https": http_types_pb2.Scheme.HTTPS}.get(http.scheme.lower())
        scheme = (http_types_pb2.Scheme(registered=registered) if registered is not None
                  else http_types_pb2.Scheme(unregistered=http.scheme))
        return M(http=M.Http(scheme=scheme))
    if kind == "method":
        names = dict(http_types_pb2.HttpMethod.Registered.items())
        value = names.get(http.method.upper())
        method = (http_types_pb2.HttpMethod(registered=value) if value is not None
                  else http_types_pb2.HttpMethod(unregistered=http.method))
        return M(http=M.Http(method=method))
    if kind == "authority":
        return M(http=M.Http(authority=M.Http.StringMatch(exact=http.authority)))
    if kind == "path":
        return M(http=M.Http(path=M.Http.StringMatch(prefix=http.path)))
    raise TapError("match.http: no condition set")


def translate_match(match: viz_tap_pb2.TapByResourceRequest.Match) -> M:
    """The viz match, as the proxies' match tree."""
    kind = match.WhichOneof("match")
    if kind == "all":
        return M(all=M.Seq(matches=[translate_match(m) for m in match.all.matches]))
    if kind == "any":
        return M(any=M.Seq(matches=[translate_match(m) for m in match.any.matches]))
    if kind == "not":
        return M(**{"not": translate_match(getattr(match, "not"))})
    if kind == "http":
        return _http_match(match.http)
    if kind == "destinations":
        resource = match.destinations.resource
        try:
            label = kind_of(resource.type)
        except TargetError as err:
            raise TapError(f"match.destinations: {err}") from None
        parts = []
        if resource.name:
            parts.append(M(destination_label=M.Label(key=label if label != NAMESPACE else "namespace",
                                                     value=resource.name)))
        if resource.namespace and label != NAMESPACE:
            parts.append(M(destination_label=M.Label(key="namespace", value=resource.namespace)))
        return M(all=M.Seq(matches=parts))
    raise TapError("match: no condition set")


def observe_request(request: viz_tap_pb2.TapByResourceRequest, limit: int) -> tap_pb2.ObserveRequest:
    out = tap_pb2.ObserveRequest(limit=limit)
    if request.HasField("match"):
        out.match.CopyFrom(translate_match(request.match))
    if request.HasField("extract") and request.extract.http.WhichOneof("extract") == "headers":
        out.extract.http.headers.SetInParent()
    return out


class TapController:
    def __init__(self, objects: Objects, mesh: Mesh, credentials: TapCredentials, *, tap_port: int = TAP_PORT) -> None:
        self.objects = objects
        self.mesh = mesh
        self.credentials = credentials
        self.tap_port = tap_port

    def plan(self, request: viz_tap_pb2.TapByResourceRequest) -> tuple[list[TapTarget], tap_pb2.ObserveRequest]:
        """The pods to call and what to ask each; ``TapError`` when the request cannot be served."""
        if not request.HasField("target") or not request.target.HasField("resource"):
            raise TapError("target: name a resource to tap")
        pods = tappable_pods(self.objects, request.target.resource, self.mesh)
        return pods, observe_request(request, per_pod_limit(request.maxRps, len(pods)))

    def _channel(self, pod: TapTarget) -> grpc.aio.Channel:
        c = self.credentials
        creds = grpc.ssl_channel_credentials(root_certificates=c.anchors_pem, private_key=c.key_pem,
                                             certificate_chain=c.chain_pem)
        # The proxy must present the pod's own identity.
        return grpc.aio.secure_channel(f"{pod.ip}:{self.tap_port}", creds,
                                       options=[("grpc.ssl_target_name_override", pod.identity)])

    async def _observe(self, pod: TapTarget, observe: tap_pb2.ObserveRequest,
                       out: asyncio.Queue[tap_pb2.TapEvent | Exception]) -> None:
        """Observe ``pod`` in one-second windows of at most ``observe.limit`` requests, forever."""
        loop = asyncio.get_running_loop()
        async with self._channel(pod) as channel:
            stub = tap_pb2_grpc.TapStub(channel)
            while True:
                window_end = loop.time() + WINDOW_S
                call = stub.Observe(observe)
                try:
                    async with asyncio.timeout_at(window_end):
                        async for event in call:
                            await out.put(event)
                except TimeoutError:
                    call.cancel()
                    continue  # the window ended with requests still open: a fresh window
                except grpc.aio.AioRpcError as err:
                    await out.put(TapError(f"{pod.namespace}/{pod.name} ({pod.ip}:{self.tap_port}): "
                                           f"{err.code().name}: {err.details()}"))
                    return
                # The limit was reached before the window ended: wait for the next one.
                await asyncio.sleep(max(0.0, window_end - loop.time()))

    def peers(self) -> Peers:
        """The pods' labels by IP, as the tap starts (``peer_labels``)."""
        return peer_labels(self.objects)

    async def tap(self, request: viz_tap_pb2.TapByResourceRequest) -> AsyncIterator[tap_pb2.TapEvent]:
        """Every tapped pod's events, merged, until the caller stops; a pod's failure is raised."""
        pods, observe = self.plan(request)
        async for event in self.observe(pods, observe, self.peers()):
            yield event

    async def observe(self, pods: list[TapTarget], observe: tap_pb2.ObserveRequest, peers: Peers | None = None
                      ) -> AsyncIterator[tap_pb2.TapEvent]:
        """What ``plan`` said, merged, each event's peers labelled from ``peers`` (for callers that plan off the
        loop: its objects may block)."""
        queue: asyncio.Queue[tap_pb2.TapEvent | Exception] = asyncio.Queue(maxsize=1000)
        tasks = [asyncio.create_task(self._observe(pod, observe, queue)) for pod in pods]
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield hydrate(item, peers) if peers else item
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


class TapService(viz_tap_pb2_grpc.TapServicer):
    """``linkerd2.tap.Tap/TapByResource`` over a ``TapController``."""

    def __init__(self, controller: TapController) -> None:
        self.controller = controller

    async def TapByResource(self, request: viz_tap_pb2.TapByResourceRequest,  # noqa: N802 - the gRPC name
                            context: grpc.aio.ServicerContext) -> AsyncIterator[tap_pb2.TapEvent]:
        try:
            async for event in self.controller.tap(request):
                yield event
        except TapError as err:
            await context.abort(err.code, str(err))
