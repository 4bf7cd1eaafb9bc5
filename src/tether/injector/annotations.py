"""The annotations and labels the injector reads and writes, namespace inheritance, and value parsing.

Callers: `patch` (what to write, what to inherit), `decision` (``linkerd.io/inject``),
`sidecar` (every ``config.linkerd.io/*`` value, through `AnnotationReader`). Keys are
Linkerd's (control-plane.md §4.3), so existing manifests configure Tether unchanged.
An invalid value is ignored with a warning and the mesh default is used, as Linkerd does.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from tether.ports import format_span, parse_port, parse_port_ranges
from tether.resources.durations import parse_duration
from tether.resources.quantities import parse_quantity

T = TypeVar("T")

PREFIX = "linkerd.io"
CONFIG = "config.linkerd.io/"
CONFIG_ALPHA = "config.alpha.linkerd.io/"
CONFIG_BETA = "config.beta.linkerd.io/"

INJECT = "linkerd.io/inject"
CREATED_BY = "linkerd.io/created-by"
PROXY_VERSION = "linkerd.io/proxy-version"
TRUST_ROOT_SHA256 = "linkerd.io/trust-root-sha256"
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"

CONTROL_PLANE_NS_LABEL = "linkerd.io/control-plane-ns"
WORKLOAD_NS_LABEL = "linkerd.io/workload-ns"
CONTROL_PLANE_COMPONENT_LABEL = "linkerd.io/control-plane-component"
PROXY_KIND_LABEL_PREFIX = "linkerd.io/proxy-"

INJECT_ENABLED = "enabled"
INJECT_DISABLED = "disabled"
INJECT_INGRESS = "ingress"
INJECT_VALUES = (INJECT_ENABLED, INJECT_DISABLED, INJECT_INGRESS)

OPAQUE_PORTS = CONFIG + "opaque-ports"
ADDITIONAL_ENV = CONFIG + "proxy-additional-env"
NATIVE_SIDECAR = CONFIG + "proxy-enable-native-sidecar"
NATIVE_SIDECAR_BETA = CONFIG_BETA + "proxy-enable-native-sidecar"
NATIVE_SIDECAR_ALPHA = CONFIG_ALPHA + "proxy-enable-native-sidecar"
WAIT_BEFORE_EXIT = CONFIG_ALPHA + "proxy-wait-before-exit-seconds"

# Linkerd's ProxyAnnotations: copied from the Namespace when the workload does not set them.
INHERITABLE_CONFIG = (
    "admin-port",
    "control-port",
    "enable-debug-sidecar",
    "enable-external-profiles",
    "image-pull-policy",
    "inbound-port",
    "outbound-port",
    "pod-inbound-ports",
    "proxy-cpu-limit",
    "proxy-cpu-request",
    "proxy-image",
    "proxy-admin-shutdown",
    "proxy-log-format",
    "proxy-log-level",
    "proxy-log-http-headers",
    "proxy-memory-limit",
    "proxy-memory-request",
    "proxy-ephemeral-storage-limit",
    "proxy-ephemeral-storage-request",
    "proxy-uid",
    "proxy-gid",
    "proxy-version",
    "proxy-require-identity-inbound-ports",
    "skip-inbound-ports",
    "opaque-ports",
    "skip-outbound-ports",
    "proxy-metrics-hostname-labels",
    "proxy-outbound-connect-timeout",
    "proxy-inbound-connect-timeout",
    "proxy-await",
    "default-inbound-policy",
    "skip-subnets",
    "access-log",
    "shutdown-grace-period",
    "proxy-outbound-discovery-cache-unused-timeout",
    "proxy-inbound-discovery-cache-unused-timeout",
    "proxy-disable-outbound-protocol-detect-timeout",
    "proxy-disable-inbound-protocol-detect-timeout",
    "proxy-enable-native-sidecar",
    "proxy-additional-env",
)
INHERITABLE = tuple(CONFIG + k for k in INHERITABLE_CONFIG) + (WAIT_BEFORE_EXIT, NATIVE_SIDECAR_ALPHA, INJECT)

# Read from the pod template only.
POD_ONLY = tuple(
    CONFIG + k
    for k in (
        "proxy-cpu-ratio-limit",
        "close-wait-timeout",
        "enable-gateway",
        "debug-image",
        "debug-image-version",
        "debug-image-pull-policy",
    )
) + (NATIVE_SIDECAR_BETA,)


def inherited_annotations(pod: Mapping[str, str], namespace: Mapping[str, str]) -> dict[str, str]:
    """The namespace's inheritable annotations the pod does not set itself, in Linkerd's key order."""
    return {key: namespace[key] for key in INHERITABLE if key in namespace and key not in pod}


def trust_root_sha256(pem: str) -> str:
    """The ``linkerd.io/trust-root-sha256`` value: SHA-256 of the anchors' PEM text, hex."""
    return hashlib.sha256(pem.encode()).hexdigest()


_GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def parse_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``, which Linkerd uses for boolean annotations."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean (true or false)")


def parse_port_list(text: str, *, names: Mapping[str, int] | None = None) -> list[str]:
    """Linkerd's port list (``80,8000-8010``; the rule is ``tether.ports``), items normalised, in written order.

    ``names`` resolves container port names.  Raises ``ValueError`` naming the first item that is
    neither a port, a range nor a known name.
    """
    return [format_span(span) for span in parse_port_ranges(text, names=names)]


class AnnotationReader:
    """Typed reads of a pod's effective annotations; a bad value becomes a warning and the default."""

    def __init__(self, annotations: Mapping[str, str]) -> None:
        self.annotations = annotations
        self.warnings: list[str] = []

    def read(self, key: str, parse: Callable[[str], T], default: T) -> T:
        """``parse(value)``, or ``default`` when absent or when ``parse`` raises `ValueError` (a warning)."""
        raw = self.annotations.get(key)
        if raw is None:
            return default
        try:
            return parse(raw)
        except ValueError as err:
            self.warnings.append(f"ignoring {key}={raw!r}: {err}")
            return default

    def has(self, key: str) -> bool:
        return key in self.annotations

    def text(self, key: str, default: str) -> str:
        return self.read(key, _non_empty, default)

    def port(self, key: str, default: int) -> int:
        return self.read(key, lambda text: parse_port(text.strip()), default)

    def integer(self, key: str, default: int, *, minimum: int) -> int:
        def parse(text: str) -> int:
            value = _int(text)
            if value < minimum:
                raise ValueError(f"must be at least {minimum}")
            return value

        return self.read(key, parse, default)

    def boolean(self, key: str, default: bool) -> bool:
        return self.read(key, parse_bool, default)

    def enabled(self, key: str, default: bool) -> bool:
        """``enabled``/``disabled`` switches (``proxy-await``, ``proxy-admin-shutdown``)."""

        def parse(text: str) -> bool:
            if text not in ("enabled", "disabled"):
                raise ValueError("expected enabled or disabled")
            return text == "enabled"

        return self.read(key, parse, default)

    def choice(self, key: str, choices: Collection[str], default: str) -> str:
        def parse(text: str) -> str:
            if text not in choices:
                raise ValueError(f"expected one of {', '.join(choices)}")
            return text

        return self.read(key, parse, default)

    def duration(self, key: str, default: float | None) -> float | None:
        """A non-negative Go duration, in seconds."""

        def parse(text: str) -> float:
            seconds = parse_duration(text)
            if seconds < 0:
                raise ValueError("must not be negative")
            return seconds

        return self.read(key, parse, default)

    def quantity(self, key: str, default: str) -> str:
        def parse(text: str) -> str:
            if parse_quantity(text).value < 0:
                raise ValueError("must not be negative")
            return text

        return self.read(key, parse, default)

    def ports(self, key: str, default: str, *, names: Mapping[str, int] | None = None) -> list[str]:
        """A port list, normalised; the default is trusted (it comes from the mesh configuration)."""
        fallback = parse_port_list(default, names=names)
        return self.read(key, lambda text: parse_port_list(text, names=names), fallback)

    def ratio(self, key: str) -> float | None:
        def parse(text: str) -> float:
            value = float(text)
            if not (math.isfinite(value) and 0 < value < 1):
                raise ValueError("must be a number between 0 and 1 (exclusive)")
            return value

        return self.read(key, parse, None)


def _non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def _int(text: str) -> int:
    if not re.fullmatch(r"-?\d+", text.strip()):
        raise ValueError("expected an integer")
    return int(text)
