"""How long one ``tether diagnose`` takes on a small running local platform: ``./run bench diagnose [-- --runs N]``.

Starts a local platform (the fixtures' naming and clean-up of ``tests/up/uplab``,
so nothing it makes outlives it), deploys a meshed HTTP server, a client and a
server whose default inbound policy is ``deny``, then times ``tether diagnose
deploy/client --to ...`` for the healthy call (``ok``) and for the denied one
(``layer: policy``), each run a fresh ``tether`` process as a user would start
it.  Reports wall time and the process's CPU time (user + system), and beside
them the CPU time of only importing ``tether.cli.diagnose`` plus the clients it
loads on the way (the destination's and the policy controller's), measured the
same way, so the share spent importing is a ratio of two figures taken side by
side.  The machine is shared, so the load average is printed with the figures.

Byte-compiled modules are allowed (``PYTHONDONTWRITEBYTECODE`` is dropped and
one unmeasured run warms the cache): an installed ``tether`` has them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from up import uplab  # noqa: E402  (the tests' platform helpers: naming, teardown, leftovers)

NS = "bd"
IMPORTS = "import tether.cli.diagnose, tether.destination.client, tether.policy.client"


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    cpu, start = _child_cpu(), time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    return time.monotonic() - start, _child_cpu() - cpu, proc


def _platform(home: Path) -> uplab.Platform:
    pid = os.getpid()
    env = {**os.environ, "TETHER_HOME": str(home), "NO_COLOR": "1"}
    # The tests' scheme (tu<pid><tag>, /27s from the pid); tag z and block 224 keep clear of a test run's first ones.
    return uplab.Platform(home, f"tu{pid:x}z", f"10.197.{pid % 256}.224/27", f"10.195.{pid % 256}.224/27", env)


def _deploy(platform: uplab.Platform) -> None:
    platform.tether("up", *platform.up_args)
    for manifest in (
        f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n",
        uplab.web_server("web", NS, 1),
        uplab.web_server("locked", NS, 1, annotations="config.linkerd.io/default-inbound-policy: deny"),
        uplab.client("client", NS, f"http://web.{NS}.svc.cluster.local/"),
    ):
        platform.apply(manifest)

    def all_ready() -> bool:
        pods = platform.pods(NS)
        return len(pods) == 3 and all(uplab.ready(p) for p in pods)

    uplab.wait_for("the benchmark's workloads ready", all_ready, timeout=180)


def _row(label: str, walls: list[float], cpus: list[float]) -> str:
    return (f"{label:34s} wall median {statistics.median(walls):5.2f} s (max {max(walls):5.2f})   "
            f"cpu median {statistics.median(cpus):5.2f} s (max {max(cpus):5.2f})")


def run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="./run bench diagnose --", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="measured runs of each case (default 5)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench diagnose needs root (network namespaces)")
    uplab.remove_dead_runs()
    before = uplab.Snapshot.take()
    with tempfile.TemporaryDirectory(prefix="bench-diagnose-") as tmp:
        platform = _platform(Path(tmp) / "home")
        try:
            _deploy(platform)
            env = {k: v for k, v in platform.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
            cases = [("healthy (ok)", f"web.{NS}:80", None), ("denied (layer policy)", f"locked.{NS}:80", "policy")]
            print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
            rows = []
            for label, to, layer in cases:
                argv_ = [uplab.TETHER, "diagnose", "deploy/client", "-n", NS, "--to", to, "-o", "json"]
                _timed(argv_, env)  # warms the byte-code cache; not counted
                walls, cpus = [], []
                for _ in range(args.runs):
                    wall, cpu, proc = _timed(argv_, env)
                    doc = json.loads(proc.stdout)
                    if doc["layer"] != layer:
                        sys.exit(f"{label}: expected layer {layer}, got {doc['layer']}: {doc['reason']}")
                    walls.append(wall)
                    cpus.append(cpu)
                rows.append(_row(f"diagnose --to {to} {label}", walls, cpus))
            walls, cpus = [], []
            for _ in range(args.runs):
                wall, cpu, _proc = _timed([sys.executable, "-c", IMPORTS], env)
                walls.append(wall)
                cpus.append(cpu)
            rows.append(_row("importing the modules only", walls, cpus))
            print("\n".join(rows))
            print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        finally:
            platform.teardown()
            problems = before.leftovers(platform.prefix)
            if problems:
                print("left behind:\n" + "\n".join(problems), file=sys.stderr)
