"""OutboundPolicies over real gRPC with mTLS: the proxy's stub from proto/ against ``tether policy serve``'s service.

Nothing is mocked: objects go into a SQLite store, the local platform's watch
feeds the indexes, the server requires a client certificate from Tether's own CA.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from outbound_grpc_helpers import Harness, next_policy, spec
from outbound_helpers import NS, backend, egress_network, grpc_route, http_route, namespace, service
from policy_helpers import Pki, eventually

from tether.serving.channel import open_channel

from tether.api import outbound_pb2 as pb
from tether.api import outbound_pb2_grpc

WEB = "web.emojivoto.svc.cluster.local:80"
BASE = (namespace(NS), namespace("other"), service("web", "10.96.0.10"), service("api", "10.96.0.11"),
        service("api-v2", "10.96.0.12"))


def names(policy: pb.OutboundPolicy) -> list[str]:
    routes = policy.protocol.detect.http1.routes
    return [r.metadata.resource.name or f"default:{r.metadata.default}" for r in routes]


async def test_get_and_watch_routes_weights_filters_timeouts_retries_and_accrual(workdir: Path,
                                                                                pki: Pki) -> None:
    annotated = service("web", "10.96.0.10", annotations={
        "retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "2", "timeout.linkerd.io/response": "3s",
        "balancer.linkerd.io/failure-accrual": "consecutive",
        "balancer.linkerd.io/failure-accrual-consecutive-max-failures": "4"})
    route = http_route("split", "web", [{
        "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
        "filters": [{"type": "RequestHeaderModifier",
                     "requestHeaderModifier": {"set": [{"name": "x-route", "value": "split"}]}}],
        "backendRefs": [backend("api", weight=80), backend("api-v2", weight=20)],
        "timeouts": {"request": "10s"}}])
    async with Harness(workdir, pki, *BASE, annotated, route) as h:
        policy = await h.get_outbound(WEB)
        assert names(policy) == ["split"]
        rule = policy.protocol.detect.http1.routes[0].rules[0]
        assert [b.weight for b in rule.backends.random_available.backends] == [80, 20]
        assert rule.filters[0].request_header_modifier.set.headers[0].value == b"split"
        assert rule.timeouts.request.seconds == 10 and not rule.timeouts.HasField("response")
        assert rule.retry.max_retries == 2 and rule.retry.conditions.status_ranges[0].start == 500
        accrual = policy.protocol.detect.http1.failure_accrual.consecutive_failures
        assert accrual.max_failures == 4

        watch = h.watch_outbound(WEB)
        assert await next_policy(watch) == policy


async def test_an_update_is_streamed_on_each_kind_of_change(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, *BASE) as h:
        watch = h.watch_outbound(WEB)
        assert names(await next_policy(watch)) == ["default:http"]
        by_ip = h.watch_outbound(addr=("10.96.0.10", 80))
        assert names(await next_policy(by_ip)) == ["default:http"]

        h.apply(http_route("r1", "web", [{"backendRefs": [backend("ghost")]}]))  # HTTPRoute (policy group)
        policy = await next_policy(watch)
        assert names(policy) == ["r1"]
        ghost = policy.protocol.detect.http1.routes[0].rules[0].backends.random_available.backends[0]
        assert ghost.backend.filters[0].failure_injector.status == 500  # dangling backend: fails, grants nothing
        dangling = {"kind": "HTTPRoute", "reason": "backend_not_found"}
        assert h.metric("outbound_index_ignored", dangling) == 1
        assert names(await next_policy(by_ip)) == ["r1"]

        h.apply(service("ghost", "10.96.0.50"))  # Service: the backend becomes real
        backend_ = (await next_policy(watch)).protocol.detect.http1.routes[0].rules[0].backends.random_available
        assert backend_.backends[0].backend.backend.balancer.discovery.dst.path.startswith("ghost.")
        assert h.metric("outbound_index_ignored", dangling) is None

        h.apply(http_route("r0", "web", [{}], gateway=True))  # Gateway HTTPRoute (the store stamps creation times)
        assert sorted(names(await next_policy(watch))) == ["r0", "r1"]

        h.apply(service("web", "10.96.0.10", annotations={"timeout.linkerd.io/idle": "1m"}))  # annotations
        policy = await next_policy(watch)
        assert policy.protocol.detect.http1.routes[0].rules[0].timeouts.idle.seconds == 60

        h.apply(namespace(NS, {"config.linkerd.io/opaque-ports": "80"}))  # Namespace: opaque ports
        assert (await next_policy(watch)).protocol.WhichOneof("kind") == "opaque"
        h.apply(namespace(NS))
        assert (await next_policy(watch)).protocol.WhichOneof("kind") == "detect"

        h.apply(grpc_route("rpc", "web", [{}]))  # GRPCRoute
        # Routes count once their status is written (read back, as Linkerd's index does): the GRPCRoute's
        # Accepted and the two HTTPRoutes' RouteReasonConflicted land one by one: one to three updates, ending here.
        for _ in range(3):
            routes = (await next_policy(watch)).protocol.grpc.routes
            if [r.metadata.resource.name for r in routes] == ["rpc"]:
                break
        else:
            raise AssertionError("the GRPCRoute never reached the stream")

        h.remove(grpc_route("rpc", "web", [{}]))
        h.remove(http_route("r0", "web", [{}], gateway=True))
        h.remove(http_route("r1", "web", [{}]))
        # Three watches (one per route type) deliver the deletions: one to three updates, ending here.
        for _ in range(3):
            if names(await next_policy(watch)) == ["default:http"]:
                break
        else:
            raise AssertionError("the deletions never reached the stream")
        # One subscription and one encoding shared by the two streams of each target.
        assert h.service.outbound.publications == 2 and h.service.outbound_index.watched_targets == 2


async def test_producer_and_consumer_routes(workdir: Path, pki: Pki) -> None:
    consumer = http_route("consumer", "web", [{"backendRefs": [backend("api-v2", namespace=NS)]}], ns="other",
                          parent_ns=NS)
    async with Harness(workdir, pki, *BASE, http_route("producer", "web", [{}]), consumer) as h:
        assert names(await h.get_outbound(WEB, ns=NS)) == ["producer"]
        assert sorted(names(await h.get_outbound(WEB, ns="other"))) == ["consumer", "producer"]
        assert names(await h.get_outbound(WEB, ns="third")) == ["producer"]


async def test_egress_networks_allow_deny_and_fallback(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, *BASE) as h:
        fallback = h.watch_outbound(addr=("93.184.216.34", 443))
        assert (await next_policy(fallback)).metadata.default == "egress-fallback"
        h.apply(egress_network("deny-example", "Deny", [{"cidr": "93.184.216.0/24"}]))
        denied = await next_policy(fallback)  # the open stream follows the new resolution
        assert denied.metadata.resource.kind == "EgressNetwork"
        assert denied.protocol.detect.opaque.routes[0].rules[0].filters[0].HasField("forbidden")
        assert denied.protocol.detect.http1.routes[-1].rules[0].filters[0].failure_injector.status == 403
        h.apply(egress_network("allow-all", "Allow"))
        allowed = await h.get_outbound(addr=("1.1.1.1", 80))
        assert allowed.metadata.resource.name == "allow-all"
        assert allowed.protocol.detect.http1.routes[-1].metadata.default == "http-egress-allow"
        assert (await h.get_outbound(addr=("93.184.216.34", 443))).metadata.resource.name == "deny-example"


async def test_errors_are_linkerds_status_codes(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, *BASE) as h:
        cases = [
            (pb.TrafficSpec(source_workload='{"ns":"emojivoto","pod":"a"}'), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.TrafficSpec(source_workload="nonsense", authority=WEB), grpc.StatusCode.INVALID_ARGUMENT),
            (spec("web.emojivoto:80", None, NS), grpc.StatusCode.NOT_FOUND),
            (spec(None, ("10.9.9.9", 80), NS), grpc.StatusCode.NOT_FOUND),
            (spec(None, ("10.96.0.10", 0), NS), grpc.StatusCode.INVALID_ARGUMENT),
        ]
        for request, code in cases:
            try:
                await h.stub.Get(request)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == code, (request, exc)
            else:
                raise AssertionError(f"{request} answered")
        # An undefined port of a Service's cluster IP: a Forbidden policy, not an error.
        undefined = await h.get_outbound(addr=("10.96.0.10", 9999))
        assert undefined.protocol.opaque.routes[0].rules[0].filters[0].HasField("forbidden")
        # Legacy ns:pod workload strings work.
        legacy = await h.stub.Get(pb.TrafficSpec(source_workload="emojivoto:web-0", authority=WEB))
        assert legacy.metadata.resource.name == "web"


async def test_a_client_without_a_certificate_is_refused(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, *BASE) as h:
        channel = open_channel(h.address, h.client_tls(with_cert=False))
        try:
            await outbound_pb2_grpc.OutboundPoliciesStub(channel).Get(spec(WEB, None, NS), timeout=5)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        else:
            raise AssertionError("a client without a certificate was served")
        finally:
            await channel.close()


async def test_a_slow_stream_is_cut_off_and_others_keep_going(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, *BASE, stream_queue_capacity=2) as h:
        stalled_channel = h.stalled_channel()
        stalled = h.watch_outbound(WEB, channel=stalled_channel)
        healthy = h.watch_outbound(WEB)
        await next_policy(healthy)
        await eventually(lambda: len(h.service.streams) == 2)
        # Large policies (many hostnames) fill the stalled client's flow-control window, then its queue.
        hosts = [f"h{i}.example.com" for i in range(200)]
        for round_ in range(200):
            h.apply(http_route("big", "web", [{}], hostnames=hosts[: 100 + round_ % 2]))
            await next_policy(healthy)  # the healthy client hears every change
            if len(h.service.streams) == 1:
                break
        else:
            raise AssertionError("the stalled stream was never cut off")
        h.apply(http_route("after", "web", [{}], created="2030-01-01T00:00:00Z"))
        assert "after" in names(await next_policy(healthy))
        try:
            while await stalled.read() is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        else:
            raise AssertionError("the stalled stream ended with OK")
        await stalled_channel.close()
        assert h.metric("policy_updates_queue_overflow_total", {"method": "Watch"}) == 1
        handled = {"grpc_service": "io.linkerd.proxy.outbound.OutboundPolicies", "grpc_method": "Watch",
                   "grpc_type": "server_stream", "grpc_code": "RESOURCE_EXHAUSTED"}
        # The handler counts the call once its abort returns, which may be after the client saw the status.
        await eventually(lambda: h.metric("grpc_server_handled_total", handled) == 1)
