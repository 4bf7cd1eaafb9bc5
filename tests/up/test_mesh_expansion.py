"""Mesh expansion on the local platform: a "VM" joins the mesh as an ExternalWorkload.

The VM is a network namespace this test makes itself on the platform's bridge (not a pod: the
pod controller knows nothing of it), with the last address of the pod range, which the
ExternalWorkload controller reserves in the pod IPAM once the workload is applied (no pod is
handed it after that).  On
it run, as on a VM outside a cluster: ``tether init`` (its own iptables redirection), ``tether
proxy`` as uid 2102 configured by the ``LINKERD2_PROXY_*`` environment, with the identity the
local platform offers when there is no SPIRE (``tether platform token``: a token for a service
account, exchanged with identity for a certificate that also names its SPIFFE ID), an HTTP
server and a client.  The ExternalWorkload names that SPIFFE ID; the ExternalWorkload controller
puts the VM behind a Service; a meshed pod calls it and it calls a meshed pod's Service, and a
capture on the VM's link shows only TLS.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from up import uplab
from up.uplab import PYTHON, TETHER, client, wait_for, web_server

from tether.api import workload_pb2, workload_pb2_grpc
from tether.identity import pki
from tether.platform.local import config as platform_config
from tether.platform.local.ipam import Ipam, IpamConfig, workload_owner

from .test_meshed import NAMESPACE, _capture_on

VM_NS, VM_SA, VM_NAME = "billing", "vm", "legacy-billing"
PROXY_UID, APP_UID = 2102, 4242
SPIFFE_ID = f"spiffe://cluster.local/ns/{VM_NS}/sa/{VM_SA}"
VM_IDENTITY = f"{VM_SA}.{VM_NS}.serviceaccount.identity.linkerd.cluster.local"

BILLING = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {VM_NS}}}
---
apiVersion: workload.linkerd.io/v1beta1
kind: ExternalWorkload
metadata: {{name: {VM_NAME}, namespace: {VM_NS}, labels: {{app: billing}}}}
spec:
  meshTLS: {{identity: "{SPIFFE_ID}", serverName: "{VM_IDENTITY}"}}
  ports: [{{name: http, port: 8080}}]
  workloadIPs: [{{ip: "{{ip}}"}}]
status:
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Service
metadata: {{name: billing, namespace: {VM_NS}}}
spec:
  selector: {{app: billing}}
  ports: [{{name: http, port: 80, targetPort: http}}]
"""


class Vm:
    """A network namespace on the platform's bridge with one address, and the processes run in it."""

    def __init__(self, p: uplab.Platform, workdir: Path) -> None:
        config = platform_config.load(p.home)
        assert config is not None
        self.config = config
        self.netns = f"{p.prefix}vm"
        self.link = f"{p.prefix}vmh"
        self.bridge = p.bridge
        network = ipaddress.ip_network(p.pod_cidr)
        self.ip = str(network.broadcast_address - 1)  # reserved for the workload once it is applied
        self.prefixlen = network.prefixlen
        self.dir = workdir
        self.procs: list[subprocess.Popen] = []

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def start(self) -> None:
        self._ip("netns", "add", self.netns)
        self._ip("link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        self._ip("link", "set", self.link, "master", self.bridge, "up")
        self._ip("-n", self.netns, "addr", "add", f"{self.ip}/{self.prefixlen}", "dev", "eth0")
        self._ip("-n", self.netns, "link", "set", "eth0", "up")
        self._ip("-n", self.netns, "link", "set", "lo", "up")
        self._ip("-n", self.netns, "route", "add", "default", "via", str(self.config.host_ip))

    def run(self, name: str, argv: list[str], *, uid: int, env: dict[str, str] | None = None) -> None:
        log = open(self.dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        self.procs.append(subprocess.Popen(["ip", "netns", "exec", self.netns, *setpriv, *argv], stdout=log,
                                           stderr=subprocess.STDOUT, env={"PATH": os.environ["PATH"], **(env or {})}))

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text()

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)

    def proxy_env(self, token_file: Path, identity_dir: Path) -> dict[str, str]:
        """What Linkerd's guide gives a VM's proxy, with the local platform's addresses and identity files."""
        c = self.config
        host = str(c.host_ip)
        destination = f"linkerd-destination.{c.control_plane_ns}.serviceaccount.identity.{c.control_plane_ns}.cluster.local"
        workload = json.dumps({"ns": VM_NS, "external_workload": VM_NAME})
        p = "LINKERD2_PROXY_"
        return {
            p + "LOG": "info",
            p + "IDENTITY_DIR": str(identity_dir),
            p + "IDENTITY_TOKEN_FILE": str(token_file),
            p + "IDENTITY_TRUST_ANCHORS": c.layout.trust_anchors.read_text(),
            p + "IDENTITY_LOCAL_NAME": VM_IDENTITY,
            p + "IDENTITY_SVC_ADDR": f"{host}:{c.ports.identity}",
            p + "IDENTITY_SVC_NAME": f"linkerd-identity.{c.control_plane_ns}.serviceaccount.identity."
                                     f"{c.control_plane_ns}.cluster.local",
            p + "DESTINATION_SVC_ADDR": f"{host}:{c.ports.destination}",
            p + "DESTINATION_SVC_NAME": destination,
            p + "DESTINATION_PROFILE_NETWORKS": c.cluster_networks,
            p + "DESTINATION_CONTEXT": json.dumps({"ns": VM_NS, "nodeName": "vm-1", "external_workload": VM_NAME}),
            p + "POLICY_SVC_ADDR": f"{host}:{c.ports.policy}",
            p + "POLICY_SVC_NAME": destination,
            p + "POLICY_WORKLOAD": workload,
            p + "POLICY_CLUSTER_NETWORKS": c.cluster_networks,
            p + "INBOUND_DEFAULT_POLICY": "all-unauthenticated",
            p + "INBOUND_LISTEN_ADDR": "0.0.0.0:4143",
            p + "OUTBOUND_LISTEN_ADDR": "127.0.0.1:4140",
            p + "ADMIN_LISTEN_ADDR": "0.0.0.0:4191",
            p + "CONTROL_LISTEN_ADDR": "0.0.0.0:4190",
            p + "INBOUND_PORTS": "8080",
            p + "INBOUND_IPS": self.ip,
        }


@pytest.fixture
def vm(running: uplab.Platform, tmp_path: Path) -> Iterator[Vm]:
    machine = Vm(running, tmp_path)
    try:
        machine.start()
        yield machine
    finally:
        machine.stop()


def join_the_mesh(p: uplab.Platform, vm: Vm) -> None:
    """The VM made a member: a token identity, its ExternalWorkload and Service, redirection, its proxy and app."""
    # The identity the local platform gives a VM without SPIRE: a token, exchanged like a pod's.
    token = p.tether("platform", "token", "-n", VM_NS, "--service-account", VM_SA, "--workload", VM_NAME).stdout
    # The VM's own disk: under the platform's run directory, which uid 2102 can traverse (removed with it).
    vm_dir = vm.config.layout.run_dir / "vm"
    vm_dir.mkdir(mode=0o755)
    identity_dir = vm_dir / "identity"
    identity_dir.mkdir(mode=0o700)
    token_file = vm_dir / "token"
    token_file.write_text(token.strip())
    token_file.chmod(0o600)
    for path in (identity_dir, token_file):
        os.chown(path, PROXY_UID, PROXY_UID)

    p.apply(BILLING.replace("{ip}", vm.ip))
    ipam = Ipam(IpamConfig(state_dir=vm.config.state_dir, pod_cidr=vm.config.pod_cidr))
    owner = workload_owner(VM_NS, VM_NAME)
    wait_for("the VM's address is reserved in the pod IPAM",
             lambda: (held := ipam.allocations().get(owner)) is not None and str(held.ip) == vm.ip, timeout=30)
    subprocess.run([TETHER, "init", "--netns", vm.netns, "--proxy-uid", str(PROXY_UID),
                    "--inbound-ports-to-ignore", "4190,4191", "--ipv6=false"], check=True, capture_output=True)
    vm.run("proxy", [TETHER, "proxy"], uid=PROXY_UID, env=vm.proxy_env(token_file, identity_dir))
    vm.run("app", [PYTHON, "-u", "-m", "http.server", "8080", "--bind", "0.0.0.0"], uid=APP_UID)
    wait_for("the VM's proxy is certified", lambda: "certified as " + VM_IDENTITY in vm.log("proxy"), timeout=60)


def test_a_vm_joins_the_mesh_calls_a_meshed_service_and_is_called_over_mtls(running: uplab.Platform, vm: Vm,
                                                                            tmp_path: Path) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("web", "meshed", 1))
    p.ready_pods("meshed", 1, "web-")
    # The pod controller meshed it through the injector, which records its Event on the owner, as on Kubernetes.
    events = p.tether("get", "events", "-n", "meshed").stdout
    assert any("Injected" in line and "deployment/web" in line for line in events.splitlines()), events
    with p.store() as store:
        web_ip = store.get("Service", "meshed", "web")["spec"]["clusterIP"]

    join_the_mesh(p, vm)

    frames: list[tuple[str, bytes]] = []
    stop = threading.Event()
    capture = threading.Thread(target=_capture_on, args=(vm.link, stop, frames), daemon=True)
    capture.start()
    try:
        # The VM calls a meshed pod's Service; a meshed pod calls the VM through its Service.
        vm.run("client", [PYTHON, "-u", "-c", uplab.CLIENT_SCRIPT, f"http://{web_ip}/"], uid=APP_UID)
        p.apply(client("caller", "meshed", f"http://billing.{VM_NS}.svc.cluster.local/"))
        (caller,) = p.ready_pods("meshed", 1, "caller-")
        name = caller["metadata"]["name"]
        wait_for("the VM gets answers from the meshed pod", lambda: vm.log("client").count("ok 200") >= 3, timeout=60)
        wait_for("the meshed pod gets answers from the VM",
                 lambda: p.logs("meshed", name).count("ok 200") >= 3, timeout=60)
    finally:
        stop.set()
        capture.join()
    vm_frames = [f for _, f in frames]
    assert any(b"\x17\x03\x03" in f for f in vm_frames)  # TLS application data crossed the VM's link
    assert not any(b"Python-urllib" in f for f in vm_frames)  # and no request (their User-Agent) was readable
    caller_proxy = p.tether("logs", "-n", "meshed", name, "-c", "proxy").stdout
    assert "Traceback" not in vm.log("proxy") and "Traceback" not in caller_proxy


# -- a VM with its identity from a SPIRE agent ------------------------------------------------------------------

LEDGER, LEDGER_ID, LEDGER_SNI = "ledger", "spiffe://cluster.local/vm/ledger", "ledger.vm.cluster.local"

LEDGER_OBJECTS = f"""
apiVersion: workload.linkerd.io/v1beta1
kind: ExternalWorkload
metadata: {{name: {LEDGER}, namespace: {VM_NS}, labels: {{app: {LEDGER}}}}}
spec:
  meshTLS: {{identity: "{LEDGER_ID}", serverName: "{LEDGER_SNI}"}}
  ports: [{{name: http, port: 8080}}]
  workloadIPs: [{{ip: "{{ip}}"}}]
status:
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Service
metadata: {{name: {LEDGER}, namespace: {VM_NS}}}
spec:
  selector: {{app: {LEDGER}}}
  ports: [{{name: http, port: 80, targetPort: http}}]
"""


class SpireAgent(workload_pb2_grpc.SpiffeWorkloadAPIServicer):
    """A SPIRE agent's Workload API on a Unix socket (grpcio): one X.509-SVID for the ledger, signed by the
    platform's issuer, as SPIRE's agent would issue it under an UpstreamAuthority of the mesh's issuer."""

    def __init__(self, pki_dir: Path, socket_path: Path) -> None:
        issuer = x509.load_pem_x509_certificate((pki_dir / "issuer.crt").read_bytes())
        issuer_key = serialization.load_pem_private_key((pki_dir / "issuer.key").read_bytes(), password=None)
        key = ec.generate_private_key(ec.SECP256R1())
        start = datetime.now(UTC) - timedelta(minutes=1)
        leaf = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.ORGANIZATION_NAME, "SPIRE")]))
                .issuer_name(issuer.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(start + timedelta(hours=1))
                .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(LEDGER_ID)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH,
                                                      x509.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .add_extension(pki.authority_key_id(issuer), critical=False)
                .sign(issuer_key, hashes.SHA256()))  # type: ignore[arg-type]
        der = serialization.Encoding.DER
        self.response = workload_pb2.X509SVIDResponse(svids=[workload_pb2.X509SVID(
            spiffe_id=LEDGER_ID, x509_svid=leaf.public_bytes(der) + issuer.public_bytes(der),
            x509_svid_key=key.private_bytes(der, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
            bundle=issuer.public_bytes(der))])
        self.calls = 0
        self._stop = threading.Event()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        workload_pb2_grpc.add_SpiffeWorkloadAPIServicer_to_server(self, self._server)
        assert self._server.add_insecure_port(f"unix:{socket_path}")
        self._server.start()
        socket_path.chmod(0o666)  # the proxy's uid connects (SPIRE's agent socket is world-writable too)

    def FetchX509SVID(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        if dict(context.invocation_metadata()).get("workload.spiffe.io") != "true":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "security header missing from request")
        self.calls += 1
        yield self.response
        self._stop.wait()  # the stream stays open, as the agent's does, for rotations

    def stop(self) -> None:
        self._stop.set()
        self._server.stop(None)


@pytest.fixture
def spire_vm(running: uplab.Platform, tmp_path: Path) -> Iterator[Vm]:
    machine = Vm(running, tmp_path)
    machine.ip = str(ipaddress.ip_network(running.pod_cidr).broadcast_address - 2)  # beside the first VM's
    try:
        machine.start()
        yield machine
    finally:
        machine.stop()


def test_a_vm_with_a_spire_svid_joins_the_mesh(running: uplab.Platform, spire_vm: Vm, tmp_path: Path) -> None:
    """The VM's ``tether proxy`` takes its identity from a SPIRE agent's Workload API socket (no token, no
    identity service): a meshed pod calls it through its Service over mTLS to the SVID's SPIFFE ID, and it
    calls a meshed pod's Service presenting the SVID."""
    p, vm = running, spire_vm
    p.apply(NAMESPACE)
    p.apply(web_server("web", "meshed", 1))
    p.ready_pods("meshed", 1, "web-")
    with p.store() as store:
        web_ip = store.get("Service", "meshed", "web")["spec"]["clusterIP"]
    p.apply(BILLING.split("---")[0])  # the namespace
    p.apply(LEDGER_OBJECTS.replace("{ip}", vm.ip))

    vm_dir = vm.config.layout.run_dir / "vm-spire"
    vm_dir.mkdir(mode=0o755)
    socket_path = vm_dir / "agent.sock"
    agent = SpireAgent(vm.config.layout.pki, socket_path)
    try:
        subprocess.run([TETHER, "init", "--netns", vm.netns, "--proxy-uid", str(PROXY_UID),
                        "--inbound-ports-to-ignore", "4190,4191", "--ipv6=false"], check=True, capture_output=True)
        env = {k: v for k, v in vm.proxy_env(Path("unused"), Path("unused")).items()
               if not k.startswith("LINKERD2_PROXY_IDENTITY_") or k.endswith("TRUST_ANCHORS")}
        env.update({
            "LINKERD2_PROXY_IDENTITY_SPIRE_WORKLOAD_API_ADDRESS": f"unix://{socket_path}",
            "LINKERD2_PROXY_IDENTITY_SERVER_ID": LEDGER_ID,
            "LINKERD2_PROXY_IDENTITY_SERVER_NAME": LEDGER_SNI,
            "LINKERD2_PROXY_POLICY_WORKLOAD": json.dumps({"ns": VM_NS, "external_workload": LEDGER}),
            "LINKERD2_PROXY_DESTINATION_CONTEXT": json.dumps({"ns": VM_NS, "nodeName": "vm-2",
                                                              "external_workload": LEDGER}),
        })
        vm.run("proxy", [TETHER, "proxy"], uid=PROXY_UID, env=env)
        vm.run("app", [PYTHON, "-u", "-m", "http.server", "8080", "--bind", "0.0.0.0"], uid=APP_UID)
        wait_for("the VM's proxy holds the SVID", lambda: "certified as " + LEDGER_ID in vm.log("proxy"), timeout=60)

        vm.run("client", [PYTHON, "-u", "-c", uplab.CLIENT_SCRIPT, f"http://{web_ip}/"], uid=APP_UID)
        p.apply(client("ledger-caller", "meshed", f"http://{LEDGER}.{VM_NS}.svc.cluster.local/"))
        (caller,) = p.ready_pods("meshed", 1, "ledger-caller-")
        name = caller["metadata"]["name"]
        wait_for("the VM gets answers from the meshed pod", lambda: vm.log("client").count("ok 200") >= 3, timeout=60)
        wait_for("the meshed pod gets answers from the VM",
                 lambda: p.logs("meshed", name).count("ok 200") >= 3, timeout=60)
        assert agent.calls == 1  # one Workload API stream, held open
        assert "Traceback" not in vm.log("proxy")
    finally:
        agent.stop()
