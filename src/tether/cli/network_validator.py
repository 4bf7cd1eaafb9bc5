"""``tether network-validator``: Linkerd's ``linkerd-network-validator`` for CNI-mode pods.

Flags are the validator's: ``--listen-addr`` (0.0.0.0:4140), ``--connect-addr`` (Linkerd's own
default 192.0.2.2:1404; the injector passes 1.1.1.1:20001), ``--timeout`` (10s), ``--log-level``
(``LINKERD_VALIDATOR_LOG_LEVEL``, info) and ``--log-format`` (``LINKERD_VALIDATOR_LOG_FORMAT``,
plain|json).  Exits 0 after logging ``Validated``; on any failure, on the timeout and on
SIGINT/SIGTERM it logs the reason at error level and exits 95 (EOPNOTSUPP), as Linkerd's does.
The check itself is ``tether.platform.local.network_validator``.  Registered by
``tether.cli.main``.
"""

from __future__ import annotations

import datetime
import json
import logging
import signal
import sys

import click

from tether.platform.local.await_proxy import parse_duration
from tether.platform.local.network_validator import SocketAddr, ValidationFailed, validate

UNSUCCESSFUL_EXIT_CODE = 95  # errno 95, "Operation not supported", Linkerd's choice
_LEVELS = {
    "trace": 5,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 10,
}
_TARGET = "network_validator"


class _Killed(Exception):
    pass


class _Formatter(logging.Formatter):
    def __init__(self, fmt: str) -> None:
        super().__init__()
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="microseconds")
        stamp = stamp.replace("+00:00", "Z")
        level = {5: "TRACE", logging.WARNING: "WARN"}.get(record.levelno, record.levelname)
        if self.json:
            fields = {"message": record.getMessage()}
            return json.dumps({"timestamp": stamp, "level": level, "fields": fields, "target": _TARGET})
        return f"{stamp} {level:>5} {_TARGET}: {record.getMessage()}"


def _level(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """The default level of an env-filter string (``debug``, ``warn,foo=trace``); per-target directives are ignored."""
    levels = [part.strip().lower() for part in value.split(",") if part.strip() and "=" not in part]
    for name in levels or ["info"]:
        if name not in _LEVELS:
            raise click.BadParameter(f"{name!r} is not a log level ({', '.join(_LEVELS)})")
    return _LEVELS[(levels or ["info"])[-1]]


def _addr(ctx: click.Context, param: click.Parameter, value: str) -> SocketAddr:
    try:
        return SocketAddr.parse(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _timeout(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _on_signal(signum: int, _frame: object) -> None:
    raise _Killed(f"Killed by {signal.Signals(signum).name}")


@click.command("network-validator")
@click.option(
    "--log-level",
    envvar="LINKERD_VALIDATOR_LOG_LEVEL",
    default="info",
    show_default=True,
    callback=_level,
    help="Log level (trace, debug, info, warn, error, off).",
)
@click.option(
    "--log-format",
    envvar="LINKERD_VALIDATOR_LOG_FORMAT",
    type=click.Choice(["plain", "json"]),
    default="plain",
    show_default=True,
    help="Log format.",
)
@click.option("--timeout", default="10s", show_default=True, callback=_timeout, help="Fail when not validated within this time.")
@click.option(
    "--listen-addr",
    default="0.0.0.0:4140",
    show_default=True,
    callback=_addr,
    help="Address connections are supposed to be redirected to (the proxy's outbound port).",
)
@click.option(
    "--connect-addr",
    default="192.0.2.2:1404",
    show_default=True,
    callback=_addr,
    help="Address the client connects to; nothing there should answer.",
)
def network_validator(
    log_level: int, log_format: str, timeout: float, listen_addr: SocketAddr, connect_addr: SocketAddr
) -> None:
    """Check that the pod's outbound TCP is redirected to the proxy's port, as linkerd-network-validator does.

    Listens on --listen-addr, connects to --connect-addr and succeeds only if that connection
    lands on its own listener.  Run it inside the pod's network namespace only: without the
    redirection the connection really goes to --connect-addr.
    """
    log = logging.getLogger("tether.network_validator")
    log.propagate = False
    log.setLevel(log_level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(log_format))
    log.handlers[:] = [handler]
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        validate(listen_addr, connect_addr, timeout, log)
    except (ValidationFailed, _Killed) as err:
        log.error("%s", err)
        raise SystemExit(UNSUCCESSFUL_EXIT_CODE) from None
    finally:
        for sig, handler_ in previous.items():
            signal.signal(sig, handler_)
