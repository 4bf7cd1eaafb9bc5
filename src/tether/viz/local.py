"""Viz on the local platform: its settings, Prometheus and the discovery process, started and stopped.

``tether viz install`` writes ``<state>/viz/viz.json`` (``VizSettings``), the
Prometheus configuration (``scrape_config.prometheus_config``) and starts its
components with the platform's launcher, so ``tether down`` stops them with
the rest:

- ``viz-discovery`` (``tether viz discovery``): watches the store and keeps
  ``<state>/viz/sd/proxies.json`` (every pod's container ports, with the labels
  Kubernetes discovery would give them) and ``controllers.json`` (the control
  plane's admin ports) up to date; its admin server (``/ready`` once both files
  are written, ``/metrics``) listens on loopback;
- ``viz-tap`` (``tether viz tap-server``): Linkerd viz's tap component,
  ``TapByResource`` on ``127.0.0.1:<tap_port>`` (gRPC), calling the proxies'
  ``Observe`` over mTLS as the tap identity
  (``tap.linkerd-viz.serviceaccount.identity.<cp-ns>.<trust-domain>``, whose
  certificate install has the platform's issuer sign into ``<state>/viz/``);
- ``prometheus``: Debian's ``prometheus`` binary with that configuration,
  listening on loopback only (``127.0.0.1:<prometheus_port>``), its data under
  ``<state>/viz/data``.  Only its read API is used; its admin API stays off.

With ``--prometheus-url`` nothing is started: the URL is saved, and viz
queries that Prometheus (which must scrape the proxies with the configuration
install writes out).

``tap_admission`` is viz's tap injector as the local platform's injection runs
it (after the proxy injector, as the cluster's webhook chain does): while viz
is installed, a meshed pod's proxy gets ``LINKERD2_PROXY_TAP_SVC_NAME`` (and
the pod ``viz.linkerd.io/tap-enabled``) unless ``viz.linkerd.io/disable-tap``
says no.  Pods created before ``viz install`` keep running without tap until
they are recreated, as on Kubernetes.

Callers: the ``tether viz`` CLI, and ``tether platform run`` (``tap_admission``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tether.admin import AdminServer
from tether.platform.local.config import LocalPlatformConfig
from tether.platform.local.launcher import ComponentSpec, Launcher
from tether.store import Store
from tether.store.errors import Gone
from tether.naming import WorkloadIdentity
from tether.viz import scrape_config, tap_injector

log = logging.getLogger(__name__)

PROMETHEUS = "prometheus"
DISCOVERY = "viz-discovery"
TAP = "viz-tap"
COMPONENTS = (DISCOVERY, TAP, PROMETHEUS)
TAP_SERVICE_ACCOUNT = ("tap", "linkerd-viz")  # the tap identity: tap.linkerd-viz.serviceaccount.identity...
LOOPBACK = "127.0.0.1"


class VizError(Exception):
    """Viz cannot be installed or used as asked; the message says why and what to do."""


@dataclass(frozen=True)
class VizSettings:
    prometheus_port: int = 9090
    discovery_port: int = 9998
    tap_port: int = 8088  # TapByResource (gRPC, loopback)
    tap_admin_port: int = 9997
    proxy_tap_port: int = 4190  # where proxies serve Observe (LINKERD2_PROXY_CONTROL_LISTEN_ADDR)
    scrape_interval: str = "10s"
    prometheus_url: str | None = None  # the user's own Prometheus; none is started then
    prometheus_binary: str = "prometheus"

    @property
    def url(self) -> str:
        return self.prometheus_url or f"http://{LOOPBACK}:{self.prometheus_port}"


@dataclass(frozen=True)
class VizLayout:
    root: Path

    @property
    def settings(self) -> Path:
        return self.root / "viz.json"

    @property
    def prometheus_yml(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def sd(self) -> Path:
        return self.root / "sd"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def tap_cert(self) -> Path:
        return self.root / "tap.crt"

    @property
    def tap_key(self) -> Path:
        return self.root / "tap.key"


def layout(config: LocalPlatformConfig) -> VizLayout:
    return VizLayout(config.state_dir / "viz")


def load_settings(config: LocalPlatformConfig) -> VizSettings | None:
    path = layout(config).settings
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return VizSettings(**data)
    except (OSError, ValueError, TypeError) as err:
        raise VizError(f"{path}: unreadable viz settings ({err}); run `tether viz uninstall` and install again") from None


def tap_workload(config: LocalPlatformConfig) -> WorkloadIdentity:
    """The tap server's identity on this platform: ``tap.linkerd-viz.serviceaccount.identity.<cp-ns>.<td>``."""
    return WorkloadIdentity(*TAP_SERVICE_ACCOUNT, config.control_plane_ns, config.trust_domain)


def tap_admission(config: LocalPlatformConfig) -> Callable[[Mapping[str, Any], Mapping[str, str]], list[dict[str, Any]]]:
    """The tap injector for the platform's pods: its patch while viz is installed (``viz.json`` exists), else none."""
    identity = tap_workload(config).dns_name
    settings = layout(config).settings

    def admit(pod: Mapping[str, Any], namespace_annotations: Mapping[str, str]) -> list[dict[str, Any]]:
        if not settings.exists():
            return []
        return tap_injector.patch(pod, namespace_annotations, identity)

    return admit


def _write(path: Path, text: str, mode: int = 0o644) -> bool:
    """Replace ``path`` atomically with ``text``; False when it already held exactly that."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def controller_addresses(config: LocalPlatformConfig) -> list[tuple[str, str]]:
    ports = config.ports
    return [("identity", config.address(ports.identity_admin)),
            ("destination", config.address(ports.destination_admin)),
            ("platform", config.address(ports.platform_admin))]


def write_prometheus_config(config: LocalPlatformConfig, settings: VizSettings) -> Path:
    lay = layout(config)
    doc = scrape_config.prometheus_config(
        str(lay.sd), f"{LOOPBACK}:{settings.prometheus_port}", control_plane_ns=config.control_plane_ns,
        scrape_interval=settings.scrape_interval)
    _write(lay.prometheus_yml, "# written by `tether viz install`\n" + yaml.safe_dump(doc, sort_keys=False))
    return lay.prometheus_yml


def component_specs(config: LocalPlatformConfig, settings: VizSettings, tether: list[str]) -> list[ComponentSpec]:
    lay = layout(config)
    specs = [ComponentSpec(
        name=DISCOVERY,
        argv=(*tether, "viz", "discovery", "--state-dir", str(config.state_dir)),
        admin_url=f"http://{LOOPBACK}:{settings.discovery_port}",
        addr=f"{LOOPBACK}:{settings.discovery_port}",
    )]
    specs.append(ComponentSpec(
        name=TAP,
        argv=(*tether, "viz", "tap-server", "--state-dir", str(config.state_dir)),
        admin_url=f"http://{LOOPBACK}:{settings.tap_admin_port}",
        addr=f"{LOOPBACK}:{settings.tap_port}",
    ))
    if settings.prometheus_url is None:
        specs.append(ComponentSpec(
            name=PROMETHEUS,
            argv=(settings.prometheus_binary, f"--config.file={lay.prometheus_yml}",
                  f"--storage.tsdb.path={lay.data}", f"--web.listen-address={LOOPBACK}:{settings.prometheus_port}",
                  "--storage.tsdb.retention.time=6h", "--log.level=warn"),
            # The launcher probes <admin_url>/ready; Prometheus answers on /-/ready.
            admin_url=f"http://{LOOPBACK}:{settings.prometheus_port}/-",
            addr=f"{LOOPBACK}:{settings.prometheus_port}",
        ))
    return specs


def install(config: LocalPlatformConfig, settings: VizSettings, tether: list[str]) -> tuple[Launcher, list[ComponentSpec]]:
    """Write settings and configuration, start the components (not waiting for them)."""
    if settings.prometheus_url is None:
        binary = shutil.which(settings.prometheus_binary)
        if binary is None:
            raise VizError(f"{settings.prometheus_binary}: not found; install Debian's prometheus package "
                           "(apt-get install prometheus) or pass --prometheus-url to use your own")
        settings = replace(settings, prometheus_binary=binary)
    lay = layout(config)
    lay.root.mkdir(parents=True, exist_ok=True)
    lay.sd.mkdir(exist_ok=True)
    _write(lay.settings, json.dumps(asdict(settings), indent=2) + "\n")
    write_prometheus_config(config, settings)
    launcher = Launcher(config.layout.components, config.layout.logs)
    specs = component_specs(config, settings, tether)
    for spec in specs:
        launcher.start(spec)
    return launcher, specs


def uninstall(config: LocalPlatformConfig, *, purge: bool) -> list[str]:
    """Stop the components; with ``purge`` also remove settings and Prometheus' data.  Returns what stopped."""
    launcher = Launcher(config.layout.components, config.layout.logs)
    stopped = [name for name in reversed(COMPONENTS) if launcher.stop(name)]
    if purge:
        shutil.rmtree(layout(config).root, ignore_errors=True)
    else:
        layout(config).settings.unlink(missing_ok=True)
    return stopped


# -- the discovery process ----------------------------------------------------------------------


class Discovery:
    """Keeps the file-based discovery targets equal to the store's pods."""

    def __init__(self, config: LocalPlatformConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.sd = layout(config).sd
        self.written = 0
        self.ready = False

    def sync(self) -> int:
        """Rewrite the target files from the store; returns the store version read."""
        version = self.store.resource_version()
        pods = self.store.list("Pod").items
        groups = scrape_config.pod_target_groups(pods)
        if _write(self.sd / scrape_config.PROXIES_FILE, json.dumps(groups, indent=1) + "\n"):
            self.written += 1
        controllers = scrape_config.controller_target_groups(controller_addresses(self.config),
                                                             self.config.control_plane_ns)
        _write(self.sd / scrape_config.CONTROLLERS_FILE, json.dumps(controllers, indent=1) + "\n")
        self.ready = True
        return version

    async def run(self, stop: asyncio.Event) -> None:
        version = await asyncio.to_thread(self.sync)
        while not stop.is_set():
            try:
                async with contextlib.aclosing(self.store.watch("Pod", version)) as events:
                    async for event in events:
                        version = await asyncio.to_thread(self.sync)
                        del event
                        if stop.is_set():
                            return
            except Gone:
                version = await asyncio.to_thread(self.sync)

    def metrics_text(self) -> bytes:
        return (f"# TYPE viz_discovery_writes_total counter\nviz_discovery_writes_total {self.written}\n").encode()


async def serve_discovery(config: LocalPlatformConfig, settings: VizSettings, store: Store) -> None:
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    discovery = Discovery(config, store)
    admin = AdminServer(discovery.metrics_text, lambda: discovery.ready, "the targets are not written yet")
    await admin.start(LOOPBACK, settings.discovery_port)
    task = asyncio.create_task(discovery.run(stop))
    try:
        await stop.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await admin.stop()

