"""The outbound side of the policy tests' ``Harness``: the real ``PolicyService`` (mTLS, a real store), called
with the ``OutboundPolicies`` stub generated from ``proto/`` as a linkerd2-proxy would call it."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_streams import next_message
from outbound_helpers import NS, type_key
from policy_helpers import WAIT, workload
from policy_helpers import Harness as PolicyHarness

from tether.api import outbound_pb2 as pb
from tether.api import outbound_pb2_grpc
from tether.api.addresses import to_tcp_address


class Harness(PolicyHarness):
    @property
    def stub(self) -> outbound_pb2_grpc.OutboundPoliciesStub:
        return outbound_pb2_grpc.OutboundPoliciesStub(self.channel)

    def stalled_channel(self) -> grpc.aio.Channel:
        """A client with a tiny flow-control window (1 KiB, no BDP growth): once it stops reading, writes block."""
        roots, key, cert = (path.read_bytes() for path in (self.pki.ca, self.pki.client_key, self.pki.client_cert))
        credentials = grpc.ssl_channel_credentials(roots, key, cert)
        tls = self.client_tls()
        return grpc.aio.secure_channel(self.address, credentials, options=[
            ("grpc.ssl_target_name_override", tls.server_name), ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", 1024)])

    def remove(self, obj: dict[str, Any]) -> None:
        assert self.store.delete(type_key(obj), obj["metadata"].get("namespace"), obj["metadata"]["name"])

    def watch_outbound(self, authority: str | None = None, addr: tuple[str, int] | None = None, ns: str = NS,
                       channel: grpc.aio.Channel | None = None) -> Any:
        return outbound_pb2_grpc.OutboundPoliciesStub(channel or self.channel).Watch(spec(authority, addr, ns))

    async def get_outbound(self, authority: str | None = None, addr: tuple[str, int] | None = None,
                           ns: str = NS) -> pb.OutboundPolicy:
        return await self.stub.Get(spec(authority, addr, ns), timeout=WAIT)


def spec(authority: str | None, addr: tuple[str, int] | None, ns: str) -> pb.TrafficSpec:
    if addr is not None:
        return pb.TrafficSpec(source_workload=workload("client-0", ns), addr=to_tcp_address(*addr))
    return pb.TrafficSpec(source_workload=workload("client-0", ns), authority=authority or "")


async def next_policy(call: Any) -> pb.OutboundPolicy:
    return await next_message(call)
