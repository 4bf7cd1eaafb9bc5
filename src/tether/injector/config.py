"""`MeshConfig`: what the injector needs to know about the mesh, with Linkerd's Helm defaults.

One frozen object handed to the patch (`tether.injector.patch`). The webhook and the CLI
build it from flags or from a Helm-style values document (`MeshConfig.from_values`, the
``values`` key of Linkerd's ``linkerd-config`` ConfigMap), so a Linkerd user's values file
configures Tether's injector unchanged. Defaults are ``charts/linkerd-control-plane/values.yaml``
(control-plane.md §8); the Tether-specific parts are the image and the commands each
container runs, since one Tether image carries the proxy, ``tether init`` and the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether import __version__
from tether.naming import DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_PLANE_NS, check_label, check_trust_domain
from tether.ports import DEFAULT_OPAQUE_PORTS as _DEFAULT_OPAQUE_PORT_SET
from tether.resources.errors import ValidationError
from tether.resources.fields import Fields

DEFAULT_PROXY_IMAGE = "tether/proxy"
DEFAULT_DEBUG_IMAGE = "cr.l5d.io/linkerd/debug"
DEFAULT_CLUSTER_NETWORKS = "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8"
DEFAULT_OPAQUE_PORTS = str(_DEFAULT_OPAQUE_PORT_SET)  # Helm values hold the text
DEFAULT_SKIP_PORTS = "4567,4568"
DEFAULT_KUBE_API_SERVER_PORTS = "443,6443"
DEFAULT_LOG_LEVEL = "warn,linkerd=info,hickory=error"
HOST_IPTABLES = "host"  # ProxyInit.iptables_mode: the host's default `iptables`, whichever backend it is
IDENTITY_AUDIENCE = "identity.l5d.io"
DEFAULT_POLICIES = (
    "all-unauthenticated",
    "all-authenticated",
    "cluster-unauthenticated",
    "cluster-authenticated",
    "deny",
    "audit",
)


@dataclass(frozen=True, slots=True)
class ProxyPorts:
    """``proxy.ports``."""

    admin: int = 4191
    control: int = 4190
    inbound: int = 4143
    outbound: int = 4140


@dataclass(frozen=True, slots=True)
class Resources:
    """``proxy.resources``: quantities as text; empty means unset."""

    cpu_request: str = ""
    cpu_limit: str = ""
    memory_request: str = ""
    memory_limit: str = ""
    ephemeral_storage_request: str = ""
    ephemeral_storage_limit: str = ""


@dataclass(frozen=True, slots=True)
class ProbeTiming:
    initial_delay_seconds: int
    timeout_seconds: int = 1
    period_seconds: int | None = None
    failure_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class ProxyInit:
    """``proxyInit``: the ``linkerd-init`` container (``tether init``)."""

    iptables_mode: str = "nft"  # nft | legacy | HOST_IPTABLES (the local platform's)
    ignore_inbound_ports: str = DEFAULT_SKIP_PORTS
    ignore_outbound_ports: str = DEFAULT_SKIP_PORTS
    kube_api_server_ports: str = DEFAULT_KUBE_API_SERVER_PORTS
    skip_subnets: str = ""
    privileged: bool = False
    run_as_root: bool = False
    run_as_user: int = 65534
    run_as_group: int = 65534
    xt_mount_path: str = "/run"


@dataclass(frozen=True, slots=True)
class NetworkValidator:
    """``networkValidator``: the init container that proves CNI redirection works."""

    connect_addr: str = "1.1.1.1:20001"
    listen_addr: str = "0.0.0.0:4140"
    timeout: str = "10s"
    log_level: str = "debug"
    log_format: str = "plain"


@dataclass(frozen=True, slots=True)
class Commands:
    """What each container runs in Tether's image (Linkerd's images have binaries at fixed paths).

    An empty ``proxy`` leaves the image's entrypoint in charge, as Linkerd's proxy image is.
    """

    proxy: tuple[str, ...] = ()
    init: tuple[str, ...] = ("tether", "init")
    network_validator: tuple[str, ...] = ("tether", "network-validator")
    await_: tuple[str, ...] = ("tether", "await")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the proxy reaches the control plane and keeps its identity files (a Tether addition).

    Empty values mean Linkerd's: the control plane's headless Services by cluster DNS name, the
    end-entity directory and token of the volumes the patch mounts. The local platform, which
    has neither cluster DNS nor volumes, gives addresses and host paths; ``$(_pod_ns)`` and
    ``$(_pod_name)`` in a path expand per pod, as the kubelet expands them.
    """

    identity_addr: str = ""
    destination_addr: str = ""
    policy_addr: str = ""
    identity_dir: str = ""
    token_file: str = ""


@dataclass(frozen=True, slots=True)
class MeshConfig:
    """The mesh as the injector sees it; every field is a Helm value (or a Tether addition).

    ``trust_anchors_pem`` (``identityTrustAnchorsPEM``) is the only value without a default.
    An empty ``trust_domain`` means the cluster domain, as ``identityTrustDomain: ""`` does.
    """

    trust_anchors_pem: str
    control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS
    trust_domain: str = ""
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    cluster_networks: str = DEFAULT_CLUSTER_NETWORKS
    disable_ipv6: bool = True
    cni_enabled: bool = False
    token_projection: bool = True  # identity.serviceAccountTokenProjection
    version: str = __version__  # linkerdVersion: the created-by annotation
    proxy_image: str = DEFAULT_PROXY_IMAGE
    proxy_version: str = __version__
    image_pull_policy: str = "IfNotPresent"
    ports: ProxyPorts = field(default_factory=ProxyPorts)
    proxy_uid: int = 2102
    proxy_gid: int = -1  # -1: no group rule, no runAsGroup
    log_level: str = DEFAULT_LOG_LEVEL
    log_format: str = "plain"
    log_http_headers: str = "off"
    resources: Resources = field(default_factory=Resources)
    workers_minimum: int = 1
    workers_maximum: int | None = None
    workers_maximum_cpu_ratio: float | None = None
    opaque_ports: str = DEFAULT_OPAQUE_PORTS
    default_inbound_policy: str = "all-unauthenticated"
    native_sidecar: bool = True
    await_: bool = True  # proxy.await
    wait_before_exit_seconds: int = 0
    outbound_connect_timeout: str = "1000ms"
    inbound_connect_timeout: str = "100ms"
    outbound_discovery_cache_unused_timeout: str = "5s"
    inbound_discovery_cache_unused_timeout: str = "90s"
    disable_outbound_protocol_detect_timeout: bool = False
    disable_inbound_protocol_detect_timeout: bool = False
    enable_external_profiles: bool = False
    enable_shutdown_endpoint: bool = False
    shutdown_grace_period: str = ""
    access_log: str = ""
    metrics_hostname_labels: bool = False
    control_stream_initial_timeout: str = "3s"
    control_stream_idle_timeout: str = "5m"
    control_stream_lifetime: str = "1h"
    http2_keep_alive_interval: str = "10s"
    http2_keep_alive_timeout: str = "3s"
    require_identity_on_inbound_ports: str = ""
    additional_env: tuple[Mapping[str, Any], ...] = ()
    liveness_probe: ProbeTiming = field(default_factory=lambda: ProbeTiming(initial_delay_seconds=10))
    readiness_probe: ProbeTiming = field(default_factory=lambda: ProbeTiming(initial_delay_seconds=2))
    startup_probe: ProbeTiming = field(
        default_factory=lambda: ProbeTiming(initial_delay_seconds=0, period_seconds=1, failure_threshold=120)
    )
    proxy_init: ProxyInit = field(default_factory=ProxyInit)
    network_validator: NetworkValidator = field(default_factory=NetworkValidator)
    debug_image: str = DEFAULT_DEBUG_IMAGE
    debug_image_version: str = ""  # empty: the proxy version
    commands: Commands = field(default_factory=Commands)
    placement: Placement = field(default_factory=Placement)

    def __post_init__(self) -> None:
        check_label("control-plane namespace", self.control_plane_ns)
        check_trust_domain(self.effective_trust_domain)
        if not self.trust_anchors_pem.strip():
            raise ValueError("identityTrustAnchorsPEM must not be empty")

    @property
    def effective_trust_domain(self) -> str:
        return self.trust_domain or self.cluster_domain

    def replace(self, **changes: Any) -> "MeshConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], *, trust_anchors_pem: str | None = None) -> "MeshConfig":
        """Read a Helm values document (Linkerd's keys); unknown keys are ignored.

        ``trust_anchors_pem`` overrides ``identityTrustAnchorsPEM`` (the webhook mounts the
        trust-roots ConfigMap separately, as Linkerd's does). Raises `ValidationError` at the
        offending key, or `ValueError` when the result is not a usable configuration.
        """
        return _from_values(Fields.of(values, ""), trust_anchors_pem)


def _from_values(v: Fields, anchors: str | None) -> MeshConfig:
    d = MeshConfig.__dataclass_fields__  # defaults come from the dataclass, never repeated here
    proxy = _dig(v, "proxy")
    image = _dig(proxy, "image")
    ports = _dig(proxy, "ports")
    init = _dig(v, "proxyInit")
    validator = _dig(v, "networkValidator")
    identity = _dig(v, "identity")
    debug_image = _dig(v, "debugContainer", "image")
    runtime = _dig(proxy, "runtime", "workers")
    control = _dig(proxy, "control", "streams")
    http2 = _dig(proxy, "inbound", "server", "http2")
    metrics = _dig(proxy, "metrics")

    def default(name: str) -> Any:
        f = d[name]
        return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default

    anchors_text = anchors if anchors is not None else v.string("identityTrustAnchorsPEM", "")
    if not anchors_text.strip():
        raise ValidationError("required (the trust anchors' PEM)", path="identityTrustAnchorsPEM")
    version = v.string("linkerdVersion", default("version"))
    ports_default = ProxyPorts()
    init_default = ProxyInit()
    validator_default = NetworkValidator()
    return MeshConfig(
        trust_anchors_pem=anchors_text,
        control_plane_ns=v.string("controllerNamespace", None) or v.string("namespace", default("control_plane_ns")),
        trust_domain=v.string("identityTrustDomain", ""),
        cluster_domain=v.string("clusterDomain", default("cluster_domain")),
        cluster_networks=v.string("clusterNetworks", default("cluster_networks")),
        disable_ipv6=v.boolean("disableIPv6", default("disable_ipv6")),
        cni_enabled=v.boolean("cniEnabled", default("cni_enabled")),
        token_projection=identity.boolean("serviceAccountTokenProjection", True),
        version=version,
        proxy_image=image.string("name", default("proxy_image")),
        proxy_version=image.string("version", "") or version,
        image_pull_policy=image.choice("pullPolicy", ("Always", "IfNotPresent", "Never"), default("image_pull_policy")),
        ports=ProxyPorts(
            admin=ports.port("admin", ports_default.admin),
            control=ports.port("control", ports_default.control),
            inbound=ports.port("inbound", ports_default.inbound),
            outbound=ports.port("outbound", ports_default.outbound),
        ),
        proxy_uid=proxy.integer("uid", default("proxy_uid"), minimum=0),
        proxy_gid=proxy.integer("gid", default("proxy_gid"), minimum=-1),
        log_level=proxy.string("logLevel", default("log_level")),
        log_format=proxy.choice("logFormat", ("plain", "json"), default("log_format")),
        log_http_headers=proxy.choice("logHTTPHeaders", ("off", "insecure"), default("log_http_headers")),
        resources=_resources(proxy.child("resources", None)),
        workers_minimum=runtime.integer("minimum", default("workers_minimum"), minimum=1),
        workers_maximum=runtime.integer("maximum", None, minimum=1),
        workers_maximum_cpu_ratio=runtime.number("maximumCPURatio", None, minimum=0),
        opaque_ports=_text(proxy, "opaquePorts", default("opaque_ports")),
        default_inbound_policy=proxy.choice("defaultInboundPolicy", DEFAULT_POLICIES, default("default_inbound_policy")),
        native_sidecar=proxy.boolean("nativeSidecar", default("native_sidecar")),
        await_=proxy.boolean("await", default("await_")),
        wait_before_exit_seconds=proxy.integer("waitBeforeExitSeconds", 0, minimum=0),
        outbound_connect_timeout=proxy.string("outboundConnectTimeout", default("outbound_connect_timeout")),
        inbound_connect_timeout=proxy.string("inboundConnectTimeout", default("inbound_connect_timeout")),
        outbound_discovery_cache_unused_timeout=proxy.string(
            "outboundDiscoveryCacheUnusedTimeout", default("outbound_discovery_cache_unused_timeout")
        ),
        inbound_discovery_cache_unused_timeout=proxy.string(
            "inboundDiscoveryCacheUnusedTimeout", default("inbound_discovery_cache_unused_timeout")
        ),
        disable_outbound_protocol_detect_timeout=proxy.boolean("disableOutboundProtocolDetectTimeout", False),
        disable_inbound_protocol_detect_timeout=proxy.boolean("disableInboundProtocolDetectTimeout", False),
        enable_external_profiles=proxy.boolean("enableExternalProfiles", False),
        enable_shutdown_endpoint=proxy.boolean("enableShutdownEndpoint", False),
        shutdown_grace_period=proxy.string("shutdownGracePeriod", ""),
        access_log=proxy.string("accessLog", ""),
        metrics_hostname_labels=metrics.boolean("hostnameLabels", False),
        control_stream_initial_timeout=control.string("initialTimeout", default("control_stream_initial_timeout")),
        control_stream_idle_timeout=control.string("idleTimeout", default("control_stream_idle_timeout")),
        control_stream_lifetime=control.string("lifetime", default("control_stream_lifetime")),
        http2_keep_alive_interval=http2.string("keepAliveInterval", default("http2_keep_alive_interval")),
        http2_keep_alive_timeout=http2.string("keepAliveTimeout", default("http2_keep_alive_timeout")),
        require_identity_on_inbound_ports=_text(proxy, "requireIdentityOnInboundPorts", ""),
        additional_env=tuple(_env_list(proxy, "additionalEnv")) + tuple(_env_list(proxy, "experimentalEnv")),
        proxy_init=ProxyInit(
            iptables_mode=init.choice("iptablesMode", ("nft", "legacy"), init_default.iptables_mode),
            ignore_inbound_ports=_text(init, "ignoreInboundPorts", init_default.ignore_inbound_ports),
            ignore_outbound_ports=_text(init, "ignoreOutboundPorts", init_default.ignore_outbound_ports),
            kube_api_server_ports=_text(init, "kubeAPIServerPorts", init_default.kube_api_server_ports),
            skip_subnets=_text(init, "skipSubnets", ""),
            privileged=init.boolean("privileged", False),
            run_as_root=init.boolean("runAsRoot", False),
            run_as_user=init.integer("runAsUser", init_default.run_as_user, minimum=0),
            run_as_group=init.integer("runAsGroup", init_default.run_as_group, minimum=0),
            xt_mount_path=_dig(init, "xtMountPath").string("mountPath", init_default.xt_mount_path),
        ),
        network_validator=NetworkValidator(
            connect_addr=validator.string("connectAddr", validator_default.connect_addr),
            listen_addr=validator.string("listenAddr", validator_default.listen_addr),
            timeout=validator.string("timeout", validator_default.timeout),
            log_level=validator.string("logLevel", validator_default.log_level),
            log_format=validator.string("logFormat", validator_default.log_format),
        ),
        debug_image=debug_image.string("name", default("debug_image")),
        debug_image_version=debug_image.string("version", ""),
    )


def _dig(fields: Fields, *keys: str) -> Fields:
    """The mapping at ``keys`` below ``fields``; an empty one when absent (every value has a default)."""
    for key in keys:
        fields = fields.child(key, None) or Fields({}, fields.at(key))
    return fields


def _text(fields: Fields, key: str, default: str) -> str:
    """A port list may be written as a number (``opaquePorts: 3306``) or a string."""
    value = fields.raw(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise fields.error(key, "expected a string")
    return str(value)


def _resources(node: Fields | None) -> Resources:
    if node is None:
        return Resources()

    def read(kind: str, which: str) -> str:
        sub = node.child(kind, None)
        if sub is None:
            return ""
        value = sub.raw(which)
        return "" if value is None else str(value)

    return Resources(
        cpu_request=read("cpu", "request"),
        cpu_limit=read("cpu", "limit"),
        memory_request=read("memory", "request"),
        memory_limit=read("memory", "limit"),
        ephemeral_storage_request=read("ephemeral-storage", "request"),
        ephemeral_storage_limit=read("ephemeral-storage", "limit"),
    )


def _env_list(fields: Fields, key: str) -> list[Mapping[str, Any]]:
    out = []
    for node in fields.children(key):
        node.string("name")
        out.append(dict(node.data))
    return out
