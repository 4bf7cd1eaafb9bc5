"""The policy controller: Linkerd's policy resources to InboundServerPolicies and OutboundPolicies.

Linkerd's policy controller, rebuilt on asyncio in the destination's shape:
platform watches feed the inbound index (``inbound.index``, from facts in
``inbound.facts``); it decides each watched pod port's policy as plain records
(``model``, ``defaults``); the translator (``inbound.translator``, with the route
parts shared with the outbound side in ``route_translator``) encodes
``inbound.proto`` messages onto bounded streams (``tether.serving``);
``inbound.server`` holds the gRPC handlers and ``service`` assembles the process.

Public API: ``PolicyConfig``, ``PolicyService``.
"""

from typing import TYPE_CHECKING

from tether.lazy import lazy_exports

if TYPE_CHECKING:
    from tether.policy.config import PolicyConfig
    from tether.policy.service import PolicyService

# Imported on first use: ``import tether.policy.X`` must not load the whole package (see tether.lazy).
__getattr__ = lazy_exports(__name__, {
    "PolicyConfig": "tether.policy.config",
    "PolicyService": "tether.policy.service",
})

__all__ = ["PolicyConfig", "PolicyService"]
