"""What the controllers' ``serve`` commands share: flag checks for domains, namespaces and opaque ports, the
gRPC port's TLS flags and their checks, and running until a signal.

Used by ``tether destination serve`` and ``tether policy serve``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click

from tether.naming import InvalidName, check_label, check_trust_domain
from tether.ports import PortSet, parse_port_set
from tether.serving.grpc_server import TlsFiles

FILE = click.Path(dir_okay=False, path_type=Path)
_Command = TypeVar("_Command", bound=Callable[..., Any])


def domain(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A ``--cluster-domain``/``--trust-domain`` callback."""
    try:
        return check_trust_domain(value)
    except InvalidName as exc:
        raise click.BadParameter(str(exc).replace("trust domain", "domain")) from None


def namespace(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A namespace flag's callback."""
    try:
        return check_label("namespace", value)
    except InvalidName as exc:
        raise click.BadParameter(str(exc)) from None


def opaque_ports(ctx: click.Context, param: click.Parameter, value: str) -> PortSet:
    """A ``--default-opaque-ports`` callback: the parsed port set."""
    ports, skipped = parse_port_set(value)
    if skipped:
        raise click.BadParameter(f"not ports or ranges: {', '.join(skipped)}")
    return ports


def serving_options(command: _Command) -> _Command:
    """``--tls-cert``, ``--tls-key``, ``--trust-anchors``, ``--insecure`` and ``--log-level``; see ``serving_tls``."""
    options = (
        click.option("--tls-cert", type=FILE, help="The gRPC port's certificate chain (PEM)."),
        click.option("--tls-key", type=FILE, help="The gRPC port's private key (PEM)."),
        click.option("--trust-anchors", type=FILE, help="Require client certificates issued under these roots (PEM)."),
        click.option("--insecure", is_flag=True, help="Serve plaintext gRPC (no TLS files); for debugging only."),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
                     show_default=True),
    )
    for option in reversed(options):  # as if written top to bottom above the command
        command = option(command)
    return command


def serving_tls(tls_cert: Path | None, tls_key: Path | None, trust_anchors: Path | None, insecure: bool,
                log_level: str) -> TlsFiles | None:
    """Set up logging and check the ``serving_options``: the gRPC port's TLS files, None for ``--insecure``."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if insecure:
        if tls_cert or tls_key or trust_anchors:
            raise click.UsageError("--insecure cannot be combined with --tls-cert, --tls-key or --trust-anchors")
        return None
    if tls_cert is None or tls_key is None:
        raise click.UsageError("give --tls-cert and --tls-key (or --insecure to serve plaintext)")
    return TlsFiles(tls_cert, tls_key, trust_anchors)


class _Runs(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


async def run_until_signalled(service: _Runs) -> None:
    """Run ``service`` until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await service.run(stop)
