"""The destination service: which endpoints a target has and how to treat requests to it (Get, GetProfile).

Linkerd's destination controller, rebuilt on asyncio: platform watches feed a
cluster index (``watcher.cluster``); publishers (``watcher.endpoints``,
``watcher.profiles``, ``watcher.opaque_ports``, ``watcher.workloads``) tell
listeners what changed; translators (``endpoint_translator``,
``profile_translator``) encode protobufs onto each stream's bounded queue
(``tether.serving.stream``); ``server`` holds the gRPC handlers and ``service`` assembles the
process.  ``client`` is the debugging client behind ``tether diagnostics``.

Public API: ``DestinationConfig``, ``TlsFiles``, ``DestinationService``.
"""

from typing import TYPE_CHECKING

from tether.lazy import lazy_exports

if TYPE_CHECKING:
    from tether.destination.config import DestinationConfig
    from tether.destination.service import DestinationService
    from tether.serving.grpc_server import ConfigError, TlsFiles

# Imported on first use: ``import tether.destination.X`` must not load the whole package (see tether.lazy).
__getattr__ = lazy_exports(__name__, {
    "ConfigError": "tether.serving.grpc_server",
    "DestinationConfig": "tether.destination.config",
    "DestinationService": "tether.destination.service",
    "TlsFiles": "tether.serving.grpc_server",
})

__all__ = ["ConfigError", "DestinationConfig", "DestinationService", "TlsFiles"]
