"""The data plane: a transparent mTLS proxy beside every workload. Imports no controller."""
