"""The policy process serves both APIs on one port over mTLS, fed by one watch per type; metrics; restart."""

from __future__ import annotations

from pathlib import Path

import grpc
from policy_helpers import NS, Harness, Pki, http_route, namespace, pod, server, workload

from tether.api import outbound_pb2 as opb
from tether.api import outbound_pb2_grpc
from tether.policy import PolicyConfig, PolicyService
from tether.platform.local.watch import LocalResourceWatcher
from tether.serving.grpc_server import TlsFiles


def service(name: str = "web", ip: str = "10.96.0.10") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterIP": ip, "selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]}}


def outbound_route(name: str) -> dict:
    return {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                     "rules": [{"matches": [{"path": {"value": "/api"}}],
                                "backendRefs": [{"name": "web", "port": 80}]}]}}


async def test_inbound_and_outbound_on_one_port(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), server("web"), http_route("in", "web"), service(),
                       outbound_route("out")) as h:
        assert [r["ref"] for r in (await h.get(8080))["http_routes"]] == ["HTTPRoute/in"]
        stub = outbound_pb2_grpc.OutboundPoliciesStub(h.channel)
        spec = opb.TrafficSpec(source_workload=workload(), authority=f"web.{NS}.svc.cluster.local:80")
        policy = await stub.Get(spec, timeout=10)
        routes = policy.protocol.detect.http1.routes
        assert [r.metadata.resource.name for r in routes] == ["out"]
        watch = stub.Watch(spec)
        assert (await watch.read()) == policy
        h.delete("httproutes.policy.linkerd.io", "out")
        changed = await watch.read()
        assert [r.metadata.resource.name for r in changed.protocol.detect.http1.routes] != ["out"]
        watch.cancel()


async def test_metrics_count_rpcs_streams_and_the_index(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), server("web")) as h:
        watch = h.watch(8080)
        await watch.next()
        await h.get(8080)
        labels = {"grpc_service": "io.linkerd.proxy.inbound.InboundServerPolicies", "grpc_type": "unary",
                  "grpc_method": "GetPort"}
        assert h.metric("grpc_server_started_total", labels) == 1
        assert h.metric("grpc_server_handled_total", {**labels, "grpc_code": "OK"}) == 1
        watch_labels = {**labels, "grpc_method": "WatchPort", "grpc_type": "server_stream"}
        assert h.metric("grpc_server_msg_sent_total", watch_labels) == 1
        assert h.metric("policy_streams", {"method": "WatchPort"}) == 1
        assert h.metric("inbound_index_size", {"kind": "server"}) == 1
        assert h.metric("inbound_index_size", {"kind": "pod"}) == 1
        assert h.metric("inbound_index_watched_ports") == 1
        h.apply(server("web", protocol="opaque"))
        assert (await watch.next())["protocol"] == "opaque"
        assert h.metric("inbound_index_updates_total") == 1
        assert h.metric("policy_delivery_lag_seconds_count", {"method": "WatchPort"}) == 1


async def test_a_restarted_controller_serves_the_same_answers(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), server("web", protocol="HTTP/2"),
                       http_route("in", "web")) as h:
        before = await h.get(8080)
        watch = h.watch(8080)
        await watch.next()
        await h.service.stop()  # the stream ends cleanly; the proxy keeps its last policy and reconnects
        assert (await watch.code()).name == "OK"
        again = PolicyService(PolicyConfig(addr=h.address, admin_addr="127.0.0.1:0",
                                           tls=TlsFiles(pki.server_cert, pki.server_key, pki.ca)),
                              LocalResourceWatcher(h.store))
        await again.start()
        try:
            h.service = again
            assert await h.get(8080) == before
        finally:
            await again.stop()
            h.service = again  # stopped twice on exit: stop is idempotent


async def test_a_slow_stream_is_cut_off_and_others_keep_going(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), server("web"), stream_queue_capacity=2) as h:
        stalled_channel = grpc.aio.secure_channel(
            h.address, grpc.ssl_channel_credentials(pki.ca.read_bytes(), pki.client_key.read_bytes(),
                                                    pki.client_cert.read_bytes()),
            options=[("grpc.ssl_target_name_override", h.client_tls().server_name),
                     ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)])
        stalled = h.watch(8080, channel=stalled_channel)
        healthy = h.watch(8080)
        await healthy.next()
        for i in range(200):
            h.apply(server("web", access_policy=("all-unauthenticated", "deny")[i % 2]))
            await healthy.next()
            if h.metric("policy_updates_queue_overflow_total", {"method": "WatchPort"}) == 1:
                break
        assert h.metric("policy_updates_queue_overflow_total", {"method": "WatchPort"}) == 1
        h.apply(server("web", protocol="opaque"))
        assert (await healthy.next())["protocol"] == "opaque"
        stalled.call.cancel()
        await stalled_channel.close()
