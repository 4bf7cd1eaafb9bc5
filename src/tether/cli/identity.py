"""``tether identity``: create the mesh PKI, inspect certificates, run the identity service.

A thin shell over ``tether.identity`` (and the local platform's token verifier for ``serve``);
registered on the root group by ``tether.cli.main``.  Bad input is reported as
``error: <file or flag>: <what>`` with exit code 1; usage errors exit 2.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from tether.cli import home
from tether.cli.errors import CliError
from tether.identity import pem, pki
from tether.identity.ca import DEFAULT_CLOCK_SKEW, DEFAULT_LIFETIME, IssuanceSettings
from tether.identity.server import (
    DEFAULT_ADDR,
    DEFAULT_ADMIN_ADDR,
    ConfigError,
    IdentityConfig,
    IdentityService,
    split_host_port,
)
from tether.naming import DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN, InvalidName, check_label, check_trust_domain
from tether.cli.platform_opts import Platform, platform_options
from tether.platform.local.tokens import TokenKeyError

ANCHOR_FILES = ("ca.crt", "ca.key")
ISSUER_FILES = ("issuer.crt", "issuer.key")


class Duration(click.ParamType):
    """``8760h``, ``365d``, ``24h0m0s``, ``20s``, ``500ms``: integers with units, Go-style sums allowed."""

    name = "duration"
    _PART = re.compile(r"(\d+)(ms|s|m|h|d)")
    _UNITS = {"ms": timedelta(milliseconds=1), "s": timedelta(seconds=1), "m": timedelta(minutes=1),
              "h": timedelta(hours=1), "d": timedelta(days=1)}

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        text = str(value).strip()
        parts = self._PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            self.fail(f"{value!r} is not a duration like 8760h, 365d, 24h0m0s or 20s", param, ctx)
        total = sum((int(n) * self._UNITS[u] for n, u in parts), timedelta())
        if total <= timedelta():
            self.fail(f"{value!r} must be longer than zero", param, ctx)
        return total


DURATION = Duration()


def _trust_domain(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_trust_domain(value)
    except InvalidName as exc:
        raise click.BadParameter(str(exc)) from None


def _label(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_label("control-plane namespace", value)
    except InvalidName as exc:
        raise click.BadParameter(str(exc)) from None


def _addr(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        split_host_port(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


_trust_domain_opt = click.option(
    "--trust-domain", default=DEFAULT_TRUST_DOMAIN, show_default=True, callback=_trust_domain,
    help="The identity trust domain.",
)
_cp_ns_opt = click.option(
    "--control-plane-ns", default=DEFAULT_CONTROL_PLANE_NS, show_default=True, callback=_label,
    help="The control-plane namespace (part of every identity name).",
)
_valid_for_opt = click.option(
    "--valid-for", type=DURATION, default="365d", show_default=True, help="Validity period, e.g. 8760h or 365d."
)
_out_opt = click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=".", show_default=True,
    help="Directory to write the certificate and key to.",
)
_force_opt = click.option("--force", is_flag=True, help="Overwrite existing files.")


class _IdentityGroup(click.Group):
    """Subcommands, plus ``tether identity po/NAME|deploy/NAME...`` as Linkerd's ``linkerd identity PODS``."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and "/" in args[0] and args[0] not in self.commands:
            return "pods", pods_command, args
        return super().resolve_command(ctx, args)


@click.group(cls=_IdentityGroup)
def identity() -> None:
    """The mesh PKI (trust anchors, issuers) and the identity service.

    `tether identity po/NAME|deploy/NAME... [-n NS] [--platform kubernetes]` prints the certificate each pod's
    proxy serves.
    """


@click.command("pods", hidden=True)
@click.argument("targets", nargs=-1, required=True, metavar="po/NAME|deploy/NAME...")
@click.option("-n", "--namespace", default="default", show_default=True)
@platform_options
def pods_command(targets: tuple[str, ...], namespace: str, platform: Platform) -> None:
    """The certificate each pod's proxy serves: subject, SANs, issuer, validity (a TLS handshake with it).

    With --platform kubernetes each pod's inbound port is reached through the API server's port-forward.
    """
    from tether.diagnose import proxies

    if platform.kubernetes:
        served = asyncio.run(_kube_served(platform, targets, namespace))
    else:
        from tether.cli.diagnostics_scrape import local_config, resolve_pods

        config = local_config()
        served = [(pod["metadata"]["name"], _local_served(pod)) for pod in resolve_pods(config, targets, namespace)]
    failed = False
    for index, (name, cert) in enumerate(served, 1):
        click.echo(f"POD {name} ({index} of {len(served)})")
        if isinstance(cert, proxies.ProxyUnreachable):
            failed = True
            click.echo(f"error: {cert}", err=True)
            continue
        for label, value in _describe(cert, _now()):
            click.echo(f"  {label + ':':<11} {value}")
    if failed:
        sys.exit(1)


def _local_served(pod: dict) -> x509.Certificate | Exception:
    from tether.diagnose import proxies

    ip, local_name = proxies.pod_ip(pod), proxies.identity_of(pod)
    try:
        if not ip or not local_name:
            raise proxies.ProxyUnreachable(f"pod {pod['metadata']['name']} is not a running meshed pod")
        return proxies.served_certificate(ip, local_name)
    except proxies.ProxyUnreachable as exc:
        return exc


async def _kube_served(platform: Platform, targets: tuple[str, ...], namespace: str
                       ) -> list[tuple[str, x509.Certificate | Exception]]:
    from tether.cli import kube_forward
    from tether.diagnose import kube_reach, proxies
    from tether.diagnose.kube_metrics import TargetNotFound, workload_pods
    from tether.platform.kubernetes.client import KubeClient, KubeError

    client = KubeClient(platform.client_settings())
    tunnel = kube_forward.tunnel_factory(platform)
    served: list[tuple[str, x509.Certificate | Exception]] = []
    try:
        for pod in await workload_pods(client, list(targets), namespace):
            name, local_name = pod["metadata"]["name"], proxies.identity_of(pod)
            try:
                if (pod.get("status") or {}).get("phase") != "Running" or not local_name:
                    raise proxies.ProxyUnreachable(f"pod {name} is not a running meshed pod")
                served.append((name, await kube_reach.served_certificate(tunnel, pod, local_name)))
            except proxies.ProxyUnreachable as exc:
                served.append((name, exc))
    except (TargetNotFound, KubeError) as exc:
        raise CliError(str(exc)) from None
    finally:
        await client.close()
    return served


@identity.command("create-trust-anchor")
@_out_opt
@click.option("--cert", "cert_path", type=click.Path(dir_okay=False, path_type=Path),
              help=f"Certificate file [default: OUT/{ANCHOR_FILES[0]}].")
@click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path),
              help=f"Private key file, written 0600 [default: OUT/{ANCHOR_FILES[1]}].")
@_valid_for_opt
@_trust_domain_opt
@_cp_ns_opt
@_force_opt
def create_trust_anchor(
    out_dir: Path, cert_path: Path | None, key_path: Path | None, valid_for: timedelta,
    trust_domain: str, control_plane_ns: str, force: bool,
) -> None:
    """Create a self-signed ECDSA P-256 root CA to be the mesh's trust anchor."""
    cert, key = pki.create_trust_anchor(
        control_plane_ns=control_plane_ns, trust_domain=trust_domain, valid_for=valid_for, now=_now()
    )
    _write_pair(cert, key, cert_path or out_dir / ANCHOR_FILES[0], key_path or out_dir / ANCHOR_FILES[1], force)


@identity.command("create-issuer")
@click.option("--anchor-cert", type=click.Path(dir_okay=False, path_type=Path), default=ANCHOR_FILES[0],
              show_default=True, help="The trust anchor's certificate.")
@click.option("--anchor-key", type=click.Path(dir_okay=False, path_type=Path), default=ANCHOR_FILES[1],
              show_default=True, help="The trust anchor's private key.")
@_out_opt
@click.option("--cert", "cert_path", type=click.Path(dir_okay=False, path_type=Path),
              help=f"Certificate file [default: OUT/{ISSUER_FILES[0]}].")
@click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path),
              help=f"Private key file, written 0600 [default: OUT/{ISSUER_FILES[1]}].")
@_valid_for_opt
@_trust_domain_opt
@_cp_ns_opt
@_force_opt
def create_issuer(
    anchor_cert: Path, anchor_key: Path, out_dir: Path, cert_path: Path | None, key_path: Path | None,
    valid_for: timedelta, trust_domain: str, control_plane_ns: str, force: bool,
) -> None:
    """Create the identity issuer: an intermediate CA signed by the trust anchor (path length 0)."""
    try:
        anchor = pem.read_certificates(anchor_cert)[0]
        key = pem.read_private_key(anchor_key)
    except pem.PemError as exc:
        raise CliError(str(exc)) from None
    try:
        cert, issuer_key = pki.create_issuer(
            anchor, key, control_plane_ns=control_plane_ns, trust_domain=trust_domain, valid_for=valid_for, now=_now()
        )
    except pki.PkiError as exc:
        raise CliError(f"{anchor_cert} / {anchor_key}: {exc}") from None
    _write_pair(cert, issuer_key, cert_path or out_dir / ISSUER_FILES[0], key_path or out_dir / ISSUER_FILES[1], force)


@identity.command()
@click.argument("file")
@click.option("--trust-anchors", type=click.Path(dir_okay=False, path_type=Path),
              help="Also check the chain's top against this bundle of roots.")
def inspect(file: str, trust_anchors: Path | None) -> None:
    """Show the certificates of FILE (PEM or DER; - for stdin) and whether each chain link verifies.

    Exits 1 when a link does not verify.
    """
    try:
        if file == "-":
            certs = pem.parse_certificates(sys.stdin.buffer.read(), "stdin")
        else:
            certs = pem.read_certificates(Path(file))
        anchors = pem.read_certificates(trust_anchors) if trust_anchors else []
    except pem.PemError as exc:
        raise CliError(str(exc)) from None
    now = _now()
    for index, cert in enumerate(certs, 1):
        click.echo(f"certificate {index} of {len(certs)}")
        for label, value in _describe(cert, now):
            click.echo(f"  {label + ':':<11} {value}")
    click.echo("chain:")
    verdicts = pki.chain_verdicts(certs, anchors)
    for verdict in verdicts:
        outcome = "ok" if verdict.problem is None else f"FAILED: {verdict.problem}"
        click.echo(f"  {pki.subject_cn(verdict.cert)} <- {verdict.signer}: {outcome}")
    if not anchors and certs[-1].issuer != certs[-1].subject:
        click.echo(f"  {pki.subject_cn(certs[-1])} <- {certs[-1].issuer.rfc4514_string()}: "
                   "not checked (pass --trust-anchors)")
    if any(v.problem for v in verdicts):
        sys.exit(1)


@identity.command()
@click.option("--trust-anchors", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="PEM bundle of trust anchors (one or more roots).")
@click.option("--issuer-cert", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The issuer certificate (PEM, optionally followed by its chain); reloaded when it changes.")
@click.option("--issuer-key", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The issuer's private key; reloaded when it changes.")
@click.option("--addr", default=DEFAULT_ADDR, show_default=True, callback=_addr, help="Certify gRPC address.")
@click.option("--admin-addr", default=DEFAULT_ADMIN_ADDR, show_default=True, callback=_addr,
              help="Admin HTTP address (/metrics, /ready, /live).")
@_trust_domain_opt
@_cp_ns_opt
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the local platform keeps its token key [default: $TETHER_HOME].")
@click.option("--issuance-lifetime", type=DURATION, default=f"{int(DEFAULT_LIFETIME.total_seconds()) // 3600}h",
              show_default=True, help="Lifetime of issued leaf certificates.")
@click.option("--clock-skew-allowance", type=DURATION, default=f"{int(DEFAULT_CLOCK_SKEW.total_seconds())}s",
              show_default=True, help="How far notBefore is backdated (and notAfter extended).")
@click.option("--spiffe-uri-san/--no-spiffe-uri-san", default=False, show_default=True,
              help="Also put the SPIFFE URI in issued certificates.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@platform_options
def serve(
    trust_anchors: Path, issuer_cert: Path, issuer_key: Path, addr: str, admin_addr: str, trust_domain: str,
    control_plane_ns: str, state_dir: Path | None, issuance_lifetime: timedelta, clock_skew_allowance: timedelta,
    spiffe_uri_san: bool, log_level: str, platform: Platform,
) -> None:
    """Run the identity service: Certify over gRPC/TLS, with tokens verified by the local platform."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = IdentityConfig(
        trust_anchors=trust_anchors,
        issuer_cert=issuer_cert,
        issuer_key=issuer_key,
        addr=addr,
        admin_addr=admin_addr,
        trust_domain=trust_domain,
        control_plane_ns=control_plane_ns,
        issuance=IssuanceSettings(issuance_lifetime, clock_skew_allowance, spiffe_uri_san),
    )
    try:
        verifier = platform.token_verifier(state_dir or home.state_dir())
        asyncio.run(_serve(IdentityService(config, verifier)))
    except (ConfigError, TokenKeyError) as exc:
        raise CliError(str(exc)) from None


async def _serve(service: IdentityService) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
        # Tests and supervisors wait for this line.
        click.echo(f"identity: serving Certify on port {service.port}, admin on port {service.admin_port}")
        await stop.wait()
    finally:
        await service.stop()


def _now() -> datetime:
    return datetime.now(UTC)


def _write_pair(
    cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, cert_path: Path, key_path: Path, force: bool
) -> None:
    """Write both files, or neither when one exists already (and ``--force`` was not given)."""
    for path in (cert_path, key_path):
        if path.exists() and not force:
            raise CliError(f"{path}: already exists (pass --force to overwrite)")
    try:
        for path in (cert_path, key_path):
            path.parent.mkdir(parents=True, exist_ok=True)  # `--out DIR` makes DIR, as Linkerd's step does
        pem.write_file(cert_path, pem.certificate_pem(cert), private=False)
        pem.write_file(key_path, pem.private_key_pem(key), private=True)
    except OSError as exc:
        raise CliError(f"{exc.filename}: {exc.strerror}") from None
    except pem.PemError as exc:
        raise CliError(str(exc)) from None
    click.echo(f"wrote {cert_path} ({pki.subject_cn(cert)}, valid until {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%SZ})")
    click.echo(f"wrote {key_path} (mode 0600)")


def _describe(cert: x509.Certificate, now: datetime) -> Sequence[tuple[str, str]]:
    not_before, not_after = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < not_before:
        state = f"not valid yet ({_days(not_before - now)} to go)"
    elif now >= not_after:
        state = f"EXPIRED {_days(now - not_after)} ago"
    else:
        state = f"{_days(not_after - now)} left"
    sans = ", ".join(f"{_SAN_KINDS.get(type(n), type(n).__name__)}:{n.value}" for n in pki.sans(cert)) or "none"
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value if pki.is_ca(cert) else None
    ca = "no" if basic is None else "yes" + ("" if basic.path_length is None else f" (path length {basic.path_length})")
    return [
        ("subject", cert.subject.rfc4514_string() or "(empty)"),
        ("issuer", cert.issuer.rfc4514_string() or "(empty)"),
        ("SANs", sans),
        ("validity", f"{not_before:%Y-%m-%d %H:%M:%SZ} to {not_after:%Y-%m-%d %H:%M:%SZ}, {state}"),
        ("key", pki.describe_key(cert.public_key())),
        ("CA", ca),
        ("serial", f"{cert.serial_number:x}"),
    ]


_SAN_KINDS = {x509.DNSName: "DNS", x509.UniformResourceIdentifier: "URI", x509.IPAddress: "IP",
              x509.RFC822Name: "email"}


def _days(delta: timedelta) -> str:
    days = delta.total_seconds() / 86400
    return f"{days:.1f} days" if days >= 1 else f"{delta.total_seconds() / 3600:.1f} hours"
