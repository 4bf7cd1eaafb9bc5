"""``--platform local|kubernetes`` for the control-plane commands, and what each choice builds.

``tether identity serve`` and ``tether destination serve`` decorate themselves with
``platform_options`` and receive one ``Platform`` argument; they ask it for their
token verifier or resource watcher instead of building the local one themselves.
On ``local`` (the default) nothing changes: tokens signed with the state
directory's key, resources from the SQLite store.  On ``kubernetes`` tokens are
checked by TokenReview and resources watched over the API server, configured
in-cluster or from ``--kubeconfig``/``--kube-context`` (``tether.platform.kubernetes``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from tether.platform.tokens import TokenVerifier
from tether.platform.watch import ResourceWatcher

if TYPE_CHECKING:  # prometheus_client is imported by the servers that export metrics, not by every command
    from prometheus_client import CollectorRegistry

    from tether.platform.kubernetes.watch import KubernetesResourceWatcher

PLATFORMS = ("local", "kubernetes")


@dataclass(frozen=True, slots=True)
class Platform:
    """The platform a control-plane process runs on, as chosen on the command line."""

    name: Literal["local", "kubernetes"] = "local"
    kubeconfig: Path | None = None
    kube_context: str | None = None

    @property
    def kubernetes(self) -> bool:
        return self.name == "kubernetes"

    def token_verifier(self, state_dir: Path) -> TokenVerifier:
        """Local: the state directory's token key (created if absent).  Kubernetes: TokenReview."""
        if self.kubernetes:
            from tether.platform.kubernetes.tokens import KubernetesTokenVerifier

            return KubernetesTokenVerifier(self._settings())
        from tether.platform.local.tokens import LocalTokenVerifier, TokenKey

        return LocalTokenVerifier(TokenKey.load_or_create(state_dir))

    def resource_watcher(self, store: Any = None) -> ResourceWatcher:
        """Local: a watcher over ``store`` (a ``tether.store.Store``).  Kubernetes: API watches (``store`` unused)."""
        if self.kubernetes:
            from tether.platform.kubernetes.watch import KubernetesResourceWatcher

            return KubernetesResourceWatcher(self._settings())
        from tether.platform.local.watch import LocalResourceWatcher

        if store is None:
            raise click.UsageError("the local platform needs a store")
        return LocalResourceWatcher(store)

    @staticmethod
    def export_metrics(watcher: ResourceWatcher, registry: CollectorRegistry) -> None:
        """Serve the watcher's own metrics (the Kubernetes watch metrics) from ``registry`` too."""
        from prometheus_client import CollectorRegistry

        metrics = getattr(watcher, "metrics", None)
        if metrics is not None and isinstance(getattr(metrics, "registry", None), CollectorRegistry):
            registry.register(metrics.registry)  # a registry is a collector too

    def client_settings(self) -> Any:
        """The ``ClientSettings`` of ``--kubeconfig``/``--kube-context`` (for commands that call the API)."""
        return self._settings()

    def _settings(self) -> Any:
        from tether.platform.kubernetes.client import ClientSettings

        return ClientSettings(kubeconfig=self.kubeconfig, context=self.kube_context)


def kubernetes_watcher(watcher: ResourceWatcher) -> KubernetesResourceWatcher | None:
    """``watcher`` if it watches a Kubernetes API server, else None.

    Asked without importing ``tether.platform.kubernetes.watch``: that loads the Kubernetes client
    (kubernetes_asyncio, aiohttp, jsonschema: ~45 MiB resident), which a controller on the local platform
    never needs. A watcher of that class exists only once its module is loaded.
    """
    module = sys.modules.get("tether.platform.kubernetes.watch")
    if module is not None and isinstance(watcher, module.KubernetesResourceWatcher):
        return watcher
    return None


def platform_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--platform``, ``--kubeconfig`` and ``--kube-context``; the command gets ``platform: Platform``."""

    @functools.wraps(command)
    def wrapper(*args: Any, platform_name: str, kubeconfig: Path | None, kube_context: str | None,
                **kwargs: Any) -> Any:
        if platform_name != "kubernetes" and (kubeconfig or kube_context):
            raise click.UsageError("--kubeconfig and --kube-context need --platform kubernetes")
        return command(*args, platform=Platform(platform_name, kubeconfig, kube_context), **kwargs)  # type: ignore[arg-type]

    options = [
        click.option("--platform", "platform_name", type=click.Choice(PLATFORMS), default="local", show_default=True,
                     envvar="TETHER_PLATFORM",
                     help="Where workloads and resources live: the local store, or a Kubernetes API server."),
        click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path),
                     help="kubeconfig file for --platform kubernetes [default: in-cluster, else $KUBECONFIG "
                          "or ~/.kube/config]."),
        click.option("--kube-context", help="kubeconfig context to use [default: the current one]."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper
