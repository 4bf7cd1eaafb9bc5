"""Linkerd CLI parity found by trying Linkerd's docs as a new user: `identity create-* --out DIR` makes DIR."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tether.cli.main import cli


def test_create_commands_make_the_out_directory(tmp_path: Path) -> None:
    runner = CliRunner()
    anchors = tmp_path / "new" / "anchors"
    done = runner.invoke(cli, ["identity", "create-trust-anchor", "--out", str(anchors)])
    assert done.exit_code == 0, done.output
    issuer = tmp_path / "other" / "issuer"
    done = runner.invoke(cli, ["identity", "create-issuer", "--anchor-cert", str(anchors / "ca.crt"),
                               "--anchor-key", str(anchors / "ca.key"), "--out", str(issuer)])
    assert done.exit_code == 0, done.output
    assert (issuer / "issuer.crt").exists() and (issuer / "issuer.key").stat().st_mode & 0o777 == 0o600


def test_an_out_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    done = CliRunner().invoke(cli, ["identity", "create-trust-anchor", "--out", str(tmp_path / "file" / "x")])
    assert done.exit_code == 1 and "Not a directory" in done.output and "Traceback" not in done.output


def test_version_flags_without_a_platform(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))
    runner = CliRunner()
    assert runner.invoke(cli, ["version"]).output == "Client version: 0.1.0\nServer version: unavailable\n"
    assert runner.invoke(cli, ["version", "--short", "--client"]).output == "0.1.0\n"
    assert runner.invoke(cli, ["version", "--proxy"]).output.endswith("Proxy versions:\n\tunavailable\n")
