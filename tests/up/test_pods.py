"""Pods of the local platform: Deployments into running, ready pods, services by name, scaling, crashes.

All tests share one platform (module scope); each works in a namespace of its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from ipaddress import IPv4Network
from pathlib import Path

from tether.platform.local.ipam import Ipam, IpamConfig
from up import uplab
from up.uplab import client, ready, restarts, wait_for, web_server


def _log(p: uplab.Platform, namespace: str, pod: str, *args: str) -> str:
    return p.logs(namespace, pod, *args)


def test_a_deployment_becomes_ready_pods_with_addresses(running: uplab.Platform) -> None:
    p = running
    p.apply(web_server("web", "apps", 2))
    pods = p.ready_pods("apps", 2)
    ips = {pod["status"]["podIP"] for pod in pods}
    assert len(ips) == 2
    hashes = {pod["metadata"]["labels"]["pod-template-hash"] for pod in pods}
    assert len(hashes) == 1
    (template_hash,) = hashes
    for pod in pods:
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ReplicaSet" and owner["controller"] is True
        assert owner["name"] == f"web-{template_hash}"
        assert pod["metadata"]["name"].startswith(f"web-{template_hash}-")
        assert pod["spec"]["nodeName"] == "local"
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
        assert os.path.exists(f"/run/netns/{p.netns_of(pod)}")
    table = p.tether("get", "pods", "-n", "apps", "-o", "wide").stdout
    for pod in pods:
        assert re.search(rf"^{pod['metadata']['name']}\s+1/1\s+Running\s+0\s+\S+\s+{pod['status']['podIP']}\s", table,
                         re.M), table
    deployment = p.tether("get", "deploy", "web", "-n", "apps", "-o", "json").stdout
    assert '"readyReplicas": 2' in deployment
    service = p.tether("get", "svc", "web", "-n", "apps", "-o", "json").stdout
    cluster_ip = re.search(r'"clusterIP": "([\d.]+)"', service).group(1)
    assert cluster_ip.startswith(p.service_cidr.rsplit(".", 1)[0])


def test_a_client_pod_reaches_the_service_by_name_and_every_replica(running: uplab.Platform) -> None:
    p = running
    p.apply(web_server("echo", "byname", 2))
    servers = p.ready_pods("byname", 2, "echo-")
    p.apply(client("client", "byname", "http://echo.byname.svc.cluster.local/"))
    (caller,) = p.ready_pods("byname", 1, "client-")
    name = caller["metadata"]["name"]
    wait_for("the client's first answer", lambda: "ok 200" in _log(p, "byname", name))
    # Short names resolve too, inside the pod's namespace (its /etc/hosts).
    hosts = Path(f"/etc/netns/{p.netns_of(caller)}/hosts").read_text()
    assert re.search(r"\secho\.byname\.svc\.cluster\.local echo\.byname\.svc echo\.byname echo$", hosts, re.M), hosts
    # Connections are spread over both replicas (random DNAT, as kube-proxy).
    client_ip = caller["status"]["podIP"]
    for server in servers:
        wait_for(f"a request from the client on {server['metadata']['name']}",
                 lambda server=server: f"{client_ip} - - " in _log(p, "byname", server["metadata"]["name"]))
    # The same from a process started in the pod's namespace: hosts file and DNAT, no proxy.
    fetched = subprocess.run(
        ["ip", "netns", "exec", p.netns_of(caller), uplab.PYTHON, "-c",
         "import urllib.request; print(urllib.request.urlopen('http://echo/', timeout=5).status)"],
        capture_output=True, text=True, timeout=30,
    )
    assert fetched.stdout.strip() == "200", fetched.stderr


def test_scaling_down_and_up_follows_replicas_and_endpoints(running: uplab.Platform) -> None:
    p = running
    p.apply(web_server("scaled", "scale", 3))
    first = p.ready_pods("scale", 3, "scaled-")
    p.apply(client("client", "scale", "http://scaled/"))
    (caller,) = p.ready_pods("scale", 1, "client-")
    netns = p.netns_of(caller)

    def dnat_targets() -> int:
        rules = subprocess.run(["ip", "netns", "exec", netns, "iptables", "-t", "nat", "-S", "TETHER-SERVICES"],
                               capture_output=True, text=True).stdout
        return sum(1 for line in rules.splitlines() if "scale/scaled" in line and "DNAT" in line)

    wait_for("three endpoints in the client's rules", lambda: dnat_targets() == 3)

    p.apply(web_server("scaled", "scale", 1))
    (left,) = p.ready_pods("scale", 1, "scaled-")
    gone = [pod for pod in first if pod["metadata"]["name"] != left["metadata"]["name"]]
    assert len(gone) == 2
    for pod in gone:
        wait_for(f"{pod['metadata']['name']}'s namespace to go",
                 lambda pod=pod: not os.path.exists(f"/run/netns/{p.netns_of(pod)}"))
    wait_for("one endpoint in the client's rules", lambda: dnat_targets() == 1)
    name = caller["metadata"]["name"]
    before = _log(p, "scale", name).count("ok 200")
    wait_for("answers after scaling down", lambda: _log(p, "scale", name).count("ok 200") > before + 3)

    p.apply(web_server("scaled", "scale", 2))
    p.ready_pods("scale", 2, "scaled-")
    wait_for("two endpoints in the client's rules", lambda: dnat_targets() == 2)


def test_a_crashed_app_restarts_and_the_count_shows(running: uplab.Platform) -> None:
    p = running
    p.apply(web_server("crashy", "crash", 1))
    (pod,) = p.ready_pods("crash", 1)
    name = pod["metadata"]["name"]
    pids = subprocess.run(["ip", "netns", "pids", p.netns_of(pod)], capture_output=True, text=True).stdout.split()
    assert pids
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)
    wait_for("the restart", lambda: [x for x in p.pods("crash") if restarts(x) == 1 and ready(x)])
    table = p.tether("get", "pods", "-n", "crash").stdout
    assert re.search(rf"^{name}\s+1/1\s+Running\s+1\s", table, re.M), table
    (after,) = p.pods("crash")
    status = after["status"]["containerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 137
    assert after["status"]["podIP"] == pod["status"]["podIP"]  # the same pod, restarted in place


def test_a_container_that_keeps_crashing_backs_off(running: uplab.Platform) -> None:
    p = running
    p.apply(f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: failing, namespace: backoff}}
spec:
  selector: {{matchLabels: {{app: failing}}}}
  template:
    metadata: {{labels: {{app: failing}}}}
    spec:
      containers:
      - name: app
        image: python
        command: [{uplab.PYTHON}, -c, "print('giving up'); raise SystemExit(3)"]
""")
    def backing_off() -> list[dict]:
        return [x for x in p.pods("backoff") if restarts(x) >= 2 and (
            x["status"]["containerStatuses"][0]["state"].get("waiting") or {}).get("reason") == "CrashLoopBackOff"]

    pod = wait_for("two restarts, then CrashLoopBackOff", backing_off)[0]
    status = pod["status"]["containerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert "back-off" in status["state"]["waiting"]["message"]
    assert not ready(pod) and not status["ready"]
    assert "giving up" in _log(p, "backoff", "deploy/failing") + _log(p, "backoff", "deploy/failing", "-p")


def test_logs_and_their_errors(running: uplab.Platform) -> None:
    p = running
    p.apply(web_server("logged", "logs", 1))
    (pod,) = p.ready_pods("logs", 1)
    name = pod["metadata"]["name"]
    subprocess.run(["ip", "netns", "exec", p.netns_of(pod), uplab.PYTHON, "-c",
                    f"import urllib.request; urllib.request.urlopen('http://{pod['status']['podIP']}:8080/hello')"],
                   check=False, capture_output=True, timeout=30)
    wait_for("the request in the log", lambda: "GET /hello" in _log(p, "logs", name))
    assert "GET /hello" in _log(p, "logs", name, "-c", "app")
    assert "GET /hello" in _log(p, "logs", name, "-c", "http", "--tail", "1")
    assert "GET /hello" in _log(p, "logs", "deploy/logged")
    wrong = p.tether("logs", "-n", "logs", name, "-c", "nope", ok=False)
    assert "choose one of http" in wrong.stderr
    missing = p.tether("logs", "-n", "logs", "nosuchpod", ok=False)
    assert 'pods "nosuchpod" not found' in missing.stderr


def test_deleting_the_deployment_removes_its_pods_fully(running: uplab.Platform) -> None:
    p = running
    p.apply(web_server("doomed", "delete", 2))
    pods = p.ready_pods("delete", 2)
    p.tether("delete", "deploy", "doomed", "-n", "delete")
    wait_for("the Pod objects to go", lambda: not p.pods("delete"))
    for pod in pods:
        netns = p.netns_of(pod)
        wait_for(f"{netns} to go", lambda netns=netns: not os.path.exists(f"/run/netns/{netns}"))
        wait_for("its hosts file to go", lambda netns=netns: not os.path.exists(f"/etc/netns/{netns}"))
        logs = p.home / "pods" / "delete" / pod["metadata"]["name"]
        wait_for("its log directory to go", lambda logs=logs: not logs.exists())  # removed last, after the address
    owners = Ipam(IpamConfig(state_dir=p.home, pod_cidr=IPv4Network(p.pod_cidr))).allocations()
    assert not [o for o in owners if o.startswith("delete/")]


def test_a_bare_pod_is_admitted_and_runs(running: uplab.Platform) -> None:
    p = running
    p.apply(f"""
apiVersion: v1
kind: Pod
metadata: {{name: lonely, namespace: bare, labels: {{app: lonely}}}}
spec:
  containers:
  - name: app
    image: python
    command: [{uplab.PYTHON}, -u, -m, http.server, "8080"]
    env: [{{name: MY_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
    ports: [{{containerPort: 8080}}]
    livenessProbe: {{exec: {{command: ["true"]}}}}
""")
    (pod,) = p.ready_pods("bare", 1)
    assert pod["spec"]["nodeName"] == "local" and "ownerReferences" not in pod["metadata"]
    # The exec probe is stored as given, not run: the pod controller says so on the pod (it counts as passing).
    events = json.loads(p.tether("get", "events", "-n", "bare", "-o", "json").stdout)["items"]
    assert [(e["type"], e["reason"], e["involvedObject"]["name"], e["message"]) for e in events] == [
        ("Warning", "FieldsNotApplied", "lonely",
         "spec.containers[0].livenessProbe.exec: exec probes are not run locally (they count as passing)")]
    env = open(f"/proc/{subprocess.run(['ip', 'netns', 'pids', p.netns_of(pod)], capture_output=True, text=True).stdout.split()[0]}/environ", "rb").read()
    assert f"MY_IP={pod['status']['podIP']}".encode() in env.split(b"\0")
    p.tether("delete", "pod", "lonely", "-n", "bare")
    wait_for("the namespace to go", lambda: not os.path.exists(f"/run/netns/{p.netns_of(pod)}"))


def test_the_control_plane_comes_back_after_its_processes_die(running: uplab.Platform) -> None:
    """Runs last in this module: it kills the destination and the pod controller, and `tether up` heals."""
    p = running
    p.apply(web_server("steady", "restart", 1))
    (pod,) = p.ready_pods("restart", 1)
    netns = p.netns_of(pod)
    before = set(subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split())
    assert before
    for name in ("destination", "platform"):
        os.kill(json.loads((p.home / "run" / f"{name}.json").read_text())["pid"], signal.SIGKILL)
    status = p.tether("status", ok=False).stdout
    assert re.search(r"^destination\s+exited\s", status, re.M) and re.search(r"^platform\s+exited\s", status, re.M)
    assert re.search(r"^identity\s+running\s+yes\s", status, re.M), status

    out = p.tether("up").stdout
    assert re.search(r"^identity\s+already running", out, re.M), out
    assert re.search(r"^destination\s+starting", out, re.M) and re.search(r"^platform\s+starting", out, re.M)
    # The new controller removes what the old one left and runs the same pod again, at the same address.
    def restarted() -> bool:
        now = set(subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split())
        return bool(now) and not now & before

    wait_for("the pod's processes to be started again", restarted)
    (again,) = p.ready_pods("restart", 1)
    assert again["metadata"]["name"] == pod["metadata"]["name"]
    assert again["status"]["podIP"] == pod["status"]["podIP"]


TERM_RECORDER = """
import signal, sys, time
path = sys.argv[1]
def on_term(*_):
    with open(path, "a") as out:
        out.write("sigterm\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("waiting", flush=True)
while True:
    time.sleep(1)
"""


def test_a_deleted_pods_prestop_hook_runs_before_its_sigterm(running: uplab.Platform, tmp_path: Path) -> None:
    p = running
    record = tmp_path / "order"
    record.touch(mode=0o666)
    # The hook takes a while: a SIGTERM that did not wait for it would be recorded first.
    hook = f"import time; time.sleep(0.5); open({str(record)!r}, 'a').write('prestop\\n')"
    p.apply(f"""
apiVersion: v1
kind: Pod
metadata: {{name: hooked, namespace: hooks}}
spec:
  containers:
  - name: app
    image: python
    command: [{uplab.PYTHON}, -u, -c, {uplab.yaml_quoted(TERM_RECORDER)}, {record}]
    lifecycle: {{preStop: {{exec: {{command: [{uplab.PYTHON}, -c, {uplab.yaml_quoted(hook)}]}}}}}}
""")
    (pod,) = p.ready_pods("hooks", 1)
    wait_for("the app to wait", lambda: "waiting" in p.logs("hooks", "hooked"))
    p.tether("delete", "pod", "hooked", "-n", "hooks")
    wait_for("the namespace to go", lambda: not os.path.exists(f"/run/netns/{p.netns_of(pod)}"))
    assert record.read_text() == "prestop\nsigterm\n"
