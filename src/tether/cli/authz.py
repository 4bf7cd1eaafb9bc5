"""``tether authz deploy/NAME``: the authorizations that apply to a workload, by port, server and route.

Lists the policy resources from the platform (``--platform``, the local store by
default) into the controller's own inbound index (``tether.policy.inbound.snapshot``)
and, for the workload's pods (or, with none running, its pod template), prints
each port a Server selects: the Server, the routes on it, and every
authorization (ServerAuthorization, AuthorizationPolicy, the Server's
``accessPolicy``) with the clients it admits.  Ports no Server selects get the
default policy, shown last.  ``-o json`` prints the same as data.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any

import click

from tether.cli import home
from tether.cli.errors import CliError
from tether.cli.platform_opts import Platform, platform_options
from tether.naming import DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN
from tether.policy.config import PolicyConfig
from tether.policy.defaults import DefaultPolicy
from tether.policy.inbound.facts import CONTROL_PLANE_NS_LABEL, PodFacts, external_workload_facts, pod_facts
from tether.policy.inbound.index import InboundIndex
from tether.policy.inbound.snapshot import snapshot_index
from tether.policy.model import AuthnKind, ClientAuthz
from tether.resources import kinds
from tether.resources.errors import ValidationError
from tether.resources.model import parse
from tether.resources.policy import DEFAULT_POLICIES
from tether.resources.workloads import DeploymentSpec
from tether.store import Store, StoreError

_WORKLOADS = {"deploy": "Deployment", "deployment": "Deployment", "deployments": "Deployment",
              "po": "Pod", "pod": "Pod", "pods": "Pod",
              "externalworkload": "ExternalWorkload", "externalworkloads": "ExternalWorkload"}
_USAGE = "deploy/NAME, po/NAME or externalworkload/NAME"


def clients(authz: ClientAuthz) -> str:
    nets = ",".join(str(n.cidr) + (" except " + ",".join(map(str, n.except_)) if n.except_ else "")
                    for n in authz.networks) or "cluster networks"
    if authz.authn is AuthnKind.UNAUTHENTICATED:
        who = "any client"
    elif authz.authn is AuthnKind.TLS_UNAUTHENTICATED:
        who = "meshed clients"
    else:
        who = ", ".join(map(str, authz.identities)) or "no identity"
    return f"{who} from {nets}"


def _ref(authz: ClientAuthz) -> str:
    return f"default:{authz.ref.name}" if authz.ref.is_default else f"{authz.ref.kind}/{authz.ref.name}"


def workload_authorizations(index: InboundIndex, pod: PodFacts) -> list[dict[str, Any]]:
    """One row per (port, server, route, authorization) that applies to ``pod``."""
    rows: list[dict[str, Any]] = []
    for port, server in index.servers_selecting(pod):
        policy = index.compute(pod, port)
        for authz in policy.authorizations:
            rows.append({"port": port, "server": server.name, "route": "*", "authorization": _ref(authz),
                         "clients": clients(authz)})
        for route in (*policy.http_routes, *policy.grpc_routes):
            if route.ref.is_default:
                continue
            for authz in route.authorizations:
                rows.append({"port": port, "server": server.name, "route": f"{route.ref.kind}/{route.ref.name}",
                             "authorization": _ref(authz), "clients": clients(authz)})
            if not route.authorizations and not policy.authorizations:
                rows.append({"port": port, "server": server.name, "route": f"{route.ref.kind}/{route.ref.name}",
                             "authorization": "-", "clients": "nobody (no authorization)"})
        if not policy.authorizations and not any(not r.ref.is_default for r in policy.http_routes):
            rows.append({"port": port, "server": server.name, "route": "*", "authorization": "-",
                         "clients": "nobody (no authorization)"})
    return rows


def _pods(store_objects: list[dict[str, Any]], namespace: str, kind: str, name: str) -> list[PodFacts]:
    if kind == "ExternalWorkload":  # a VM: its own labels and named ports, Servers' externalWorkloadSelector
        workloads = [o for o in store_objects if o["kind"] == kind and o["metadata"]["name"] == name]
        if not workloads:
            raise CliError(f"external workload {namespace}/{name} not found")
        return [external_workload_facts(parse(workloads[0]))]
    pods = [o for o in store_objects if o["kind"] == "Pod"]
    if kind == "Pod":
        found = [p for p in pods if p["metadata"]["name"] == name]
        if not found:
            raise CliError(f"pod {namespace}/{name} not found")
        facts = [pod_facts(parse(p)) for p in found]
        if facts[0] is None:
            raise CliError(f"pod {namespace}/{name} is not meshed (no {CONTROL_PLANE_NS_LABEL} label)")
        return [f for f in facts if f is not None]
    deployments = [o for o in store_objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    if not deployments:
        raise CliError(f"deployment {namespace}/{name} not found")
    resource = parse(deployments[0])
    spec = resource.spec
    assert isinstance(spec, DeploymentSpec)
    selected = [f for p in pods if spec.selector.matches((p["metadata"].get("labels") or {}))
                if (f := pod_facts(parse(p))) is not None]
    if selected:
        return selected[:1]  # every replica has the same template: one answers for all
    template = deployments[0]["spec"]["template"]
    meta = template.get("metadata") or {}
    pseudo = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": f"{name}-template", "namespace": namespace,
                           "labels": {**(meta.get("labels") or {}), CONTROL_PLANE_NS_LABEL: "template"},
                           "annotations": meta.get("annotations") or {}},
              "spec": template["spec"]}
    facts = pod_facts(parse(pseudo))
    assert facts is not None
    return [facts]


@click.command()
@click.argument("workload")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--store", "store_path", type=click.Path(dir_okay=False), help="The resource store.")
@click.option("--default-policy", type=click.Choice(DEFAULT_POLICIES), default="all-unauthenticated",
              show_default=True, help="The cluster default the controller runs with.")
@click.option("--control-plane-ns", default=DEFAULT_CONTROL_PLANE_NS, show_default=True)
@click.option("--identity-trust-domain", "--trust-domain", "trust_domain", default=DEFAULT_TRUST_DOMAIN,
              show_default=True)
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@platform_options
def authz(workload: str, namespace: str, store_path: str | None, default_policy: str, control_plane_ns: str,
          trust_domain: str, output: str, platform: Platform) -> None:
    """The authorizations that apply to WORKLOAD (deploy/NAME, po/NAME or externalworkload/NAME), by port,
    server and route."""
    kind_text, sep, name = workload.partition("/")
    if not sep or kind_text.lower() not in _WORKLOADS or not name:
        raise click.BadParameter(f"{workload!r}: expected {_USAGE}", param_hint="WORKLOAD")
    config = PolicyConfig(default_policy=DefaultPolicy.parse(default_policy), control_plane_ns=control_plane_ns,
                          identity_domain=trust_domain)
    try:
        store = None if platform.kubernetes else Store(store_path or home.store_path())
    except StoreError as exc:
        raise CliError(str(exc)) from None
    try:
        index, objects = asyncio.run(_load(platform, store, config, namespace))
        pods = _pods(objects, namespace, _WORKLOADS[kind_text.lower()], name)
    except ValidationError as exc:
        raise CliError(str(exc)) from None
    finally:
        if store is not None:
            store.close()
    rows = workload_authorizations(index, pods[0])
    default = index.default_policy(pods[0], 0).name
    if output == "json":
        click.echo(json.dumps({"workload": workload, "namespace": namespace, "authorizations": rows,
                               "default_policy": default}, indent=2))
        return
    if rows:
        widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in rows[0]}
        click.echo("  ".join(k.upper().ljust(widths[k]) for k in widths).rstrip())
        for row in rows:
            click.echo("  ".join(str(row[k]).ljust(widths[k]) for k in widths).rstrip())
    else:
        click.echo("No Server selects this workload.")
    click.echo(f"Ports no Server selects: default policy {default}.")


async def _load(platform: Platform, store: Store | None, config: PolicyConfig,
                namespace: str) -> tuple[InboundIndex, list[dict[str, Any]]]:
    watcher = platform.resource_watcher(store)
    index = await snapshot_index(watcher, config)
    objects: list[dict[str, Any]] = []
    for rtype in (kinds.POD, kinds.DEPLOYMENT, kinds.EXTERNAL_WORKLOAD):
        async with aclosing(watcher.watch(rtype.key, namespace)) as events:
            async for event in events:
                if event.type == "SYNCED":
                    break
                objects.append(dict(event.object or {}))
    return index, objects
