"""``tether await``: Linkerd's ``linkerd-await`` - wait for the pod's proxy, then run the app (or just exit).

Flags are linkerd-await's: ``--port/-p`` (4191), ``--backoff/-b`` (1s), ``--timeout/-t``,
``--shutdown/-S``, ``--verbose/-v``; ``LINKERD_AWAIT_DISABLED``/``LINKERD_DISABLED`` skip the
wait.  Without a command it exits 0 once ``/ready`` answers 2xx (the classic sidecar's
``postStart`` hook, rendered by ``tether.injector`` as ``tether await --timeout=2m --port=4191``).
With one it execs it; with ``--shutdown`` it runs it as a child, forwards SIGTERM, then sends
``POST /shutdown`` to the proxy and exits with the child's code.  A timeout fails with exit 69
(EX_UNAVAILABLE); a program that cannot be started, 71 (EX_OSERR).  The logic is in
``tether.platform.local.await_proxy``.  Registered by ``tether.cli.main``.
"""

from __future__ import annotations

import os

import click

from tether.cli.errors import CliError
from tether.platform.local.await_proxy import (
    EX_OSERR,
    EX_UNAVAILABLE,
    disabled_reason,
    parse_duration,
    run_child,
    send_shutdown,
    wait_ready,
)


class _NotReady(CliError):
    exit_code = EX_UNAVAILABLE


class _CannotRun(CliError):
    exit_code = EX_OSERR


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


@click.command("await", context_settings={"allow_interspersed_args": False})
@click.option(
    "--port", "-p", type=click.IntRange(1, 65535), default=4191, show_default=True, help="Port of the proxy's admin server."
)
@click.option(
    "--backoff", "-b", default="1s", show_default=True, callback=_duration, help="Time to wait after a failed readiness check."
)
@click.option(
    "--timeout", "-t", callback=_duration, help="Fail when the proxy is not ready within this time (e.g. 2m); default: wait forever."
)
@click.option("--shutdown", "-S", is_flag=True, help="Run CMD as a child and shut the proxy down (POST /shutdown) when it ends.")
@click.option("--verbose", "-v", is_flag=True, envvar="LINKERD_AWAIT_VERBOSE", help="Say so when the environment disables the wait.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def await_(port: int, backoff: float, timeout: float | None, shutdown: bool, verbose: bool, cmd: tuple[str, ...]) -> None:
    """Wait until the pod's proxy is ready (GET /ready on localhost), then run CMD [ARGS]..., as linkerd-await does.

    Without CMD, exit 0 once ready (a postStart hook).  Put `--` before CMD when its own
    arguments start with a dash.
    """
    if shutdown and not cmd:
        raise click.UsageError("--shutdown needs a command to run")
    reason = disabled_reason(os.environ)
    if reason is not None:
        if verbose:
            click.echo(f"Linkerd readiness check skipped: {reason}", err=True)
    else:
        failure = wait_ready(port, backoff=backoff, timeout=timeout)
        if failure is not None:
            raise _NotReady(
                f"linkerd-proxy failed to become ready within the {timeout:g}s timeout "
                f"(GET http://localhost:{port}/ready: {failure})"
            )
    if not cmd:
        return
    if shutdown and reason is None:
        try:
            code = run_child(cmd)
        except OSError as err:
            raise _CannotRun(f"failed to start {cmd[0]}: {err.strerror or err}") from None
        send_shutdown(port)
        raise SystemExit(code)
    try:
        os.execvp(cmd[0], list(cmd))
    except OSError as err:
        raise _CannotRun(f"failed to exec {cmd[0]}: {err.strerror or err}") from None

