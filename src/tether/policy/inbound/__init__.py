"""The inbound side of the policy controller: pods and Servers to InboundServerPolicies."""
