"""``tether stat``: golden metrics per workload, read from the proxies' own ``/metrics`` (``linkerd viz stat``).

    tether stat deploy -n emojivoto          # one table, rates over a 2 s window
    tether stat deploy/web po -A -o wide     # ... several kinds, every namespace, byte rates and clients
    tether stat deploy -n emojivoto -w       # live, redrawn in place every second over a 10 s window
    tether stat ns -o json

RESOURCE is ``deploy``/``po``/``ns`` (any of their names), optionally with
``/NAME``, or a kind followed by names.  The workloads come from the store of
``$TETHER_HOME``; each meshed, running pod's proxy is scraped at
``<pod IP>:4191/metrics`` (``tether.viz``).  Registered on the root group by
``tether.cli.main``.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import click
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tether.cli.errors import CliError
from tether.cli.home import store_path
from tether.resources.errors import UnknownKind
from tether.resources.kinds import lookup
from tether.store import Store
from tether.store.errors import StoreError
from tether.viz import render
from tether.viz.stat import StatCollector, StatRow
from tether.viz.workloads import DEPLOYMENT, NAMESPACE, POD, Workload, select

DEFAULT_NAMESPACE = "default"
_KIND_OF = {"Deployment": DEPLOYMENT, "Pod": POD, "Namespace": NAMESPACE}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")


def _duration(text: str) -> float:
    match = _DURATION.match(text.strip())
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration such as 500ms, 10s or 1m")
    value = float(match.group(1))
    return {"ms": value / 1000, "m": value * 60}.get(match.group(2) or "s", value)


def _targets(resources: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """``deploy web emoji`` -> [(deployment, [web, emoji])]; ``deploy/web po`` -> [(deployment, [web]), (pod, [])]."""
    out: list[tuple[str, list[str]]] = []
    bare_kind_seen = False
    args = [part for arg in resources for part in (arg.split(",") if "/" not in arg else [arg]) if part]
    for i, arg in enumerate(args):
        kind_text, slash, name = arg.partition("/")
        try:
            rtype = lookup(kind_text)
        except UnknownKind:
            if i > 0 and not slash and bare_kind_seen and out:
                out[-1][1].append(arg)  # a name after a bare kind
                continue
            raise click.BadParameter(f"unknown resource type {kind_text!r}", param_hint="RESOURCE") from None
        kind = _KIND_OF.get(rtype.kind)
        if kind is None:
            raise click.BadParameter(f"stat shows deployments, pods and namespaces, not {rtype.plural}",
                                     param_hint="RESOURCE")
        if slash and not name:
            raise click.BadParameter(f"{arg!r} names no object", param_hint="RESOURCE")
        existing = next((t for t in out if t[0] == kind), None)
        if existing is None:
            existing = (kind, [])
            out.append(existing)
        if slash:
            existing[1].append(name)
        bare_kind_seen = not slash
    return out


class _Source:
    """Reads the workloads from the store on every poll (pods come and go)."""

    def __init__(self, store: Store, targets: list[tuple[str, list[str]]], namespace: str | None) -> None:
        self.store = store
        self.targets = targets
        self.namespace = namespace

    def __call__(self) -> list[Workload]:
        ns = self.namespace
        pods = self.store.list("Pod", ns).items
        out: list[Workload] = []
        for kind, names in self.targets:
            if kind == DEPLOYMENT:
                out += select(kind, pods, deployments=self.store.list("Deployment.apps", ns).items, names=names)
            elif kind == NAMESPACE:
                all_pods = pods if ns is None else self.store.list("Pod").items
                out += select(kind, all_pods, namespaces=self.store.list("Namespace").items, names=names)
            else:
                out += select(kind, pods, names=names)
        return out


def _styled(cell: str, column: str) -> Text:
    if cell == render.DASH:
        return Text(cell, style="dim")
    if column in ("SUCCESS", "MTLS") and cell.endswith("%"):
        value = float(cell[:-1])
        good, fair = (100.0, 100.0) if column == "MTLS" else (95.0, 80.0)
        return Text(cell, style="green" if value >= good else ("yellow" if value >= fair else "red"))
    if column == "MESHED":
        meshed, _, total = cell.partition("/")
        return Text(cell, style="green" if meshed == total and total != "0" else "yellow")
    return Text(cell)


def _rich_table(kind: str, grid: list[list[str]], titled: bool) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=kind if titled else None, title_justify="left")
    header = grid[0]
    for col in header:
        table.add_column(col, no_wrap=col != "CLIENTS",
                         justify="left" if col in ("NAMESPACE", "NAME", "CLIENTS") else "right")
    for row in grid[1:]:
        table.add_row(*(_styled(c, h) for c, h in zip(row, header, strict=True)))
    return table


def _errors(rows: list[StatRow]) -> list[str]:
    return [f"{r.workload.namespace}/{r.workload.name}: cannot read metrics of {e}" for r in rows for e in r.errors]


@click.command()
@click.argument("resources", nargs=-1, required=True, metavar="RESOURCE [NAME...]")
@click.option("-n", "--namespace", help="The namespace (default: default).")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace.")
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json"]), default="table", show_default=True,
              help="wide adds byte rates and the clients of each workload's open connections.")
@click.option("-w", "--watch", is_flag=True, help="Keep the table live, redrawn in place, until Ctrl-C.")
@click.option("-t", "--time-window", "window", help="Window of the rates [default: 2s, or 10s with --watch].")
@click.option("--interval", default="1s", show_default=True, help="Time between refreshes with --watch.")
@click.option("--admin-port", type=int, default=4191, show_default=True, help="The proxies' admin port.")
def stat(resources: tuple[str, ...], namespace: str | None, all_namespaces: bool, output: str, watch: bool,
         window: str | None, interval: str, admin_port: int) -> None:
    """Success rate, requests per second, latency, connections and mTLS of each workload's proxies.

    Numbers are the proxies' inbound traffic (what the workload served), over
    the window; "-" means no traffic, or a proxy without request metrics.
    """
    targets = _targets(resources)
    window_s = _duration(window) if window else (10.0 if watch else 2.0)
    interval_s = _duration(interval)
    if window_s <= 0 or interval_s <= 0:
        raise click.BadParameter("must be positive", param_hint="--time-window / --interval")
    ns = None if all_namespaces else (namespace or DEFAULT_NAMESPACE)
    path = store_path()
    if not path.exists():
        raise CliError(f"{path.parent}: no store here; start the platform with `tether up` (or set TETHER_HOME)")
    try:
        store = Store(path)
    except StoreError as err:
        raise CliError(str(err)) from None
    try:
        collector = StatCollector(_Source(store, targets, ns), window_s, port=admin_port)
        if watch:
            _watch(collector, output, all_namespaces, ns, window_s, interval_s)
        else:
            _once(collector, output, all_namespaces, ns, window_s)
    except StoreError as err:
        raise CliError(str(err)) from None
    finally:
        store.close()


def _once(collector: StatCollector, output: str, all_namespaces: bool, ns: str | None, window: float) -> None:
    rows = collector.poll()
    if any(p.scrapable for r in rows for p in r.workload.pods):
        time.sleep(window)
        rows = collector.poll()
    for line in _errors(rows):
        click.echo(f"warning: {line}", err=True)
    if output == "json":
        click.echo(json.dumps([render.as_json(r) for r in rows], indent=2))
        return
    if not rows:
        click.echo(f"No resources found in {ns} namespace." if ns else "No resources found.", err=True)
        return
    click.echo(render.plain_tables(rows, all_namespaces=all_namespaces, wide=output == "wide"))


def _watch(collector: StatCollector, output: str, all_namespaces: bool, ns: str | None, window: float,
           interval: float) -> None:
    console = Console()
    where = f"namespace {ns}" if ns else "all namespaces"
    wide = output == "wide"

    def caption() -> str:
        stamp = datetime.now().strftime("%H:%M:%S")
        return f"{stamp}  {where}  rates over the last {window:g}s (inbound, from each pod's proxy)"

    try:
        # A first scrape as the baseline, so that the first frame already has rates.
        collector.poll()
        time.sleep(min(1.0, interval))
        if output == "json" or not console.is_terminal:
            # Not a terminal (a log, a pipe): print each refresh after the last, as kubectl get -w does.
            while True:
                rows = collector.poll()
                for line in _errors(rows):
                    click.echo(f"warning: {line}", err=True)
                if output == "json":
                    click.echo(json.dumps([render.as_json(r) for r in rows]))
                else:
                    text = render.plain_tables(rows, all_namespaces=all_namespaces, wide=wide) if rows else (
                        "No resources found.")
                    click.echo(f"\n{caption()}\n{text}")
                time.sleep(interval)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                rows = collector.poll()
                grids = render.tables(rows, all_namespaces=all_namespaces, wide=wide)
                parts: list[Text | Table] = [Text(caption() + "   (Ctrl-C to stop)", style="bold")]
                parts += [_rich_table(kind, grid, len(grids) > 1) for kind, grid in grids]
                if not rows:
                    parts.append(Text("No resources found.", style="dim"))
                problems = _errors(rows)
                if problems:
                    parts.append(Text("\n".join(problems), style="yellow"))
                live.update(Group(*parts), refresh=True)
                time.sleep(interval)
    except (KeyboardInterrupt, BrokenPipeError):
        return
