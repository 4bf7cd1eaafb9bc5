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

from tether.destination.config import DestinationConfig
from tether.destination.service import DestinationService
from tether.serving.grpc_server import ConfigError, TlsFiles

__all__ = ["ConfigError", "DestinationConfig", "DestinationService", "TlsFiles"]
