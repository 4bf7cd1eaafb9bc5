"""The CustomResourceDefinitions of the mesh's kinds, with OpenAPI v3 schemas.

``tether install --crds`` prints ``render(values)``.  Groups, versions, plurals and
short names come from the resource model (``tether.resources.kinds``), so a kind the
model knows has a CRD; the schemas follow Linkerd's CRDs (control-plane.md §5.2, §6)
and are structural, as the API server requires.  Every served version of a kind
shares one schema (a superset where versions differ) and the model's preferred
version is the storage version; like Linkerd's CRDs they convert with ``None``
(only ``apiVersion`` changes).  Gateway API HTTPRoute/GRPCRoute/TLSRoute/TCPRoute CRDs are included
only with ``installGatewayAPI: true``, as Linkerd does; their schemas here cover the
fields the mesh reads, not all of Gateway API.
"""

from __future__ import annotations

from typing import Any

from tether.resources import kinds
from tether.resources.kinds import ResourceType

Schema = dict[str, Any]


def obj(properties: dict[str, Schema] | None = None, *, required: list[str] | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "object"}
    if properties is not None:
        schema["properties"] = properties
    if required:
        schema["required"] = required
    schema.update(extra)
    return schema


def arr(items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "items": items, **extra}


def string(**extra: Any) -> Schema:
    return {"type": "string", **extra}


def integer(**extra: Any) -> Schema:
    return {"type": "integer", **extra}


def boolean() -> Schema:
    return {"type": "boolean"}


INT_OR_STRING: Schema = {"x-kubernetes-int-or-string": True}
PRESERVE: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
PORT_NUMBER = integer(minimum=1, maximum=65535)
DURATION = string(pattern=r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")

LABEL_SELECTOR = obj({
    "matchLabels": obj(additionalProperties=string()),
    "matchExpressions": arr(obj({
        "key": string(),
        "operator": string(enum=["In", "NotIn", "Exists", "DoesNotExist"]),
        "values": arr(string()),
    }, required=["key", "operator"])),
})
NETWORK = obj({"cidr": string(), "except": arr(string())}, required=["cidr"])
LOCAL_REF = obj({"group": string(), "kind": string(), "name": string()}, required=["kind", "name"])
NAMESPACED_REF = obj({"group": string(), "kind": string(), "name": string(), "namespace": string()},
                     required=["kind", "name"])
STATUS_CONDITION = obj({
    "type": string(), "status": string(enum=["True", "False", "Unknown"]), "reason": string(), "message": string(),
    "lastTransitionTime": string(format="date-time"), "observedGeneration": integer(format="int64"),
}, required=["type", "status"])
CONDITIONS_STATUS = obj({"conditions": arr(STATUS_CONDITION)})

# -- routes (policy.linkerd.io HTTPRoute and the Gateway API routes share these parts) ---------------

HEADER = obj({"name": string(), "value": string()}, required=["name", "value"])
HEADER_MODIFIER = obj({"set": arr(HEADER), "add": arr(HEADER), "remove": arr(string())})
PARENT_REF = obj({
    "group": string(), "kind": string(), "namespace": string(), "name": string(), "sectionName": string(),
    "port": PORT_NUMBER,
}, required=["name"])
HTTP_MATCH = obj({
    "path": obj({"type": string(enum=["Exact", "PathPrefix", "RegularExpression"]), "value": string()}),
    "headers": arr(obj({"type": string(enum=["Exact", "RegularExpression"]), "name": string(), "value": string()},
                       required=["name", "value"])),
    "queryParams": arr(obj({"type": string(enum=["Exact", "RegularExpression"]), "name": string(),
                            "value": string()}, required=["name", "value"])),
    "method": string(enum=["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]),
})
PATH_MODIFIER = obj({"type": string(enum=["ReplaceFullPath", "ReplacePrefixMatch"]), "replaceFullPath": string(),
                     "replacePrefixMatch": string()}, required=["type"])
HTTP_FILTER = obj({
    "type": string(enum=["RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "RequestMirror",
                         "URLRewrite", "ExtensionRef"]),
    "requestHeaderModifier": HEADER_MODIFIER,
    "responseHeaderModifier": HEADER_MODIFIER,
    "requestRedirect": obj({"scheme": string(enum=["http", "https"]), "hostname": string(), "path": PATH_MODIFIER,
                            "port": PORT_NUMBER, "statusCode": integer(enum=[301, 302])}),
    "requestMirror": obj({"backendRef": PRESERVE}),
    "urlRewrite": obj({"hostname": string(), "path": PATH_MODIFIER}),
    "extensionRef": LOCAL_REF,
}, required=["type"])
BACKEND_REF = obj({
    "group": string(), "kind": string(), "name": string(), "namespace": string(), "port": PORT_NUMBER,
    "weight": integer(minimum=0, maximum=1000000), "filters": arr(HTTP_FILTER),
}, required=["name"])
ROUTE_STATUS = obj({"parents": arr(obj({
    "parentRef": PARENT_REF, "controllerName": string(), "conditions": arr(STATUS_CONDITION),
}, required=["parentRef", "controllerName"]))})


def http_route_spec() -> Schema:
    return obj({
        "parentRefs": arr(PARENT_REF, maxItems=32),
        "hostnames": arr(string(), maxItems=16),
        "rules": arr(obj({
            "matches": arr(HTTP_MATCH, maxItems=8),
            "filters": arr(HTTP_FILTER, maxItems=16),
            "backendRefs": arr(BACKEND_REF, maxItems=16),
            "timeouts": obj({"request": DURATION, "backendRequest": DURATION}),
        }), maxItems=16),
    })


def stream_route_spec(*, hostnames: bool) -> Schema:
    """TLSRoute (with SNI ``hostnames``) and TCPRoute: one rule of backends, which take no filters."""
    backend_ref = obj({k: v for k, v in BACKEND_REF["properties"].items() if k != "filters"}, required=["name"])
    properties: dict[str, Schema] = {
        "parentRefs": arr(PARENT_REF, maxItems=32),
        "rules": arr(obj({"backendRefs": arr(backend_ref, maxItems=16)}), minItems=1, maxItems=16),
    }
    if hostnames:
        properties["hostnames"] = arr(string(), maxItems=16)
    return obj(properties, required=["rules"])


def grpc_route_spec() -> Schema:
    grpc_match = obj({
        "method": obj({"type": string(enum=["Exact", "RegularExpression"]), "service": string(), "method": string()}),
        "headers": arr(obj({"type": string(enum=["Exact", "RegularExpression"]), "name": string(), "value": string()},
                           required=["name", "value"])),
    })
    grpc_filter = obj({
        "type": string(enum=["RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "ExtensionRef"]),
        "requestHeaderModifier": HEADER_MODIFIER, "responseHeaderModifier": HEADER_MODIFIER,
        "requestMirror": obj({"backendRef": PRESERVE}), "extensionRef": LOCAL_REF,
    }, required=["type"])
    return obj({
        "parentRefs": arr(PARENT_REF, maxItems=32),
        "hostnames": arr(string(), maxItems=16),
        "rules": arr(obj({
            "matches": arr(grpc_match, maxItems=8),
            "filters": arr(grpc_filter, maxItems=16),
            "backendRefs": arr(BACKEND_REF, maxItems=16),
        }), maxItems=16),
    })


# -- the kinds ----------------------------------------------------------------------------------------

def service_profile_spec() -> Schema:
    # Request and response conditions nest (all/any/not): the nested levels keep their fields open.
    request_match = obj({
        "all": arr(PRESERVE), "any": arr(PRESERVE), "not": PRESERVE, "method": string(), "pathRegex": string(),
    })
    response_match = obj({
        "all": arr(PRESERVE), "any": arr(PRESERVE), "not": PRESERVE,
        "status": obj({"min": integer(minimum=100, maximum=599), "max": integer(minimum=100, maximum=599)}),
    })
    return obj({
        "routes": arr(obj({
            "name": string(),
            "condition": request_match,
            "responseClasses": arr(obj({"condition": response_match, "isFailure": boolean()},
                                       required=["condition"])),
            "isRetryable": boolean(),
            "timeout": string(),
        }, required=["name", "condition"])),
        "retryBudget": obj({"retryRatio": {"type": "number"}, "minRetriesPerSecond": integer(format="int32"),
                            "ttl": string()}, required=["retryRatio", "minRetriesPerSecond", "ttl"]),
        "dstOverrides": arr(obj({"authority": string(), "weight": INT_OR_STRING}, required=["authority", "weight"])),
    })


def server_spec() -> Schema:
    return obj({
        "podSelector": LABEL_SELECTOR,
        "externalWorkloadSelector": LABEL_SELECTOR,
        "port": INT_OR_STRING,
        "proxyProtocol": string(default="unknown", enum=["unknown", "HTTP/1", "HTTP/2", "gRPC", "opaque", "TLS"]),
        "accessPolicy": string(default="deny"),
    }, required=["port"], oneOf=[{"required": ["podSelector"]}, {"required": ["externalWorkloadSelector"]}])


def server_authorization_spec() -> Schema:
    return obj({
        "server": obj({"name": string(), "selector": LABEL_SELECTOR},
                      oneOf=[{"required": ["name"]}, {"required": ["selector"]}]),
        "client": obj({
            "networks": arr(NETWORK),
            "unauthenticated": boolean(),
            "meshTLS": obj({
                "unauthenticatedTLS": boolean(),
                "identities": arr(string()),
                "serviceAccounts": arr(obj({"name": string(), "namespace": string()}, required=["name"])),
            }),
        }),
    }, required=["server", "client"])


def authorization_policy_spec() -> Schema:
    return obj({
        "targetRef": obj({"group": string(), "kind": string(), "name": string(), "namespace": string()},
                         required=["kind", "name"]),
        "requiredAuthenticationRefs": arr(NAMESPACED_REF),
    }, required=["targetRef", "requiredAuthenticationRefs"])


def mesh_tls_authentication_spec() -> Schema:
    return obj({
        "identities": arr(string(), minItems=1),
        "identityRefs": arr(NAMESPACED_REF, minItems=1),
    }, oneOf=[{"required": ["identities"]}, {"required": ["identityRefs"]}])


def network_authentication_spec() -> Schema:
    return obj({"networks": arr(NETWORK, minItems=1)}, required=["networks"])


def rate_limit_spec() -> Schema:
    rps = obj({"requestsPerSecond": integer(format="int32", minimum=1)}, required=["requestsPerSecond"])
    return obj({
        "targetRef": obj({"group": string(), "kind": string(), "name": string()}, required=["kind", "name"]),
        "total": rps,
        "identity": rps,
        "overrides": arr(obj({
            "requestsPerSecond": integer(format="int32", minimum=1),
            "clientRefs": arr(obj({"kind": string(), "name": string(), "namespace": string()},
                                  required=["kind", "name"])),
        }, required=["requestsPerSecond", "clientRefs"])),
    }, required=["targetRef"])


def egress_network_spec() -> Schema:
    return obj({"networks": arr(NETWORK), "trafficPolicy": string(enum=["Allow", "Deny"])},
               required=["trafficPolicy"])


def external_workload_spec() -> Schema:
    return obj({
        "meshTLS": obj({"identity": string(minLength=1), "serverName": string(minLength=1)},
                       required=["identity", "serverName"]),
        "ports": arr(obj({"name": string(), "port": PORT_NUMBER, "protocol": string(enum=["TCP", "UDP"])},
                         required=["port"])),
        "workloadIPs": arr(obj({"ip": string()}, required=["ip"]), maxItems=1),
    }, required=["meshTLS"])


def _columns(*columns: tuple[str, str, str]) -> list[dict[str, Any]]:
    return [{"name": n, "type": t, "jsonPath": p} for n, t, p in columns]


AGE = ("Age", "date", ".metadata.creationTimestamp")

# type key -> (spec schema, status schema or None, whether spec is required, printer columns)
_KINDS: dict[str, tuple[Schema, Schema | None, bool, list[dict[str, Any]]]] = {
    kinds.SERVICE_PROFILE.key: (service_profile_spec(), None, True, []),
    kinds.SERVER.key: (server_spec(), None, True, _columns(
        ("Port", "string", ".spec.port"), ("Protocol", "string", ".spec.proxyProtocol"), AGE)),
    kinds.SERVER_AUTHORIZATION.key: (server_authorization_spec(), None, True, _columns(
        ("Server", "string", ".spec.server.name"), AGE)),
    kinds.AUTHORIZATION_POLICY.key: (authorization_policy_spec(), None, True, _columns(
        ("Target Kind", "string", ".spec.targetRef.kind"), ("Target Name", "string", ".spec.targetRef.name"), AGE)),
    kinds.MESH_TLS_AUTHENTICATION.key: (mesh_tls_authentication_spec(), None, True, []),
    kinds.NETWORK_AUTHENTICATION.key: (network_authentication_spec(), None, True, []),
    kinds.POLICY_HTTP_ROUTE.key: (http_route_spec(), ROUTE_STATUS, True, []),
    kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.key: (rate_limit_spec(), CONDITIONS_STATUS, True, _columns(
        ("Target Kind", "string", ".spec.targetRef.kind"), ("Target Name", "string", ".spec.targetRef.name"),
        ("Total RPS", "integer", ".spec.total.requestsPerSecond"), AGE)),
    kinds.EGRESS_NETWORK.key: (egress_network_spec(), CONDITIONS_STATUS, True, _columns(
        ("Traffic Policy", "string", ".spec.trafficPolicy"), AGE)),
    kinds.EXTERNAL_WORKLOAD.key: (external_workload_spec(), CONDITIONS_STATUS, True, _columns(
        ("Identity", "string", ".spec.meshTLS.identity"), AGE)),
    kinds.GATEWAY_HTTP_ROUTE.key: (http_route_spec(), ROUTE_STATUS, True, _columns(
        ("Hostnames", "string", ".spec.hostnames"), AGE)),
    kinds.GRPC_ROUTE.key: (grpc_route_spec(), ROUTE_STATUS, True, _columns(("Hostnames", "string", ".spec.hostnames"),
                                                                          AGE)),
    kinds.TLS_ROUTE.key: (stream_route_spec(hostnames=True), ROUTE_STATUS, True, _columns(
        ("Hostnames", "string", ".spec.hostnames"), AGE)),
    kinds.TCP_ROUTE.key: (stream_route_spec(hostnames=False), ROUTE_STATUS, True, _columns(AGE)),
}

GATEWAY_API_KINDS = (kinds.GATEWAY_HTTP_ROUTE.key, kinds.GRPC_ROUTE.key, kinds.TLS_ROUTE.key, kinds.TCP_ROUTE.key)
# Gateway API ships its v1alpha2 kinds in the experimental channel only.
_EXPERIMENTAL = (kinds.TLS_ROUTE.key, kinds.TCP_ROUTE.key)
GATEWAY_API_BUNDLE_VERSION = "v1.1.1"  # the Gateway API release Linkerd bundles (control-plane.md §5.2)
MESH_KINDS = tuple(key for key in _KINDS if key not in GATEWAY_API_KINDS)


def schema_of(type_key: str) -> Schema:
    """The ``openAPIV3Schema`` of one kind (for validating objects of it)."""
    spec, status, spec_required, _ = _KINDS[type_key]
    properties: dict[str, Schema] = {"apiVersion": string(), "kind": string(), "metadata": {"type": "object"},
                                     "spec": spec}
    if status is not None:
        properties["status"] = status
    return obj(properties, required=["spec"] if spec_required else None)


def crd(rtype: ResourceType, labels: dict[str, str]) -> dict[str, Any]:
    _, status, _, columns = _KINDS[rtype.key]
    schema = schema_of(rtype.key)
    versions = []
    for index, version in enumerate(rtype.versions):
        entry: dict[str, Any] = {"name": version, "served": True, "storage": index == 0,
                                 "schema": {"openAPIV3Schema": schema}}
        if status is not None:
            entry["subresources"] = {"status": {}}
        if columns:
            entry["additionalPrinterColumns"] = columns
        versions.append(entry)
    names: dict[str, Any] = {"plural": rtype.plural, "singular": rtype.kind.lower(), "kind": rtype.kind,
                             "listKind": f"{rtype.kind}List"}
    if rtype.short_names:
        names["shortNames"] = list(rtype.short_names)
    if rtype.group in ("policy.linkerd.io", "linkerd.io", "workload.linkerd.io"):
        names["categories"] = ["policy"] if rtype.group == "policy.linkerd.io" else ["linkerd"]
    metadata: dict[str, Any] = {"name": f"{rtype.plural}.{rtype.group}", "labels": dict(labels)}
    if rtype.group == "gateway.networking.k8s.io":
        metadata["annotations"] = {"gateway.networking.k8s.io/bundle-version": GATEWAY_API_BUNDLE_VERSION,
                                   "gateway.networking.k8s.io/channel":
                                       "experimental" if rtype.key in _EXPERIMENTAL else "standard"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {
            "group": rtype.group,
            "names": names,
            "scope": "Namespaced" if rtype.namespaced else "Cluster",
            "versions": versions,
        },
    }


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """CRDs for every mesh kind of the resource model, plus the Gateway API routes when asked for."""
    labels = {"linkerd.io/control-plane-ns": str(values.get("controllerNamespace") or "linkerd"),
              "app.kubernetes.io/managed-by": "tether"}
    wanted = list(MESH_KINDS)
    if values.get("installGatewayAPI"):
        wanted += GATEWAY_API_KINDS
    by_key = {rtype.key: rtype for rtype in kinds.REGISTRY}
    return [crd(by_key[key], labels) for key in wanted]
