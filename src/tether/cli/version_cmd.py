"""``tether version [--client] [--proxy] [--short]``: the client's, the control plane's and the proxies' versions.

As ``linkerd version``: ``Client version: X`` then ``Server version: Y`` (the
local platform's running components; ``unavailable`` when none runs);
``--client`` prints the client's alone, ``--short`` only the version strings,
``--proxy`` adds the versions the data plane's proxies report
(``proxy_build_info``), with how many pods run each.  Registered on the root
group by ``tether.cli.main``.
"""

from __future__ import annotations

from collections import Counter

import click

from tether import __version__
from tether.cli import home
from tether.platform.local import config as platform_config
from tether.platform.local.config import PlatformConfigError
from tether.platform.local.launcher import Launcher

UNAVAILABLE = "unavailable"


def _server_version() -> str:
    try:
        config = platform_config.load(home.state_dir())
    except PlatformConfigError:
        return UNAVAILABLE
    if config is None:
        return UNAVAILABLE
    launcher = Launcher(config.layout.components, config.layout.logs)
    versions = sorted({r.version for name in launcher.recorded() if (r := launcher.running(name)) is not None})
    return ", ".join(versions) or UNAVAILABLE


def _proxy_versions(namespace: str | None) -> Counter[str]:
    from tether.diagnose import facts
    from tether.diagnose.local import proxy_version
    from tether.store import Store, StoreError

    try:
        config = platform_config.load(home.state_dir())
        if config is None:
            return Counter()
        with Store(config.layout.store) as store:
            pods = store.list("Pod", namespace).items
    except (PlatformConfigError, StoreError):
        return Counter()
    return Counter(proxy_version(config, p) or UNAVAILABLE for p in pods if facts.meshed(p) and facts.running(p))


@click.command()
@click.option("--client", "client_only", is_flag=True, help="Print the client's version only.")
@click.option("--short", is_flag=True, help="Print the version strings only.")
@click.option("--proxy", is_flag=True, help="Also print the data plane's proxy versions.")
@click.option("-n", "--namespace", help="With --proxy: only the pods of this namespace [default: all].")
def version(client_only: bool, short: bool, proxy: bool, namespace: str | None) -> None:
    """Print the client and server versions."""
    if namespace is not None and not proxy:
        raise click.UsageError("-n/--namespace selects the proxies: give --proxy too")
    click.echo(__version__ if short else f"Client version: {__version__}")
    if client_only:
        return
    server = _server_version()
    click.echo(server if short else f"Server version: {server}")
    if proxy:
        versions = _proxy_versions(namespace)
        if not short:
            click.echo("Proxy versions:")
        for found, count in sorted(versions.items()):
            click.echo(found if short else f"\t{found} ({count} pod{'s' if count != 1 else ''})")
        if not versions and not short:
            click.echo(f"\t{UNAVAILABLE}")
