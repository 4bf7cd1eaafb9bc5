"""parse(): the round trip of whole manifests, metadata, and where errors say they are."""

import copy
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tether.resources import kinds
from tether.resources.errors import ValidationError
from tether.resources.loading import load_path, load_text
from tether.resources.model import PARSERS, Resource, parse

MANIFESTS = Path(__file__).parent / "manifests"


def all_manifests():
    return [pytest.param(src, i, obj, id=f"{obj['kind']}/{obj['metadata']['name']}") for src, i, obj in load_path(MANIFESTS)]


@pytest.mark.parametrize(("source", "index", "obj"), all_manifests())
def test_every_realistic_manifest_parses_and_raw_is_an_exact_deep_copy(source, index, obj):
    original = copy.deepcopy(obj)
    resource = parse(obj, source, index)
    assert isinstance(resource, Resource)
    assert resource.raw == original
    assert resource.type.kind == obj["kind"]
    assert resource.name == obj["metadata"]["name"]
    obj["metadata"]["name"] = "changed"
    obj.setdefault("spec", {})["added"] = True
    assert resource.raw == original


def test_the_manifests_cover_every_registered_kind():
    covered = {kinds.type_of(obj) for _, _, obj in load_path(MANIFESTS)}
    assert covered == set(kinds.REGISTRY)


def test_there_is_one_parser_per_registered_type():
    assert set(PARSERS) == set(kinds.REGISTRY)


def test_unknown_fields_of_known_kinds_are_kept(manifest, edits):
    server = manifest("Server.policy.linkerd.io", "web-http")
    server = edits.set(server, "spec.futureField", {"nested": [1, 2]})
    server = edits.set(server, "metadata.managedFields", [{"manager": "kubectl"}])
    server = edits.set(server, "spec.podSelector.matchLabels.extra", "x")
    server["topLevelExtra"] = "kept"
    resource = parse(server)
    assert resource.raw == server
    assert resource.raw["spec"]["futureField"] == {"nested": [1, 2]}
    assert resource.spec.pod_selector.matches({"app": "web-svc", "version": "v12", "extra": "x"})


def test_a_missing_namespace_is_not_defaulted(manifest, edits):
    service = edits.delete(manifest("Service", "web-svc"), "metadata.namespace")
    assert parse(service).namespace is None


def test_a_cluster_scoped_object_ignores_a_namespace_as_the_api_server_does(manifest, edits):
    namespace = edits.set(manifest("Namespace", "emojivoto"), "metadata.namespace", "default")
    resource = parse(namespace)
    assert resource.namespace is None
    assert resource.raw["metadata"]["namespace"] == "default"


def test_metadata_is_typed(manifest, edits):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-7d4b9c-x2x1z",
            "namespace": "emojivoto",
            "uid": "8c9f2c2e-1111-4e0b-9b55-000000000001",
            "resourceVersion": "42",
            "generation": 1,
            "creationTimestamp": "2024-10-04T18:19:00Z",
            "labels": {"app": "web-svc", "linkerd.io/control-plane-ns": "linkerd"},
            "annotations": {"linkerd.io/inject": "enabled", "config.linkerd.io/opaque-ports": "3306"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c", "uid": "u1", "controller": True}
            ],
        },
        "spec": {"containers": [{"name": "web-svc", "image": "web:v11"}]},
    }
    resource = parse(pod)
    meta = resource.metadata
    assert (resource.name, resource.namespace) == ("web-7d4b9c-x2x1z", "emojivoto")
    assert resource.labels == {"app": "web-svc", "linkerd.io/control-plane-ns": "linkerd"}
    assert resource.annotations["config.linkerd.io/opaque-ports"] == "3306"
    assert (meta.uid, meta.resource_version, meta.generation) == ("8c9f2c2e-1111-4e0b-9b55-000000000001", "42", 1)
    assert meta.creation_timestamp == datetime(2024, 10, 4, 18, 19, tzinfo=timezone.utc)
    assert meta.controller.kind == "ReplicaSet"
    assert meta.controller.name == "web-7d4b9c"
    assert parse(edits.set(pod, "metadata.ownerReferences[0].controller", False)).metadata.controller is None


CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}


@pytest.mark.parametrize(
    ("key", "name", "path", "value", "expected"),
    [
        ("Service", "web-svc", "metadata.name", None, "Service: metadata.name: required"),
        (
            "Service",
            "web-svc",
            "metadata.name",
            "1web",
            "Service 1web: metadata.name: '1web' must be a DNS-1035 label: lower case letters, digits and '-', "
            "starting with a letter and ending with a letter or digit",
        ),
        (
            "Namespace",
            "emojivoto",
            "metadata.name",
            "emoji.voto",
            "Namespace emoji.voto: metadata.name: 'emoji.voto' must be a DNS-1123 label: lower case letters, digits and "
            "'-', starting and ending with a letter or digit",
        ),
        (
            "Deployment.apps",
            "web",
            "metadata.name",
            "Web",
            "Deployment Web: metadata.name: 'Web' must be a DNS-1123 subdomain: lower case letters, digits, '-' and "
            "'.', starting and ending with a letter or digit",
        ),
        (
            "Service",
            "web-svc",
            "metadata.namespace",
            "Emojivoto",
            "Service web-svc: metadata.namespace: 'Emojivoto' must be a DNS-1123 label: lower case letters, digits "
            "and '-', starting and ending with a letter or digit",
        ),
        ("Service", "web-svc", "metadata.labels", {"app": 1}, "Service web-svc: metadata.labels[app]: expected a string"),
        (
            "Service",
            "web-svc",
            "metadata.labels",
            {"app": "web svc"},
            "Service web-svc: metadata.labels[app]: 'web svc' a label value must be empty or consist of letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit",
        ),
        (
            "Service",
            "web-svc",
            "metadata.annotations",
            {"linkerd.io/inject": True},
            "Service web-svc: metadata.annotations[linkerd.io/inject]: expected a string",
        ),
        (
            "Service",
            "web-svc",
            "metadata.annotations",
            {"/inject": "enabled"},
            "Service web-svc: metadata.annotations[/inject]: '/inject' prefix part must be non-empty",
        ),
        (
            "Service",
            "web-svc",
            "metadata.creationTimestamp",
            "yesterday",
            "Service web-svc: metadata.creationTimestamp: expected an RFC 3339 time such as 2024-01-31T12:00:00Z",
        ),
        ("Service", "web-svc", "metadata", "web-svc", "Service: metadata: expected a mapping"),
    ],
)
def test_metadata_errors(manifest, edits, key, name, path, value, expected):
    obj = manifest(key, name)
    obj = edits.change(obj, path, value)
    with pytest.raises(ValidationError) as info:
        parse(obj)
    assert str(info.value) == expected


def test_errors_name_file_document_kind_name_and_field():
    text = """\
apiVersion: v1
kind: Namespace
metadata: {name: emojivoto}
---
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: web-svc.emojivoto.svc.cluster.local
  namespace: emojivoto
spec:
  routes:
  - name: GET /api/list
    condition:
      method: [GET]
"""
    _, (index, profile) = [(i, o) for i, o in enumerate(load_text(text, "emoji.yaml"), start=1)]
    with pytest.raises(ValidationError) as info:
        parse(profile, "emoji.yaml", index)
    assert str(info.value) == (
        "emoji.yaml doc 2 ServiceProfile web-svc.emojivoto.svc.cluster.local: "
        "spec.routes[0].condition.method: expected a string"
    )
    e = info.value
    assert (e.source, e.doc_index, e.kind, e.name, e.path) == (
        "emoji.yaml",
        2,
        "ServiceProfile",
        "web-svc.emojivoto.svc.cluster.local",
        "spec.routes[0].condition.method",
    )


def test_unknown_kinds_and_non_objects_are_validation_errors():
    with pytest.raises(ValidationError) as info:
        parse(CONFIG_MAP, "c.yaml", 3)
    assert str(info.value) == "c.yaml doc 3 ConfigMap settings: kind: unknown kind 'ConfigMap'"
    with pytest.raises(ValidationError) as info:
        parse(["not", "an", "object"], "c.yaml", 1)  # type: ignore[arg-type]
    assert str(info.value) == "c.yaml doc 1: expected a mapping (a Kubernetes object)"


def test_null_counts_as_absent(manifest, edits):
    profile = edits.set(manifest("ServiceProfile.linkerd.io", "web-svc.emojivoto.svc.cluster.local"), "spec.routes[0].timeout", None)
    assert parse(profile).spec.routes[0].timeout is None
