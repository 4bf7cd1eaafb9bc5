"""``GetProfile`` against the real server and store: translation, lookup order, updates and dedup, IPs, errors."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from destination_helpers import NS, Harness, Pki, authority, namespace, pod, profile, server, service, token

from tether.api import destination_pb2 as pb
from tether.destination.client import profile_dict

WEB_ID = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
FQDN = "web.emojivoto.svc.cluster.local"
DEFAULT_BUDGET = {"retry_ratio": 0.2, "min_retries_per_second": 10, "ttl_s": 10.0}
EMPTY = profile_dict(pb.DestinationProfile())


async def test_default_profile_when_there_is_no_service_profile(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service()) as h:
        doc = await h.get_profile(authority()).next()
        assert doc == {
            "fully_qualified_name": FQDN,
            "opaque_protocol": False,
            "routes": [],
            "dst_overrides": [],
            "retry_budget": DEFAULT_BUDGET,
            "parent_ref": {"group": "core", "kind": "Service", "namespace": NS, "name": "web", "port": 80},
            "profile_ref": {"group": "linkerd.io", "kind": "", "namespace": "", "name": ""},
        }


async def test_service_profile_is_translated(workdir: Path, pki: Pki) -> None:
    sp = profile(
        routes=[
            {
                "name": "GET /books/{id}",
                "condition": {"method": "GET", "pathRegex": "/books/[^/]*"},
                "responseClasses": [{"condition": {"status": {"min": 500, "max": 599}}, "isFailure": True},
                                    {"condition": {"not": {"status": {"min": 200}}}}],
                "isRetryable": True,
                "timeout": "250ms",
            },
            {
                "name": "vote",
                "condition": {"all": [{"method": "POST"}, {"any": [{"pathRegex": "/a"}, {"pathRegex": "/b"}]},
                                      {"not": {"method": "PURGE"}}]},
            },
        ],
        retryBudget={"retryRatio": 0.5, "minRetriesPerSecond": 3, "ttl": "1m"},
        dstOverrides=[{"authority": "web-v2.emojivoto.svc.cluster.local", "weight": "500m"},
                      {"authority": "web-v1.emojivoto.svc.cluster.local:8080", "weight": 1}],
    )
    async with Harness(workdir, pki, namespace(), service(), sp) as h:
        doc = await h.get_profile(authority()).next()
        first, second = doc["routes"]
        assert first == {
            "metrics_labels": {"route": "GET /books/{id}"},
            "condition": {"all": [{"path_regex": "/books/[^/]*"}, {"method": "GET"}]},
            "response_classes": [
                {"condition": {"status": {"min": 500, "max": 599}}, "is_failure": True},
                {"condition": {"not": {"status": {"min": 200, "max": 0}}}, "is_failure": False},
            ],
            "is_retryable": True,
            "timeout_s": 0.25,
        }
        assert second["condition"] == {"all": [
            {"method": "POST"},
            {"any": [{"path_regex": "/a"}, {"path_regex": "/b"}]},
            {"not": {"method": "PURGE"}},
        ]}
        assert "timeout_s" not in second and second["is_retryable"] is False
        assert doc["retry_budget"] == {"retry_ratio": 0.5, "min_retries_per_second": 3, "ttl_s": 60.0}
        assert doc["dst_overrides"] == [
            {"authority": "web-v2.emojivoto.svc.cluster.local:80", "weight": 5000},
            {"authority": "web-v1.emojivoto.svc.cluster.local:8080", "weight": 10000},
        ]
        assert doc["profile_ref"] == {"group": "linkerd.io", "kind": "ServiceProfile", "namespace": NS,
                                      "name": FQDN}


def _route_names(doc: dict) -> list[str]:
    return [r["metrics_labels"]["route"] for r in doc["routes"]]


async def test_client_namespace_profile_wins_then_falls_back(workdir: Path, pki: Pki) -> None:
    async with Harness(
        workdir, pki, namespace(), namespace("client"), service(),
        profile(routes=[{"name": "server-side", "condition": {"method": "GET"}}]),
        profile(ns="client", routes=[{"name": "client-side", "condition": {"method": "GET"}}]),
    ) as h:
        as_client = h.get_profile(authority(), token("client"))
        assert _route_names(await as_client.next()) == ["client-side"]
        legacy = h.get_profile(authority(), "ns:client")
        assert _route_names(await legacy.next()) == ["client-side"]
        no_token = h.get_profile(authority())
        assert _route_names(await no_token.next()) == ["server-side"]
        same_ns = h.get_profile(authority(), token(NS))
        assert _route_names(await same_ns.next()) == ["server-side"]

        h.delete("ServiceProfile.linkerd.io", f"{FQDN}", "client")  # the client's own profile goes: fall back
        assert _route_names(await as_client.next()) == ["server-side"]
        h.delete("ServiceProfile.linkerd.io", f"{FQDN}", NS)
        assert _route_names(await as_client.next()) == []
        h.apply(profile(ns="client", routes=[{"name": "client-again", "condition": {"method": "GET"}}]))
        assert _route_names(await as_client.next()) == ["client-again"]


async def test_updates_are_sent_when_an_input_changes_and_only_then(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), profile()) as h:
        stream = h.get_profile(authority())
        assert _route_names(await stream.next()) == ["GET /"]
        # A change the proxy cannot see (a label on the profile): no message...
        relabelled = profile()
        relabelled["metadata"]["labels"] = {"team": "books"}
        h.apply(relabelled)
        # ...so the next message is the one for the next real change.
        h.apply(profile(routes=[{"name": "POST /", "condition": {"method": "POST"}}]))
        assert _route_names(await stream.next()) == ["POST /"]
        h.apply(service(annotations={"config.linkerd.io/opaque-ports": "http"}))  # by service port name
        assert (await stream.next())["opaque_protocol"] is True
        h.apply(service(annotations={"config.linkerd.io/opaque-ports": "80"}))  # same set: nothing
        h.apply(service(annotations={}))
        assert (await stream.next())["opaque_protocol"] is False
        assert h.metric("destination_updates_sent_total", {"kind": "profile"}) == 4


async def test_opaque_protocol_follows_namespace_and_default_ports(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(),
                       service("db", ports=[{"name": "mysql", "port": 3306, "targetPort": 3306}])) as h:
        assert (await h.get_profile(authority("db", 3306)).next())["opaque_protocol"] is True
        stream = h.get_profile(authority("db", 3306))
        assert (await stream.next())["opaque_protocol"] is True
        h.apply(namespace(annotations={"config.linkerd.io/opaque-ports": "9999"}))
        assert (await stream.next())["opaque_protocol"] is False


async def test_endpoint_profile_for_a_pod_ip(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1")) as h:
        stream = h.get_profile("10.1.0.1:8080")
        doc = await stream.next()
        assert doc["fully_qualified_name"] == "" and doc["routes"] == []
        assert doc["retry_budget"] == DEFAULT_BUDGET
        assert doc["opaque_protocol"] is False
        endpoint = doc["endpoint"]
        assert endpoint["addr"] == "10.1.0.1:8080"
        assert endpoint["tls_identity"] == WEB_ID
        assert endpoint["protocol_hint"] == "h2"
        assert endpoint["metric_labels"]["namespace"] == NS
        assert endpoint["metric_labels"]["pod"] == "web-1"

        # Readiness does not matter for an endpoint profile (only running does): nothing is sent...
        h.apply(pod("web-1", "10.1.0.1", ready=False))
        # ...and a Server marking the port opaque is the next message.
        h.apply(server("web-opaque", port=8080))
        doc = await stream.next()
        assert doc["opaque_protocol"] is True
        assert doc["endpoint"]["protocol_hint"] == "opaque"
        assert doc["endpoint"]["opaque_transport_port"] == 4143

        h.delete("Pod", "web-1")
        doc = await stream.next()
        assert doc["endpoint"] == {"addr": "10.1.0.1:8080", "weight": 10000, "metric_labels": {}}
        assert doc["opaque_protocol"] is False


async def test_endpoint_profile_for_an_unknown_ip_uses_default_opaque_ports(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace()) as h:
        doc = await h.get_profile("192.0.2.10:5432").next()
        assert doc["opaque_protocol"] is True
        assert doc["endpoint"] == {"addr": "192.0.2.10:5432", "weight": 10000, "metric_labels": {}}
        doc = await h.get_profile("[2001:db8::1]:80").next()
        assert doc["endpoint"]["addr"] == "[2001:db8::1]:80"


async def test_cluster_ip_resolves_to_the_service(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(cluster_ip="10.96.0.10"), profile()) as h:
        doc = await h.get_profile("10.96.0.10:80").next()
        assert doc["fully_qualified_name"] == FQDN
        assert _route_names(doc) == ["GET /"]


async def test_an_address_that_becomes_a_cluster_ip_ends_its_endpoint_profile_stream(workdir: Path, pki: Pki) -> None:
    # A pod can resolve a Service's name (and connect) before the destination has seen the Service; its proxy's
    # GetProfile of the address is then an endpoint profile (no identity: forwarded in plaintext). Kept open, it
    # would stay so for as long as traffic keeps the proxy's watch; ended, the proxy asks again for the Service.
    async with Harness(workdir, pki, namespace(), profile()) as h:
        stream = h.get_profile("10.96.0.10:80")
        doc = await stream.next()
        assert doc["fully_qualified_name"] == "" and doc["endpoint"] == {"addr": "10.96.0.10:80", "weight": 10000,
                                                                         "metric_labels": {}}
        h.apply(service(cluster_ip="10.96.0.10"))
        assert await stream.code() == grpc.StatusCode.OK
        again = await h.get_profile("10.96.0.10:80").next()
        assert again["fully_qualified_name"] == FQDN and _route_names(again) == ["GET /"]
        h.apply(service(cluster_ip="10.96.0.10", ports=[{"name": "http", "port": 80, "targetPort": 8081}]))
        other = h.get_profile("10.96.0.11:80")  # an address no Service takes: its stream stays
        assert (await other.next())["fully_qualified_name"] == ""
        h.apply(service("db", cluster_ip="10.96.0.12"))
        with pytest.raises(TimeoutError):
            await other.next(timeout=0.5)


@pytest.mark.parametrize(
    ("path", "code"),
    [
        pytest.param("web.emojivoto.svc.cluster.local:0", grpc.StatusCode.INVALID_ARGUMENT, id="bad-port"),
        pytest.param("a:b:c", grpc.StatusCode.INVALID_ARGUMENT, id="malformed"),
        pytest.param("web.emojivoto.svc.example.org:80", grpc.StatusCode.INVALID_ARGUMENT, id="other-cluster"),
        pytest.param("ext.emojivoto.svc.cluster.local:80", grpc.StatusCode.INVALID_ARGUMENT, id="external-name"),
        pytest.param("10.96.0.20:80", grpc.StatusCode.FAILED_PRECONDITION, id="service-ip-conflict"),
        pytest.param("10.1.0.5:8080", grpc.StatusCode.FAILED_PRECONDITION, id="pod-ip-conflict"),
    ],
)
async def test_error_codes(workdir: Path, pki: Pki, path: str, code: grpc.StatusCode) -> None:
    async with Harness(
        workdir, pki, namespace(), service("ext", type_="ExternalName"),
        service("a", cluster_ip="10.96.0.20"), service("b", cluster_ip="10.96.0.20"),
        pod("web-1", "10.1.0.5"), pod("web-2", "10.1.0.5"),
    ) as h:
        error = await h.get_profile(path).error()
        assert error.code() == code, error.details()


async def test_unknown_service_still_gets_a_profile_stream(workdir: Path, pki: Pki) -> None:
    # As Linkerd 2.20: a profile may exist before its Service; the stream stays open and follows it.
    async with Harness(workdir, pki, namespace()) as h:
        stream = h.get_profile(authority("later"))
        assert (await stream.next())["routes"] == []
        h.apply(profile("later"))
        assert _route_names(await stream.next()) == ["GET /"]


async def test_a_port_the_service_does_not_define_gets_an_empty_profile_that_follows_the_service(
        workdir: Path, pki: Pki) -> None:
    # Linkerd (after 2.20) answers an empty DestinationProfile, so the proxy asks the client policy API, whose
    # undefined-port policy forbids the traffic; a ServiceProfile for the Service does not change that.
    async with Harness(workdir, pki, namespace(), service(cluster_ip="10.96.0.10"), profile()) as h:
        by_name = h.get_profile(authority(port=8080))
        assert await by_name.next() == EMPTY
        by_ip = h.get_profile("10.96.0.10:8080", token("client"))
        assert await by_ip.next() == EMPTY
        assert _route_names(await h.get_profile(authority()).next()) == ["GET /"]  # a defined port: the profile
        assert h.metric("destination_updates_sent_total", {"kind": "profile"}) == 3

        # The Service now defines the port: the stream carries its profile; and empty again when it goes.
        ports = [{"name": "http", "port": 80, "targetPort": 8080}, {"name": "admin", "port": 8080}]
        h.apply(service(cluster_ip="10.96.0.10", ports=ports))
        doc = await by_name.next()
        assert doc["fully_qualified_name"] == FQDN and _route_names(doc) == ["GET /"]
        assert doc["parent_ref"]["port"] == 8080
        assert _route_names(await by_ip.next()) == ["GET /"]
        h.apply(service(cluster_ip="10.96.0.10"))
        assert await by_name.next() == EMPTY
        assert await by_ip.next() == EMPTY

        # A Service deleted defines nothing, but only an existing Service's ports are checked (as for one that
        # does not exist yet): the default profile follows.
        h.delete("Service", "web")
        assert _route_names(await by_name.next()) == ["GET /"]
