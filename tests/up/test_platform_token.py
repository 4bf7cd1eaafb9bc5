"""``tether platform token``: a VM's identity token from the local platform, and its errors (no traceback)."""

from __future__ import annotations

from ipaddress import IPv4Network
from pathlib import Path

import pytest
from click.testing import CliRunner

from tether.cli.main import cli
from tether.platform.local.config import LocalPlatformConfig
from tether.platform.local.tokens import LocalTokenVerifier, TokenKey
from tether.platform.tokens import IDENTITY_AUDIENCE


def _run(home: Path, *args: str):  # noqa: ANN202
    return CliRunner().invoke(cli, ["platform", "token", *args], env={"TETHER_HOME": str(home)})


def test_a_token_for_a_workload_verifies_as_its_service_account(tmp_path: Path) -> None:
    LocalPlatformConfig(state_dir=tmp_path, prefix="tx1", bridge="tx1br", pod_cidr=IPv4Network("10.9.0.0/24"),
                        service_cidr=IPv4Network("10.9.1.0/24")).save()
    result = _run(tmp_path, "-n", "billing", "--service-account", "vm", "--workload", "legacy-billing")
    assert result.exit_code == 0, result.output
    claims = LocalTokenVerifier(TokenKey.load_or_create(tmp_path)).verify(result.output.strip().encode(),
                                                                          IDENTITY_AUDIENCE)
    assert (claims.namespace, claims.service_account, claims.pod) == ("billing", "vm", "legacy-billing")


@pytest.mark.parametrize(("setup", "args", "message"), [
    (False, ["-n", "billing", "--service-account", "vm", "--workload", "w"], "no local platform; run `tether up`"),
    (True, ["-n", "Bad_NS", "--service-account", "vm", "--workload", "w"], "--namespace/--service-account"),
])
def test_errors_name_the_problem(tmp_path: Path, setup: bool, args: list[str], message: str) -> None:
    if setup:
        LocalPlatformConfig(state_dir=tmp_path, prefix="tx1", bridge="tx1br", pod_cidr=IPv4Network("10.9.0.0/24"),
                            service_cidr=IPv4Network("10.9.1.0/24")).save()
    result = _run(tmp_path, *args)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
