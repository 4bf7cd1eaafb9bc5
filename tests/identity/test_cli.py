"""``tether identity``: PKI files that openssl accepts, inspect's verdicts, serve as a process, clear errors."""

from __future__ import annotations

import signal
import stat
import subprocess
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from cryptography import x509
from identity_helpers import WEB, csr_for
from executables import TETHER

from tether.cli.identity import identity
from tether.identity import pem
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer


def run(*args: str, input: bytes | None = None) -> Result:
    result = CliRunner().invoke(identity, list(args), input=input)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def make_pki(directory: Path, trust_domain: str = "cluster.local") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    assert run("create-trust-anchor", "--out", str(directory), "--trust-domain", trust_domain).exit_code == 0
    result = run(
        "create-issuer", "--anchor-cert", str(directory / "ca.crt"), "--anchor-key", str(directory / "ca.key"),
        "--out", str(directory), "--trust-domain", trust_domain,
    )
    assert result.exit_code == 0, result.output
    return directory


def openssl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30)


def test_created_pki_is_accepted_by_openssl(tmp_path: Path) -> None:
    pki_dir = make_pki(tmp_path)
    anchor = openssl("x509", "-in", str(pki_dir / "ca.crt"), "-noout", "-subject", "-ext", "basicConstraints,keyUsage")
    assert anchor.returncode == 0, anchor.stderr
    assert "CN=root.linkerd.cluster.local" in anchor.stdout.replace(" ", "")
    assert "CA:TRUE" in anchor.stdout and "Certificate Sign" in anchor.stdout
    issuer = openssl("x509", "-in", str(pki_dir / "issuer.crt"), "-noout", "-subject", "-ext", "basicConstraints")
    assert "CN=identity.linkerd.cluster.local" in issuer.stdout.replace(" ", "")
    assert "CA:TRUE, pathlen:0" in issuer.stdout
    verified = openssl("verify", "-CAfile", str(pki_dir / "ca.crt"), str(pki_dir / "issuer.crt"))
    assert verified.returncode == 0 and ": OK" in verified.stdout
    for key in ("ca.key", "issuer.key"):
        assert openssl("pkey", "-in", str(pki_dir / key), "-noout").returncode == 0
        assert stat.S_IMODE((pki_dir / key).stat().st_mode) == 0o600
    for cert in ("ca.crt", "issuer.crt"):
        assert stat.S_IMODE((pki_dir / cert).stat().st_mode) == 0o644
    key_text = openssl("pkey", "-in", str(pki_dir / "issuer.key"), "-noout", "-text").stdout
    assert "prime256v1" in key_text or "P-256" in key_text


def test_names_follow_the_flags(tmp_path: Path) -> None:
    pki_dir = tmp_path / "pki"
    pki_dir.mkdir()
    run("create-trust-anchor", "--out", str(pki_dir), "--trust-domain", "example.org", "--control-plane-ns", "mesh")
    run("create-issuer", "--anchor-cert", str(pki_dir / "ca.crt"), "--anchor-key", str(pki_dir / "ca.key"),
        "--out", str(pki_dir), "--trust-domain", "example.org", "--control-plane-ns", "mesh")
    issuer = pem.read_certificates(pki_dir / "issuer.crt")[0]
    assert issuer.subject.rfc4514_string() == "CN=identity.mesh.example.org"


@pytest.mark.parametrize(("flag", "days"), [("8760h", 365), ("30d", 30), ("720h0m0s", 30)])
def test_valid_for_sets_the_lifetime(tmp_path: Path, flag: str, days: int) -> None:
    cert_path, key_path = tmp_path / "root.pem", tmp_path / "root-key.pem"
    result = run("create-trust-anchor", "--cert", str(cert_path), "--key", str(key_path), "--valid-for", flag)
    assert result.exit_code == 0, result.output
    cert = pem.read_certificates(cert_path)[0]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == timedelta(days=days)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


def test_issuer_never_outlives_its_anchor(tmp_path: Path) -> None:
    run("create-trust-anchor", "--out", str(tmp_path), "--valid-for", "10d")
    run("create-issuer", "--anchor-cert", str(tmp_path / "ca.crt"), "--anchor-key", str(tmp_path / "ca.key"),
        "--out", str(tmp_path), "--valid-for", "365d")
    anchor, issuer = (pem.read_certificates(tmp_path / f)[0] for f in ("ca.crt", "issuer.crt"))
    assert issuer.not_valid_after_utc == anchor.not_valid_after_utc


def test_existing_files_are_kept_unless_forced(tmp_path: Path) -> None:
    run("create-trust-anchor", "--out", str(tmp_path))
    before = (tmp_path / "ca.key").read_bytes()
    refused = run("create-trust-anchor", "--out", str(tmp_path))
    assert refused.exit_code == 1
    assert f"{tmp_path / 'ca.crt'}: already exists" in refused.output
    assert (tmp_path / "ca.key").read_bytes() == before
    assert run("create-trust-anchor", "--out", str(tmp_path), "--force").exit_code == 0
    assert (tmp_path / "ca.key").read_bytes() != before
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["create-issuer", "--anchor-cert", "{tmp}/missing.crt", "--anchor-key", "{tmp}/missing.key", "--out", "{tmp}"],
         1, "{tmp}/missing.crt: no such file"),
        (["create-trust-anchor", "--out", "{tmp}/junk.pem/dir"], 1, "{tmp}/junk.pem/dir: Not a directory"),
        (["create-trust-anchor", "--out", "{tmp}/junk.pem"], 2, "is a file"),
        (["create-trust-anchor", "--out", "{tmp}", "--valid-for", "1 year"], 2, "--valid-for"),
        (["create-trust-anchor", "--out", "{tmp}", "--valid-for", "0h"], 2, "--valid-for"),
        (["create-trust-anchor", "--out", "{tmp}", "--trust-domain", "Not_A_Domain"], 2, "--trust-domain"),
        (["create-trust-anchor", "--out", "{tmp}", "--control-plane-ns", "a.b"], 2, "--control-plane-ns"),
        (["inspect", "{tmp}/missing.pem"], 1, "{tmp}/missing.pem: no such file"),
        (["inspect", "{tmp}/junk.pem"], 1, "{tmp}/junk.pem: no readable X.509 certificate"),
        (["serve", "--trust-anchors", "{tmp}/missing.crt", "--issuer-cert", "x", "--issuer-key", "y",
          "--state-dir", "{tmp}/state"], 1, "trust anchors: {tmp}/missing.crt: no such file"),
        (["serve", "--trust-anchors", "x", "--issuer-cert", "x", "--issuer-key", "y", "--addr", "8080"], 2, "--addr"),
        (["serve"], 2, "--trust-anchors"),
    ],
)
def test_bad_input_names_the_file_or_flag(tmp_path: Path, args: list[str], code: int, words: str) -> None:
    (tmp_path / "junk.pem").write_text("hello")
    result = run(*(a.format(tmp=tmp_path) for a in args))
    assert result.exit_code == code, result.output
    assert words.format(tmp=tmp_path) in result.output


def test_inspect_shows_the_certificate_and_chain_verdicts(tmp_path: Path) -> None:
    pki_dir = make_pki(tmp_path)
    chain = tmp_path / "chain.pem"
    chain.write_bytes(_leaf_chain_pem(pki_dir))
    result = run("inspect", str(chain), "--trust-anchors", str(pki_dir / "ca.crt"))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "certificate 1 of 2" in out and "certificate 2 of 2" in out
    assert f"DNS:{WEB.dns_name}" in out
    assert "ECDSA P-256" in out
    assert "left" in out and "CA:         yes (path length 0)" in out
    assert f"{WEB.dns_name} <- identity.linkerd.cluster.local: ok" in out
    assert "identity.linkerd.cluster.local <- trust anchors: ok" in out


def test_inspect_reports_a_broken_chain_and_exits_1(tmp_path: Path) -> None:
    ours, theirs = make_pki(tmp_path / "ours"), make_pki(tmp_path / "theirs")
    result = run("inspect", str(theirs / "issuer.crt"), "--trust-anchors", str(ours / "ca.crt"))
    assert result.exit_code == 1
    assert "identity.linkerd.cluster.local <- trust anchors: FAILED: not signed by any of the trust anchors" in result.output
    mixed = tmp_path / "mixed.pem"
    mixed.write_bytes(_leaf_chain_pem(ours).split(b"-----END CERTIFICATE-----\n")[0] + b"-----END CERTIFICATE-----\n"
                      + (theirs / "issuer.crt").read_bytes())
    result = run("inspect", str(mixed))
    assert result.exit_code == 1
    assert "FAILED: signature does not verify" in result.output


def test_inspect_reads_stdin(tmp_path: Path) -> None:
    pki_dir = make_pki(tmp_path)
    result = run("inspect", "-", input=(pki_dir / "issuer.crt").read_bytes() + (pki_dir / "ca.crt").read_bytes())
    assert result.exit_code == 0, result.output
    assert "identity.linkerd.cluster.local <- root.linkerd.cluster.local: ok" in result.output
    assert "root.linkerd.cluster.local <- itself: ok" in result.output


def test_two_anchors_in_a_bundle_both_verify(tmp_path: Path) -> None:
    first, second = make_pki(tmp_path / "first"), make_pki(tmp_path / "second")
    bundle = tmp_path / "bundle.crt"
    bundle.write_bytes((first / "ca.crt").read_bytes() + (second / "ca.crt").read_bytes())
    for pki_dir in (first, second):
        result = run("inspect", str(pki_dir / "issuer.crt"), "--trust-anchors", str(bundle))
        assert result.exit_code == 0 and "trust anchors: ok" in result.output
        verified = openssl("verify", "-CAfile", str(bundle), str(pki_dir / "issuer.crt"))
        assert verified.returncode == 0, verified.stderr


def test_serve_runs_until_terminated(tmp_path: Path) -> None:
    pki_dir = make_pki(tmp_path / "pki")
    proc = subprocess.Popen(
        [TETHER, "identity", "serve", "--trust-anchors", str(pki_dir / "ca.crt"),
         "--issuer-cert", str(pki_dir / "issuer.crt"), "--issuer-key", str(pki_dir / "issuer.key"),
         "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the service says it is serving
        assert line.startswith("identity: serving Certify on port"), line + proc.stderr.read()  # type: ignore[union-attr]
        admin_port = int(line.rsplit(" ", 1)[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=10) as ready:
            assert ready.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=10) as page:
            assert b"identity_issuer_expiry_timestamp_seconds" in page.read()
        assert stat.S_IMODE((tmp_path / "state" / "identity-token.key").stat().st_mode) == 0o600
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "issuer 'identity.linkerd.cluster.local' loaded" in stderr


def _leaf_chain_pem(pki_dir: Path) -> bytes:
    """A leaf for WEB issued by the directory's issuer, followed by that issuer (PEM)."""
    issuer_cert = pem.read_certificates(pki_dir / "issuer.crt")[0]
    anchor = pem.read_certificates(pki_dir / "ca.crt")[0]
    authority = CertificateAuthority(Issuer.validated([issuer_cert], pem.read_private_key(pki_dir / "issuer.key"), [anchor]), IssuanceSettings())
    csr = x509.load_der_x509_csr(csr_for(WEB.dns_name))
    leaf = authority.issue(csr.public_key(), WEB, issuer_cert.not_valid_before_utc + timedelta(minutes=1))
    return pem.certificate_pem(leaf, issuer_cert)
