"""The outbound side of the policy controller: Services and EgressNetworks to OutboundPolicy messages.

Platform watches feed ``OutboundIndex`` (``index``: targets, producer and
consumer routes, EgressNetwork choice, the facts it keeps are read in
``facts`` and ``annotations``); ``translator`` encodes its states as
``outbound.proto`` messages; ``server`` holds the ``OutboundPolicies`` gRPC
handlers (Get, Watch) over shared, bounded streams.

Wiring, for the policy process::

    index = OutboundIndex(OutboundConfig(...), schedule=loop.call_soon)
    # each watch event of the types in WATCHED: index.apply(type_key, event)
    servicer = OutboundPoliciesServicer(index, stream_set)  # server.py; stream_set: tether.serving.rpc.StreamSet
    grpc_server.add_generic_rpc_handlers((servicer.handler(),))

``server`` is not imported here: it needs ``tether.serving``'s stream code. See docs/policy-outbound.md.
"""

from tether.policy.outbound.config import OutboundConfig
from tether.policy.outbound.index import WATCHED, OutboundIndex

__all__ = ["WATCHED", "OutboundConfig", "OutboundIndex"]
