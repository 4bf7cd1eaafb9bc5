"""Helpers for the local platform's end-to-end tests: a platform per test run, host snapshots, waiting.

Every name a run makes starts with ``tu<pid in hex><tag>`` (namespaces ``tu1a2bp-<pod>.<ns>``,
veths ``tu1a2bp<hash>``, bridge ``tu1a2bpbr``), and its pod and service ranges are /27s picked
from the pid and the tag, so runs in parallel (and a developer's own ``tether up``) never meet;
``remove_dead_runs`` tears down what runs that are gone left behind. ``Platform.teardown`` reports
what ``tether down --purge`` left (processes, namespaces, links, files) and ``Snapshot.leftovers``
what is still on the host after the fallback (namespaces, links, the host's nat table).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from executables import TETHER

from tether.platform.local.launcher import processes_matching
from tether.platform.local.netns import HostNet, NetnsConfig
from tether.store import Store

PYTHON = sys.executable
TAGS = "pqrstvwxyz"
_RUN_NAME = re.compile(r"^tu([0-9a-f]+)([p-z])(?:-|br$|[0-9a-f])")
# The network validator's tests (tests/injector) name their namespaces tv<pid>-...
_VALIDATOR_RUN_NAME = re.compile(r"^tv([0-9a-f]+)-")


def _stdout(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def netns_names() -> set[str]:
    return {n["name"] for n in json.loads(_stdout(["ip", "-j", "netns", "list"]) or "[]")}


def link_names() -> set[str]:
    return {link["ifname"] for link in json.loads(_stdout(["ip", "-j", "link", "show"]) or "[]")}


def host_nat() -> list[str]:
    """``iptables -t nat -S`` of the host (IPv4 and IPv6)."""
    return _stdout(["iptables", "-t", "nat", "-S"]).splitlines() + _stdout(["ip6tables", "-t", "nat", "-S"]).splitlines()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def live_run_prefixes() -> set[str]:
    """Prefixes (``tu<pid>``, ``tv<pid>``) of test runs whose process is alive, ours included."""
    out = set()
    for name in netns_names() | link_names():
        for pattern, mark in ((_RUN_NAME, "tu"), (_VALIDATOR_RUN_NAME, "tv")):
            match = pattern.match(name)
            if match and _alive(int(match.group(1), 16)):
                out.add(f"{mark}{match.group(1)}")
    return out


def remove_dead_runs() -> None:
    seen: set[tuple[str, str]] = set()
    for name in netns_names() | link_names():
        match = _RUN_NAME.match(name)
        if match and not _alive(int(match.group(1), 16)):
            seen.add((match.group(1), match.group(2)))
    for pid_hex, tag in seen:
        prefix = f"tu{pid_hex}{tag}"
        HostNet(NetnsConfig(prefix=prefix, bridge=prefix + "br")).teardown_all()


@dataclass
class Snapshot:
    netns: set[str]
    links: set[str]
    nat: list[str]

    @classmethod
    def take(cls) -> Snapshot:
        return cls(netns_names(), link_names(), host_nat())

    def leftovers(self, prefix: str) -> list[str]:
        """What is there now that was not before: ours (by prefix), or anything else not another live run's."""
        now = Snapshot.take()
        others = tuple(p for p in live_run_prefixes() if not prefix.startswith(p)) + ("tp",)
        new = (now.netns - self.netns) | (now.links - self.links)
        problems = [f"left behind: {n}" for n in sorted(new) if n.startswith(prefix) or not n.startswith(others)]
        if now.nat != self.nat:
            problems.append(f"host nat table changed: {sorted(set(now.nat) ^ set(self.nat))}")
        return problems


@dataclass
class Platform:
    """One local platform of this test run: its state directory, names and ranges."""

    home: Path
    prefix: str
    pod_cidr: str
    service_cidr: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return self.prefix + "br"

    @property
    def up_args(self) -> list[str]:
        return ["--prefix", self.prefix, "--bridge", self.bridge, "--pod-cidr", self.pod_cidr,
                "--service-cidr", self.service_cidr]

    def tether(self, *args: str, ok: bool | None = True, input: str | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run([TETHER, *args], input=input, capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        assert "Traceback" not in proc.stderr, proc.stderr
        if ok is True:
            assert proc.returncode == 0, f"tether {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
        elif ok is False:
            assert proc.returncode != 0, proc.stdout
        return proc

    def logs(self, namespace: str, pod: str, *args: str) -> str:
        """``tether logs`` of a pod; "" while its container has written nothing yet (a poll's answer, not a
        failure: a container starts after its pod is listed)."""
        proc = self.tether("logs", "-n", namespace, pod, *args, ok=None)
        if proc.returncode != 0:
            assert "no output of container" in proc.stderr, f"tether logs -n {namespace} {pod}: {proc.stderr}"
            return ""
        return str(proc.stdout)

    def apply(self, manifest: str) -> None:
        self.tether("apply", "-f", "-", input=manifest)

    @contextmanager
    def store(self) -> Iterator[Store]:
        with Store(self.home / "store.db") as store:
            yield store

    def pods(self, namespace: str, prefix: str = "") -> list[dict[str, Any]]:
        """The pods of ``namespace``; with ``prefix``, those whose names start with it (a Deployment's, say)."""
        with self.store() as store:
            return [x for x in store.list("Pod", namespace).items if x["metadata"]["name"].startswith(prefix)]

    def ready_pods(self, namespace: str, count: int, prefix: str = "", timeout: float = 90.0) -> list[dict[str, Any]]:
        """Wait until ``namespace`` has exactly ``count`` pods named ``prefix``*, all ready; return them."""
        def check() -> list[dict[str, Any]] | None:
            pods = self.pods(namespace, prefix)
            return pods if len(pods) == count and all(ready(x) for x in pods) else None

        return wait_for(f"{count} ready pods {prefix}* in {namespace}", check, timeout=timeout)

    def proxy_metrics(self, pod: dict[str, Any]) -> str:
        """The pod's proxy's /metrics, read from inside its network namespace (the admin port is loopback-only)."""
        script = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:4191/metrics').read().decode())"
        return subprocess.run(["ip", "netns", "exec", self.netns_of(pod), PYTHON, "-c", script],
                              capture_output=True, text=True, timeout=30).stdout

    def netns_of(self, pod: dict[str, Any]) -> str:
        return f"{self.prefix}-{pod['metadata']['name']}.{pod['metadata']['namespace']}"

    def teardown(self) -> list[str]:
        """Everything this platform made goes, whatever state the test left it in: ``tether down --purge``, then a
        fallback by name. Returns what ``tether down --purge`` had left (the fallback removed it since): a user has
        no fallback, so that is a leak the caller reports."""
        subprocess.run([TETHER, "down", "--purge"], env=self.env, capture_output=True, timeout=120)
        left = self.left_by_down()
        for pid in processes_matching([str(self.home)]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        HostNet(NetnsConfig(prefix=self.prefix, bridge=self.bridge)).teardown_all()
        for etc in Path("/etc/netns").glob(f"{self.prefix}-*"):
            subprocess.run(["rm", "-rf", str(etc)], check=False)
        subprocess.run(["rm", "-rf", f"/run/tether/{self.prefix}"], check=False)
        return left

    def left_by_down(self) -> list[str]:
        """This platform's processes (by its state directory in their command line, or in one of its pods'
        namespaces), namespaces, links, hosts files and run directory still there."""
        problems = [f"process {pid} still running: {_cmdline(pid)}" for pid in processes_matching([str(self.home)])]
        for name in sorted(n for n in netns_names() if n.startswith(self.prefix + "-")):
            pids = _stdout(["ip", "netns", "pids", name]).split()
            problems.append(f"network namespace {name} still there"
                            + "".join(f"; process {pid}: {_cmdline(int(pid))}" for pid in pids))
        problems += [f"link {n} still there" for n in sorted(link_names()) if n.startswith(self.prefix)]
        problems += [f"{etc} still there" for etc in sorted(Path("/etc/netns").glob(f"{self.prefix}-*"))]
        if Path(f"/run/tether/{self.prefix}").exists():
            problems.append(f"/run/tether/{self.prefix} still there")
        return [f"left by tether down --purge: {p}" for p in problems]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone since)"


def ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(s.get("restartCount", 0)) for s in (pod.get("status") or {}).get("containerStatuses") or ())


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def web_server(name: str, namespace: str, replicas: int, *, annotations: str = "", pre_stop_sleep: int = 0) -> str:
    """A Deployment of a tiny Python HTTP server on 8080 and its Service on port 80; with ``pre_stop_sleep``, its
    container's preStop hook sleeps that many seconds (it goes on serving meanwhile)."""
    lifecycle = f"\n        lifecycle: {{preStop: {{sleep: {{seconds: {pre_stop_sleep}}}}}}}" if pre_stop_sleep else ""
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{{annotations}}}
    spec:
      containers:
      - name: http
        image: python
        command: [{PYTHON}, -u, -m, http.server, "8080", --bind, 0.0.0.0]
        ports: [{{name: http, containerPort: 8080}}]{lifecycle}
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  selector: {{app: {name}}}
  ports: [{{name: http, port: 80, targetPort: http}}]
"""


CLIENT_SCRIPT = """
import sys, time, urllib.request
url = sys.argv[1]
while True:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            print("ok", r.status, flush=True)
    except Exception as e:
        print("error", e, flush=True)
    time.sleep(0.2)
"""


def yaml_quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (scripts go into manifests so)."""
    return '"' + text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"'


def script_deployment(name: str, namespace: str, script: str, *args: str, container: str = "main",
                      port: int | None = None, port_name: str | None = None, service_account: str | None = None,
                      annotations: str = "") -> str:
    """A Deployment (label ``app: name``) whose one container runs the Python ``script`` with ``args``."""
    argv = "".join(f", {yaml_quoted(a)}" for a in args)
    named = f"name: {port_name}, " if port_name else ""
    ports = f"\n        ports: [{{{named}containerPort: {port}}}]" if port is not None else ""
    account = f"\n      serviceAccountName: {service_account}" if service_account else ""
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{{annotations}}}
    spec:{account}
      containers:
      - name: {container}
        image: python
        command: [{PYTHON}, -u, -c, {yaml_quoted(script)}{argv}]{ports}
"""


def client(name: str, namespace: str, url: str, *, annotations: str = "") -> str:
    """A Deployment that GETs ``url`` five times a second and prints ``ok 200`` or the error."""
    return script_deployment(name, namespace, CLIENT_SCRIPT, url, container="client", annotations=annotations)


def tap_lines(p: Platform, *args: str, want: int, timeout: float = 60, command: str = "tap") -> list[str]:
    """The first ``want`` lines ``tether viz tap ARGS`` (or ``viz top``: ``command``) streams (it runs until
    interrupted, as a user's would)."""
    proc = subprocess.Popen([TETHER, "viz", command, *args], env=p.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while len(lines) < want:
            readable, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert readable, f"viz {command} {' '.join(args)}: {len(lines)} lines after {timeout:.0f}s: {lines}"
            line = proc.stdout.readline()
            assert line, f"viz {command} {' '.join(args)} ended: {proc.stderr.read() if proc.stderr else ''}"
            lines.append(line.rstrip("\n"))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return lines
