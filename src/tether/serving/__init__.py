"""What the control-plane servers share: bounded update streams, context tokens and gRPC serving."""
