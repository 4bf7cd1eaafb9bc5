"""What the proxy's resident memory is made of, import by import: ``./run bench proxy_memory [-- OPTIONS]``.

Three views, each from fresh interpreters of this environment (nothing here
starts a proxy; ``./run bench mesh`` reports the running proxies' RSS):

1. **Cumulative**, in the order the proxy imports them: one interpreter imports
   the steps of ``STEPS`` that the proxy loads (a first interpreter imports
   the proxy's modules, ``PROXY``, and says which), one after the other, and
   reads VmRSS after each (after a full collection). A module shared by two
   steps is charged to the first; the last row is what ``python -m
   tether.proxy`` holds before its first connection. A second interpreter
   does the same under ``tracemalloc``: the part of each step that is Python
   objects (module code, classes, tables); the rest is native (shared
   libraries' touched pages, C allocations).
2. **Alone**: for every step, a fresh interpreter that has imported only the
   base (``ssl``, ``asyncio``: every step needs them) imports that step alone;
   the RSS delta is what dropping the step would save at most (its own
   dependencies included, unless another step still needs them).
3. **By mapping**: at the end of view 1, ``/proc/self/smaps`` summed per
   mapped file (shared libraries: their touched pages count in RSS) and for
   the anonymous memory (the Python heap, the allocator's arenas).

Every figure is for this machine's Python and wheels; deltas below ~0.2 MB
are page-granularity noise.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MB = 1024 * 1024

BASE = ("ssl", "asyncio")
# (label, modules): the proxy's imports, in the order it makes them (main, config, app, admin at start).
STEPS: list[tuple[str, tuple[str, ...]]] = [
    ("ssl + asyncio", BASE),
    # The process entry's package: the compiled modules' finder (tether.proxy.native), and protobuf's Python
    # message implementation deferred (upb does the work) before protobuf is imported, as tether.proxy.main does.
    ("tether.proxy (compiled-module finder, protobuf deferral)", ("tether.proxy.protobuf_runtime",)),
    ("uvloop", ("uvloop",)),
    ("httptools", ("httptools",)),
    ("hpack (its Huffman decoder, for the HTTP/2 codec)", ("hpack.huffman_table",)),
    ("cryptography (x509, ec)", ("cryptography.x509", "cryptography.hazmat.primitives.asymmetric.ec",
                                 "cryptography.hazmat.primitives.serialization")),
    ("protobuf + tether.api messages", ("google.protobuf", "tether.api.destination_pb2",
                                        "tether.api.identity_pb2", "tether.api.net_pb2")),
    ("grpc (grpcio, aio)", ("grpc", "grpc.aio")),
    ("tether.api *_grpc stubs", ("tether.api.destination_pb2_grpc", "tether.api.identity_pb2_grpc")),
    ("tether.proxy.main (config, logs)", ("tether.proxy.main",)),
    ("tether.proxy.app (the data path)", ("tether.proxy.app",)),
    ("tether.proxy.io.admin", ("tether.proxy.io.admin",)),
]
PROCESS = ("tether.proxy.protobuf_runtime",)  # in the base of the "alone" runs too: every proxy process has it
PROXY = PROCESS + ("tether.proxy.main", "uvloop", "tether.proxy.app", "tether.proxy.io.admin")  # uvloop: in main()
# Whole packages that have no business in a proxy: the report says whether the proxy pulled them in.
UNWANTED = ("yaml", "kubernetes", "rich", "click", "typer", "prometheus_client", "grpc", "google.protobuf", "h2",
            "hyperframe")


def _run_child(mode: str, steps: list[tuple[str, tuple[str, ...]]], base: tuple[str, ...] = ()) -> list[dict]:
    arg = repr((mode, [(label, list(mods)) for label, mods in steps], list(base)))
    out = subprocess.run([sys.executable, str(REPO / "bench" / "_import_child.py"), arg], capture_output=True,
                         text=True, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    return [ast.literal_eval(line) for line in out.stdout.splitlines() if line.startswith("{")]


def measure(steps: list[tuple[str, tuple[str, ...]]] = STEPS) -> dict[str, Any]:
    """All three views as one dict (``render`` makes the Markdown)."""
    proxy = _run_child("rss", [("the proxy's modules", PROXY)])
    loaded = set(next(r for r in proxy if "modules" in r)["modules"])
    used = [(label, mods) for label, mods in steps if all(m in loaded for m in mods)]
    cumulative = _run_child("rss", used)
    traced = {r["step"]: r["size"] for r in _run_child("trace", used) if "size" in r}
    alone = {}
    for label, modules in steps[1:]:
        by = {r["step"]: r for r in _run_child("rss", [(label, modules)], BASE + PROCESS) if "step" in r}
        if "size" in by.get(label, {}):
            alone[label] = by[label]["size"] - by["base"]["size"]
    return {"cumulative": [r for r in cumulative if "step" in r], "traced": traced, "alone": alone,
            "final": next(r for r in cumulative if "smaps" in r),
            "proxy": {"rss": next(r["size"] for r in proxy if r.get("step") == "the proxy's modules"),
                      "packages": next(r for r in proxy if "packages" in r)["packages"]}}


def _mb(n: float) -> str:
    return f"{n / MB:.1f}"


def render(res: dict[str, Any], top: int = 12) -> str:
    out = ["| import step (in the proxy's order) | RSS after, MB | added, MB | of which Python objects, MB "
           "| alone (after ssl + asyncio), MB |", "|---|---:|---:|---:|---:|"]
    prev: tuple[int, int] | None = None
    traced = res["traced"]
    for row in res["cumulative"]:
        if "error" in row:
            out.append(f"| {row['step']} | – | – | – | not importable: {row['error']} |")
            continue
        step = row["step"]
        added = "" if prev is None else _mb(row["size"] - prev[0])
        py = "" if prev is None or step not in traced else _mb(traced[step] - prev[1])
        alone = res["alone"].get(step)
        out.append(f"| {step} | {_mb(row['size'])} | {added} | {py} | {'' if alone is None else _mb(alone)} |")
        prev = (row["size"], traced.get(step, 0))
    smaps = res["final"]["smaps"]
    total = sum(smaps.values())
    out += ["", f"RSS by mapping after every step ({_mb(total)} MB):", "",
            "| mapping | RSS, MB |", "|---|---:|"]
    for name, size in sorted(smaps.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"| `{name}` | {_mb(size)} |")
    proxy = res["proxy"]
    packages = proxy["packages"]
    present = [u for u in UNWANTED if u in packages]
    skipped = [label for label in res["alone"] if label not in {r["step"] for r in res["cumulative"]}]
    if skipped:
        out += ["", "Not loaded by the proxy (alone figures only): " + ", ".join(skipped) + "."]
    out += ["", f"`tether.proxy.main`, `.app` and `.io.admin` alone (what `python -m tether.proxy` imports before its "
            f"first connection): {_mb(proxy['rss'])} MB; of the packages a lean proxy would not hold, they load: "
            + (", ".join(f"{p} ({packages[p]} modules)" for p in present) if present else "none") + "."]
    return "\n".join(out) + "\n"


def run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="./run bench proxy_memory --", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the raw figures to this file")
    args = ap.parse_args(argv)
    res = measure()
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(render(res))


if __name__ == "__main__":
    run(sys.argv[1:])
