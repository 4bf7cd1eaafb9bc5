"""Linkerd's policy kinds: Server, authorizations, authentications, rate limits, egress networks."""

import ipaddress

import pytest

from tether.resources import kinds
from tether.resources.model import parse
from tether.resources.policy import Network, ServiceAccountRef
from tether.resources.references import ObjectRef
from tether.resources.selectors import LabelSelector

SERVER = ("Server.policy.linkerd.io", "web-http")
SAZ = ("ServerAuthorization.policy.linkerd.io", "web-public")
AUTHZ = ("AuthorizationPolicy.policy.linkerd.io", "web-vote-bot")
MESH = ("MeshTLSAuthentication.policy.linkerd.io", "vote-bot")
NET = ("NetworkAuthentication.policy.linkerd.io", "cluster-network")
RATE = ("HTTPLocalRateLimitPolicy.policy.linkerd.io", "web-rl")
EGRESS = ("EgressNetwork.policy.linkerd.io", "all-egress-traffic")


def test_server(manifest, edits):
    server = parse(manifest(*SERVER)).spec
    assert server.port == "http"
    assert (server.proxy_protocol, server.access_policy) == ("HTTP/1", "deny")
    assert server.pod_selector == LabelSelector.parse("app=web-svc,version in (v11,v12)")
    assert server.external_workload_selector is None
    defaults = parse(edits.delete(edits.delete(manifest(*SERVER), "spec.proxyProtocol"), "spec.accessPolicy")).spec
    assert (defaults.proxy_protocol, defaults.access_policy) == ("unknown", "deny")


def test_server_for_external_workloads_with_a_numbered_port_and_older_version(manifest, edits):
    obj = edits.delete(manifest(*SERVER), "spec.podSelector")
    obj = edits.set(obj, "spec.externalWorkloadSelector", {"matchLabels": {"app": "legacy"}})
    obj = edits.set(obj, "spec.port", 8080)
    obj = edits.set(obj, "apiVersion", "policy.linkerd.io/v1beta2")
    server = parse(obj).spec
    assert (server.port, server.pod_selector) == (8080, None)
    assert server.external_workload_selector.matches({"app": "legacy"})


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.podSelector", None, "spec: exactly one of podSelector, externalWorkloadSelector must be set"),
        ("spec.externalWorkloadSelector", {}, "spec: exactly one of podSelector, externalWorkloadSelector must be set"),
        ("spec.port", None, "spec.port: required"),
        ("spec.port", 0, "spec.port: must be between 1 and 65535"),
        ("spec.port", "HTTP", "spec.port: 'HTTP' must contain only lower case letters, digits and '-'"),
        ("spec.proxyProtocol", "HTTP/3", "spec.proxyProtocol: unsupported value 'HTTP/3' (supported: unknown, HTTP/1, HTTP/2, gRPC, opaque, TLS)"),
        ("spec.proxyProtocol", "http/1", "spec.proxyProtocol: unsupported value 'http/1' (supported: unknown, HTTP/1, HTTP/2, gRPC, opaque, TLS)"),
        ("spec.accessPolicy", "allow", "spec.accessPolicy: unsupported value 'allow' (supported: all-unauthenticated, all-authenticated, cluster-unauthenticated, cluster-authenticated, deny, audit)"),
        ("spec.podSelector.matchExpressions[0].values", [], "spec.podSelector.matchExpressions[0].values: must not be empty when operator is In"),
    ],
)
def test_server_errors(manifest, edits, path, value, expected, parse_error):
    assert parse_error(edits.change(manifest(*SERVER), path, value)) == f"Server web-http: {expected}"


def test_server_authorization(manifest, edits):
    saz = parse(manifest(*SAZ)).spec
    assert (saz.server.name, saz.server.selector) == ("web-http", None)
    assert saz.client.unauthenticated
    assert saz.client.mesh_tls is None
    everywhere_but_pods, v6 = saz.client.networks
    assert everywhere_but_pods == Network(ipaddress.ip_network("0.0.0.0/0"), (ipaddress.ip_network("10.0.0.0/8"),))
    assert everywhere_but_pods.contains(ipaddress.ip_address("192.0.2.1"))
    assert not everywhere_but_pods.contains(ipaddress.ip_address("10.1.2.3"))
    assert v6.contains(ipaddress.ip_address("fd00::1"))


def test_server_authorization_for_mesh_identities_by_selector(manifest, edits):
    obj = edits.set(manifest(*SAZ), "spec", {
        "server": {"selector": {"matchLabels": {"emojivoto/api": "web"}}},
        "client": {"meshTLS": {
            "identities": ["*.emojivoto.serviceaccount.identity.linkerd.cluster.local"],
            "serviceAccounts": [{"name": "vote-bot"}, {"name": "prometheus", "namespace": "linkerd-viz"}],
        }},
    })
    saz = parse(obj).spec
    assert saz.server.selector.matches({"emojivoto/api": "web"})
    assert saz.client.networks is None
    assert saz.client.mesh_tls.service_accounts == (ServiceAccountRef("vote-bot"), ServiceAccountRef("prometheus", "linkerd-viz"))
    assert parse(edits.set(obj, "spec.client", {"meshTLS": {"unauthenticatedTLS": True}})).spec.client.mesh_tls.unauthenticated_tls


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.server", {}, "spec.server: exactly one of name, selector must be set"),
        ("spec.server.selector", {}, "spec.server: exactly one of name, selector must be set"),
        ("spec.client", None, "spec.client: required"),
        ("spec.client.unauthenticated", False, "spec.client: must set unauthenticated, meshTLS.unauthenticatedTLS, or meshTLS identities or serviceAccounts"),
        ("spec.client.meshTLS", {"identities": ["*"]}, "spec.client.meshTLS: must not be set when unauthenticated is true"),
        ("spec.client", {"meshTLS": {"unauthenticatedTLS": True, "identities": ["*"]}}, "spec.client.meshTLS: identities and serviceAccounts must be empty when unauthenticatedTLS is true"),
        ("spec.client", {"meshTLS": {"identities": ["Web.Emojivoto"]}}, "spec.client.meshTLS.identities[0]: 'Web.Emojivoto' must be a DNS-like identity (optionally starting with '*.'), '*', or a spiffe:// ID"),
        ("spec.client.networks[0].cidr", "0.0.0.0/33", "spec.client.networks[0].cidr: '0.0.0.0/33' is not a CIDR or IP address"),
        ("spec.client.networks[0].except", ["0.0.0.0/0"], "spec.client.networks[0].except[0]: '0.0.0.0/0' must be a proper subset of cidr 0.0.0.0/0"),
        ("spec.client.networks[1].except", ["10.0.0.0/8"], "spec.client.networks[1].except[0]: '10.0.0.0/8' must be a proper subset of cidr ::/0"),
        ("spec.client.networks", [], "spec.client.networks: must not be empty"),
    ],
)
def test_server_authorization_errors(manifest, edits, path, value, expected, parse_error):
    assert parse_error(edits.change(manifest(*SAZ), path, value)) == f"ServerAuthorization web-public: {expected}"


def test_authorization_policy(manifest):
    policy = parse(manifest(*AUTHZ)).spec
    assert policy.target_ref == ObjectRef("policy.linkerd.io", "Server", "web-http")
    assert policy.target_ref.targets(kinds.SERVER)
    mesh, network = policy.required_authentication_refs
    assert mesh.targets(kinds.MESH_TLS_AUTHENTICATION) and network.targets(kinds.NETWORK_AUTHENTICATION)


@pytest.mark.parametrize(
    ("target", "rtype"),
    [
        ({"kind": "Namespace", "name": "emojivoto"}, kinds.NAMESPACE),
        ({"group": "policy.linkerd.io", "kind": "HTTPRoute", "name": "web-api"}, kinds.POLICY_HTTP_ROUTE),
        ({"group": "gateway.networking.k8s.io", "kind": "httproute", "name": "web-api"}, kinds.GATEWAY_HTTP_ROUTE),
        ({"group": "gateway.networking.k8s.io", "kind": "GRPCRoute", "name": "emoji"}, kinds.GRPC_ROUTE),
    ],
)
def test_authorization_policy_targets(manifest, edits, target, rtype):
    obj = edits.set(manifest(*AUTHZ), "spec.targetRef", target)
    assert parse(obj).spec.target_ref.targets(rtype)


def test_authorization_policy_with_a_service_account_and_no_authentication(manifest, edits):
    obj = edits.set(manifest(*AUTHZ), "spec.requiredAuthenticationRefs", [{"kind": "ServiceAccount", "name": "web", "namespace": "emojivoto"}])
    [ref] = parse(obj).spec.required_authentication_refs
    assert ref == ObjectRef("", "ServiceAccount", "web", "emojivoto")
    assert parse(edits.set(obj, "spec.requiredAuthenticationRefs", [])).spec.required_authentication_refs == ()


MESH_REF = {"group": "policy.linkerd.io", "kind": "MeshTLSAuthentication", "name": "a"}
NET_REF = {"group": "policy.linkerd.io", "kind": "NetworkAuthentication", "name": "n"}
SA_REF = {"kind": "ServiceAccount", "name": "web"}


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.targetRef", {"kind": "Service", "name": "web-svc"}, "spec.targetRef.kind: unsupported target Service (supported: Server.policy.linkerd.io, Namespace, HTTPRoute.policy.linkerd.io, HTTPRoute.gateway.networking.k8s.io, GRPCRoute.gateway.networking.k8s.io)"),
        ("spec.targetRef", {"group": "policy.linkerd.io", "kind": "Server"}, "spec.targetRef.name: required"),
        ("spec.targetRef", {"kind": "Namespace", "name": "default"}, "spec.targetRef.name: a Namespace target must be the policy's own namespace 'emojivoto'"),
        ("spec.targetRef.kind", "1Server", "spec.targetRef.kind: '1Server' must be a kind name: letters, digits and '-', starting with a letter, at most 63 characters"),
        ("spec.targetRef.group", "Policy.Linkerd.IO", "spec.targetRef.group: 'Policy.Linkerd.IO' must be a DNS-1123 subdomain: lower case letters, digits, '-' and '.', starting and ending with a letter or digit"),
        ("spec.requiredAuthenticationRefs", None, "spec.requiredAuthenticationRefs: required"),
        ("spec.requiredAuthenticationRefs", [MESH_REF, dict(MESH_REF, name="b")], "spec.requiredAuthenticationRefs[1]: at most one MeshTLSAuthentication may be required"),
        ("spec.requiredAuthenticationRefs", [NET_REF, NET_REF], "spec.requiredAuthenticationRefs[1]: at most one NetworkAuthentication may be required"),
        ("spec.requiredAuthenticationRefs", [SA_REF, NET_REF, MESH_REF], "spec.requiredAuthenticationRefs[2]: a MeshTLSAuthentication and a ServiceAccount may not both be required"),
        ("spec.requiredAuthenticationRefs", [{"kind": "Secret", "name": "token"}], "spec.requiredAuthenticationRefs[0].kind: unsupported authentication Secret (supported: MeshTLSAuthentication.policy.linkerd.io, NetworkAuthentication.policy.linkerd.io, ServiceAccount)"),
        ("spec.requiredAuthenticationRefs", [dict(MESH_REF, group="")], "spec.requiredAuthenticationRefs[0].kind: unsupported authentication MeshTLSAuthentication (supported: MeshTLSAuthentication.policy.linkerd.io, NetworkAuthentication.policy.linkerd.io, ServiceAccount)"),
    ],
)
def test_authorization_policy_errors(manifest, edits, path, value, expected, parse_error):
    assert parse_error(edits.change(manifest(*AUTHZ), path, value)) == f"AuthorizationPolicy web-vote-bot: {expected}"


def test_mesh_tls_authentication(manifest, edits):
    mesh = parse(manifest(*MESH)).spec
    assert mesh.identities[1] == "*.linkerd-viz.serviceaccount.identity.linkerd.cluster.local"
    refs = edits.set(edits.delete(manifest(*MESH), "spec.identities"), "spec.identityRefs", [
        {"kind": "ServiceAccount", "name": "vote-bot"},
        {"kind": "Namespace", "name": "linkerd-viz"},
        {"kind": "ServiceAccount"},
    ])
    spec = parse(refs).spec
    assert spec.identities == ()
    assert [r.targets(kinds.SERVICE_ACCOUNT) for r in spec.identity_refs] == [True, False, True]
    assert spec.identity_refs[2].name is None  # every ServiceAccount in the namespace


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.identities", None, "spec: exactly one of identities, identityRefs must be set"),
        ("spec.identityRefs", [{"kind": "Namespace", "name": "x"}], "spec: exactly one of identities, identityRefs must be set"),
        ("spec.identities[0]", "spiffe://cluster.local/ns/../sa", "spec.identities[0]: 'spiffe://cluster.local/ns/../sa' must be a DNS-like identity (optionally starting with '*.'), '*', or a spiffe:// ID"),
        ("spec", {"identityRefs": [{"kind": "Deployment", "name": "web"}]}, "spec.identityRefs[0].kind: unsupported identity reference Deployment (supported: ServiceAccount, Namespace)"),
        ("spec", {"identityRefs": [{"kind": "Namespace", "name": "a", "namespace": "b"}]}, "spec.identityRefs[0].namespace: must not be set for a Namespace reference"),
        ("spec", {"identityRefs": [{"name": "web"}]}, "spec.identityRefs[0].kind: required"),
    ],
)
def test_mesh_tls_authentication_errors(manifest, edits, path, value, expected, parse_error):
    assert parse_error(edits.change(manifest(*MESH), path, value)) == f"MeshTLSAuthentication vote-bot: {expected}"


def test_network_authentication_accepts_cidrs_and_single_addresses(manifest, edits, parse_error):
    networks = parse(manifest(*NET)).spec.networks
    assert [str(n.cidr) for n in networks] == ["10.0.0.0/8", "192.168.0.1/32"]
    obj = edits.set(manifest(*NET), "spec.networks", [])
    assert parse_error(obj) == "NetworkAuthentication cluster-network: spec.networks: must not be empty"
    assert parse_error(edits.delete(obj, "spec.networks")) == "NetworkAuthentication cluster-network: spec.networks: required"


def test_http_local_rate_limit_policy(manifest, edits):
    policy = parse(manifest(*RATE))
    assert (policy.spec.total, policy.spec.identity) == (100, 20)
    [override] = policy.spec.overrides
    assert override.requests_per_second == 25
    assert override.client_refs == (ObjectRef("", "ServiceAccount", "special-client", "emojivoto"),)
    assert policy.status.conditions == ()
    total_only = parse(edits.delete(edits.delete(manifest(*RATE), "spec.identity"), "spec.overrides")).spec
    assert (total_only.total, total_only.identity, total_only.overrides) == (100, None, ())


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.targetRef.kind", "Service", "spec.targetRef.kind: unsupported target Service.policy.linkerd.io (supported: Server.policy.linkerd.io)"),
        ("spec.total.requestsPerSecond", 0, "spec.total.requestsPerSecond: must be at least 1"),
        ("spec.identity.requestsPerSecond", 101, "spec.identity.requestsPerSecond: must not exceed the total of 100"),
        ("spec.overrides[0].requestsPerSecond", 200, "spec.overrides[0].requestsPerSecond: must not exceed the total of 100"),
        ("spec.overrides[0].clientRefs", None, "spec.overrides[0].clientRefs: required"),
        ("spec.overrides[0].clientRefs[0].kind", "Namespace", "spec.overrides[0].clientRefs[0].kind: unsupported client Namespace (supported: ServiceAccount)"),
    ],
)
def test_http_local_rate_limit_policy_errors(manifest, edits, path, value, expected, parse_error):
    assert parse_error(edits.change(manifest(*RATE), path, value)) == f"HTTPLocalRateLimitPolicy web-rl: {expected}"


def test_egress_network(manifest, edits, parse_error):
    egress = parse(manifest(*EGRESS))
    assert (egress.spec.traffic_policy, egress.spec.networks) == ("Allow", None)
    obj = edits.set(manifest(*EGRESS), "spec.networks", [{"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}])
    assert parse(obj).spec.networks[0].except_ == (ipaddress.ip_network("10.0.0.0/8"),)
    obj = edits.set(obj, "status", {"conditions": [{"type": "Accepted", "status": "False", "reason": "EgressReasonNetworkOverlap"}]})
    assert parse(obj).status.condition("Accepted").reason == "EgressReasonNetworkOverlap"
    prefix = "EgressNetwork all-egress-traffic: "
    assert parse_error(edits.set(obj, "spec.trafficPolicy", "allow")) == prefix + "spec.trafficPolicy: unsupported value 'allow' (supported: Allow, Deny)"
    assert parse_error(edits.set(obj, "spec.networks", [])) == prefix + "spec.networks: must not be empty"
    assert parse_error(edits.delete(obj, "spec.trafficPolicy")) == prefix + "spec.trafficPolicy: required"
