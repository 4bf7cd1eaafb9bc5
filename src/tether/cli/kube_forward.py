"""Where a diagnostics command reaches a control-plane component: its local address, or a port-forward.

On the local platform a command connects to the address it is given, else where
``tether up`` runs the component (the bridge's address in ``$TETHER_HOME``'s
settings, verified against that state's trust anchors and presenting its CLI
certificate when no anchors are given), else
the component's default address.  With ``--platform kubernetes`` it needs neither
address nor certificate: a ready pod of the component is reached through the
API server's port-forward and the component's certificate verified against the
cluster's published trust anchors (``tether.diagnose.kube_reach``).  An address
option given with ``--platform kubernetes`` is refused, not ignored.

Callers: ``tether diagnostics endpoints|profile`` (destination) and ``tether
diagnostics policy`` (policy).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import click

from tether.cli import home
from tether.cli.errors import CliError
from tether.cli.platform_opts import Platform
from tether.platform.local import config as platform_config
from tether.serving.channel import ClientTls

# component -> (gRPC port in its pod, as `tether install` renders it; default address on the local platform)
PORTS = {"destination": (8086, "localhost:8086"), "policy": (8090, "localhost:8090")}

Follow = Callable[[str, ClientTls | None], Coroutine[Any, Any, None]]


def _api_tunnel(platform: Platform) -> Callable[[str, str, int], Any]:
    """The dialer of a pod's port through the API server (``tether.platform.kubernetes.tunnel``)."""
    settings = platform.client_settings()

    def dialer(namespace: str, pod: str, port: int) -> Any:
        from tether.platform.kubernetes.tunnel import open_tunnel

        return lambda: open_tunnel(settings, namespace, pod, port)

    return dialer


# Tests replace this with a loopback stand-in: kmock speaks no port-forward protocol.
tunnel_factory: Callable[[Platform], Callable[[str, str, int], Any]] = _api_tunnel


def reach(platform: Platform, component: str, addr: str | None, addr_flag: str, control_plane_ns: str,
          tls: ClientTls | None, follow: Follow) -> None:
    """Run ``follow(addr, tls)`` against ``component``: at ``addr`` locally, through a port-forward on Kubernetes."""
    port, _ = PORTS[component]
    if not platform.kubernetes:
        if addr is None:
            addr, tls = _local_component(component, tls)
        asyncio.run(follow(addr, tls))
        return
    if addr is not None:
        raise click.UsageError(f"{addr_flag} is for the local platform: with --platform kubernetes the "
                               f"{component} is reached through a port-forward")
    asyncio.run(_through_forward(platform, component, port, control_plane_ns, tls, follow))


def _local_component(component: str, tls: ClientTls | None) -> tuple[str, ClientTls | None]:
    """Where ``tether up`` runs ``component``, with its state's trust anchors and client certificate when ``tls``
    names no roots; the default address when there is no local platform in ``$TETHER_HOME``."""
    try:
        config = platform_config.load(home.state_dir())
    except platform_config.PlatformConfigError:
        config = None
    if config is None:
        return PORTS[component][1], tls
    layout = config.layout
    if tls is not None and tls.roots is None:
        tls = dataclasses.replace(tls, roots=layout.trust_anchors)
        if tls.cert is None and layout.cli_cert.exists():  # the destination requires a client's certificate
            tls = dataclasses.replace(tls, cert=layout.cli_cert, key=layout.cli_key)
    return config.address(getattr(config.ports, component)), tls


async def _through_forward(platform: Platform, component: str, port: int, control_plane_ns: str,
                           tls: ClientTls | None, follow: Follow) -> None:
    from tether.diagnose import kube_reach
    from tether.platform.kubernetes.client import KubeClient, KubeError

    client = KubeClient(platform.client_settings())
    try:
        needs_anchors = tls is not None and tls.roots is None
        async with kube_reach.component(client, control_plane_ns, component, port,
                                        tunnel_factory(platform), anchors=needs_anchors) as reached:
            if tls is not None and needs_anchors:
                tls = dataclasses.replace(tls, roots=reached.anchors_pem.encode())
            try:
                await follow(reached.forward.addr, tls)
            except CliError:
                if reached.forward.failures:  # the forward broke: that, not "cannot reach 127.0.0.1:…", is why
                    raise CliError(f"pod {control_plane_ns}/{reached.pod}: {reached.forward.failures[0]}") from None
                raise
    except (kube_reach.NotReachable, KubeError) as exc:
        raise CliError(str(exc)) from None
    finally:
        await client.close()
