"""The outbound side of the policy controller: Services and EgressNetworks to OutboundPolicy messages.

Platform watches feed ``OutboundIndex`` (``index``: targets, producer and
consumer routes, EgressNetwork choice; the facts it keeps are read in
``facts`` and ``annotations``); ``translator`` encodes its states as
``outbound.proto`` messages (route parts through ``tether.policy.route_translator``);
``server`` holds the ``OutboundPolicies`` gRPC handlers (Get, Watch) over the
bounded streams of ``tether.serving``.  ``tether.policy.service`` wires them
into the policy process beside the inbound side.
"""

from tether.policy.outbound.index import WATCHED, OutboundIndex

__all__ = ["WATCHED", "OutboundIndex"]
