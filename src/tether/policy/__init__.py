"""The policy controller: Linkerd's policy resources to InboundServerPolicies and OutboundPolicies."""
