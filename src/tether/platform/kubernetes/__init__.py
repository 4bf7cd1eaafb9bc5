"""The Kubernetes platform: resource watches over the API server and TokenReview token verification.

``watch.KubernetesResourceWatcher`` and ``tokens.KubernetesTokenVerifier`` implement the
seams of ``tether.platform.watch`` and ``tether.platform.tokens``; ``client`` is the
small async API client both use (in-cluster config or a kubeconfig); ``resources`` maps
type keys to API paths.  Selected with ``--platform kubernetes`` (``tether.cli.platform_opts``).
"""
