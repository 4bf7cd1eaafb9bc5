"""``Get`` against the real server and store: snapshot then diffs, endpoint rules, identities and hints, errors."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from destination_helpers import (
    CLIENT_NAME,
    NS,
    Harness,
    Pki,
    addrs,
    authority,
    by_addr,
    eventually,
    namespace,
    pod,
    server,
    service,
)

WEB_ID = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"


async def test_snapshot_then_diffs_on_scale_up_and_scale_down(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1"), pod("web-2", "10.1.0.2")) as h:
        stream = h.get(authority())
        first = await stream.next()
        assert addrs(first) == ["10.1.0.1:8080", "10.1.0.2:8080"]
        assert first["add"]["metric_labels"] == {"namespace": NS, "service": "web"}

        h.apply(pod("web-3", "10.1.0.3"))  # scale up
        assert addrs(await stream.next()) == ["10.1.0.3:8080"]

        h.delete("Pod", "web-1")  # scale down
        assert await stream.next() == {"remove": ["10.1.0.1:8080"]}

        # One store transaction, two events, read in one batch: one coalesced update.
        h.apply(pod("web-4", "10.1.0.4"), pod("web-5", "10.1.0.5"))
        assert addrs(await stream.next()) == ["10.1.0.4:8080", "10.1.0.5:8080"]


async def test_readiness_phase_and_ip_decide_membership(workdir: Path, pki: Pki) -> None:
    objects = [
        namespace(), service(), pod("web-1", "10.1.0.1"),
        pod("web-pending", "10.1.0.7", phase="Pending", ready=False),
        pod("web-no-ip", None, phase="Pending", ready=False),
        pod("web-unready", "10.1.0.8", ready=False),
    ]
    async with Harness(workdir, pki, *objects) as h:
        stream = h.get(authority())
        assert addrs(await stream.next()) == ["10.1.0.1:8080"]

        h.apply(pod("web-1", "10.1.0.1", ready=False))
        assert await stream.next() == {"remove": ["10.1.0.1:8080"]}
        h.apply(pod("web-1", "10.1.0.1", ready=True))
        assert addrs(await stream.next()) == ["10.1.0.1:8080"]
        h.apply(pod("web-unready", "10.1.0.8", ready=True))
        assert addrs(await stream.next()) == ["10.1.0.8:8080"]
        h.apply(pod("web-1", "10.1.0.1", phase="Succeeded", ready=False))
        assert await stream.next() == {"remove": ["10.1.0.1:8080"]}


async def test_changes_to_unselected_pods_send_nothing(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), service("emoji"), pod("web-1", "10.1.0.1")) as h:
        stream = h.get(authority())
        assert addrs(await stream.next()) == ["10.1.0.1:8080"]
        # Another service's pods come and go; then one of ours: that must be the next message.
        h.apply(pod("emoji-1", "10.1.1.1", app="emoji"))
        h.apply(pod("emoji-1", "10.1.1.1", app="emoji", ready=False))
        h.apply(pod("web-2", "10.1.0.2"))
        assert addrs(await stream.next()) == ["10.1.0.2:8080"]


async def test_named_target_port_resolves_per_pod(workdir: Path, pki: Pki) -> None:
    objects = [
        namespace(),
        service(ports=[{"name": "http", "port": 80, "targetPort": "web-http"}]),
        pod("web-1", "10.1.0.1", ports=[("web-http", 8080)]),
        pod("web-2", "10.1.0.2", ports=[("web-http", 9090)]),
        pod("web-3", "10.1.0.3", ports=[("other", 7000)]),  # lacks the named port: not an endpoint
    ]
    async with Harness(workdir, pki, *objects) as h:
        stream = h.get(authority())
        assert addrs(await stream.next()) == ["10.1.0.1:8080", "10.1.0.2:9090"]
        # The Service retargets to a number: every address changes port.
        h.apply(service(ports=[{"name": "http", "port": 80, "targetPort": 7000}]))
        first, second = await stream.next(), await stream.next()
        assert addrs(first) == ["10.1.0.1:7000", "10.1.0.2:7000", "10.1.0.3:7000"]
        assert sorted(second["remove"]) == ["10.1.0.1:8080", "10.1.0.2:9090"]


async def test_no_endpoints_then_service_deleted_and_recreated(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1", ready=False)) as h:
        stream = h.get(authority())
        assert await stream.next() == {"no_endpoints": {"exists": True}}
        h.apply(pod("web-1", "10.1.0.1"))
        assert addrs(await stream.next()) == ["10.1.0.1:8080"]
        h.delete("Service", "web")
        assert await stream.next() == {"no_endpoints": {"exists": False}}
        h.apply(service())
        update = await stream.next()
        if "no_endpoints" in update:  # the Service came back before its EndpointSlice did
            assert update == {"no_endpoints": {"exists": True}}
            update = await stream.next()
        assert addrs(update) == ["10.1.0.1:8080"]


async def test_meshed_pod_gets_identity_h2_and_labels(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1")) as h:
        [endpoint] = (await h.get(authority()).next())["add"]["addrs"]
        assert endpoint["weight"] == 10000
        assert endpoint["tls_identity"] == WEB_ID
        assert endpoint["server_name"] == WEB_ID
        assert endpoint["protocol_hint"] == "h2"
        assert "opaque_transport_port" not in endpoint
        assert endpoint["http2"]["keep_alive_while_idle"] is True
        assert endpoint["resource"] == {"kind": "Pod", "namespace": NS, "name": "web-1"}
        assert endpoint["metric_labels"] == {
            "pod": "web-1",
            "deployment": "web",  # ReplicaSet web-5d4f8 -> Deployment web, by the pod-template-hash
            "pod_template_hash": "5d4f8",
            "serviceaccount": "web",
            "control_plane_ns": "linkerd",
            "zone": "",
            "zone_locality": "unknown",  # the local platform has no nodes, so no subscriber zone
        }


@pytest.mark.parametrize(
    ("pod_kwargs", "expect"),
    [
        pytest.param({"meshed": False}, {"identity": None, "hint": None}, id="unmeshed"),
        pytest.param({"control_plane": "other-cp"}, {"identity": None, "hint": "h2"}, id="other-control-plane"),
        pytest.param({"native_sidecar": True}, {"identity": WEB_ID, "hint": "h2"}, id="native-sidecar"),
        pytest.param({"control_plane": None}, {"identity": WEB_ID, "hint": "h2"}, id="proxy-without-label"),
        pytest.param({"annotations": {"config.linkerd.io/opaque-ports": "8080"}},
                     {"identity": WEB_ID, "hint": "opaque", "transport": 4143}, id="opaque-by-annotation"),
        pytest.param({"annotations": {"config.linkerd.io/opaque-ports": "http"}},
                     {"identity": WEB_ID, "hint": "opaque", "transport": 4143}, id="opaque-by-port-name"),
        pytest.param({"annotations": {"config.linkerd.io/opaque-ports": "8000-8100"}},
                     {"identity": WEB_ID, "hint": "opaque", "transport": 4143}, id="opaque-by-range"),
        pytest.param({"annotations": {"config.linkerd.io/skip-inbound-ports": "8080"}},
                     {"identity": None, "hint": None}, id="skip-inbound"),
        pytest.param({"meshed": True, "proxy_env": False, "annotations": {"config.linkerd.io/opaque-ports": "8080"}},
                     {"identity": WEB_ID, "hint": "opaque", "transport": 4143}, id="inbound-port-from-port-name"),
    ],
)
async def test_identity_and_hint_per_pod(workdir: Path, pki: Pki, pod_kwargs: dict, expect: dict) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1", **pod_kwargs)) as h:
        [endpoint] = (await h.get(authority()).next())["add"]["addrs"]
        assert endpoint.get("tls_identity") == expect["identity"]
        assert endpoint.get("protocol_hint") == expect["hint"]
        assert endpoint.get("opaque_transport_port") == expect.get("transport")


async def test_opaque_by_default_ports_and_namespace_annotation(workdir: Path, pki: Pki) -> None:
    objects = [
        namespace(annotations={"config.linkerd.io/opaque-ports": "9000"}),
        service("db", ports=[{"name": "mysql", "port": 3306, "targetPort": 3306}]),
        service(ports=[{"name": "http", "port": 80, "targetPort": 9000}]),
        pod("db-1", "10.1.2.1", app="db", ports=[("mysql", 3306)]),
        pod("web-1", "10.1.0.1", ports=[("http", 9000)]),
    ]
    async with Harness(workdir, pki, *objects) as h:
        [db] = (await h.get(authority("db", 3306)).next())["add"]["addrs"]
        [web] = (await h.get(authority()).next())["add"]["addrs"]
        # The namespace's annotation replaces the defaults for pods without their own.
        assert db["protocol_hint"] == "h2"
        assert web["protocol_hint"] == "opaque"


async def test_server_makes_a_port_opaque_while_subscribed(workdir: Path, pki: Pki) -> None:
    objects = [namespace(), service(), pod("web-1", "10.1.0.1"), pod("admin-1", "10.1.0.9", app="admin")]
    async with Harness(workdir, pki, *objects) as h:
        stream = h.get(authority())
        assert by_addr(await stream.next())["10.1.0.1:8080"]["protocol_hint"] == "h2"
        h.apply(server("web-http", port="http"))  # by container-port name
        endpoint = by_addr(await stream.next())["10.1.0.1:8080"]
        assert (endpoint["protocol_hint"], endpoint["opaque_transport_port"]) == ("opaque", 4143)
        h.apply(server("web-http", port="http", protocol="HTTP/1"))
        assert by_addr(await stream.next())["10.1.0.1:8080"]["protocol_hint"] == "h2"
        h.apply(server("web-num", port=8080))  # by number
        assert by_addr(await stream.next())["10.1.0.1:8080"]["protocol_hint"] == "opaque"


async def test_transport_header_mode_and_disabled_h2(workdir: Path, pki: Pki) -> None:
    objects = [namespace(), service(), pod("web-1", "10.1.0.1")]
    async with Harness(workdir, pki, *objects, force_opaque_transport=True, enable_h2_upgrade=False) as h:
        [endpoint] = (await h.get(authority()).next())["add"]["addrs"]
        assert endpoint["protocol_hint"] == "unknown"
        assert endpoint["opaque_transport_port"] == 4143


async def test_streams_for_one_target_share_a_subscription(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1")) as h:
        streams = [h.get(authority()) for _ in range(5)]
        for stream in streams:
            assert addrs(await stream.next()) == ["10.1.0.1:8080"]
        assert h.service.endpoints.publishers == 1
        labels = {"cluster": "local", "namespace": NS, "service": "web", "port": "80", "hostname": "", "nodename": ""}
        assert h.metric("endpoints_subscribers", labels) == 5
        h.apply(pod("web-2", "10.1.0.2"))
        for stream in streams:
            assert addrs(await stream.next()) == ["10.1.0.2:8080"]
        for stream in streams:
            stream.cancel()
        await eventually(lambda: h.service.endpoints.publishers == 0)
        assert h.metric("endpoints_subscribers", labels) is None


@pytest.mark.parametrize(
    ("path", "code"),
    [
        pytest.param("web.emojivoto.svc.cluster.local:http", grpc.StatusCode.INVALID_ARGUMENT, id="bad-port"),
        pytest.param("web.emojivoto.svc.cluster.local:70000", grpc.StatusCode.INVALID_ARGUMENT, id="port-range"),
        pytest.param("a:b:c", grpc.StatusCode.INVALID_ARGUMENT, id="malformed"),
        pytest.param("", grpc.StatusCode.INVALID_ARGUMENT, id="empty"),
        pytest.param("10.1.0.1:8080", grpc.StatusCode.INVALID_ARGUMENT, id="ipv4"),
        pytest.param("[fd00::1]:8080", grpc.StatusCode.INVALID_ARGUMENT, id="ipv6"),
        pytest.param("web.emojivoto.svc.example.org:80", grpc.StatusCode.INVALID_ARGUMENT, id="other-cluster"),
        pytest.param("web.emojivoto:80", grpc.StatusCode.INVALID_ARGUMENT, id="short-name"),
        pytest.param("y.x.web.emojivoto.svc.cluster.local:80", grpc.StatusCode.INVALID_ARGUMENT, id="label-count"),
        pytest.param("nope.emojivoto.svc.cluster.local:80", grpc.StatusCode.NOT_FOUND, id="unknown-service"),
        pytest.param("ext.emojivoto.svc.cluster.local:80", grpc.StatusCode.INVALID_ARGUMENT, id="external-name"),
    ],
)
async def test_error_codes(workdir: Path, pki: Pki, path: str, code: grpc.StatusCode) -> None:
    async with Harness(workdir, pki, namespace(), service(), service("ext", type_="ExternalName")) as h:
        error = await h.get(path).error()
        assert error.code() == code, error.details()


async def test_client_certificates_required_with_trust_anchors(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1"), require_client_certs=True) as h:
        assert addrs(await h.get(authority()).next()) == ["10.1.0.1:8080"]
        anonymous = h.open_channel(with_cert=False)
        try:
            error = await h.get(authority(), channel=anonymous).error()
            assert error.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await anonymous.close()
    assert CLIENT_NAME  # the client certificate's identity, for the record
