"""``tether viz check`` on the local platform: Linkerd's ``linkerd-viz`` and ``linkerd-viz-data-plane`` categories.

Linkerd's checks ask the API server about viz's namespace, RBAC, tap's APIService
and pods. The local platform has none of those; what stands in for them is
checked instead, under Linkerd's category names and, where the question is the
same, its wording:

- ``local-platform`` (fatal): ``tether check``'s, for the settings and the store,
  and viz installed (``<state>/viz/viz.json``);
- ``linkerd-viz``: the tap server's
  certificate (``<state>/viz/tap.crt``) in its validity window and naming the tap
  identity, and not past half its life (a warning: ``viz install`` renews it
  then); viz's components running and ready (the launcher's records and each
  one's ``/ready``); the "viz extension self-check" — a PromQL query answered,
  which is what Linkerd's metrics API checks of Prometheus, the metrics API being
  the CLI here; Prometheus ready with Linkerd's scrape jobs loaded;
- ``linkerd-viz-data-plane`` (``--proxy``): the namespace exists (``-n``);
  "prometheus is authorized to scrape data plane pods" (a warning, Linkerd's
  rule: in a namespace without the ``prometheus-scrape`` AuthorizationPolicy
  of ``viz allow-scrapes``, every running meshed pod whose proxy has the
  ``deny`` default inbound policy is named -- its admin port refuses
  Prometheus); and every running meshed pod's proxy is among Prometheus'
  healthy ``linkerd-proxy`` targets.

Callers: ``tether.cli.viz``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509

from tether.diagnose import facts, proxies
from tether.diagnose.certs import validity_problem
from tether.diagnose.checks import Category, Check, Problem
from tether.diagnose.local import LocalChecks
from tether.identity import pem
from tether.resources import kinds
from tether.viz import local
from tether.viz.allow_scrapes import SCRAPE_POLICY
from tether.viz.prometheus import Prometheus, PrometheusError
from tether.viz.scrape_config import CONTROLLER_JOB, PROXY_JOB

INSTALL_HINT = "run `tether viz install` (after `tether up`)"


@dataclass
class LocalVizChecks:
    """The categories; ``platform`` loads the platform's settings first (its fatal category)."""

    platform: LocalChecks
    prometheus_url: str | None = None  # --prometheus-url / TETHER_PROMETHEUS_URL, else viz.json's
    now: Callable[[], datetime] = lambda: datetime.now(UTC)

    def _settings(self) -> local.VizSettings:
        config = self.platform._config()
        try:
            settings = local.load_settings(config)
        except local.VizError as err:
            raise Problem(str(err)) from None
        if settings is None:
            raise Problem(f"viz is not installed in {config.state_dir} (no {local.layout(config).settings})")
        return settings

    def _prometheus(self) -> Prometheus:
        url = self.prometheus_url or self._settings().url
        try:
            return Prometheus(url)
        except PrometheusError as err:
            raise Problem(str(err)) from None

    # -- linkerd-viz ------------------------------------------------------------------------

    def _installed(self) -> None:
        self._settings()

    def _tap_cert(self) -> x509.Certificate:
        path = local.layout(self.platform._config()).tap_cert
        try:
            return pem.read_certificates(path)[0]
        except (OSError, pem.PemError) as err:
            raise Problem(f"{path}: {err}") from None

    def _tap_cert_valid(self) -> None:
        cert = self._tap_cert()
        problem = validity_problem(cert, self.now())
        if problem:
            raise Problem(f"tap server's certificate is {problem}")
        want = local.tap_workload(self.platform._config()).dns_name
        try:
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName)
        except x509.ExtensionNotFound:
            names = []
        if want not in names:
            raise Problem(f"tap server's certificate names {', '.join(names) or 'nothing'}, not {want}")

    def _tap_cert_fresh(self) -> None:
        cert = self._tap_cert()
        half = cert.not_valid_before_utc + (cert.not_valid_after_utc - cert.not_valid_before_utc) / 2
        if self.now() >= half:
            raise Problem(f"tap server's certificate is past half its life; it expires on "
                          f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")

    def _components(self) -> list[str]:
        settings = self._settings()
        return [c for c in local.COMPONENTS if c != local.PROMETHEUS or settings.prometheus_url is None]

    def _running(self) -> None:
        launcher = self.platform._launcher()
        down = [f"* {name}: {launcher.status(name).state} (log: {launcher.log_path(name)})"
                for name in self._components() if launcher.running(name) is None]
        if down:
            raise Problem("\n".join(["viz components are not running:", *down]))

    def _ready(self) -> None:
        launcher = self.platform._launcher()
        unready = [f"* {name}: its /ready does not answer 200 (log: {launcher.log_path(name)})"
                   for name in self._components() if not launcher.status(name).ready]
        if unready:
            raise Problem("\n".join(["viz components are not ready:", *unready]))

    def _self_check(self) -> None:
        prometheus = self._prometheus()
        try:
            prometheus.query("up")
        except PrometheusError as err:
            raise Problem(f"the metrics API cannot query Prometheus: {err}") from None

    def _prometheus_configured(self) -> None:
        prometheus = self._prometheus()
        try:
            prometheus.ready()
            jobs = {(t.get("labels") or {}).get("job") for t in prometheus.targets()}
        except PrometheusError as err:
            raise Problem(str(err)) from None
        if CONTROLLER_JOB not in jobs:
            raise Problem(f"Prometheus at {prometheus.url} has no {CONTROLLER_JOB} targets: it does not run viz's "
                          f"scrape configuration ({local.layout(self.platform._config()).prometheus_yml})")

    def viz_category(self) -> Category:
        components_hint = "`tether viz install` starts them again; their logs are in <state>/logs/"
        return Category("linkerd-viz", [
            Check("tap server has valid cert", self._tap_cert_valid,
                  "run `tether viz install` again: it issues the tap server's certificate anew"),
            Check("tap server cert is not past half its life", self._tap_cert_fresh,
                  "run `tether viz install` again: it renews the certificate past half its life", warning=True),
            Check("viz extension components are running", self._running, components_hint, retry=True),
            Check("viz extension components are ready", self._ready, components_hint, retry=True),
            Check("viz extension self-check", self._self_check,
                  "check that Prometheus runs (`tether viz install`) or that --prometheus-url is right", retry=True),
            Check("prometheus is installed and configured correctly", self._prometheus_configured,
                  "add the jobs of <state>/viz/prometheus.yml to your Prometheus, or run `tether viz install`",
                  retry=True),
        ])

    # -- linkerd-viz-data-plane ----------------------------------------------------------------

    def _namespace(self) -> None:
        namespace = self.platform.namespace
        if namespace and not any(n["metadata"]["name"] == namespace for n in self.platform._store_list("Namespace")):
            raise Problem(f"the \"{namespace}\" namespace does not exist")

    def _proxy_metrics(self) -> None:
        prometheus = self._prometheus()
        try:
            targets = prometheus.targets()
        except PrometheusError as err:
            raise Problem(str(err)) from None
        scraped = {((t.get("labels") or {}).get("namespace"), (t.get("labels") or {}).get("pod")): t
                   for t in targets if (t.get("labels") or {}).get("job") == PROXY_JOB}
        pods = [facts.ref(p) for p in self.platform._meshed_pods(fresh=True)]
        if not pods:
            raise Problem('No "linkerd-proxy" containers found')
        missing = [str(p) for p in pods if (p.namespace, p.name) not in scraped]
        down = [f"{p} ({scraped[(p.namespace, p.name)].get('lastError') or scraped[(p.namespace, p.name)].get('health')})"
                for p in pods if (p.namespace, p.name) in scraped and scraped[(p.namespace, p.name)].get("health") != "up"]
        problems = ([f"Data plane metrics not found for {', '.join(missing)}."] if missing else []) + (
            [f"scrapes failing: {', '.join(down)}"] if down else [])
        if problems:
            raise Problem("\n".join(problems))

    def _prometheus_authorized(self) -> None:
        pods = self.platform._meshed_pods(fresh=True)
        allowed = {a["metadata"]["namespace"] for a in self.platform._store_list(kinds.AUTHORIZATION_POLICY.key,
                                                                                self.platform.namespace)
                   if a["metadata"]["name"] == SCRAPE_POLICY}
        # The proxy's own variable, not the annotation: a cluster-wide deny sets no annotation (as Linkerd reads).
        refused = [facts.ref(p) for p in pods if facts.ref(p).namespace not in allowed
                   and proxies.proxy_env(p, "LINKERD2_PROXY_INBOUND_DEFAULT_POLICY") == "deny"]
        if refused:
            names = (str(r) if not self.platform.namespace else r.name for r in refused)
            raise Problem("prometheus may not be authorized to scrape the following pods:\n"
                          + "\n".join(f"\t* {name}" for name in names))

    def data_plane_category(self) -> Category:
        return Category("linkerd-viz-data-plane", [
            Check("data plane namespace exists", self._namespace, "create it, or pass another -n"),
            Check("prometheus is authorized to scrape data plane pods", self._prometheus_authorized,
                  "consider running `tether viz allow-scrapes` to authorize prometheus scrapes", warning=True),
            Check("data plane proxy metrics are present in Prometheus", self._proxy_metrics,
                  "wait for Prometheus' next scrape (--scrape-interval); pods created before `viz install` are "
                  "scraped once discovery lists them", retry=True),
        ])

    def categories(self, *, proxy: bool) -> list[Category]:
        platform = self.platform.platform_category()
        # The platform's fatal category minus the bridge (viz's checks read files and ask Prometheus), and viz
        # installed: without it nothing after can be asked.
        platform = Category(platform.name, [*(c for c in platform.checks if "bridge" not in c.description),
                                            Check("viz is installed", self._installed, INSTALL_HINT)], fatal=True)
        return [platform, self.viz_category(), *([self.data_plane_category()] if proxy else [])]
