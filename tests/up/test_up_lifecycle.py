"""``tether up``, ``status``, ``down`` and ``down --purge`` with a state directory and names of the test's own."""

from __future__ import annotations

import re
import shutil

from up import uplab


def _rows(status_out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in status_out.splitlines()
            if line.split() and line.split()[0] in ("identity", "destination", "policy", "platform")}


def test_up_status_down_and_purge(new_platform) -> None:
    p = new_platform()
    out = p.tether("up", *p.up_args).stdout
    assert "created trust anchor" in out and "created issuer" in out
    for name in ("identity", "destination", "policy", "platform"):
        assert re.search(rf"^{name}\s+ready\s", out, re.M), out
    gateway = p.pod_cidr.split("/")[0].rsplit(".", 1)
    gateway = f"{gateway[0]}.{int(gateway[1]) + 1}"

    status = p.tether("status").stdout
    rows = _rows(status)
    assert set(rows) == {"identity", "destination", "policy", "platform"}, status
    for name, port in (("identity", 8080), ("destination", 8086), ("policy", 8090), ("platform", 9994)):
        assert rows[name][1:4] == ["running", "yes", "0"], status
        assert rows[name][5] == "0.1.0" or rows[name][5][0].isdigit()
        assert rows[name][6] == f"{gateway}:{port}", status
    pids = {name: rows[name][4] for name in rows}

    # Idempotent: nothing is created or started twice.
    again = p.tether("up").stdout
    assert "created" not in again
    assert again.count("already running") == 4, again
    assert {name: row[4] for name, row in _rows(p.tether("status").stdout).items()} == pids

    # Other settings are refused while the platform runs.
    refused = p.tether("up", "--service-cidr", "10.195.255.0/27", ok=False)
    assert "tether down" in refused.stderr

    # down stops everything and keeps the state.
    down = p.tether("down").stdout
    assert all(f"{name}" in down for name in ("identity", "destination", "policy", "platform"))
    stopped = p.tether("status", ok=False).stdout
    assert all(row[1] == "stopped" for row in _rows(stopped).values()), stopped
    for name in ("ca.crt", "ca.key", "issuer.crt", "issuer.key", "destination.crt", "destination.key"):
        assert (p.home / "pki" / name).exists()
    assert (p.home / "store.db").exists()

    # Up again from the kept state: the same PKI, everything ready.
    anchor = (p.home / "pki" / "ca.crt").read_bytes()
    out = p.tether("up").stdout
    assert "created" not in out and out.count(" ready ") == 4, out
    assert (p.home / "pki" / "ca.crt").read_bytes() == anchor

    p.tether("down", "--purge")
    assert not {n for n in uplab.netns_names() | uplab.link_names() if n.startswith(p.prefix)}
    assert not list(p.home.glob("run/*.json"))


def test_up_says_which_component_failed_and_where_its_log_is(new_platform) -> None:
    p = new_platform()
    p.tether("up", *p.up_args)
    p.tether("down")
    issuer = p.home / "pki" / "issuer.crt"
    saved = issuer.read_bytes()
    issuer.write_text("not a certificate\n")

    failed = p.tether("up", "--timeout", "10", ok=False)
    assert re.search(r"^identity\s+FAILED\s", failed.stderr, re.M), failed.stderr
    assert str(p.home / "logs" / "identity.log") in failed.stderr
    assert "identity did not become ready" in failed.stderr
    assert re.search(r"^destination\s+ready\s", failed.stdout, re.M), failed.stdout

    # Fixing the issuer is enough: identity reloads it; `up` again finds everything running and ready.
    shutil.copyfile(issuer, issuer.with_suffix(".broken"))
    issuer.write_bytes(saved)
    again = p.tether("up", "--timeout", "30").stdout
    assert again.count("already running") == 4 and again.count(" ready ") == 4, again
