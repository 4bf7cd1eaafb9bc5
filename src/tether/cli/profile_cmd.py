"""``tether profile (--template | --open-api FILE | --proto FILE) SERVICE -n NS``: generate a ServiceProfile.

As ``linkerd profile``:

- ``--template``: a commented ServiceProfile to edit and apply;
- ``--open-api FILE`` (OpenAPI 2 / Swagger, JSON or YAML): one route per path and
  method, named ``METHOD /path``, matching ``pathRegex`` (``{param}`` matches one
  segment) and the method; the operation's responses become response classes
  (5xx ones are failures); ``x-linkerd-retryable`` and ``x-linkerd-timeout`` set
  ``isRetryable`` and ``timeout``;
- ``--proto FILE``: one route per rpc, named after it, matching ``POST
  /<package>.<Service>/<Method>``; an rpc with ``option idempotency_level =
  IDEMPOTENT`` (or ``NO_SIDE_EFFECTS``) is retryable.

The profile is named ``SERVICE.NS.svc.CLUSTER-DOMAIN``.  Registered on the root group
by ``tether.cli.main``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import yaml

from tether.cli.errors import CliError
from tether.naming import DEFAULT_CLUSTER_DOMAIN

METHODS = ("delete", "get", "head", "options", "patch", "post", "put")  # Linkerd's order
_PARAM = re.compile(r"\\\{[^}]*\\\}")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_PACKAGE = re.compile(r"\bpackage\s+([\w.]+)\s*;")
_SERVICE = re.compile(r"\bservice\s+(\w+)\s*\{")
_RPC = re.compile(r"\brpc\s+(\w+)\s*\([^)]*\)\s*returns\s*\([^)]*\)\s*(\{|;)")
_IDEMPOTENT = re.compile(r"option\s+idempotency_level\s*=\s*(IDEMPOTENT|NO_SIDE_EFFECTS)\s*;")

TEMPLATE = """\
### ServiceProfile for {service}.{namespace} ###
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: {name}
  namespace: {namespace}
spec:
  # A service profile defines a list of routes.  Each request is matched against the
  # routes in order and takes the first that matches; its metrics are labelled with it.
  routes:
  - name: '/authors/{{id}}'
    # What a request must look like to match this route.
    condition:
      pathRegex: '/authors/\\d+'
      method: POST
    # Responses are classified in order: the first that matches decides.
    responseClasses:
    - condition:
        status:
          min: 500
          max: 599
      isFailure: true
    # Whether a failed request of this route may be retried.
    isRetryable: false
    # How long the proxy waits for a response (default 10s).
    timeout: 200ms
  # Retries may add at most this share of the requests to the service.
  retryBudget:
    retryRatio: 0.2
    minRetriesPerSecond: 10
    ttl: 10s
"""


def path_regex(path: str) -> str:
    """A path of the spec as Linkerd matches it: escaped, each ``{param}`` one segment."""
    return _PARAM.sub("[^/]*", re.escape(path))


def service_profile(service: str, namespace: str, cluster_domain: str,
                    routes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
            "metadata": {"name": f"{service}.{namespace}.svc.{cluster_domain}", "namespace": namespace},
            "spec": {"routes": routes}}


def _read(path: Path, flag: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise CliError(f"{flag} {path}: {exc.strerror}") from None


def open_api_routes(text: str, source: str) -> list[dict[str, Any]]:
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{source}: not YAML or JSON: {exc}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("paths") or {}, dict):
        raise CliError(f"{source}: not an OpenAPI document (no paths mapping)")
    base = str(spec.get("basePath") or "").rstrip("/")
    routes = []
    for rel in sorted(spec.get("paths") or {}):
        item = spec["paths"][rel] or {}
        path = base + "/" + rel.lstrip("/")
        for method in METHODS:
            if method not in item:
                continue
            operation = item[method] or {}
            route: dict[str, Any] = {"name": f"{method.upper()} {path}",
                                     "condition": {"pathRegex": path_regex(path), "method": method.upper()}}
            statuses = sorted(int(s) for s in (operation.get("responses") or {}) if str(s).isdigit())
            if statuses:
                route["responseClasses"] = [{"condition": {"status": {"min": s, "max": s}}, "isFailure": s >= 500}
                                            for s in statuses]
            if operation.get("x-linkerd-retryable") is True:
                route["isRetryable"] = True
            if operation.get("x-linkerd-timeout"):
                route["timeout"] = str(operation["x-linkerd-timeout"])
            routes.append(route)
    return routes


def _block(text: str, start: int) -> str:
    """The text inside the braces opening just before ``start``."""
    depth, i = 1, start
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    if depth:
        raise CliError("unbalanced braces in the proto file")
    return text[start:i - 1]


def proto_routes(text: str) -> list[dict[str, Any]]:
    text = _COMMENT.sub("", text)
    package = _PACKAGE.search(text)
    prefix = f"{package.group(1)}." if package else ""
    routes = []
    for service in _SERVICE.finditer(text):
        body = _block(text, service.end())
        for rpc in _RPC.finditer(body):
            options = _block(body, rpc.end()) if rpc.group(2) == "{" else ""
            route: dict[str, Any] = {"name": rpc.group(1), "condition": {
                "method": "POST", "pathRegex": re.escape(f"/{prefix}{service.group(1)}/{rpc.group(1)}")}}
            if _IDEMPOTENT.search(options):
                route["isRetryable"] = True
            routes.append(route)
    return routes


@click.command()
@click.argument("service")
@click.option("-n", "--namespace", default="default", show_default=True, help="Namespace of the service.")
@click.option("--template", is_flag=True, help="Print a commented ServiceProfile template.")
@click.option("--open-api", "open_api", type=click.Path(dir_okay=False, path_type=Path),
              help="Generate from this OpenAPI (Swagger 2) spec, YAML or JSON.")
@click.option("--proto", type=click.Path(dir_okay=False, path_type=Path), help="Generate from this .proto file.")
@click.option("--cluster-domain", default=DEFAULT_CLUSTER_DOMAIN, show_default=True)
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
def profile(service: str, namespace: str, template: bool, open_api: Path | None, proto: Path | None,
            cluster_domain: str, output: str) -> None:
    """Generate a ServiceProfile for SERVICE: a --template, or routes from --open-api or --proto."""
    if sum((template, open_api is not None, proto is not None)) != 1:
        raise click.UsageError("give exactly one of --template, --open-api FILE or --proto FILE")
    name = f"{service}.{namespace}.svc.{cluster_domain}"
    if template:
        if output == "json":
            raise click.UsageError("--template prints YAML (with comments)")
        click.echo(TEMPLATE.format(service=service, namespace=namespace, name=name), nl=False)
        return
    if open_api is not None:
        routes = open_api_routes(_read(open_api, "--open-api"), str(open_api))
    else:
        assert proto is not None
        routes = proto_routes(_read(proto, "--proto"))
    doc = service_profile(service, namespace, cluster_domain, routes)
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)
