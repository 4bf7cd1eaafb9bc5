"""bench/proxy_tcp.py runs end to end (a tiny run; its figures belong in docs, not in assertions).

Real proxies, identity and destination on loopback: the transfer through the pair of proxies must deliver
every byte (the service's endpoints come from the EndpointSlices the bench writes).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_tiny_run_goes_through_the_proxies() -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "proxy_tcp", "--", "--megabytes", "1", "--streams", "1",
                          "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.split()[:1] == ["1"]]
    assert len(rows) == 1 and float(rows[0][2]) > 0, run.stdout
