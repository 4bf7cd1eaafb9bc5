"""``tether apply/get/delete`` end to end: real executable, real SQLite store, real manifests."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "emojivoto"
Run = Any  # the `tether` fixture from conftest: run(*args, input=None, ok=True)


def _docs(path: Path) -> list[dict]:
    return [d for f in sorted(path.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def _contains(stored: object, given: object) -> bool:
    """Everything in ``given`` is in ``stored`` unchanged (the store only adds metadata)."""
    if isinstance(given, dict):
        return isinstance(stored, dict) and all(k in stored and _contains(stored[k], v) for k, v in given.items())
    if isinstance(given, list):
        return isinstance(stored, list) and len(stored) == len(given) and all(map(_contains, stored, given))
    return stored == given


def test_apply_folder_then_get_yaml_gives_everything_back(tether: Run) -> None:
    out = tether("apply", "-f", str(EXAMPLES)).stdout
    assert "serviceprofile.linkerd.io/web-svc.emojivoto.svc.cluster.local created" in out
    assert "httproute.gateway.networking.k8s.io/web-vote created" in out
    for doc in _docs(EXAMPLES):
        kind = doc["kind"].lower() + ("." + doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else "")
        args = ["get", kind, doc["metadata"]["name"], "-o", "yaml"]
        if "namespace" in doc["metadata"]:
            args += ["-n", doc["metadata"]["namespace"]]
        stored = yaml.safe_load(tether(*args).stdout)
        assert _contains(stored, doc), (doc, stored)
        meta = stored["metadata"]
        assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"] and meta["generation"] == 1


def test_reapply_is_unchanged_and_a_change_is_configured(tether: Run, tmp_path: Path) -> None:
    tether("apply", "-f", str(EXAMPLES))
    assert set(tether("apply", "-f", str(EXAMPLES)).stdout.split()) >= {"unchanged"}
    assert "created" not in tether("apply", "-f", str(EXAMPLES)).stdout
    svc = tmp_path / "svc.yaml"
    doc = yaml.safe_load((EXAMPLES / "20-emoji.yaml").read_text().split("---")[1])
    doc["spec"]["ports"][0]["port"] = 9090
    svc.write_text(yaml.safe_dump(doc))
    assert tether("apply", "-f", str(svc)).stdout.strip() == "service/emoji-svc configured"
    stored = json.loads(tether("get", "svc", "emoji-svc", "-n", "emojivoto", "-o", "json").stdout)
    assert stored["spec"]["ports"][0]["port"] == 9090 and stored["metadata"]["generation"] == 2


def test_get_output_formats(tether: Run) -> None:
    tether("apply", "-f", str(EXAMPLES))
    listed = json.loads(tether("get", "svc", "-n", "emojivoto", "-o", "json").stdout)
    assert listed["kind"] == "List" and {i["metadata"]["name"] for i in listed["items"]} == {"web-svc", "emoji-svc"}
    assert tether("get", "sa", "-n", "emojivoto", "-o", "name").stdout.split() == [
        "serviceaccount/emoji", "serviceaccount/web"]
    table = tether("get", "svc", "-n", "emojivoto", "-o", "wide").stdout.splitlines()
    assert table[0].split() == ["NAME", "TYPE", "CLUSTER-IP", "PORT(S)", "AGE", "SELECTOR"]
    assert any(line.startswith("web-svc") and "80/TCP" in line and "app=web-svc" in line for line in table)
    every = tether("get", "svc", "-A").stdout.splitlines()
    assert every[0].split()[:2] == ["NAMESPACE", "NAME"]


def test_get_by_file_and_by_selector(tether: Run, tmp_path: Path) -> None:
    tether("apply", "-f", str(EXAMPLES))
    one = json.loads(tether("get", "-f", str(EXAMPLES / "30-profile.yaml"), "-o", "json").stdout)
    assert one["kind"] == "ServiceProfile"
    several = json.loads(tether("get", "-f", str(EXAMPLES / "40-policy.yaml"), "-o", "json").stdout)
    assert several["kind"] == "List" and len(several["items"]) == 3
    names = tether("get", "srv", "-A", "-l", "app.kubernetes.io/part-of=emojivoto", "-o", "name").stdout.split()
    assert names == ["server.policy.linkerd.io/emoji-grpc"]
    assert tether("get", "srv", "-A", "-l", "app.kubernetes.io/part-of!=emojivoto", "-o", "name").stdout == ""


def test_delete_by_file_and_by_name(tether: Run) -> None:
    tether("apply", "-f", str(EXAMPLES))
    out = tether("delete", "-f", str(EXAMPLES / "50-route.yaml")).stdout
    assert out.strip() == "httproute.gateway.networking.k8s.io/web-vote deleted"
    missing = tether("get", "httproutes.gateway.networking.k8s.io", "web-vote", "-n", "emojivoto", ok=False)
    assert missing.returncode == 1 and "not found" in missing.stderr
    assert tether("delete", "sa", "web", "-n", "emojivoto").stdout.strip() == "serviceaccount/web deleted"
    again = tether("delete", "sa", "web", "-n", "emojivoto", ok=False)
    assert again.returncode == 1 and "not found" in again.stderr
    tether("delete", "sa", "web", "-n", "emojivoto", "--ignore-not-found")


def test_bad_document_names_the_field_and_stores_nothing(tether: Run, tmp_path: Path) -> None:
    bad = tmp_path / "emoji.yaml"
    good = (EXAMPLES / "10-web.yaml").read_text()
    profile = yaml.safe_load((EXAMPLES / "30-profile.yaml").read_text())
    profile["spec"]["routes"][0]["condition"]["method"] = ["GET"]
    bad.write_text(good + "---\n" + yaml.safe_dump(profile))
    proc = tether("apply", "-f", str(bad), ok=False)
    assert proc.returncode == 1
    assert (f"{bad} doc 4 ServiceProfile web-svc.emojivoto.svc.cluster.local: "
            "spec.routes[0].condition.method: expected a string") in proc.stderr
    assert tether("get", "sa", "-n", "emojivoto", "-o", "name").stdout == ""


def test_stdin_apply_and_namespace_defaulting(tether: Run) -> None:
    doc = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: lonely\n"
    assert tether("apply", "-f", "-", input=doc).stdout.strip() == "serviceaccount/lonely created"
    assert json.loads(tether("get", "sa", "lonely", "-o", "json").stdout)["metadata"]["namespace"] == "default"
    clash = tether("apply", "-n", "other", "-f", str(EXAMPLES / "10-web.yaml"), ok=False)
    assert "namespace" in clash.stderr and clash.returncode == 1


def test_usage_and_unknown_kind_errors(tether: Run, home: Path) -> None:
    assert tether("get", ok=False).returncode == 2
    assert tether("get", "svc", "-o", "toml", ok=False).returncode == 2
    unknown = tether("get", "flurbs", ok=False)
    assert unknown.returncode == 1 and "flurbs" in unknown.stderr
    assert tether("apply", "-f", str(home / "nope.yaml"), ok=False).returncode == 1


def test_corrupt_store_is_reported_and_left_alone(tether: Run, home: Path) -> None:
    home.mkdir(parents=True)
    db = home / "store.db"
    db.write_bytes(b"this is not a database" * 100)
    before = db.read_bytes()
    proc = tether("get", "svc", ok=False)
    assert proc.returncode == 1 and str(db) in proc.stderr
    assert db.read_bytes() == before


def test_get_several_kinds_at_once(tether: Run) -> None:
    tether("apply", "-f", str(EXAMPLES))
    names = tether("get", "deploy,sp", "-A", "-o", "name").stdout.split()
    assert names == ["deployment.apps/web", "serviceprofile.linkerd.io/web-svc.emojivoto.svc.cluster.local"]
    table = tether("get", "sa,svc", "-n", "emojivoto").stdout
    assert "serviceaccount/web" in table and "service/web-svc" in table


def test_namespace_on_a_cluster_scoped_kind_is_ignored_as_kubernetes_does(tether: Run) -> None:
    doc = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  namespace: stray\n"
    assert tether("apply", "-f", "-", input=doc).stdout.strip() == "namespace/shop created"
    assert "namespace" not in json.loads(tether("get", "ns", "shop", "-o", "json").stdout)["metadata"]


def test_pod_table_counts_native_sidecars_as_kubectl_does(tether: Run) -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1", "namespace": "default"},
        "spec": {"initContainers": [{"name": "linkerd-init", "image": "x"},
                                    {"name": "linkerd-proxy", "image": "x", "restartPolicy": "Always"}],
                 "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "10.213.0.9",
                   "initContainerStatuses": [{"name": "linkerd-init", "ready": False, "restartCount": 0},
                                             {"name": "linkerd-proxy", "ready": True, "restartCount": 2}],
                   "containerStatuses": [{"name": "app", "ready": True, "restartCount": 1}]},
    }
    tether("apply", "-f", "-", input=json.dumps(pod))
    row = tether("get", "pods", "-o", "wide").stdout.splitlines()[1].split()
    assert row[:4] == ["web-1", "2/2", "Running", "3"] and "10.213.0.9" in row
    tether("apply", "-f", str(EXAMPLES))
    header = tether("get", "deploy", "-n", "emojivoto").stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "AGE"]


def test_get_endpointslices_shows_kubectls_columns(tether: Run, tmp_path: Path) -> None:
    # A selectorless Service's hand-written slice (issue #18): one ready address, one terminating.
    manifest = tmp_path / "slice.yaml"
    manifest.write_text("""
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Service
metadata: {name: legacy, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: legacy-1, namespace: shop, labels: {kubernetes.io/service-name: legacy}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.9.0.7]
  conditions: {ready: true}
- addresses: [10.9.0.8]
  conditions: {ready: false, terminating: true}
""")
    tether("apply", "-f", str(manifest))
    table = tether("get", "endpointslices", "-n", "shop").stdout.splitlines()
    assert table[0].split() == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    assert table[1].split()[:4] == ["legacy-1", "IPv4", "8080", "10.9.0.7,10.9.0.8"]
    assert tether("get", "endpointslice", "-n", "shop", "-o", "name").stdout.split() == [
        "endpointslice.discovery.k8s.io/legacy-1"]


def test_apply_warns_of_pod_fields_the_local_platform_does_not_apply(tether: Run) -> None:
    pod = ("apiVersion: v1\nkind: Pod\nmetadata: {name: edge, namespace: default}\nspec:\n  hostNetwork: true\n"
           "  containers:\n  - name: app\n    image: app\n    command: [app]\n"
           "    ports: [{containerPort: 8080, hostPort: 80}]\n"
           "    livenessProbe: {exec: {command: [ok]}}\n    readinessProbe: {httpGet: {port: 8080}}\n")
    proc = tether("apply", "-f", "-", input=pod)
    assert proc.stdout.strip() == "pod/edge created"  # stored as given: the warnings only say what has no effect
    assert proc.stderr.splitlines() == [
        "Warning: pod/edge: spec.hostNetwork: every local pod has a network namespace of its own",
        "Warning: pod/edge: spec.containers[0].ports[0].hostPort: nothing is forwarded from the host to a local pod",
        "Warning: pod/edge: spec.containers[0].livenessProbe.exec: exec probes are not run locally (they count as "
        "passing)"]
    plain = "apiVersion: v1\nkind: Pod\nmetadata: {name: plain, namespace: default}\nspec: {containers: [{name: a, image: a}]}\n"
    assert tether("apply", "-f", "-", input=plain).stderr == ""
