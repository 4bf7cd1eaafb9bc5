"""``tether diagnostics policy po/NAME PORT``: the inbound policy a pod's proxy receives, read off the real API.

Connects to ``--policy-addr`` as the pod's proxy would (TLS, expecting the
controller's identity ``linkerd-destination.<cp-ns>...``), sends its
``PortSpec`` and prints the ``Server`` message: protocol, authorizations
(networks, authentication, identities) and routes with their own
authorizations — as a summary, or every field with ``-o json``; ``--watch``
follows ``WatchPort``.  ``svc/NAME PORT`` asks the outbound side.  With
``--platform kubernetes`` a ready policy pod is reached through a port-forward
(``tether.cli.kube_forward``), no address or certificate needed.  Registered
on ``tether diagnostics`` by ``tether.cli.diagnostics``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import grpc

from tether.cli.errors import CliError
from tether.cli.kube_forward import reach
from tether.cli.platform_opts import Platform, platform_options
from tether.naming import DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN, control_plane_identity
from tether.policy.client import PolicyError, inbound_policy, server_dict, watch_port, workload_string
from tether.policy.outbound.client import describe, get_outbound, policy_dict, service_request, watch_outbound
from tether.serving.channel import ClientTls, open_channel

_FILE = click.Path(dir_okay=False, exists=True, path_type=Path)
_KINDS = {"po": "pod", "pod": "pod", "pods": "pod", "svc": "service", "service": "service", "services": "service",
          "externalworkload": "externalworkload", "externalworkloads": "externalworkload"}
_USAGE = "po/NAME, externalworkload/NAME or svc/NAME"


def parse_target(target: str) -> tuple[str, str]:
    """``po/NAME``, ``externalworkload/NAME`` or ``svc/NAME`` -> ("pod" | "externalworkload" | "service", NAME)."""
    kind, sep, name = target.partition("/")
    if not sep or kind.lower() not in _KINDS or not name:
        raise click.BadParameter(f"{target!r}: expected {_USAGE}", param_hint="TARGET")
    return _KINDS[kind.lower()], name


def describe_authz(authz: dict[str, Any]) -> str:
    who = authz["authentication"]
    if who == "identities":
        who = ", ".join([*authz.get("identities", []), *authz.get("suffixes", [])]) or "(no identity)"
    return f"{authz['ref']}: {who} from {', '.join(authz['networks'])}"


def print_server(doc: dict[str, Any]) -> None:
    labels = doc["labels"]
    server = f"{labels.get('kind')}/{labels.get('name')}" if labels.get("kind") != "default" \
        else f"default policy {labels.get('name')}"
    click.echo(f"server:         {server}")
    click.echo(f"protocol:       {doc['protocol']}" + (f" (timeout {doc['detect_timeout_s']:g}s)"
                                                       if "detect_timeout_s" in doc else ""))
    click.echo("authorizations: " + ("none (every connection is denied)" if not doc["authorizations"] else ""))
    for authz in doc["authorizations"]:
        click.echo(f"  {describe_authz(authz)}")
    for key in ("http_routes", "grpc_routes"):
        for route in doc.get(key, []):
            matches = "; ".join(", ".join(f"{k}={v}" for k, v in m.items() if v)
                                for rule in route["rules"] for m in rule["matches"]) or "everything"
            click.echo(f"route {route['ref']}: {matches}")
            for authz in route["authorizations"]:
                click.echo(f"  {describe_authz(authz)}")
    if "ratelimit" in doc:
        limit = doc["ratelimit"]
        click.echo(f"rate limit:     {limit['ref']} total={limit['total']} identity={limit['identity']} "
                   f"overrides={len(limit['overrides'])}")


@click.command("policy")
@click.argument("target")
@click.argument("port", type=click.IntRange(1, 65535))
@click.option("-n", "--namespace", default="default", show_default=True, help="Namespace of the pod or service.")
@click.option("--client-namespace", help="svc/: the namespace of the asking proxy, which decides the consumer "
                                         "routes that apply [default: the service's namespace].")
@click.option("--cluster-domain", default=DEFAULT_CLUSTER_DOMAIN, show_default=True,
              help="svc/: the cluster domain of the service's name.")
@click.option("--policy-addr", help="Where the policy controller listens [default: where `tether up` runs it "
                                    "($TETHER_HOME), else localhost:8090; with --platform kubernetes: a "
                                    "port-forward to a ready linkerd-policy pod].")
@click.option("--trust-anchors", type=_FILE, help="Roots to verify the controller's certificate (PEM) [default: "
                                                  "$TETHER_HOME's trust anchors when `tether up` runs it, else "
                                                  "system roots; with --platform kubernetes: the cluster's "
                                                  "linkerd-identity-trust-roots ConfigMap].")
@click.option("--server-name", help="Identity expected in the controller's certificate "
                                    "[default: linkerd-destination.<cp-ns>.serviceaccount.identity.<cp-ns>.<td>].")
@click.option("--control-plane-ns", "-L", default=DEFAULT_CONTROL_PLANE_NS, show_default=True)
@click.option("--identity-trust-domain", "--trust-domain", "trust_domain", default=DEFAULT_TRUST_DOMAIN,
              show_default=True)
@click.option("--tls-cert", type=_FILE, help="Client certificate chain, when the controller requires one.")
@click.option("--tls-key", type=_FILE, help="Client private key.")
@click.option("--insecure", is_flag=True, help="Connect without TLS.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True)
@click.option("--watch", "-w", is_flag=True, help="Follow WatchPort, printing every message.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@platform_options
def policy(target: str, port: int, namespace: str, client_namespace: str | None, cluster_domain: str,
           policy_addr: str | None, trust_anchors: Path | None,
           server_name: str | None, control_plane_ns: str, trust_domain: str, tls_cert: Path | None,
           tls_key: Path | None, insecure: bool, timeout: float, watch: bool, output: str,
           platform: Platform) -> None:
    """The policy a proxy receives: po/NAME PORT or externalworkload/NAME PORT (inbound, a pod's or a VM's
    proxy), or svc/NAME PORT (outbound)."""
    kind, name = parse_target(target)
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("give both --tls-cert and --tls-key, or neither")
    tls = None if insecure else ClientTls(
        trust_anchors, server_name or control_plane_identity("destination", control_plane_ns, trust_domain).dns_name,
        tls_cert, tls_key)
    if kind == "service":
        spec = service_request(namespace, name, port, client_namespace or namespace, cluster_domain)
        reach(platform, "policy", policy_addr, "--policy-addr", control_plane_ns, tls,
              lambda addr, tls_: _run_outbound(addr, tls_, spec, timeout, watch, output))
        return

    def show(doc: dict[str, Any]) -> None:
        if output == "json":
            click.echo(json.dumps(doc, indent=None if watch else 2, sort_keys=True))
        else:
            print_server(doc)

    reach(platform, "policy", policy_addr, "--policy-addr", control_plane_ns, tls,
          lambda addr, tls_: _run(addr, tls_, namespace, name, kind == "externalworkload", port, timeout, watch,
                                  show))


async def _run(addr: str, tls: ClientTls | None, namespace: str, pod: str, external: bool, port: int,
               timeout: float, watch: bool, show: Any) -> None:
    channel = open_channel(addr, tls)
    try:
        if not watch:
            show(await inbound_policy(channel, namespace, pod, port, timeout, external=external))
            return
        async for message in watch_port(channel, workload_string(namespace, pod, external=external), port):
            show(server_dict(message))
    except TimeoutError:
        raise CliError(f"no answer from the policy controller at {addr} within {timeout:g}s") from None
    except PolicyError as exc:
        if exc.code is grpc.StatusCode.NOT_FOUND:
            what = "external workload" if external else "pod"
            raise CliError(f"unknown {what} {namespace}/{pod}: {exc.details}") from None
        if exc.code is grpc.StatusCode.UNAVAILABLE:
            raise CliError(f"cannot reach the policy controller at {addr}: {exc.details}") from None
        raise CliError(f"{namespace}/{pod}:{port}: {exc.code.name}: {exc.details}") from None
    finally:
        await channel.close()


async def _run_outbound(addr: str, tls: ClientTls | None, spec: Any, timeout: float, watch: bool,
                        output: str) -> None:
    def show(message: Any) -> None:
        if output == "json":
            click.echo(json.dumps(policy_dict(message), indent=None if watch else 2, sort_keys=True))
        else:
            click.echo("\n".join(describe(message)))

    channel = open_channel(addr, tls)
    try:
        if not watch:
            show(await get_outbound(channel, spec, timeout))
            return
        async for message in watch_outbound(channel, spec):
            show(message)
    except TimeoutError:
        raise CliError(f"no answer from the policy controller at {addr} within {timeout:g}s") from None
    except PolicyError as exc:
        if exc.code is grpc.StatusCode.UNAVAILABLE:
            raise CliError(f"cannot reach the policy controller at {addr}: {exc.details}") from None
        raise CliError(f"{spec.authority}: {exc.code.name}: {exc.details}") from None
    finally:
        await channel.close()
