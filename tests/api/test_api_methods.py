"""The 8 gRPC methods of linkerd2-proxy-api v0.20: paths, message types, streaming kind.

Checked in the service descriptors, in the generated stubs (which multicallable
each method uses), and once over a real loopback gRPC channel.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from tether.api import destination_pb2, destination_pb2_grpc, identity_pb2, identity_pb2_grpc

# full path, request, response (both in the service's package), grpcio multicallable;
# from proxy-api.md section 1.
METHODS_TABLE = """
/io.linkerd.proxy.destination.Destination/Get              GetDestination  Update              unary_stream
/io.linkerd.proxy.destination.Destination/GetProfile       GetDestination  DestinationProfile  unary_stream
/io.linkerd.proxy.identity.Identity/Certify                CertifyRequest  CertifyResponse     unary_unary
/io.linkerd.proxy.inbound.InboundServerPolicies/GetPort    PortSpec        Server              unary_unary
/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort  PortSpec        Server              unary_stream
/io.linkerd.proxy.outbound.OutboundPolicies/Get            TrafficSpec     OutboundPolicy      unary_unary
/io.linkerd.proxy.outbound.OutboundPolicies/Watch          TrafficSpec     OutboundPolicy      unary_stream
/io.linkerd.proxy.tap.Tap/Observe                          ObserveRequest  TapEvent            unary_stream
"""


def _parse_methods() -> dict[str, tuple[str, str, str]]:
    methods = {}
    for line in METHODS_TABLE.strip().splitlines():
        path, request, response, kind = line.split()
        package = path[1:].rsplit(".", 1)[0]  # "/io.linkerd.proxy.tap.Tap/Observe" -> "io.linkerd.proxy.tap"
        methods[path] = (f"{package}.{request}", f"{package}.{response}", kind)
    return methods


METHODS = _parse_methods()
# generated module -> its client stub class
STUBS = {
    "destination": "DestinationStub",
    "identity": "IdentityStub",
    "inbound": "InboundServerPoliciesStub",
    "outbound": "OutboundPoliciesStub",
    "tap": "TapStub",
}
ALL_FILES = [
    *STUBS, "net", "meta", "http_types", "http_route", "grpc_route", "opaque_route", "tls_route", "transport",
]


def _service_descriptors() -> Iterator[Any]:
    for module in ALL_FILES:
        descriptor = importlib.import_module(f"tether.api.{module}_pb2").DESCRIPTOR
        yield from descriptor.services_by_name.values()


def test_descriptors_declare_exactly_the_eight_methods() -> None:
    actual = {}
    for service in _service_descriptors():
        for method in service.methods:
            assert not method.client_streaming, f"{method.full_name} streams from the client"
            kind = "unary_stream" if method.server_streaming else "unary_unary"
            path = f"/{service.full_name}/{method.name}"
            actual[path] = (method.input_type.full_name, method.output_type.full_name, kind)
    assert actual == METHODS


class _RecordingChannel:
    """Stands in for grpc.Channel: records which multicallable each stub method asks for."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, Any]] = {}

    def _record(self, kind: str) -> Any:
        def make(path: str, response_deserializer: Any, **_: Any) -> str:
            self.calls[path] = (kind, response_deserializer)
            return path

        return make

    def __getattr__(self, kind: str) -> Any:
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._record(kind)
        raise AttributeError(kind)


def test_generated_stubs_use_the_right_paths_multicallables_and_response_types() -> None:
    channel = _RecordingChannel()
    for module, stub in STUBS.items():
        getattr(importlib.import_module(f"tether.api.{module}_pb2_grpc"), stub)(channel)
    assert {path: kind for path, (kind, _) in channel.calls.items()} == {
        path: kind for path, (_, _, kind) in METHODS.items()
    }
    for path, (_, deserialize) in channel.calls.items():
        assert deserialize(b"").DESCRIPTOR.full_name == METHODS[path][1]


class _Destination(destination_pb2_grpc.DestinationServicer):
    def Get(self, request: destination_pb2.GetDestination, context: grpc.ServicerContext) -> Iterator[Any]:
        yield destination_pb2.Update(no_endpoints=destination_pb2.NoEndpoints(exists=True))
        labels = {"path": request.path}
        yield destination_pb2.Update(add=destination_pb2.WeightedAddrSet(metric_labels=labels))


class _Identity(identity_pb2_grpc.IdentityServicer):
    def Certify(self, request: identity_pb2.CertifyRequest, context: grpc.ServicerContext) -> Any:
        return identity_pb2.CertifyResponse(leaf_certificate=request.certificate_signing_request[::-1])


@pytest.fixture
def channel() -> Iterator[grpc.Channel]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    destination_pb2_grpc.add_DestinationServicer_to_server(_Destination(), server)
    identity_pb2_grpc.add_IdentityServicer_to_server(_Identity(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
            yield chan
    finally:
        server.stop(grace=None)


def test_streaming_and_unary_calls_work_over_grpcio(channel: grpc.Channel) -> None:
    request = destination_pb2.GetDestination(scheme="k8s", path="web.shop.svc.cluster.local:80")
    updates = list(destination_pb2_grpc.DestinationStub(channel).Get(request, timeout=10))
    assert [u.WhichOneof("update") for u in updates] == ["no_endpoints", "add"]
    assert updates[1].add.metric_labels["path"] == "web.shop.svc.cluster.local:80"

    reply = identity_pb2_grpc.IdentityStub(channel).Certify(
        identity_pb2.CertifyRequest(certificate_signing_request=b"\x01\x02\x03"), timeout=10
    )
    assert reply.leaf_certificate == b"\x03\x02\x01"


def test_unimplemented_methods_answer_unimplemented(channel: grpc.Channel) -> None:
    stub = destination_pb2_grpc.DestinationStub(channel)
    stream = stub.GetProfile(destination_pb2.GetDestination(), timeout=10)
    with pytest.raises(grpc.RpcError) as failure:
        next(iter(stream))
    assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED
