"""The local platform's settings and where it keeps its files: one typed object, saved with the state.

``tether up`` builds a ``LocalPlatformConfig`` from its flags and saves it as
``<state>/platform.json``; every later command (``status``, ``down --purge``, ``logs``) and
the pod controller process (``tether platform run``) load that file, so they all use the
same names, address ranges and ports.  ``Layout`` names every file and directory the
platform makes, in one place.  Nothing here reads the environment or runs a command.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from pathlib import Path
from typing import Any

from tether.naming import DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN
from tether.platform.local.ipam import DEFAULT_POD_CIDR
from tether.platform.local.netns import NetnsConfig

CONFIG_FILE = "platform.json"
STORE_FILE = "store.db"
DEFAULT_SERVICE_CIDR = IPv4Network("10.214.0.0/16")
DEFAULT_PROXY_LOG_LEVEL = "warn,linkerd=info,hickory=error"
RUN_ROOT = Path("/run/tether")
ETC_NETNS = Path("/etc/netns")


class PlatformConfigError(ValueError):
    """The platform settings are inconsistent or the saved file is unreadable; the message says which."""


@dataclass(frozen=True)
class Ports:
    """The control plane's ports, all bound on the bridge's gateway address (reachable from pods)."""

    identity: int = 8080
    identity_admin: int = 9990
    destination: int = 8086
    destination_admin: int = 9996
    policy: int = 8090
    policy_admin: int = 9992
    platform_admin: int = 9994


@dataclass(frozen=True)
class LocalPlatformConfig:
    """Everything the local platform needs to know; ``state_dir`` is not saved (it is where the file is)."""

    state_dir: Path
    prefix: str = "tether"
    bridge: str = "tether0"
    pod_cidr: IPv4Network = DEFAULT_POD_CIDR
    service_cidr: IPv4Network = DEFAULT_SERVICE_CIDR
    # Per-pod files the pod's own users must read (workload tokens); default /run/tether/<prefix>.
    run_dir: Path | None = None
    node_name: str = "local"
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS
    ports: Ports = field(default_factory=Ports)
    # A crashed container is restarted after initial, 2*initial, ... seconds, at most max.
    restart_backoff_initial: float = 1.0
    restart_backoff_max: float = 300.0
    # A container that ran this long without crashing starts its backoff again from initial.
    restart_backoff_reset: float = 600.0
    # How meshed pods start the proxy and proxy-init; the defaults mean the tether executable
    # that runs the pod controller (resolved by ``tether platform run``).
    proxy_command: tuple[str, ...] = ("tether", "proxy")
    init_command: tuple[str, ...] = ("tether", "init")
    proxy_log_level: str = DEFAULT_PROXY_LOG_LEVEL

    def __post_init__(self) -> None:
        NetnsConfig(self.prefix, self.bridge)  # validates both names
        if self.pod_cidr.overlaps(self.service_cidr):
            raise PlatformConfigError(
                f"service_cidr: {self.service_cidr} overlaps the pod range {self.pod_cidr}; pick disjoint ranges"
            )
        if self.service_cidr.prefixlen > 30:
            raise PlatformConfigError(f"service_cidr: {self.service_cidr} is too small (/30 or larger)")
        if not 0 < self.restart_backoff_initial <= self.restart_backoff_max:
            raise PlatformConfigError("restart backoff: need 0 < initial <= max")

    # -- derived values ---------------------------------------------------------------------

    @property
    def netns(self) -> NetnsConfig:
        return NetnsConfig(prefix=self.prefix, bridge=self.bridge)

    @property
    def gateway(self) -> IPv4Interface:
        """The bridge's address: the pod range's first host address, with its prefix length."""
        return IPv4Interface((int(self.pod_cidr.network_address) + 1, self.pod_cidr.prefixlen))

    @property
    def host_ip(self) -> IPv4Address:
        """Where pods reach the control plane (and where every component listens)."""
        return self.gateway.ip

    def address(self, port: int) -> str:
        return f"{self.host_ip}:{port}"

    @property
    def cluster_networks(self) -> str:
        """The pod and service ranges, as the proxy's profile and policy networks."""
        return f"{self.pod_cidr},{self.service_cidr}"

    @property
    def layout(self) -> Layout:
        return Layout(self.state_dir, self.run_dir or RUN_ROOT / self.prefix)

    # -- saving and loading -----------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["state_dir"]
        for key in ("pod_cidr", "service_cidr"):
            data[key] = str(data[key])
        data["run_dir"] = None if self.run_dir is None else str(self.run_dir)
        data["proxy_command"] = list(self.proxy_command)
        data["init_command"] = list(self.init_command)
        return data

    @classmethod
    def from_json(cls, state_dir: Path, data: dict[str, Any]) -> LocalPlatformConfig:
        known = {f.name for f in fields(cls)} - {"state_dir"}
        unknown = set(data) - known
        if unknown:
            raise PlatformConfigError(f"{state_dir / CONFIG_FILE}: unknown settings {', '.join(sorted(unknown))}")
        values = dict(data)
        try:
            for key in ("pod_cidr", "service_cidr"):
                if key in values:
                    values[key] = IPv4Network(values[key])
            if values.get("run_dir") is not None:
                values["run_dir"] = Path(values["run_dir"])
            if "ports" in values:
                values["ports"] = Ports(**values["ports"])
            for key in ("proxy_command", "init_command"):
                if key in values:
                    values[key] = tuple(values[key])
            return cls(state_dir=state_dir, **values)
        except (TypeError, ValueError) as exc:
            raise PlatformConfigError(f"{state_dir / CONFIG_FILE}: {exc}") from None

    def with_changes(self, **changes: Any) -> LocalPlatformConfig:
        """A copy with the given fields replaced (None values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def save(self) -> None:
        """Write ``<state>/platform.json`` atomically."""
        path = self.state_dir / CONFIG_FILE
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.state_dir, prefix=f".{CONFIG_FILE}.")
        with os.fdopen(fd, "w") as out:
            json.dump(self.to_json(), out, indent=2)
            out.write("\n")
        os.replace(tmp, path)


def load(state_dir: Path) -> LocalPlatformConfig | None:
    """The saved settings, or None when ``tether up`` never ran with this state directory."""
    path = state_dir / CONFIG_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PlatformConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlatformConfigError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PlatformConfigError(f"{path}: expected a JSON object")
    return LocalPlatformConfig.from_json(state_dir, data)


@dataclass(frozen=True)
class Layout:
    """Every path the local platform uses.

    Under the state directory (root's own): the store, IPAM, PKI, component records and logs,
    and each pod's container logs.  Under the run directory (world-traversable, so a proxy
    running as uid 2102 can read its token): each pod's token and identity directory.
    """

    state_dir: Path
    run_dir: Path

    @property
    def store(self) -> Path:
        return self.state_dir / STORE_FILE

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def trust_anchors(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def cli_cert(self) -> Path:
        """The certificate (and ``cli_key``) the CLI presents to the controllers, which require a client's."""
        return self.pki / "cli.crt"

    @property
    def cli_key(self) -> Path:
        return self.pki / "cli.key"

    @property
    def service_ipam_dir(self) -> Path:
        return self.state_dir / "services"

    @property
    def components(self) -> Path:
        return self.state_dir / "run"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    def pod_dir(self, namespace: str, pod: str) -> Path:
        """Container logs of one pod."""
        return self.state_dir / "pods" / namespace / pod

    def container_log(self, namespace: str, pod: str, container: str, previous: bool = False) -> Path:
        suffix = ".previous.log" if previous else ".log"
        return self.pod_dir(namespace, pod) / f"{container}{suffix}"

    def pod_run_dir(self, namespace: str, pod: str) -> Path:
        return self.run_dir / "pods" / namespace / pod

    def token_file(self, namespace: str, pod: str) -> Path:
        return self.pod_run_dir(namespace, pod) / "identity-token"

    def identity_dir(self, namespace: str, pod: str) -> Path:
        return self.pod_run_dir(namespace, pod) / "identity"


def netns_etc_dir(netns: str) -> Path:
    """``/etc/netns/<netns>``: files ``ip netns exec`` bind-mounts over ``/etc`` for the pod's processes."""
    return ETC_NETNS / netns
