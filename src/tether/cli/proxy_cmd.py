"""``tether proxy``: run the data-plane proxy, configured only by the ``LINKERD2_PROXY_*`` environment.

A thin shell over ``tether.proxy.main.main`` (also ``python -m tether.proxy``);
registered on the root group by ``tether.cli.main``. Exits 64 when a variable is
invalid, naming it, as linkerd2-proxy does.
"""

from __future__ import annotations

import os
import sys

import click


@click.command(context_settings={"ignore_unknown_options": False})
def proxy() -> None:
    """Run the proxy (inbound 4143, outbound 4140, admin 4191), configured by LINKERD2_PROXY_* variables."""
    from tether.proxy.main import main

    sys.exit(main(os.environ))
