"""Small readers of ``tether`` JSON output for ``dev/demo.sh`` (stdin in, one line out).

    tether get pods -n emojivoto -o json | python demo/checks.py pods
        -> "3 4 emoji ✓  vote-bot Pending  voting ✓  web ✓"   (ready, total, summary)

    tether get pods -n emojivoto -o json | python demo/checks.py web-url
        -> "http://10.215.0.4:8080/"   (the web page, from the host; empty when web is not ready)

    python demo/checks.py traffic <(tether viz stat deploy -n emojivoto -o json) \
                                  <(tether viz edges deploy -n emojivoto -o json)
        -> exit 0 when every workload is meshed and web, emoji and voting
           each hold mTLS connections from their expected client (both
           read from Prometheus); else exit 1 naming what is missing
"""

from __future__ import annotations

import json
import sys
from typing import Any

# (server, client): who must be seen talking to whom, over mTLS.
EDGES = (("web", "vote-bot"), ("emoji", "web"), ("voting", "web"))
WORKLOADS = ("emoji", "voting", "web", "vote-bot")


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _app(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str((meta.get("labels") or {}).get("linkerd.io/proxy-deployment") or meta.get("name", "?"))


def pods(doc: dict[str, Any]) -> str:
    items = sorted(doc.get("items") or [], key=_app)
    parts = [f"{_app(p)} {'✓' if _ready(p) else (p.get('status') or {}).get('phase') or 'Pending'}"
             for p in items]
    return f"{sum(map(_ready, items))} {len(items)} {'  '.join(parts) or '(no pods yet)'}"


def web_url(doc: dict[str, Any]) -> str:
    for pod in doc.get("items") or ():
        if _app(pod) == "web" and _ready(pod) and (pod.get("status") or {}).get("podIP"):
            return f"http://{pod['status']['podIP']}:8080/"
    return ""


def traffic(rows: list[dict[str, Any]], edges: list[dict[str, Any]]) -> list[str]:
    """What is missing: a workload not fully meshed, or an expected client -> server edge not over mTLS."""
    by_name = {r["name"]: r for r in rows}
    problems = []
    for name in WORKLOADS:
        row = by_name.get(name)
        if row is None:
            problems.append(f"{name}: no such deployment")
            continue
        meshed, _, total = str(row.get("meshed") or "0/0").partition("/")
        if meshed != total or total == "0":
            problems.append(f"{name}: meshed {row.get('meshed')}")
    seen = {(e["src"], e["dst"]): e for e in edges}
    for server, client in EDGES:
        edge = seen.get((client, server))
        if edge is None:
            problems.append(f"{server}: no connection from {client} seen (edges: {sorted(seen) or 'none'})")
        elif not edge.get("secured"):
            problems.append(f"{client} -> {server}: not mTLS ({edge.get('no_tls_reason')})")
    return problems


def main(argv: list[str]) -> int:
    what = argv[1] if len(argv) > 1 else ""
    if what == "traffic":
        try:
            docs = [json.loads(open(path).read()) for path in argv[2:4]]  # noqa: SIM115 - two small files
        except (OSError, ValueError) as err:
            print(f"demo: cannot read viz's answers: {err}", file=sys.stderr)
            return 1
        if len(docs) != 2:
            print(__doc__, file=sys.stderr)
            return 2
        problems = traffic(*docs)
        if problems:
            print("demo: " + "; ".join(problems), file=sys.stderr)
            return 1
        print("ok: " + ", ".join(f"{c} -> {s}" for s, c in EDGES) + ": every connection mTLS")
        return 0
    try:
        doc = json.load(sys.stdin)
    except ValueError:
        doc = {} if what == "pods" else []
    if what == "pods":
        print(pods(doc))
        return 0
    if what == "web-url":
        print(web_url(doc))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
