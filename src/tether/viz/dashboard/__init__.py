"""``tether viz dashboard``: a read-only web UI over the metrics API (namespaces, workloads, edges, routes, pods).

``server`` serves ``static/`` (one page, plain JavaScript, no outside
resources) and ``views``' JSON, behind a Host-header check against DNS
rebinding.  Callers: ``tether.cli.viz``.
"""
