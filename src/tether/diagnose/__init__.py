"""Health checks (``tether check``) and layer-by-layer diagnosis (``tether diagnose``).

- ``checks``: the check model (categories of checks, each a success, warning or
  error with a hint), the runner with ``--wait`` retries, and Linkerd's text and
  JSON renderings;
- ``certs``: the identity checks of trust anchors and issuers (pure);
- ``local``: the categories for the local platform;
- ``facts`` and ``proxies``: what check and diagnose read off the local platform and its proxies;
- ``walk``: the diagnosis model and the judgements both platforms share; ``layers``
  walks the local platform, ``kube_layers`` an API server (with ``kube_reach``'s
  port-forwards to proxies and controllers); ``kube`` holds the Kubernetes checks.

Sits between ``tether.cli`` and the controllers: it reads the platform, the store,
the identity PKI helpers and proxy metrics; the CLI only parses flags and prints.
"""
