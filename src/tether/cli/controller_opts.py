"""What the controllers' ``serve`` commands share: flag checks for domains and namespaces, and running until a signal.

Used by ``tether destination serve`` and ``tether policy serve``.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Protocol

import click

from tether.naming import InvalidName, check_label, check_trust_domain


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


class _Runs(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


async def run_until_signalled(service: _Runs) -> None:
    """Run ``service`` until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await service.run(stop)
