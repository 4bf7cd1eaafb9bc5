"""The registry and kubectl-style name resolution."""

import pytest

from tether.resources import kinds
from tether.resources.errors import UnknownKind, ValidationError
from tether.resources.kinds import REGISTRY, lookup, type_of


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("po", kinds.POD),
        ("pods", kinds.POD),
        ("Pod", kinds.POD),
        ("POD", kinds.POD),
        ("svc", kinds.SERVICE),
        ("services", kinds.SERVICE),
        ("sa", kinds.SERVICE_ACCOUNT),
        ("ns", kinds.NAMESPACE),
        ("deploy", kinds.DEPLOYMENT),
        ("deployments.apps", kinds.DEPLOYMENT),
        ("deployment.v1.apps", kinds.DEPLOYMENT),
        ("sp", kinds.SERVICE_PROFILE),
        ("serviceprofiles.linkerd.io", kinds.SERVICE_PROFILE),
        ("srv", kinds.SERVER),
        ("Server", kinds.SERVER),
        ("saz", kinds.SERVER_AUTHORIZATION),
        ("srvauthz", kinds.SERVER_AUTHORIZATION),
        ("authzpolicy", kinds.AUTHORIZATION_POLICY),
        ("authorizationpolicy", kinds.AUTHORIZATION_POLICY),
        ("meshtlsauthentication", kinds.MESH_TLS_AUTHENTICATION),
        ("meshtlsauthn", kinds.MESH_TLS_AUTHENTICATION),
        ("networkauthentication", kinds.NETWORK_AUTHENTICATION),
        ("netauthn", kinds.NETWORK_AUTHENTICATION),
        # A bare httproute is Linkerd's; the Gateway API one needs its group.
        ("httproute", kinds.POLICY_HTTP_ROUTE),
        ("HTTPRoute", kinds.POLICY_HTTP_ROUTE),
        ("httproutes.policy.linkerd.io", kinds.POLICY_HTTP_ROUTE),
        ("httproutes.gateway.networking.k8s.io", kinds.GATEWAY_HTTP_ROUTE),
        ("HTTPRoute.gateway.networking.k8s.io", kinds.GATEWAY_HTTP_ROUTE),
        ("httproutes.v1beta1.gateway.networking.k8s.io", kinds.GATEWAY_HTTP_ROUTE),
        ("grpcroute", kinds.GRPC_ROUTE),
        ("httplocalratelimitpolicies", kinds.HTTP_LOCAL_RATE_LIMIT_POLICY),
        ("egressnetwork", kinds.EGRESS_NETWORK),
        ("externalworkloads", kinds.EXTERNAL_WORKLOAD),
    ],
)
def test_lookup_resolves_names_as_kubectl_does(name, expected):
    assert lookup(name) is expected


@pytest.mark.parametrize("rtype", REGISTRY, ids=lambda t: t.key)
def test_every_key_and_qualified_plural_resolves_to_its_type(rtype):
    assert lookup(rtype.key) is rtype
    if rtype.group:
        assert lookup(f"{rtype.plural}.{rtype.group}") is rtype
        assert lookup(f"{rtype.plural}.{rtype.versions[-1]}.{rtype.group}") is rtype


def test_keys_are_unique_and_read_kind_dot_group():
    assert len({t.key for t in REGISTRY}) == len(REGISTRY)
    assert [kinds.POD.key, kinds.SERVICE_PROFILE.key, kinds.POLICY_HTTP_ROUTE.key, kinds.GATEWAY_HTTP_ROUTE.key] == [
        "Pod",
        "ServiceProfile.linkerd.io",
        "HTTPRoute.policy.linkerd.io",
        "HTTPRoute.gateway.networking.k8s.io",
    ]


def test_api_version_is_the_preferred_version():
    assert kinds.POD.api_version == "v1"
    assert kinds.DEPLOYMENT.api_version == "apps/v1"
    assert kinds.SERVER.api_version == "policy.linkerd.io/v1beta3"
    assert kinds.SERVICE_PROFILE.api_version == "linkerd.io/v1alpha2"


def test_only_namespaces_are_cluster_scoped():
    assert [t.kind for t in REGISTRY if not t.namespaced] == ["Namespace"]


@pytest.mark.parametrize(
    ("name", "suggestion"), [("srvr", "srv"), ("podz", "pods"), ("httproute.gateway", "httproutes.gateway.networking.k8s.io")]
)
def test_unknown_names_suggest_close_matches(name, suggestion):
    with pytest.raises(UnknownKind) as info:
        lookup(name)
    assert suggestion in info.value.suggestions
    assert suggestion in str(info.value)


def test_a_known_name_in_the_wrong_group_is_unknown():
    with pytest.raises(UnknownKind):
        lookup("pods.apps")


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"apiVersion": "v1", "kind": "Pod"}, kinds.POD),
        ({"apiVersion": "policy.linkerd.io/v1beta1", "kind": "Server"}, kinds.SERVER),
        ({"apiVersion": "policy.linkerd.io/v1beta2", "kind": "HTTPRoute"}, kinds.POLICY_HTTP_ROUTE),
        ({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "HTTPRoute"}, kinds.GATEWAY_HTTP_ROUTE),
        ({"apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "GRPCRoute"}, kinds.GRPC_ROUTE),
        ({"apiVersion": "linkerd.io/v1alpha1", "kind": "ServiceProfile"}, kinds.SERVICE_PROFILE),
    ],
)
def test_type_of_reads_api_version_and_kind(obj, expected):
    assert type_of(obj) is expected


@pytest.mark.parametrize(
    ("obj", "path", "message"),
    [
        ({"kind": "Pod"}, "apiVersion", "required"),
        ({"apiVersion": 1, "kind": "Pod"}, "apiVersion", "expected a string"),
        ({"apiVersion": "v1"}, "kind", "required"),
        ({"apiVersion": "v1", "kind": ["Pod"]}, "kind", "expected a string"),
        ({"apiVersion": "v1", "kind": "ConfigMap"}, "kind", "unknown kind 'ConfigMap'"),
        ({"apiVersion": "apps/", "kind": "Deployment"}, "apiVersion", "'apps/' is not <group>/<version> or <version>"),
        (
            {"apiVersion": "policy.linkerd.io/v1", "kind": "Server"},
            "apiVersion",
            "unsupported version 'policy.linkerd.io/v1' of Server (supported: policy.linkerd.io/v1beta3, "
            "policy.linkerd.io/v1beta2, policy.linkerd.io/v1beta1, policy.linkerd.io/v1alpha1)",
        ),
        (
            {"apiVersion": "example.com/v1", "kind": "HTTPRoute"},
            "apiVersion",
            "kind HTTPRoute is not served by 'example.com/v1' "
            "(supported: policy.linkerd.io/v1beta3, gateway.networking.k8s.io/v1)",
        ),
    ],
)
def test_type_of_errors_name_the_field(obj, path, message):
    with pytest.raises(ValidationError) as info:
        type_of(obj)
    assert (info.value.path, info.value.message) == (path, message)
