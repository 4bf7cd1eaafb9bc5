"""The proxy behind real iptables redirection, in a network namespace of its own (root only).

The scenario (``netns_scenario.py``) runs in a child process started with
``unshare --net``, so the host's network and firewall are never touched. It is
skipped where namespaces or iptables are not available.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = Path(__file__).with_name("netns_scenario.py")
SKIP = 77


@pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "ip", "iptables", "ip6tables")),
                    reason="needs root, unshare, ip and iptables")
def test_redirected_connections_in_a_network_namespace(tmp_path: Path) -> None:
    """SO_ORIGINAL_DST (IPv4, IPv4-mapped, IPv6); outbound by redirection; inbound TLS detection on app ports:
    meshed, plaintext, opaque port, TLS passthrough, an untrusted client certificate."""
    done = subprocess.run(["unshare", "--net", "--", sys.executable, str(SCENARIO), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode == SKIP:
        pytest.skip(f"network namespace unavailable: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok")
