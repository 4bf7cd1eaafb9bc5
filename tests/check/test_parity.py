"""Linkerd CLI parity found by trying Linkerd's docs as a new user: `identity create-* --out DIR` makes DIR."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tether.cli.main import cli


def test_create_commands_make_the_out_directory(tmp_path: Path) -> None:
    runner = CliRunner()
    anchors = tmp_path / "new" / "anchors"
    done = runner.invoke(cli, ["identity", "create-trust-anchor", "--out", str(anchors)])
    assert done.exit_code == 0, done.output
    issuer = tmp_path / "other" / "issuer"
    done = runner.invoke(cli, ["identity", "create-issuer", "--anchor-cert", str(anchors / "ca.crt"),
                               "--anchor-key", str(anchors / "ca.key"), "--out", str(issuer)])
    assert done.exit_code == 0, done.output
    assert (issuer / "issuer.crt").exists() and (issuer / "issuer.key").stat().st_mode & 0o777 == 0o600


def test_an_out_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    done = CliRunner().invoke(cli, ["identity", "create-trust-anchor", "--out", str(tmp_path / "file" / "x")])
    assert done.exit_code == 1 and "Not a directory" in done.output and "Traceback" not in done.output


def test_version_flags_without_a_platform(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))
    runner = CliRunner()
    assert runner.invoke(cli, ["version"]).output == "Client version: 0.1.0\nServer version: unavailable\n"
    assert runner.invoke(cli, ["version", "--short", "--client"]).output == "0.1.0\n"
    assert runner.invoke(cli, ["version", "--proxy"]).output.endswith("Proxy versions:\n\tunavailable\n")


LIST_WITH_NULL = """
apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web, namespace: default}
  spec:
    selector: {matchLabels: {app: web}}
    template:
      metadata: {labels: {app: web}}
      spec: {containers: [{name: web, image: nginx}]}
-
"""


def _anchors(tmp_path: Path) -> Path:
    out = tmp_path / "pki"
    assert CliRunner().invoke(cli, ["identity", "create-trust-anchor", "--out", str(out)]).exit_code == 0
    return out / "ca.crt"


def _template_spec(text: str) -> dict:
    import yaml

    (deployment, *rest) = yaml.safe_load(text)["items"]
    assert rest == [None]  # the null item is printed back as it was
    return deployment["spec"]["template"]["spec"]


def test_inject_accepts_a_list_with_null_items_and_reinjects_injected_workloads(tmp_path: Path) -> None:
    manifest = tmp_path / "list.yaml"
    manifest.write_text(LIST_WITH_NULL)
    anchors = _anchors(tmp_path)
    runner = CliRunner()
    first = runner.invoke(cli, ["inject", "--manual", "--identity-trust-anchors-file", str(anchors), str(manifest)])
    assert first.exit_code == 0, first.output
    injected = first.stdout
    manifest.write_text(injected)
    again = runner.invoke(cli, ["inject", "--manual", "--identity-trust-anchors-file", str(anchors),
                                "--proxy-log-level", "debug", str(manifest)])
    assert again.exit_code == 0, again.output
    spec = _template_spec(again.stdout)
    names = [c["name"] for c in spec.get("initContainers", [])] + [c["name"] for c in spec["containers"]]
    assert names.count("linkerd-proxy") == 1 and names.count("linkerd-init") == 1
    proxy = next(c for c in spec["initContainers"] if c["name"] == "linkerd-proxy")
    log = next(e["value"] for e in proxy["env"] if e["name"] == "LINKERD2_PROXY_LOG")
    assert log.startswith("debug")  # the re-injection took the new setting
    assert "already" not in again.stderr


def test_gateway_httproute_v1alpha2_is_accepted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))
    route = tmp_path / "route.yaml"
    route.write_text("""
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: HTTPRoute
metadata: {name: egress, namespace: default}
spec:
  parentRefs: [{name: all-egress, kind: EgressNetwork, group: policy.linkerd.io, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /get}}]
    backendRefs: [{kind: EgressNetwork, group: policy.linkerd.io, name: all-egress, port: 80}]
""")
    done = CliRunner().invoke(cli, ["apply", "-f", str(route)])
    assert done.exit_code == 0 and "httproute.gateway.networking.k8s.io/egress created" in done.output, done.output


VOTING_PROTO = """
syntax = "proto3";
package emojivoto.v1;
// rpc Commented(A) returns (B);
service VotingService {
  rpc VotePoop (VoteRequest) returns (VoteResponse);
  rpc Results (ResultsRequest) returns (ResultsResponse) {
    option idempotency_level = NO_SIDE_EFFECTS;
  }
}
"""

BOOKS_OPENAPI = """
swagger: "2.0"
basePath: /api/
paths:
  /books/{id}:
    get:
      responses: {"200": {description: ok}, "503": {description: down}}
      x-linkerd-retryable: true
      x-linkerd-timeout: 300ms
  /books:
    post: {responses: {"201": {description: made}}}
"""


def _applies(tmp_path: Path, monkeypatch, text: str) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path / "home"))
    done = CliRunner().invoke(cli, ["apply", "-f", "-"], input=text)
    assert done.exit_code == 0 and "serviceprofile.linkerd.io/" in done.output, done.output


def test_profile_from_a_proto_file(tmp_path: Path, monkeypatch) -> None:
    import yaml

    proto = tmp_path / "voting.proto"
    proto.write_text(VOTING_PROTO)
    done = CliRunner().invoke(cli, ["profile", "--proto", str(proto), "voting-svc", "-n", "emojivoto"])
    assert done.exit_code == 0, done.output
    doc = yaml.safe_load(done.output)
    assert doc["metadata"] == {"name": "voting-svc.emojivoto.svc.cluster.local", "namespace": "emojivoto"}
    assert doc["spec"]["routes"] == [
        {"name": "VotePoop", "condition": {"method": "POST", "pathRegex": r"/emojivoto\.v1\.VotingService/VotePoop"}},
        {"name": "Results", "condition": {"method": "POST", "pathRegex": r"/emojivoto\.v1\.VotingService/Results"},
         "isRetryable": True},
    ]
    _applies(tmp_path, monkeypatch, done.output)


def test_profile_from_an_open_api_spec_and_the_template(tmp_path: Path, monkeypatch) -> None:
    import yaml

    spec = tmp_path / "books.yaml"
    spec.write_text(BOOKS_OPENAPI)
    done = CliRunner().invoke(cli, ["profile", "--open-api", str(spec), "books", "-n", "shop", "-o", "json"])
    assert done.exit_code == 0, done.output
    routes = {r["name"]: r for r in yaml.safe_load(done.output)["spec"]["routes"]}
    assert list(routes) == ["POST /api/books", "GET /api/books/{id}"]
    get = routes["GET /api/books/{id}"]
    assert get["condition"] == {"pathRegex": "/api/books/[^/]*", "method": "GET"}
    assert [(c["condition"]["status"]["min"], c["isFailure"]) for c in get["responseClasses"]] == [(200, False),
                                                                                                   (503, True)]
    assert get["isRetryable"] is True and get["timeout"] == "300ms"
    _applies(tmp_path, monkeypatch, done.output)
    template = CliRunner().invoke(cli, ["profile", "--template", "web", "-n", "emojivoto"])
    assert template.exit_code == 0 and "# A service profile defines a list of routes" in template.output
    _applies(tmp_path, monkeypatch, template.output)
    both = CliRunner().invoke(cli, ["profile", "--template", "--proto", str(spec), "web"])
    assert both.exit_code == 2 and "exactly one of" in both.output
