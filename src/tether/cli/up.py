"""``tether up``, ``down``, ``status``, ``logs`` and the pod controller process (``tether platform run``).

The local platform's commands.  ``up`` makes the state directory, the PKI on first run (trust
anchor, issuer, and the destination's serving certificate), the host bridge, then starts
identity, destination, policy and the pod controller as separate processes (their command lines are
``tether identity serve ...`` and so on, run by ``tether.platform.local.launcher``, each under a
supervisor that restarts it with backoff when it exits) and waits until each answers ``/ready``.  ``down`` stops them (the controller stops every pod first);
``--purge`` also removes every namespace, veth, bridge, rule, file and address the platform
made.  ``platform run`` (hidden) is the controller process: it wires the store, the token
signer and the trust anchors into ``PodController`` and keeps the destination's certificate
fresh.  Registered on the root group by ``tether.cli.main``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Network
from pathlib import Path

import click

from tether import __version__
from tether.cli import home
from tether.cli.errors import CliError
from tether.identity import pem, pki
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.naming import WorkloadIdentity, control_plane_identity
from tether.platform.local import config as platform_config
from tether.platform.local import deployments
from tether.platform.local.config import ETC_NETNS, LocalPlatformConfig, PlatformConfigError
from tether.platform.local.ipam import Ipam, IpamConfig, IpamError
from tether.platform.local.launcher import (
    DEFAULT_BACKOFF,
    ComponentSpec,
    Launcher,
    Outcome,
    processes_matching,
    tail,
)
from tether.platform.local.netns import HostNet, LocalNetError
from tether.store import Store, StoreError

COMPONENTS = ("identity", "destination", "policy", "platform")
DESTINATION_CERT_LIFETIME = timedelta(days=7)
RENEW_CHECK_S = 600.0
ANCHOR_VALIDITY = timedelta(days=365)
ISSUER_VALIDITY = timedelta(days=365)


# -- shared helpers --------------------------------------------------------------------------


def tether_argv() -> list[str]:
    """How to run this very ``tether``: the script beside the interpreter, else the interpreter itself."""
    script = Path(sys.executable).parent / "tether"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from tether.cli.main import main; sys.argv[0] = 'tether'; main()"]


def _load_config(state: Path) -> LocalPlatformConfig | None:
    try:
        return platform_config.load(state)
    except PlatformConfigError as exc:
        raise CliError(str(exc)) from None


def _launcher(config: LocalPlatformConfig) -> Launcher:
    layout = config.layout
    # Components restart as containers do, from the same first delay, but a crash loop is capped
    # at 30 s: every new connection in the mesh waits on them.
    backoff = replace(DEFAULT_BACKOFF, initial=min(config.restart_backoff_initial, DEFAULT_BACKOFF.max))
    return Launcher(layout.components, layout.logs, backoff)


def _now() -> datetime:
    return datetime.now(UTC)


# -- PKI ---------------------------------------------------------------------------------------


def _pki_files(config: LocalPlatformConfig) -> dict[str, Path]:
    pki_dir = config.layout.pki
    return {name: pki_dir / name for name in (
        "ca.crt", "ca.key", "issuer.crt", "issuer.key", "destination.crt", "destination.key", "cli.crt", "cli.key")}


def ensure_pki(config: LocalPlatformConfig, echo=click.echo) -> None:  # noqa: ANN001
    """Trust anchor and issuer on first run (kept afterwards)."""
    files = _pki_files(config)
    config.layout.pki.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not files["ca.crt"].exists():
        cert, key = pki.create_trust_anchor(control_plane_ns=config.control_plane_ns, trust_domain=config.trust_domain,
                                            valid_for=ANCHOR_VALIDITY, now=_now())
        pem.write_file(files["ca.crt"], pem.certificate_pem(cert), private=False)
        pem.write_file(files["ca.key"], pem.private_key_pem(key), private=True)
        echo(f"created trust anchor {files['ca.crt']} ({pki.subject_cn(cert)})")
    if not files["issuer.crt"].exists():
        anchor = pem.read_certificates(files["ca.crt"])[0]
        anchor_key = pem.read_private_key(files["ca.key"])
        cert, key = pki.create_issuer(anchor, anchor_key, control_plane_ns=config.control_plane_ns,
                                      trust_domain=config.trust_domain, valid_for=ISSUER_VALIDITY, now=_now())
        pem.write_file(files["issuer.crt"], pem.certificate_pem(cert), private=False)
        pem.write_file(files["issuer.key"], pem.private_key_pem(key), private=True)
        echo(f"created issuer {files['issuer.crt']} ({pki.subject_cn(cert)})")


def ensure_destination_cert(config: LocalPlatformConfig) -> bool:
    """(Re)issue the destination's serving certificate when missing or past half its life; True if issued.

    The destination serves Get/GetProfile over TLS as ``linkerd-destination.<cp-ns>.serviceaccount...``,
    the name proxies check; in Linkerd its own proxy gets that certificate, here the platform
    signs it with the issuer and the destination reloads the files when they change.
    """
    files = _pki_files(config)
    identity = control_plane_identity("destination", config.control_plane_ns, config.trust_domain)
    return ensure_serving_cert(config, identity, files["destination.crt"], files["destination.key"])


def ensure_cli_cert(config: LocalPlatformConfig) -> bool:
    """(Re)issue the client certificate host tools present to the destination, which requires one.

    ``linkerd-cli.<cp-ns>.serviceaccount...``: what ``tether diagnose`` (and ``tether diagnostics
    ... --tls-cert <state>/pki/cli.crt --tls-key <state>/pki/cli.key``) show the destination.
    """
    files = _pki_files(config)
    identity = control_plane_identity("cli", config.control_plane_ns, config.trust_domain)
    return ensure_serving_cert(config, identity, files["cli.crt"], files["cli.key"])


def ensure_serving_cert(config: LocalPlatformConfig, identity: WorkloadIdentity, cert_path: Path, key_path: Path,
                        lifetime: timedelta = DESTINATION_CERT_LIFETIME) -> bool:
    """(Re)issue ``identity``'s certificate, signed by the platform's issuer, when missing or past half its life."""
    files = _pki_files(config)
    now = _now()
    if cert_path.exists():
        try:
            current = pem.read_certificates(cert_path)[0]
            life = current.not_valid_after_utc - current.not_valid_before_utc
            if now < current.not_valid_before_utc + life / 2:
                return False
        except pem.PemError:
            pass
    anchors = pem.read_certificates(files["ca.crt"])
    issuer = Issuer.validated(pem.read_certificates(files["issuer.crt"]), pem.read_private_key(files["issuer.key"]),
                              anchors)
    authority = CertificateAuthority(issuer, IssuanceSettings(lifetime=lifetime))
    key = pki.new_key()
    leaf = authority.issue(key.public_key(), identity, now)
    pem.write_file(key_path, pem.private_key_pem(key), private=True)
    pem.write_file(cert_path, pem.certificate_pem(leaf, *issuer.intermediates), private=False)
    return True


# -- component command lines -------------------------------------------------------------------


def component_specs(config: LocalPlatformConfig) -> list[ComponentSpec]:
    tether = tether_argv()
    files = _pki_files(config)
    ports = config.ports
    common = ["--trust-domain", config.trust_domain, "--control-plane-ns", config.control_plane_ns]
    admin = lambda port: f"http://{config.address(port)}"  # noqa: E731
    return [
        ComponentSpec(
            name="identity",
            # --spiffe-uri-san: every certificate also names spiffe://<td>/ns/<ns>/sa/<sa>, the identity an
            # ExternalWorkload's meshTLS.identity gives for a VM (docs/mesh-expansion.md).
            argv=(*tether, "identity", "serve", "--spiffe-uri-san", "--trust-anchors", str(files["ca.crt"]),
                  "--issuer-cert", str(files["issuer.crt"]), "--issuer-key", str(files["issuer.key"]),
                  "--addr", config.address(ports.identity), "--admin-addr", config.address(ports.identity_admin),
                  "--state-dir", str(config.state_dir), *common),
            admin_url=admin(ports.identity_admin),
            addr=config.address(ports.identity),
            version=__version__,
        ),
        ComponentSpec(
            name="destination",
            argv=(*tether, "destination", "serve", "--addr", config.address(ports.destination),
                  "--admin-addr", config.address(ports.destination_admin), "--store", str(config.layout.store),
                  "--cluster-domain", config.cluster_domain, *common,
                  "--tls-cert", str(files["destination.crt"]), "--tls-key", str(files["destination.key"]),
                  # Clients must present a certificate issued under the trust anchor: proxies present
                  # their own identity (in Linkerd they reach the destination through its meshed pod).
                  "--trust-anchors", str(files["ca.crt"])),
            admin_url=admin(ports.destination_admin),
            addr=config.address(ports.destination),
            version=__version__,
        ),
        ComponentSpec(
            # Proxies check the policy service's identity as the destination's (Linkerd runs both in
            # one pod), so it serves the destination's certificate.
            name="policy",
            argv=(*tether, "policy", "serve", "--addr", config.address(ports.policy),
                  "--admin-addr", config.address(ports.policy_admin), "--store", str(config.layout.store),
                  "--cluster-domain", config.cluster_domain, "--cluster-networks", config.cluster_networks,
                  "--identity-domain", config.trust_domain, "--control-plane-namespace", config.control_plane_ns,
                  "--tls-cert", str(files["destination.crt"]), "--tls-key", str(files["destination.key"])),
            admin_url=admin(ports.policy_admin),
            addr=config.address(ports.policy),
            version=__version__,
        ),
        ComponentSpec(
            name="platform",
            argv=(*tether, "platform", "run", "--state-dir", str(config.state_dir)),
            admin_url=admin(ports.platform_admin),
            addr=config.address(ports.platform_admin),
            version=__version__,
            # Stopping the controller stops every pod first (each within its grace period).
            stop_timeout=60.0,
        ),
    ]


# -- up ------------------------------------------------------------------------------------------


def _cidr(ctx: click.Context, param: click.Parameter, value: str | None) -> IPv4Network | None:
    if value is None:
        return None
    try:
        return IPv4Network(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.option("--prefix", help="Name prefix of pod namespaces and veths [default: tether].")
@click.option("--bridge", help="Host bridge name [default: tether0].")
@click.option("--pod-cidr", callback=_cidr, help="Pod address range [default: 10.213.0.0/16].")
@click.option("--service-cidr", callback=_cidr, help="Service cluster IP range [default: 10.214.0.0/16].")
@click.option("--proxy-log-level", help="Default LINKERD2_PROXY_LOG of meshed pods.")
@click.option("--restart-backoff", type=click.FloatRange(min=0.1), help="First crash-restart delay in seconds [default: 1].")
@click.option("--timeout", type=click.FloatRange(min=1), default=60, show_default=True,
              help="Seconds to wait for each component to become ready.")
@click.option("--viz", is_flag=True, help="Also install and start viz (Prometheus, discovery, tap) with its "
              "defaults, as `tether viz install` does. Once installed, viz starts with every `tether up` until "
              "`tether viz uninstall`; `tether down` stops it with the rest.")
def up(prefix: str | None, bridge: str | None, pod_cidr: IPv4Network | None, service_cidr: IPv4Network | None,
       proxy_log_level: str | None, restart_backoff: float | None, timeout: float, viz: bool) -> None:
    """Start the local control plane: identity, destination, policy and the pod controller (and viz, when asked
    with --viz or installed before)."""
    if os.geteuid() != 0:
        raise CliError("tether up needs root: pods are network namespaces with iptables rules")
    state = home.state_dir()
    saved = _load_config(state)
    base = saved or LocalPlatformConfig(state_dir=state)
    try:
        config = base.with_changes(prefix=prefix, bridge=bridge, pod_cidr=pod_cidr, service_cidr=service_cidr,
                                   proxy_log_level=proxy_log_level, restart_backoff_initial=restart_backoff)
    except (PlatformConfigError, ValueError) as exc:
        raise CliError(str(exc)) from None
    launcher = _launcher(config)
    if saved is not None and config != saved:
        running = [name for name in COMPONENTS if launcher.running(name)]
        if running:
            raise CliError(f"the running platform ({', '.join(running)}) uses other settings; "
                           "run `tether down` first to change them")
    config.save()
    click.echo(f"state: {state}  (bridge {config.bridge}, pods {config.pod_cidr}, services {config.service_cidr})")
    try:
        ensure_pki(config)
        ensure_cli_cert(config)
        if ensure_destination_cert(config):
            click.echo(f"issued the destination's certificate ({control_plane_identity('destination', config.control_plane_ns, config.trust_domain).dns_name})")
        ipam = Ipam(IpamConfig(state_dir=state, pod_cidr=config.pod_cidr))
        HostNet(config.netns).ensure_bridge(ipam.gateway)
        Store(config.layout.store).close()  # create it before two processes race to
    except (pem.PemError, pki.PkiError, IpamError, LocalNetError, StoreError, OSError) as exc:
        raise CliError(str(exc)) from None
    specs = component_specs(config)
    for spec in specs:
        record, started = launcher.start(spec)
        verb = "starting" if started else "already running"
        click.echo(f"{spec.name:<12} {verb} (pid {record.pid})")

    def progress(outcome: Outcome) -> None:
        spec = next(s for s in specs if s.name == outcome.name)
        if outcome.problem is None:
            click.echo(f"{outcome.name:<12} ready     {spec.addr:<22} ({outcome.seconds:.1f}s)")
        else:
            click.echo(f"{outcome.name:<12} FAILED    {outcome.problem}; log: {outcome.log}", err=True)
            if outcome.log_tail:
                click.echo("\n".join(f"    {line}" for line in outcome.log_tail.splitlines()), err=True)

    outcomes = launcher.wait_ready([s.name for s in specs], timeout, progress)
    failed = [o.name for o in outcomes if o.problem is not None]
    if failed:
        raise CliError(f"{', '.join(failed)} did not become ready; it is restarted with backoff (`tether status` "
                       "shows its restarts): fix it and run `tether up` again, or `tether down` to stop everything")
    _start_viz(config, asked=viz, timeout=timeout)
    click.echo("the control plane is up: deploy with `tether apply -f FILE`, watch with `tether get pods`, "
               "stop with `tether down`")


def _start_viz(config: LocalPlatformConfig, *, asked: bool, timeout: float) -> None:
    """Viz with the mesh: its saved settings when it is installed, its defaults when ``--viz`` installs it."""
    from tether.cli import viz
    from tether.viz import local

    try:
        settings = local.load_settings(config)
    except local.VizError as exc:
        raise CliError(str(exc)) from None
    if settings is None and not asked:
        return
    viz.start_local(config, settings or local.VizSettings(), timeout)


# -- down ----------------------------------------------------------------------------------------


@click.command()
@click.option("--purge", is_flag=True,
              help="Also remove every pod namespace, veth, the bridge, rules and pod addresses (keeps the store and PKI).")
def down(purge: bool) -> None:
    """Stop the local control plane (and every pod); keep the state."""
    state = home.state_dir()
    config = _load_config(state) or LocalPlatformConfig(state_dir=state)
    launcher = _launcher(config)
    stopped = False
    # Extensions (viz) run under the same launcher; they read the store, so they stop first.
    for name in [n for n in launcher.recorded() if n not in COMPONENTS] + list(reversed(COMPONENTS)):
        if launcher.stop(name):
            click.echo(f"{name:<12} stopped")
            stopped = True
    if not stopped:
        click.echo("nothing was running")
    if purge:
        purge_platform(config)
        click.echo(f"purged: pod namespaces {config.prefix}-*, veths, bridge {config.bridge}, their rules and "
                   "addresses (the store and PKI in the state directory are kept)")


def purge_platform(config: LocalPlatformConfig) -> None:
    """Remove everything the platform made on the host, including what a crashed run left."""
    layout = config.layout
    needles = [f"--state-dir {config.state_dir}", str(layout.store)]
    for pid in processes_matching(n.replace(" ", "\0") for n in needles):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        HostNet(config.netns).teardown_all()
    except LocalNetError as exc:
        raise CliError(f"purge: {exc}") from None
    for etc in ETC_NETNS.glob(f"{config.prefix}-*"):
        shutil.rmtree(etc, ignore_errors=True)
    shutil.rmtree(layout.run_dir, ignore_errors=True)
    for parent in (ETC_NETNS, layout.run_dir.parent):
        with contextlib.suppress(OSError):
            parent.rmdir()  # only when empty: another platform's (or the admin's) files stay
    try:
        ipam = Ipam(IpamConfig(state_dir=config.state_dir, pod_cidr=config.pod_cidr))
        for owner in ipam.allocations():
            ipam.release(owner)
    except IpamError as exc:
        click.echo(f"warning: pod addresses not released: {exc}", err=True)
    for name in COMPONENTS:
        (layout.components / f"{name}.json").unlink(missing_ok=True)


# -- status --------------------------------------------------------------------------------------


@click.command()
def status() -> None:
    """Show each component's health, version and address; exit 1 unless all are ready."""
    state = home.state_dir()
    config = _load_config(state)
    if config is None:
        click.echo(f"no local platform in {state}: run `tether up`")
        sys.exit(1)
    launcher = _launcher(config)
    rows = [("COMPONENT", "STATUS", "READY", "RESTARTS", "PID", "VERSION", "ADDRESS", "ADMIN", "LOG")]
    healthy = True
    for spec in component_specs(config):
        st = launcher.status(spec.name)
        healthy &= st.healthy
        rec = st.record
        rows.append((
            spec.name, st.state, "yes" if st.ready else "no", str(st.restarts), str(st.pid) if st.pid else "-",
            rec.version if rec else "-", spec.addr, spec.admin_url.removeprefix("http://"), str(st.log),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("   ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    click.echo(f"state: {state}   bridge: {config.bridge} ({config.gateway})   "
               f"pods: {config.pod_cidr}   services: {config.service_cidr}")
    try:
        with Store(config.layout.store) as store:
            pods = store.list("Pod").items
    except StoreError:
        pods = []
    if pods:
        running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
        ready = sum(1 for p in pods if deployments.pod_ready(p))
        click.echo(f"pods: {len(pods)} ({running} running, {ready} ready): tether get pods -A")
    if not healthy:
        sys.exit(1)


# -- logs ----------------------------------------------------------------------------------------


def _pick_pod(store: Store, namespace: str, ref: str) -> dict:
    kind, _, name = ref.rpartition("/")
    if kind in ("deploy", "deployment", "deployments", "deployment.apps"):
        pods = [p for p in store.list("Pod", namespace).items if deployments.managed_by(p) == name]
        if not pods:
            raise CliError(f'no pods of deployment "{name}" in namespace {namespace}')
        return sorted(pods, key=lambda p: p["metadata"]["name"])[0]
    if kind not in ("", "pod", "pods", "po"):
        raise CliError(f"logs of {kind}/... are not supported: name a pod or deploy/NAME")
    pod = store.get("Pod", namespace, name)
    if pod is None:
        raise CliError(f'pods "{name}" not found in namespace {namespace}')
    return pod


def _container_name(pod: dict, wanted: str | None) -> str:
    spec = pod.get("spec") or {}
    apps = [c["name"] for c in spec.get("containers") or ()]
    inits = [c["name"] for c in spec.get("initContainers") or ()]
    if wanted in (None, "app"):
        default = ((pod["metadata"].get("annotations") or {}).get("kubectl.kubernetes.io/default-container"))
        return default if default in apps else apps[0]
    if wanted == "proxy":
        wanted = "linkerd-proxy"
    if wanted not in apps + inits:
        raise CliError(f"container {wanted} is not valid for pod {pod['metadata']['name']}: "
                       f"choose one of {', '.join(apps + inits)} (or proxy, app)")
    return wanted


@click.command()
@click.argument("pod")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("-c", "--container", help="Container name, or `proxy` (linkerd-proxy) or `app` (the default).")
@click.option("-p", "--previous", is_flag=True, help="The previous run's log (before the last restart).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output.")
@click.option("--tail", "tail_lines", type=int, default=-1, help="Lines from the end to show (-1: all).")
def logs(pod: str, namespace: str, container: str | None, previous: bool, follow: bool, tail_lines: int) -> None:
    """Print a pod container's output: POD, or deploy/NAME for one of its pods."""
    state = home.state_dir()
    config = _load_config(state) or LocalPlatformConfig(state_dir=state)
    try:
        with Store(config.layout.store) as store:
            obj = _pick_pod(store, namespace, pod)
    except StoreError as exc:
        raise CliError(str(exc)) from None
    name = _container_name(obj, container)
    path = config.layout.container_log(namespace, obj["metadata"]["name"], name, previous)
    if not path.exists():
        what = "previous run" if previous else "output"
        raise CliError(f"no {what} of container {name} in pod {obj['metadata']['name']} yet ({path})")
    text = path.read_text(errors="replace") if tail_lines < 0 else tail(path, tail_lines)
    click.echo(text, nl=bool(text) and not text.endswith("\n"))
    if follow and not previous:
        _follow(path)


def _follow(path: Path) -> None:
    """Print what is appended to ``path``; a restart's new file is picked up."""
    handle = open(path, "rb")  # noqa: SIM115 - reopened on rotation
    handle.seek(0, os.SEEK_END)
    inode = os.fstat(handle.fileno()).st_ino
    try:
        while True:
            chunk = handle.read()
            if chunk:
                click.echo(chunk.decode(errors="replace"), nl=False)
                continue
            time.sleep(0.25)
            try:
                if os.stat(path).st_ino != inode:
                    handle.close()
                    handle = open(path, "rb")  # noqa: SIM115
                    inode = os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                pass
    except KeyboardInterrupt:
        pass
    finally:
        handle.close()


# -- the pod controller process -----------------------------------------------------------------


@click.group(hidden=True)
def platform() -> None:
    """The local platform's own processes (started by `tether up`)."""


@platform.command("token")
@click.option("--namespace", "-n", required=True, help="The workload's namespace.")
@click.option("--service-account", required=True, help="The service account its identity is named after.")
@click.option("--workload", required=True, help="The ExternalWorkload's name (the token's pod claim).")
@click.option("--hours", type=click.IntRange(1, 24), default=24, show_default=True, help="How long the token lives.")
def platform_token(namespace: str, service_account: str, workload: str, hours: int) -> None:
    """Print an identity token for a workload outside the pods (a VM joining the mesh without SPIRE).

    Its proxy sends it to identity with a CSR, as a pod's proxy sends its own, and gets a
    certificate for <service-account>.<namespace>.serviceaccount.identity... that also names
    spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>: the ExternalWorkload's
    meshTLS.identity.
    """
    from tether.naming import InvalidName
    from tether.platform.local.tokens import LocalTokenSigner, TokenKey, TokenKeyError

    state = home.state_dir()
    if _load_config(state) is None:
        raise CliError(f"{state}: no local platform; run `tether up`")
    try:
        signer = LocalTokenSigner(TokenKey.load_or_create(state))
        token = signer.mint(namespace=namespace, service_account=service_account, pod=workload,
                            lifetime=timedelta(hours=hours))
    except (TokenKeyError, OSError) as exc:
        raise CliError(str(exc)) from None
    except InvalidName as exc:
        raise CliError(f"--namespace/--service-account: {exc}") from None
    click.echo(token.decode())


@platform.command("run")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def platform_run(state_dir: Path, log_level: str) -> None:
    """Run the local pod controller of STATE_DIR until SIGTERM."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = _load_config(state_dir)
    if config is None:
        raise CliError(f"{state_dir}: no platform settings; run `tether up`")
    # Imported here: the controller pulls in the platform's runtime only for this process.
    from tether.admin import AdminServer
    from tether.platform.local.pods import PodController
    from tether.platform.local.tokens import LocalTokenSigner, TokenKey, TokenKeyError

    try:
        signer = LocalTokenSigner(TokenKey.load_or_create(state_dir))
        anchors = config.layout.trust_anchors.read_text()
        store = Store(config.layout.store)
    except (TokenKeyError, OSError, StoreError) as exc:
        raise CliError(str(exc)) from None
    # The default commands mean "this tether": the executable that runs this process.
    defaults = LocalPlatformConfig(state_dir=state_dir)
    if config.proxy_command == defaults.proxy_command:
        config = config.with_changes(proxy_command=(*tether_argv(), "proxy"))
    if config.init_command == defaults.init_command:
        config = config.with_changes(init_command=(*tether_argv(), "init"))
    path = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
    for extra in ("/usr/local/sbin", "/usr/sbin", "/sbin"):
        if extra not in path.split(":"):
            path += ":" + extra
    from tether.injector.local_platform import LocalMesher, mesh_config

    from tether.viz.local import tap_admission

    # The webhooks' patches, for local pods: the proxy injector, then viz's tap injector (while viz is installed).
    mesher = LocalMesher(mesh_config(config, anchors, __version__), later=[tap_admission(config)])
    controller = PodController(config, store, signer=signer, mesh=mesher, version=__version__,
                               base_env={"PATH": path})
    admin = AdminServer(lambda: controller.metrics_text().encode(), controller.ready.is_set, "the store has not been read yet")
    try:
        asyncio.run(_run_platform(config, controller, admin))
    finally:
        store.close()


async def _run_platform(config: LocalPlatformConfig, controller, admin) -> None:  # noqa: ANN001
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    port = await admin.start(str(config.host_ip), config.ports.platform_admin)
    click.echo(f"platform: pod controller running, admin on {config.host_ip}:{port}")
    renewer = asyncio.create_task(_renew_destination_cert(config, stop))
    from tether.platform.local.endpointslices import EndpointSliceController
    from tether.platform.local.endpointslices import external_workload_controller
    from tether.platform.local.events import expire_events

    # Services -> EndpointSlices, of their pods and of the ExternalWorkloads they select; Events expire.
    slices = [asyncio.create_task(EndpointSliceController(controller.store).run()),
              asyncio.create_task(external_workload_controller(controller.store, controller.ipam,
                                                               controller.counters.workload_rejected).run()),
              asyncio.create_task(expire_events(controller.store))]
    try:
        await controller.run(stop)
    finally:
        renewer.cancel()
        for task in slices:
            task.cancel()
        await asyncio.gather(*slices, return_exceptions=True)
        await admin.stop()
    click.echo("platform: stopped every pod")


async def _renew_destination_cert(config: LocalPlatformConfig, stop: asyncio.Event) -> None:
    log = logging.getLogger("tether.platform.certs")
    while not stop.is_set():
        try:
            if await asyncio.to_thread(ensure_destination_cert, config):
                log.info("renewed the destination's serving certificate")
            if await asyncio.to_thread(ensure_cli_cert, config):
                log.info("renewed the host tools' client certificate")
        except (pem.PemError, pki.PkiError, OSError) as exc:
            log.error("cannot renew the destination's certificate: %s", exc)
        try:
            await asyncio.wait_for(stop.wait(), RENEW_CHECK_S)
        except TimeoutError:
            pass
