"""The ``io.linkerd.proxy.outbound.OutboundPolicies`` gRPC handlers: ``Get`` and ``Watch``.

Registered by ``tether.policy.service`` beside the inbound handlers.
``TrafficSpec.source_workload`` names the client (``tether.policy.workload``:
JSON ``{"ns": .., "pod": ..}`` or ``{"ns": .., "external_workload": ..}``, or
legacy ``<ns>:<pod>``); the target is an ``authority`` (a Service name) or
an ``addr`` (``ip:port``), which the index resolves
(``tether.policy.outbound.index``).

Every target watched by at least one stream is one ``_Publication``: it holds
the index subscription and the encoded message, so a change is resolved once
and serialised once for all the streams of that target; each stream gets the
bytes on its own bounded queue (``tether.serving``), and a client too slow for
its queue is cut off with ``RESOURCE_EXHAUSTED``.  Updates are coalesced by the
index (one per event-loop turn) and only sent when the policy changed.

Status codes, as Linkerd's: no target or a bad workload, port or authority
host -> INVALID_ARGUMENT; a name not shaped ``<svc>.<ns>.svc.<cluster-domain>``
or an in-cluster address no Service or EgressNetwork covers -> NOT_FOUND; a
server shutting down -> UNAVAILABLE for new calls, OK for open streams.
"""

from __future__ import annotations

import grpc

from tether.api import outbound_pb2 as pb
from tether.api.addresses import InvalidAddress, from_ip_address
from tether.policy.outbound.index import (
    InvalidTarget,
    OutboundIndex,
    State,
    Target,
    TargetNotFound,
)
from tether.policy.outbound.translator import encode
from tether.policy.metrics import PolicyMetrics
from tether.policy.workload import InvalidWorkload, parse_workload
from tether.serving.rpc import Rejected, StreamSet, passthrough
from tether.serving.stream import EndReason, UpdateStream

SERVICE_NAME = "io.linkerd.proxy.outbound.OutboundPolicies"
_END_CODES = {EndReason.OVERFLOW: grpc.StatusCode.RESOURCE_EXHAUSTED, EndReason.SHUTDOWN: grpc.StatusCode.OK,
              EndReason.GONE: grpc.StatusCode.OK}


class _Publication:
    """One watched target: its subscription to the index, its current encoding, its streams."""

    __slots__ = ("target", "message", "streams", "_servicer")

    def __init__(self, servicer: OutboundPoliciesServicer, target: Target) -> None:
        self._servicer = servicer
        self.target = target
        self.message = b""
        self.streams: set[UpdateStream] = set()

    def encode(self, state: State) -> None:
        self.message = encode(self.target, state, self._servicer.index.config).SerializeToString()

    def __call__(self, state: State, at: float | None) -> None:
        self.encode(state)
        for stream in list(self.streams):
            stream.send(self.message, at)


class OutboundPoliciesServicer:
    """The OutboundPolicies service over an ``OutboundIndex``; ``streams`` bounds and ends its streams."""

    def __init__(self, index: OutboundIndex, streams: StreamSet, metrics: PolicyMetrics) -> None:
        self.index = index
        self._streams = streams
        self._metrics = metrics
        self._publications: dict[Target, _Publication] = {}
        self._get = metrics.grpc.call(SERVICE_NAME, "Get", "unary")
        self._watch = metrics.grpc.call(SERVICE_NAME, "Watch", "server_stream")
        self._lag = metrics.delivery_lag.labels("Watch")
        self._overflow = metrics.queue_overflow.labels("Watch")

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Get": grpc.unary_unary_rpc_method_handler(
                    self.get, request_deserializer=pb.TrafficSpec.FromString, response_serializer=passthrough
                ),
                "Watch": grpc.unary_stream_rpc_method_handler(
                    self.watch, request_deserializer=pb.TrafficSpec.FromString, response_serializer=passthrough
                ),
            },
        )

    @property
    def publications(self) -> int:
        """Targets with at least one open stream (each one subscription and one encoding)."""
        return len(self._publications)

    def _target(self, spec: pb.TrafficSpec) -> Target:
        if self._streams.stopping:
            raise Rejected(grpc.StatusCode.UNAVAILABLE, "the policy controller is shutting down")
        kind = spec.WhichOneof("target")
        if kind is None:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, "target is required")
        try:
            source_ns = parse_workload(spec.source_workload).namespace
        except InvalidWorkload as exc:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        try:
            if kind == "authority":
                return self.index.service_target(spec.authority, source_ns)
            if not spec.addr.HasField("ip"):
                raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, "traffic target must have an IP")
            try:
                ip = from_ip_address(spec.addr.ip)
            except InvalidAddress as exc:
                raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"failed to parse target addr: {exc}") from None
            return self.index.address_target(ip, spec.addr.port, source_ns)
        except InvalidTarget as exc:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except TargetNotFound as exc:
            raise Rejected(grpc.StatusCode.NOT_FOUND, str(exc)) from None

    async def get(self, request: pb.TrafficSpec, context: grpc.aio.ServicerContext) -> bytes:
        self._get.start()
        try:
            target = self._target(request)
            publication = self._publications.get(target)
            if publication is not None:
                message = publication.message
            else:
                try:
                    state = self.index.state(target)
                except TargetNotFound as exc:
                    raise Rejected(grpc.StatusCode.NOT_FOUND, str(exc)) from None
                message = encode(target, state, self.index.config).SerializeToString()
        except Rejected as rejected:
            self._get.end(rejected.code)
            await context.abort(rejected.code, rejected.message)
            raise AssertionError("abort returns only by raising") from None
        self._get.end(grpc.StatusCode.OK)
        return message

    async def watch(self, request: pb.TrafficSpec, context: grpc.aio.ServicerContext) -> None:
        self._watch.start()
        lag = self._lag

        def on_sent(delay: float | None) -> None:
            self._watch.sent()
            if delay is not None:  # None: the first answer, not caused by a change
                lag.observe(delay)

        try:
            target = self._target(request)
            stream = self._streams.new_stream(on_sent=on_sent, on_overflow=self._overflow.inc)
            try:
                publication = self._attach(target, stream)
            except TargetNotFound as exc:
                raise Rejected(grpc.StatusCode.NOT_FOUND, str(exc)) from None
        except Rejected as rejected:
            self._watch.end(rejected.code)
            await context.abort(rejected.code, rejected.message)
            return
        stream.send(publication.message, None)
        try:
            await self._streams.run(stream, context, lambda: self._detach(publication, stream),
                                    self._metrics.streams.labels("Watch"))
        finally:
            ended = stream.ended
            self._watch.end(grpc.StatusCode.CANCELLED if ended is None else _END_CODES[ended])

    def _attach(self, target: Target, stream: UpdateStream) -> _Publication:
        publication = self._publications.get(target)
        if publication is None:
            publication = _Publication(self, target)
            publication.encode(self.index.subscribe(target, publication))
            self._publications[target] = publication
        publication.streams.add(stream)
        return publication

    def _detach(self, publication: _Publication, stream: UpdateStream) -> None:
        if stream not in publication.streams:
            return
        publication.streams.discard(stream)
        if not publication.streams:
            self._publications.pop(publication.target, None)
            self.index.unsubscribe(publication.target, publication)
