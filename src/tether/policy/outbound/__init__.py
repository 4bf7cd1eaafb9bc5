"""The outbound side of the policy controller: Services and EgressNetworks to OutboundPolicy messages."""
