"""The ``io.linkerd.proxy.inbound.InboundServerPolicies`` handlers: ``GetPort`` and ``WatchPort``.

Registered by ``tether.policy.service``.  A ``PortSpec`` names a workload
(``tether.policy.workload``: a pod, or an ExternalWorkload for a VM's proxy) and a
port: a bad workload string or a port outside 1-65535 is ``INVALID_ARGUMENT``; a
workload the index does not know (not there, or a pod not meshed) is
``NOT_FOUND`` "unknown server", as in Linkerd.
``WatchPort`` sends the port's policy at once and then every change, through
the bounded stream shared with destination (``tether.serving``); a pod deleted
under a watch ends it with OK.  Encodings are cached by value, so the streams
of every port with the same policy share one serialisation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import grpc

from tether.api import inbound_pb2 as pb
from tether.policy.config import PolicyConfig
from tether.policy.inbound.index import InboundIndex, UnknownPod
from tether.policy.inbound.translator import encode
from tether.policy.metrics import PolicyMetrics
from tether.policy.model import InboundServer
from tether.policy.workload import InvalidWorkload, Workload, parse_workload
from tether.serving.rpc import Rejected, StreamSet, passthrough
from tether.serving.stream import EndReason

SERVICE_NAME = "io.linkerd.proxy.inbound.InboundServerPolicies"
_END_CODES = {EndReason.OVERFLOW: grpc.StatusCode.RESOURCE_EXHAUSTED, EndReason.SHUTDOWN: grpc.StatusCode.OK,
              EndReason.GONE: grpc.StatusCode.OK}


class InboundPolicyServer:
    def __init__(self, config: PolicyConfig, index: InboundIndex, metrics: PolicyMetrics, streams: StreamSet) -> None:
        self._config = config
        self._index = index
        self._metrics = metrics
        self.streams = streams
        self._get = metrics.grpc.call(SERVICE_NAME, "GetPort", "unary")
        self._watch = metrics.grpc.call(SERVICE_NAME, "WatchPort", "server_stream")
        self._lag = metrics.delivery_lag.labels("WatchPort")
        self._overflow = metrics.queue_overflow.labels("WatchPort")
        networks = config.cluster_networks
        self.encode: Callable[[InboundServer], bytes] = functools.lru_cache(maxsize=4096)(
            lambda server: encode(server, networks))

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "GetPort": grpc.unary_unary_rpc_method_handler(
                self.get_port, request_deserializer=pb.PortSpec.FromString, response_serializer=passthrough),
            "WatchPort": grpc.unary_stream_rpc_method_handler(
                self.watch_port, request_deserializer=pb.PortSpec.FromString, response_serializer=passthrough),
        })

    def _target(self, spec: pb.PortSpec) -> tuple[Workload, int]:
        if self.streams.stopping:
            raise Rejected(grpc.StatusCode.UNAVAILABLE, "the policy controller is shutting down")
        try:
            workload = parse_workload(spec.workload)
        except InvalidWorkload as exc:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if not 0 < spec.port < 65536:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid port: {spec.port}")
        return workload, spec.port

    async def get_port(self, spec: pb.PortSpec, context: grpc.aio.ServicerContext) -> bytes:
        self._get.start()
        try:
            workload, port = self._target(spec)
            try:
                server = self._index.lookup(workload.namespace, workload.name, port, external=workload.external)
            except UnknownPod as exc:
                raise Rejected(grpc.StatusCode.NOT_FOUND, str(exc)) from None
        except Rejected as rejected:
            self._get.end(rejected.code)
            await context.abort(rejected.code, rejected.message)
            raise AssertionError("abort returns only by raising") from None
        self._get.end(grpc.StatusCode.OK)
        return self.encode(server)

    async def watch_port(self, spec: pb.PortSpec, context: grpc.aio.ServicerContext) -> None:
        self._watch.start()
        try:
            workload, port = self._target(spec)
        except Rejected as rejected:
            self._watch.end(rejected.code)
            await context.abort(rejected.code, rejected.message)
            return
        lag = self._lag

        def on_sent(delay: float | None) -> None:
            self._watch.sent()
            if delay is not None:
                lag.observe(delay)

        stream = self.streams.new_stream(on_sent=on_sent, on_overflow=self._overflow.inc)

        def listener(server: InboundServer | None, at: float | None) -> None:
            if server is None:
                stream.end(EndReason.GONE)
            else:
                stream.send(self.encode(server), at)

        ns, name, external = workload.namespace, workload.name, workload.external
        try:
            self._index.subscribe(ns, name, port, listener, external=external)
        except UnknownPod as exc:
            self._watch.end(grpc.StatusCode.NOT_FOUND)
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            return
        try:
            await self.streams.run(stream, context, lambda: self._index.unsubscribe(ns, name, port, listener, external=external),
                                   self._metrics.streams.labels("WatchPort"))
        finally:
            self._watch.end(_END_CODES.get(stream.ended, grpc.StatusCode.CANCELLED))
