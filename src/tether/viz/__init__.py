"""Tether's viz (Linkerd viz): Prometheus for the mesh, the metrics API, and the dashboard.

Modules, bottom up:

- ``targets``: resource arguments (``deploy/web``, ``po``, ``svc/web``, ``au/...``) (pure);
- ``promql``: Linkerd viz's PromQL for stat, routes, edges and authz (pure);
- ``scrape_config``: Prometheus' configuration -- Linkerd's scrape jobs and
  relabelling -- and file-discovery target groups from Pod objects (pure);
- ``workloads``: which pods make up each deployment, namespace or pod (pure);
- ``exposition``: the Prometheus text format, parsed (pure; ``tether check`` uses it);
- ``prometheus``: a small client of Prometheus' HTTP API (I/O);
- ``metrics_api``: StatSummary, TopRoutes, Edges, Authz: PromQL answers joined
  with the platform's objects (``objects``: the local store's);
- ``tables``: rows as ``linkerd viz`` prints them, and as JSON (pure);
- ``local``: viz on the local platform -- settings, Prometheus and the
  discovery process, started and stopped with the platform's launcher;
- ``dashboard``: the web UI.

Callers: ``tether.cli.viz``.  viz sits beside the controllers and the proxy: it
reads the store and talks to Prometheus over HTTP, and imports neither.
See docs/viz.md.
"""
