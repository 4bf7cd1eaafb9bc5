"""``tether diagnostics endpoints|profile AUTHORITY``: what the destination tells a proxy, read off the real streams.

Connects to ``--destination-addr`` as a proxy would (TLS, expecting the
destination's identity), opens ``Get`` or ``GetProfile`` and prints the first
message as a table (or every field with ``-o json``); ``--watch`` keeps
printing each message as it comes.  "No endpoints" (the service exists, nobody
is ready) and "unknown service" (NOT_FOUND) are told apart: the first prints a
notice and exits 0, the second is an error (exit 1).  With ``--platform
kubernetes`` no address or certificate is needed: a ready destination pod is
reached through a port-forward of the API server and its certificate verified
against the cluster's published trust anchors (``tether.diagnose.kube_reach``).
Registered on the root group by ``tether.cli.main``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import click
import grpc
from rich.console import Console
from rich.table import Table

from tether.cli.errors import CliError
from tether.cli.kube_forward import reach
from tether.cli.platform_opts import Platform, platform_options
from tether.destination.client import (
    ClientTls,
    DestinationError,
    open_channel,
    profile_dict,
    stream_endpoints,
    stream_profile,
    update_dict,
)
from tether.naming import DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN, control_plane_identity

_FILE = click.Path(dir_okay=False, exists=True, path_type=Path)


def _connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--destination-addr",
                     help="Where the destination service listens [default: where `tether up` runs it "
                          "($TETHER_HOME), else localhost:8086; with --platform kubernetes: a port-forward to a "
                          "ready linkerd-destination pod]."),
        click.option("--trust-anchors", "--tls-ca", "trust_anchors", type=_FILE,
                     help="Roots to verify the destination's certificate (PEM) [default: $TETHER_HOME's trust "
                          "anchors when `tether up` runs it, else system roots; with --platform kubernetes: the "
                          "cluster's linkerd-identity-trust-roots ConfigMap]."),
        click.option("--server-name",
                     help="Identity expected in the destination's certificate "
                          "[default: linkerd-destination.<cp-ns>.serviceaccount.identity.<cp-ns>.<trust-domain>]."),
        click.option("--control-plane-ns", "-L", default=DEFAULT_CONTROL_PLANE_NS, show_default=True,
                     help="Control-plane namespace (for the default server name, and where --platform "
                          "kubernetes finds the destination)."),
        click.option("--identity-trust-domain", "--trust-domain", "trust_domain", default=DEFAULT_TRUST_DOMAIN,
                     show_default=True, help="Trust domain (for the default server name)."),
        click.option("--tls-cert", type=_FILE, help="Client certificate chain, when the destination requires one."),
        click.option("--tls-key", type=_FILE, help="Client private key."),
        click.option("--insecure", is_flag=True, help="Connect without TLS."),
        click.option("--context-token", default="",
                     help='The context token to send, e.g. \'{"ns":"emojivoto"}\' (who is asking).'),
        click.option("-n", "--namespace", default=None,
                     help='Ask as a client in this namespace (sends {"ns": NAMESPACE} as the token).'),
        click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
                     help="Seconds to wait for the first message."),
        click.option("--watch", "-w", is_flag=True, help="Keep printing every message until interrupted."),
        click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True),
    ]
    for option in reversed(options):
        command = option(command)
    return platform_options(command)


def _tls(insecure: bool, trust_anchors: Path | None, server_name: str | None, control_plane_ns: str,
         trust_domain: str, tls_cert: Path | None, tls_key: Path | None) -> ClientTls | None:
    if insecure:
        return None
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("give both --tls-cert and --tls-key, or neither")
    name = server_name or control_plane_identity("destination", control_plane_ns, trust_domain).dns_name
    return ClientTls(roots=trust_anchors, server_name=name, cert=tls_cert, key=tls_key)


def _token(context_token: str, namespace: str | None) -> str:
    if namespace is not None:
        if context_token:
            raise click.UsageError("give --namespace or --context-token, not both")
        return json.dumps({"ns": namespace})
    return context_token


async def _follow(
    authority: str, addr: str, tls: ClientTls | None, token: str, timeout: float, watch: bool,
    open_stream: Callable[..., AsyncIterator[Any]], show: Callable[[Any], None],
) -> None:
    channel = open_channel(addr, tls)
    try:
        first = True
        async for message in open_stream(channel, authority, token, timeout if not watch else None):
            show(message)
            if not watch:
                return
            first = False
        if first:
            raise CliError(f"the destination closed the stream for {authority} without an answer")
    except TimeoutError:
        raise CliError(f"no answer from the destination at {addr} for {authority} within {timeout:g}s") from None
    except DestinationError as exc:
        if exc.code is grpc.StatusCode.NOT_FOUND:
            raise CliError(f"unknown service: {authority}: {exc.details}") from None
        if exc.code is grpc.StatusCode.UNAVAILABLE:
            raise CliError(f"cannot reach the destination at {addr}: {exc.details}") from None
        raise CliError(f"{authority}: {exc.code.name}: {exc.details}") from None
    finally:
        await channel.close()


@click.group()
def diagnostics() -> None:
    """Look at what the control plane tells proxies."""


@diagnostics.command()
@click.argument("authority")
@_connection_options
def endpoints(authority: str, destination_addr: str, trust_anchors: Path | None, server_name: str | None,
              control_plane_ns: str, trust_domain: str, tls_cert: Path | None, tls_key: Path | None,
              insecure: bool, context_token: str, namespace: str | None, timeout: float, watch: bool,
              output: str, platform: Platform) -> None:
    """The endpoints a proxy would receive for AUTHORITY (<svc>.<ns>.svc.<cluster-domain>:<port>)."""
    tls = _tls(insecure, trust_anchors, server_name, control_plane_ns, trust_domain, tls_cert, tls_key)
    console = Console(soft_wrap=True)

    def show(update: Any) -> None:
        doc = update_dict(update)
        if output == "json":
            click.echo(json.dumps(doc, indent=2 if not watch else None, sort_keys=True))
        else:
            _print_update(console, authority, doc)

    token = _token(context_token, namespace)
    reach(platform, "destination", destination_addr, "--destination-addr", control_plane_ns, tls,
          lambda addr, tls_: _follow(authority, addr, tls_, token, timeout, watch, stream_endpoints, show))


@diagnostics.command()
@click.argument("authority")
@_connection_options
def profile(authority: str, destination_addr: str, trust_anchors: Path | None, server_name: str | None,
            control_plane_ns: str, trust_domain: str, tls_cert: Path | None, tls_key: Path | None,
            insecure: bool, context_token: str, namespace: str | None, timeout: float, watch: bool,
            output: str, platform: Platform) -> None:
    """The profile a proxy would receive for AUTHORITY (a service authority, or IP:PORT of a pod)."""
    tls = _tls(insecure, trust_anchors, server_name, control_plane_ns, trust_domain, tls_cert, tls_key)
    console = Console(soft_wrap=True)

    def show(message: Any) -> None:
        doc = profile_dict(message)
        if output == "json":
            click.echo(json.dumps(doc, indent=2 if not watch else None, sort_keys=True))
        else:
            _print_profile(console, doc)

    token = _token(context_token, namespace)
    reach(platform, "destination", destination_addr, "--destination-addr", control_plane_ns, tls,
          lambda addr, tls_: _follow(authority, addr, tls_, token, timeout, watch, stream_profile, show))


def _hint(addr: dict[str, Any]) -> str:
    hint = addr.get("protocol_hint", "-")
    if "opaque_transport_port" in addr:
        hint += f" (transport :{addr['opaque_transport_port']})"
    return hint


def _print_update(console: Console, authority: str, doc: dict[str, Any]) -> None:
    if "no_endpoints" in doc:
        if doc["no_endpoints"]["exists"]:
            console.print(f"No endpoints found for {authority}: the service exists, but no pod is ready.")
        else:
            console.print(f"No endpoints: {authority} does not exist (any more).")
        return
    if "remove" in doc:
        console.print("removed: " + ", ".join(doc["remove"]))
        return
    added = doc["add"]
    table = Table(box=None, pad_edge=False)
    for column in ("NAMESPACE", "IP", "PORT", "POD", "SERVICE", "IDENTITY", "HINT"):
        table.add_column(column)
    for addr in sorted(added["addrs"], key=lambda a: (a["metric_labels"].get("pod", ""), a["addr"])):
        ip, _, port = addr["addr"].rpartition(":")
        labels = addr["metric_labels"]
        table.add_row(
            added["metric_labels"].get("namespace", ""), ip.strip("[]"), port, labels.get("pod", "-"),
            added["metric_labels"].get("service", ""), addr.get("tls_identity", "-"), _hint(addr),
        )
    console.print(table)


def _condition(node: Any) -> str:
    if isinstance(node, dict) and len(node) == 1:
        (key, value), = node.items()
        if key in ("all", "any"):
            return f"{key}(" + ", ".join(_condition(v) for v in value) + ")"
        if key == "not":
            return f"not({_condition(value)})"
        if key == "status":
            return f"status {value['min']}-{value['max'] or value['min']}"
        return f"{key}={value}"
    return str(node)


def _print_profile(console: Console, doc: dict[str, Any]) -> None:
    console.print(f"fully qualified name: {doc['fully_qualified_name'] or '-'}")
    console.print(f"opaque protocol:      {doc['opaque_protocol']}")
    if "retry_budget" in doc:
        budget = doc["retry_budget"]
        console.print(f"retry budget:         ratio {budget['retry_ratio']:g}, "
                      f"{budget['min_retries_per_second']}/s minimum, ttl {budget['ttl_s']:g}s")
    if "profile_ref" in doc and doc["profile_ref"]["name"]:
        ref = doc["profile_ref"]
        console.print(f"service profile:      {ref['namespace']}/{ref['name']}")
    if "endpoint" in doc:
        endpoint = doc["endpoint"]
        console.print(f"endpoint:             {endpoint['addr']} "
                      f"pod={endpoint['metric_labels'].get('pod', '-')} "
                      f"identity={endpoint.get('tls_identity', '-')} hint={_hint(endpoint)}")
    if doc["dst_overrides"]:
        console.print("traffic split:        " + ", ".join(f"{d['authority']} ({d['weight']})"
                                                          for d in doc["dst_overrides"]))
    if doc["routes"]:
        table = Table(box=None, pad_edge=False)
        for column in ("ROUTE", "CONDITION", "RETRYABLE", "TIMEOUT", "FAILURE CLASSES"):
            table.add_column(column)
        for route in doc["routes"]:
            failures = [_condition(rc["condition"]) for rc in route["response_classes"] if rc["is_failure"]]
            table.add_row(
                route["metrics_labels"].get("route", "-"), _condition(route["condition"]),
                "yes" if route["is_retryable"] else "no",
                f"{route['timeout_s']:g}s" if "timeout_s" in route else "-", ", ".join(failures) or "-",
            )
        console.print(table)


def _register_policy() -> None:
    from tether.cli.policy_diagnostics import policy

    diagnostics.add_command(policy)


_register_policy()


def _register_scrapes() -> None:
    from tether.cli.diagnostics_scrape import controller_metrics, proxy_metrics

    diagnostics.add_command(proxy_metrics)
    diagnostics.add_command(controller_metrics)


_register_scrapes()
