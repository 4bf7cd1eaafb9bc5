"""``tether viz allow-scrapes``: the policy resources that let viz's Prometheus scrape a locked-down namespace.

Linkerd's ``linkerd viz allow-scrapes --namespace NS`` prints, for a namespace
whose pods have the ``deny`` default inbound policy (or any policy that would
refuse Prometheus), a ``Server`` on every meshed pod's admin port
(``proxy-admin``: ``linkerd-admin``, HTTP/1), two ``HTTPRoute`` s on it
(``proxy-metrics``: ``/metrics``; ``proxy-probes``: ``/live`` and ``/ready``)
and two ``AuthorizationPolicy`` s: ``prometheus-scrape`` lets Prometheus'
identity use the metrics route, ``proxy-probes`` lets the kubelet use the
probe route. The proxies authorize each admin request under that Server
(docs/proxy.md, Admin server).

Two targets, as viz has two Prometheuses:

- ``kubernetes``: Linkerd's objects as they are. Prometheus is meshed, so it is
  authenticated as the ``prometheus`` ServiceAccount of the viz namespace; the
  kubelet by the ``kubelet`` NetworkAuthentication that ``viz install``
  creates in the viz namespace (every network, as Linkerd's chart).
- ``local``: the local platform's Prometheus is a host process, not meshed: it
  scrapes from the host's address on the pod bridge, so ``prometheus-scrape``
  requires a NetworkAuthentication of that address alone (``prometheus``);
  the probes come from inside each pod (``kubelet``: every network). Both
  NetworkAuthentications are made in the target namespace (the local platform
  has no viz namespace).

Pure: objects out. Caller: ``tether.cli.viz``.
"""

from __future__ import annotations

import ipaddress
from typing import Any

POLICY_GROUP = "policy.linkerd.io"
SCRAPE_POLICY = "prometheus-scrape"  # the AuthorizationPolicy that admits Prometheus (viz check looks for it)
ALL_NETWORKS = ({"cidr": "0.0.0.0/0"}, {"cidr": "::/0"})


def kubelet_authentication(namespace: str, version: str) -> dict[str, Any]:
    """The ``kubelet`` NetworkAuthentication (every network) the probe routes' authorization requires."""
    return {"apiVersion": f"{POLICY_GROUP}/v1alpha1", "kind": "NetworkAuthentication",
            "metadata": _meta("kubelet", namespace, version),
            "spec": {"networks": [dict(n) for n in ALL_NETWORKS]}}


def kubernetes(namespace: str, viz_namespace: str, version: str) -> list[dict[str, Any]]:
    """Linkerd's allow-scrapes objects for ``namespace``: Prometheus authenticated by its ServiceAccount."""
    prometheus = {"kind": "ServiceAccount", "name": "prometheus", "namespace": viz_namespace}
    kubelet = {"kind": "NetworkAuthentication", "group": POLICY_GROUP, "name": "kubelet", "namespace": viz_namespace}
    return _objects(namespace, version, prometheus, kubelet)


def local(namespace: str, host: ipaddress.IPv4Address, version: str) -> list[dict[str, Any]]:
    """The local platform's: Prometheus authenticated by the host's address on the pod bridge."""
    scraper = {"apiVersion": f"{POLICY_GROUP}/v1alpha1", "kind": "NetworkAuthentication",
               "metadata": _meta("prometheus", namespace, version),
               "spec": {"networks": [{"cidr": f"{host}/32"}]}}
    prometheus = {"kind": "NetworkAuthentication", "group": POLICY_GROUP, "name": "prometheus"}
    kubelet = {"kind": "NetworkAuthentication", "group": POLICY_GROUP, "name": "kubelet"}
    return [scraper, kubelet_authentication(namespace, version), *_objects(namespace, version, prometheus, kubelet)]


def _objects(namespace: str, version: str, prometheus: dict[str, str],
             kubelet: dict[str, str]) -> list[dict[str, Any]]:
    server_ref = {"name": "proxy-admin", "kind": "Server", "group": POLICY_GROUP}
    return [
        {"apiVersion": f"{POLICY_GROUP}/v1beta3", "kind": "Server", "metadata": _meta("proxy-admin", namespace, version),
         "spec": {"podSelector": {"matchExpressions": [{"key": "linkerd.io/control-plane-ns", "operator": "Exists"}]},
                  "port": "linkerd-admin", "proxyProtocol": "HTTP/1"}},
        {"apiVersion": f"{POLICY_GROUP}/v1alpha1", "kind": "HTTPRoute",
         "metadata": _meta("proxy-metrics", namespace, version),
         "spec": {"parentRefs": [server_ref], "rules": [{"matches": [{"path": {"value": "/metrics"}}]}]}},
        {"apiVersion": f"{POLICY_GROUP}/v1alpha1", "kind": "HTTPRoute",
         "metadata": _meta("proxy-probes", namespace, version),
         "spec": {"parentRefs": [server_ref],
                  "rules": [{"matches": [{"path": {"value": "/live"}}, {"path": {"value": "/ready"}}]}]}},
        _authorization(SCRAPE_POLICY, "proxy-metrics", prometheus, namespace, version),
        _authorization("proxy-probes", "proxy-probes", kubelet, namespace, version),
    ]


def _authorization(name: str, route: str, authentication: dict[str, str], namespace: str,
                   version: str) -> dict[str, Any]:
    return {"apiVersion": f"{POLICY_GROUP}/v1alpha1", "kind": "AuthorizationPolicy",
            "metadata": _meta(name, namespace, version),
            "spec": {"targetRef": {"group": POLICY_GROUP, "kind": "HTTPRoute", "name": route},
                     "requiredAuthenticationRefs": [authentication]}}


def _meta(name: str, namespace: str, version: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace,
            "annotations": {"linkerd.io/created-by": f"tether/cli {version}".strip()},
            "labels": {"linkerd.io/extension": "viz"}}
