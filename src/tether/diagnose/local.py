"""``tether check`` on the local platform: the categories, with Linkerd's ids and wording where they apply.

``local-platform`` (settings, store, bridge) and ``linkerd-existence`` (the
component processes) are fatal: without them nothing else can be asked.  Then
``linkerd-config`` (each component ready), ``linkerd-identity`` (the PKI files),
``control-plane-version``; with ``--proxy`` the data plane categories
(``linkerd-identity-data-plane``, ``linkerd-data-plane``,
``linkerd-opaque-ports-definition``), limited to one namespace with ``-n``;
with ``--pre`` the ``pre-local-setup`` category instead of everything else.

Callers: ``tether.cli.check``.  The components to check come from the caller
(``tether.cli.up.component_specs``), so this module does not import the CLI.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tether.diagnose import facts, proxies
from tether.diagnose.certs import Credentials, IdentityHints, identity_checks
from tether.injector.annotations import trust_root_sha256
from tether.diagnose.checks import Category, Check, Problem
from tether.identity import pem, pki
from tether.platform.local import config as platform_config
from tether.platform.local.config import LocalPlatformConfig, PlatformConfigError
from tether.platform.local.launcher import ComponentSpec, Launcher
from tether.platform.local.netns import LocalNetError
from tether.ports import PortSet, parse_port_set
from tether.store import Store, StoreError
from tether.store.schema import SCHEMA_VERSION, stored_version
from tether.viz.exposition import parse

SpecsFor = Callable[[LocalPlatformConfig], Sequence[ComponentSpec]]
OPAQUE_PORTS = "config.linkerd.io/opaque-ports"


@dataclass
class LocalChecks:
    """What the local categories share: the state directory, what was loaded, the clock."""

    state_dir: Path
    specs_for: SpecsFor
    cli_version: str
    namespace: str | None = None
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    config: LocalPlatformConfig | None = None
    _pods: list[dict[str, Any]] | None = field(default=None, repr=False)

    # -- helpers ---------------------------------------------------------------------------

    def _config(self) -> LocalPlatformConfig:
        if self.config is None:
            raise Problem("the platform settings could not be read (see the first check)")
        return self.config

    def _launcher(self) -> Launcher:
        layout = self._config().layout
        return Launcher(layout.components, layout.logs)

    def _specs(self) -> Sequence[ComponentSpec]:
        return self.specs_for(self._config())

    def _store_list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        try:
            with Store(self._config().layout.store) as store:
                return store.list(kind, namespace).items
        except StoreError as exc:
            raise Problem(str(exc)) from None

    def _meshed_pods(self, fresh: bool = False) -> list[dict[str, Any]]:
        if self._pods is None or fresh:
            pods = self._store_list("Pod", self.namespace)
            self._pods = [p for p in pods if facts.meshed(p) and facts.running(p)]
        return self._pods

    # -- local-platform ---------------------------------------------------------------------

    def _settings(self) -> None:
        try:
            self.config = platform_config.load(self.state_dir)
        except PlatformConfigError as exc:
            raise Problem(str(exc)) from None
        if self.config is None:
            raise Problem(f"no local platform in {self.state_dir}")

    def _store_readable(self) -> None:
        try:
            self._version = stored_version(self._config().layout.store)
        except StoreError as exc:
            raise Problem(str(exc)) from None

    def _store_migrated(self) -> None:
        version = getattr(self, "_version", None)
        if version is None:
            raise Problem("the store could not be read (see above)")
        if version != SCHEMA_VERSION:
            raise Problem(f"the store has schema version {version}; this Tether uses {SCHEMA_VERSION}")

    def _bridge(self) -> None:
        problem = facts.bridge_problem(self._config())
        if problem:
            raise Problem(problem)

    def platform_category(self) -> Category:
        return Category("local-platform", [
            Check("platform settings are readable", self._settings, "run `tether up` to create the local platform"),
            Check("store is readable", self._store_readable,
                  "the store file is damaged or not a Tether store: move it aside and run `tether up`"),
            Check("store schema is up to date", self._store_migrated, "run `tether up`: it migrates the store"),
            Check("host bridge is up", self._bridge, "run `tether up`: it recreates the bridge"),
        ], fatal=True)

    # -- linkerd-existence / linkerd-config ----------------------------------------------------

    def _running(self) -> None:
        launcher = self._launcher()
        down = [f"{s.name}: {launcher.status(s.name).state} (log: {launcher.log_path(s.name)})"
                for s in self._specs() if launcher.running(s.name) is None]
        if down:
            raise Problem("control plane components are not running:\n" + "\n".join(f"* {d}" for d in down))

    def _ready(self) -> None:
        launcher = self._launcher()
        unready = [f"{s.name}: {s.admin_url}/ready does not answer 200"
                   for s in self._specs() if not launcher.status(s.name).ready]
        if unready:
            raise Problem("\n".join(f"* {u}" for u in unready))

    def existence_category(self) -> Category:
        return Category("linkerd-existence", [
            Check("control plane components are running", self._running,
                  "run `tether up`; `tether status` and `tether logs` show why a component stopped", retry=True),
        ], fatal=True)

    def config_category(self) -> Category:
        return Category("linkerd-config", [
            Check("control plane pods are ready", self._ready,
                  "see `tether status` and the component's log", retry=True),
        ])

    # -- linkerd-identity ------------------------------------------------------------------------

    def _credentials(self) -> Credentials:
        pki_dir = self._config().layout.pki
        try:
            anchors = pem.read_certificates(pki_dir / "ca.crt")
            issuer = pem.read_certificates(pki_dir / "issuer.crt")[0]
        except pem.PemError as exc:
            raise Problem(str(exc)) from None
        return Credentials(anchors, issuer)

    def identity_category(self) -> Category:
        pki_dir = self.state_dir / "pki"
        hints = IdentityHints(
            config=f"the PKI files are in {pki_dir}; `tether up` creates them when missing",
            anchors=f"make a new trust anchor (`tether identity create-trust-anchor --out {pki_dir} --force`), "
                    "a new issuer signed by it, then restart the platform and its pods",
            issuer=f"make a new issuer (`tether identity create-issuer --anchor-cert {pki_dir}/ca.crt "
                   f"--anchor-key {pki_dir}/ca.key --out {pki_dir} --force`); identity reloads it",
        )
        return Category("linkerd-identity", identity_checks(self._credentials, self.now, hints))

    # -- control-plane-version -------------------------------------------------------------------

    def _versions(self) -> dict[str, str]:
        launcher = self._launcher()
        out = {}
        for spec in self._specs():
            record = launcher.running(spec.name)
            if record is None:
                raise Problem(f"{spec.name} is not running")
            out[spec.name] = record.version
        return out

    def _versions_match(self) -> None:
        other = {name: v for name, v in self._versions().items() if v != self.cli_version}
        if other:
            raise Problem(", ".join(f"{n} is {v}" for n, v in other.items()) + f"; the cli is {self.cli_version}")

    def version_category(self) -> Category:
        return Category("control-plane-version", [
            Check("can retrieve the control plane version", lambda: self._versions() and None,
                  "run `tether up`"),
            Check("control plane and cli versions match", self._versions_match,
                  "restart the platform with this tether (`tether down && tether up`)", warning=True),
        ])

    # -- data plane (--proxy) --------------------------------------------------------------------

    def _namespace_exists(self) -> None:
        if self.namespace is not None and not any(
                n["metadata"]["name"] == self.namespace for n in self._store_list("Namespace")):
            raise Problem(f"The \"{self.namespace}\" namespace does not exist")

    def _proxies_ready(self) -> None:
        pods = self._meshed_pods(fresh=True)
        if not pods:
            raise Problem("No \"linkerd-proxy\" containers found" +
                          (f" in namespace {self.namespace}" if self.namespace else ""))
        problems = []
        for pod in pods:
            ip = proxies.pod_ip(pod)
            try:
                answer = proxies.admin_get(ip, "/ready", netns=facts.netns_of(self._config(), pod)) if ip else None
            except proxies.ProxyUnreachable as exc:
                problems.append(f"{facts.ref(pod)}: {exc}")
                continue
            if answer is None or answer.status != 200:
                problems.append(f"{facts.ref(pod)}: the proxy is not ready"
                                + (f" ({answer.status} {answer.body.strip()})" if answer else " (no pod IP)"))
        if problems:
            raise Problem("\n".join(f"* {p}" for p in problems))

    def _proxy_versions(self) -> None:
        other = []
        for pod in self._meshed_pods():
            version = proxy_version(self._config(), pod)
            if version != self.cli_version:
                other.append(f"* {facts.ref(pod)} runs proxy {version or 'unknown'}")
        if other:
            raise Problem("\n".join([f"some proxies are not running {self.cli_version}:", *other]))

    def _rules(self) -> None:
        problems = []
        for pod in self._meshed_pods():
            netns = facts.netns_of(self._config(), pod)
            try:
                rules = facts.nat_rules(netns)
            except LocalNetError as exc:
                problems.append(f"* {facts.ref(pod)}: {exc}")
                continue
            for problem in (facts.redirect_problem(rules), facts.services_problem(rules)):
                if problem:
                    problems.append(f"* {facts.ref(pod)} ({netns}): {problem}")
        if problems:
            raise Problem("\n".join(problems))

    def _trust_roots(self) -> None:
        pki_dir = self._config().layout.pki
        try:
            anchors_pem = (pki_dir / "ca.crt").read_text()
            anchors = pem.parse_certificates(anchors_pem.encode(), str(pki_dir / "ca.crt"))
            issuer = pem.read_certificates(pki_dir / "issuer.crt")[0]
        except (OSError, pem.PemError) as exc:
            raise Problem(str(exc)) from None
        current = trust_root_sha256(anchors_pem)
        stale = []
        for pod in self._meshed_pods():
            problem = trust_problem(pod, current, issuer, anchors)
            if problem:
                stale.append(f"* {facts.ref(pod)}: {problem}")
        if stale:
            raise Problem("\n".join(["Some pods do not have the current trust bundle and must be restarted:", *stale]))

    def _opaque_ports(self) -> None:
        problems = opaque_port_problems(self._store_list("Service", self.namespace),
                                        self._store_list("Pod", self.namespace))
        if problems:
            raise Problem("\n".join(f"* {p}" for p in problems))

    def data_plane_categories(self) -> list[Category]:
        restart = "restart the pods (`tether delete pod NAME -n NS`; their Deployment makes new ones)"
        return [
            Category("linkerd-identity-data-plane", [
                Check("data plane proxies certificate match CA", self._trust_roots, restart),
            ]),
            Category("linkerd-data-plane", [
                Check("data plane namespace exists", self._namespace_exists, "create it, or pass another -n"),
                Check("data plane proxies are ready", self._proxies_ready,
                      "see `tether logs POD -c proxy -n NS`", retry=True),
                Check("data plane and cli versions match", self._proxy_versions, restart, warning=True),
                Check("data plane redirect rules are present", self._rules,
                      "the pod's iptables rules were changed from outside: " + restart),
            ]),
            Category("linkerd-opaque-ports-definition", [
                Check("opaque ports are properly annotated", self._opaque_ports,
                      f"annotate the Service and its pods with the same {OPAQUE_PORTS}", warning=True),
            ]),
        ]

    # -- pre -------------------------------------------------------------------------------------

    def pre_category(self) -> Category:
        def root() -> None:
            if os.geteuid() != 0:
                raise Problem("tether up needs root: pods are network namespaces with iptables rules")

        def tools() -> None:
            missing = [t for t in ("ip", "iptables", "iptables-save", "iptables-restore", "setpriv")
                       if shutil.which(t) is None]
            if missing:
                raise Problem("not found on PATH: " + ", ".join(missing))

        def not_running() -> None:
            try:
                config = platform_config.load(self.state_dir)
            except PlatformConfigError as exc:
                raise Problem(str(exc)) from None
            if config is None:
                return
            launcher = Launcher(config.layout.components, config.layout.logs)
            running = [name for name in launcher.recorded() if launcher.running(name)]
            if running:
                raise Problem(f"already running in {self.state_dir}: {', '.join(running)}")

        return Category("pre-local-setup", [
            Check("can run as root", root, "run tether as root"),
            Check("iproute2, iptables and setpriv are installed", tools,
                  "apt-get install iproute2 iptables util-linux"),
            Check("control plane is not already running", not_running,
                  "`tether down` stops it, or set TETHER_HOME to use another state directory"),
        ])

    # -- all -------------------------------------------------------------------------------------

    def categories(self, *, proxy: bool, pre: bool) -> list[Category]:
        if pre:
            return [self.pre_category()]
        out = [self.platform_category(), self.existence_category(), self.config_category(),
               self.identity_category(), self.version_category()]
        if proxy:
            out += self.data_plane_categories()
        return out


def proxy_version(config: LocalPlatformConfig, pod: dict[str, Any]) -> str | None:
    ip = proxies.pod_ip(pod)
    if not ip:
        return None
    try:
        answer = proxies.admin_get(ip, "/metrics", netns=facts.netns_of(config, pod))
    except proxies.ProxyUnreachable:
        return None
    for sample in parse(answer.body).named("proxy_build_info"):
        return sample.labels.get("version")
    return None


def trust_problem(pod: dict[str, Any], current_sha: str, issuer: Any, anchors: Sequence[Any]) -> str | None:
    """Why ``pod``'s proxy does not hold the current trust root, or None."""
    given = proxies.proxy_env(pod, "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS")
    if given is not None and trust_root_sha256(given) != current_sha:
        return (f"its trust anchors (sha256 {trust_root_sha256(given)[:16]}...) are not the current ones "
                f"(sha256 {current_sha[:16]}...)")
    ip, name = proxies.pod_ip(pod), proxies.identity_of(pod)
    if not ip or not name:
        return "no pod IP or identity"
    try:
        leaf = proxies.served_certificate(ip, name)
    except proxies.ProxyUnreachable as exc:
        return str(exc)
    if pki.link_problem(leaf, issuer) is not None and pki.signing_anchor(leaf, anchors) is None:
        return f"the certificate it serves ({pki.subject_cn(leaf)}) was not issued by the current issuer"
    return None


def _ports(annotations: dict[str, str]) -> PortSet:
    return parse_port_set(annotations.get(OPAQUE_PORTS) or "")[0]


def opaque_port_problems(services: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]]) -> list[str]:
    """Linkerd's rule: a port opaque on a Service must be opaque on the pods it targets, and vice versa."""
    problems = []
    for svc in services:
        meta, spec = svc["metadata"], svc.get("spec") or {}
        svc_opaque = _ports(meta.get("annotations") or {})
        for pod in pods:
            pmeta = pod["metadata"]
            if pmeta.get("namespace") != meta.get("namespace") or not facts.selects(spec.get("selector") or {},
                                                                              pmeta.get("labels") or {}):
                continue
            pod_opaque = _ports(pmeta.get("annotations") or {})
            for port in spec.get("ports") or ():
                target = facts.target_port(port, pod)
                if target is None:
                    continue
                if port.get("port") in svc_opaque and target not in pod_opaque:
                    problems.append(f"service {meta['name']} targets the opaque port {port.get('port')} "
                                    f"but pod {pmeta['name']} does not mark port {target} opaque")
                elif target in pod_opaque and port.get("port") not in svc_opaque:
                    problems.append(f"pod {pmeta['name']} has the annotation {OPAQUE_PORTS} with port {target} "
                                    f"but service {meta['name']} does not mark port {port.get('port')} opaque")
    return problems
