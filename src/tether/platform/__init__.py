"""The Platform seam: resource watches and workload-token verification, local or Kubernetes."""
