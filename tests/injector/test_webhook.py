"""The webhook over real HTTPS on 127.0.0.1: AdmissionReview v1 in, JSON patch out, the same pod as the pure
function; skips, annotation-only patches, malformed requests, the failure policy, timeouts, the admin
port, TLS 1.3, certificate reload; and ``tether injector serve`` as its own process."""

from __future__ import annotations

import asyncio
import base64
import datetime
import http.client
import ipaddress
import json
import os
import queue
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from executables import TETHER

from tether.injector import MeshConfig, Origin, inject
from tether.injector.admission import Admission
from tether.injector.jsonpatch import apply
from tether.injector.metrics import InjectorMetrics
from tether.injector.namespaces import StaticNamespaces
from tether.injector.server import InjectorServer, ServeConfig

from .helpers import ANCHOR_FILE, deployment, pod

NAMESPACES = {"shop": {"linkerd.io/inject": "enabled"}, "plain": {}}


# --- certificates -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def _make_pki(directory: Path, name: str) -> Pki:
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} webhook CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "linkerd-proxy-injector.linkerd.svc")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.DNSName("linkerd-proxy-injector.linkerd.svc"),
        ]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    pki.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return _make_pki(tmp_path_factory.mktemp("webhook-tls"), "first")


# --- a server on a thread of its own ------------------------------------------------------------------------


class Running:
    def __init__(self, admission: Admission, config: ServeConfig) -> None:
        self.admission = admission
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = InjectorServer(config, admission)
        self.port, self.admin_port = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


Start = Callable[..., Running]


@pytest.fixture
def start(pki: Pki, config: MeshConfig) -> Iterator[Start]:
    running: list[Running] = []

    def run(
        *,
        namespaces: Callable[[str], Mapping[str, str]] | None = None,
        failure_policy: str = "Ignore",
        tls: Pki | None = None,
        **serve: Any,
    ) -> Running:
        admission = Admission(
            lambda: config,
            namespaces or StaticNamespaces(NAMESPACES),
            metrics=InjectorMetrics(),
            failure_policy=failure_policy,
        )
        tls = tls or pki
        serve_config = ServeConfig(tls_cert=tls.cert, tls_key=tls.key, addr=("127.0.0.1", 0),
                                   admin_addr=("127.0.0.1", 0), **serve)  # fmt: skip
        r = Running(admission, serve_config)
        running.append(r)
        return r

    yield run
    for r in running:
        r.close()


def client_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def post(port: int, body: bytes | dict[str, Any], ca: Path, path: str = "/") -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_context(ca), timeout=10)
    try:
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, payload, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def admin_get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def review(obj: Any, *, kind: str = "Pod", namespace: str = "shop", operation: str = "CREATE", uid: str = "uid-1",
           api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:  # fmt: skip
    resource = {"Pod": "pods", "Service": "services"}.get(kind, kind.lower() + "s")
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": obj,
            "dryRun": False,
        },
    }


def response_of(status: int, body: bytes, uid: str = "uid-1") -> dict[str, Any]:
    assert status == 200, body
    answer = json.loads(body)
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == uid
    return answer["response"]


def patched(obj: dict[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True
    if "patch" not in response:
        return obj
    assert response["patchType"] == "JSONPatch"
    return apply(obj, json.loads(base64.b64decode(response["patch"])))


def generated_pod(**kw: Any) -> dict[str, Any]:
    """A pod as the ReplicaSet controller creates it: generateName, no name, no namespace."""
    obj = pod(namespace=None, **kw)
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "web-7d9c5b-"
    obj["metadata"]["labels"] = {"app": "web", "pod-template-hash": "7d9c5b", **obj["metadata"].get("labels", {})}
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9c5b", "uid": "rs-1", "controller": True}
    ]
    return obj


# --- admission --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        generated_pod(),
        generated_pod(annotations={"config.alpha.linkerd.io/proxy-enable-native-sidecar": "false"}),
        generated_pod(annotations={"config.linkerd.io/skip-inbound-ports": "25"}, ports=(3306, ("http", 8080))),
        pod(namespace="shop", initContainers=[{"name": "setup", "image": "busybox"}], volumes=[{"name": "v", "emptyDir": {}}]),
    ],
)
def test_webhook_patch_equals_the_pure_function(start: Start, pki: Pki, config: MeshConfig, obj: dict[str, Any]) -> None:
    server = start()
    response = response_of(*post(server.port, review(obj), pki.ca))
    expected = inject(obj, NAMESPACES["shop"], config, origin=Origin.WEBHOOK, namespace="shop").obj
    assert patched(obj, response) == expected
    assert expected["metadata"]["labels"]["linkerd.io/workload-ns"] == "shop"


def test_injected_pod_is_labelled_with_its_deployment(start: Start, pki: Pki) -> None:
    server = start()
    out = patched(generated_pod(), response_of(*post(server.port, review(generated_pod()), pki.ca)))
    assert out["metadata"]["labels"]["linkerd.io/proxy-deployment"] == "web"
    _, metrics = admin_get(server.admin_port, "/metrics")
    assert (
        'proxy_inject_admission_responses_total{annotation_at="namespace",namespace="shop",owner_kind="deployment",'
        'skip="false",skip_reason=""} 1.0' in metrics
    )


def test_skip_without_the_annotation(start: Start, pki: Pki) -> None:
    server = start()
    obj = pod(namespace=None, ports=())
    response = response_of(*post(server.port, review(obj, namespace="plain"), pki.ca))
    assert response == {"uid": "uid-1", "allowed": True}
    _, metrics = admin_get(server.admin_port, "/metrics")
    assert 'skip="true",skip_reason="injection_enable_annotation_absent"} 1.0' in metrics


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (pod(annotations={"linkerd.io/inject": "disabled"}, ports=()), "injection_disable_annotation_present"),
        (pod(hostNetwork=True, ports=()), "host_network_enabled"),
    ],
)
def test_skip_reasons_are_counted(start: Start, pki: Pki, obj: dict[str, Any], reason: str) -> None:
    server = start()
    assert response_of(*post(server.port, review(obj), pki.ca)) == {"uid": "uid-1", "allowed": True}
    assert f'skip_reason="{reason}"}} 1.0' in admin_get(server.admin_port, "/metrics")[1]


def test_already_injected_pod_is_left_alone(start: Start, pki: Pki, config: MeshConfig) -> None:
    server = start()
    once = inject(pod(ports=(3306,)), NAMESPACES["shop"], config).obj
    del once["metadata"]["annotations"]["config.linkerd.io/opaque-ports"]
    assert response_of(*post(server.port, review(once), pki.ca)) == {"uid": "uid-1", "allowed": True}


def test_not_injected_pod_gets_its_opaque_ports(start: Start, pki: Pki) -> None:
    server = start()
    obj = pod(ports=(5432, 8080))
    out = patched(obj, response_of(*post(server.port, review(obj, namespace="plain"), pki.ca)))
    assert out["metadata"]["annotations"] == {"config.linkerd.io/opaque-ports": "5432"}
    assert out["spec"] == obj["spec"]


def test_service_gets_its_opaque_ports(start: Start, pki: Pki) -> None:
    server = start()
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"},
           "spec": {"ports": [{"port": 3306}, {"port": 80, "targetPort": 8080}]}}  # fmt: skip
    out = patched(svc, response_of(*post(server.port, review(svc, kind="Service"), pki.ca)))
    assert out["metadata"]["annotations"] == {"config.linkerd.io/opaque-ports": "3306"}


@pytest.mark.parametrize(
    "request_review",
    [
        review(pod(), operation="UPDATE"),
        review({"apiVersion": "apps/v1", "kind": "Deployment"}, kind="Deployment"),
    ],
)
def test_other_requests_are_allowed_unchanged(start: Start, pki: Pki, request_review: dict[str, Any]) -> None:
    server = start()
    assert response_of(*post(server.port, request_review, pki.ca)) == {"uid": "uid-1", "allowed": True}


def test_v1beta1_reviews_are_answered_in_kind(start: Start, pki: Pki) -> None:
    server = start()
    status, body = post(server.port, review(pod(), api_version="admission.k8s.io/v1beta1"), pki.ca)
    assert json.loads(body)["apiVersion"] == "admission.k8s.io/v1beta1"
    assert response_of(status, body)["patchType"] == "JSONPatch"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "body is not JSON"),
        (b"[]", "not a JSON object"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "expected kind AdmissionReview"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "has no request"),
        (json.dumps({**review(pod()), "request": {"object": pod()}}).encode(), "has no uid"),
    ],
)
def test_malformed_requests_get_a_clear_400(start: Start, pki: Pki, body: bytes, message: str) -> None:
    server = start()
    status, answer = post(server.port, body, pki.ca)
    assert status == 400
    assert message in answer.decode()
    assert 'proxy_inject_admission_failures_total{reason="malformed_request"} 1.0' in admin_get(
        server.admin_port, "/metrics"
    )[1]


def _broken_pod() -> dict[str, Any]:
    obj = pod()
    obj["spec"]["containers"] = {"name": "app"}
    return obj


def test_invalid_object_is_admitted_with_a_warning_under_ignore(start: Start, pki: Pki) -> None:
    server = start()
    response = response_of(*post(server.port, review(_broken_pod()), pki.ca))
    assert response["allowed"] is True and "patch" not in response
    assert "spec.containers" in response["warnings"][0] and "without the proxy" in response["warnings"][0]
    assert 'reason="invalid_object"} 1.0' in admin_get(server.admin_port, "/metrics")[1]


def test_invalid_object_is_denied_under_fail(start: Start, pki: Pki) -> None:
    server = start(failure_policy="Fail")
    response = response_of(*post(server.port, review(_broken_pod()), pki.ca))
    assert response["allowed"] is False
    assert response["status"]["code"] == 500 and "spec.containers" in response["status"]["message"]


def test_internal_errors_admit_the_pod(start: Start, pki: Pki) -> None:
    def broken(namespace: str) -> Mapping[str, str]:
        raise RuntimeError("namespace cache unavailable")

    server = start(namespaces=broken)
    response = response_of(*post(server.port, review(pod()), pki.ca))
    assert response["allowed"] is True and "patch" not in response
    assert "namespace cache unavailable" in response["warnings"][0]
    assert 'reason="internal_error"} 1.0' in admin_get(server.admin_port, "/metrics")[1]


def test_a_slow_handler_is_answered_in_time(start: Start, pki: Pki) -> None:
    release = threading.Event()

    def slow(namespace: str) -> Mapping[str, str]:
        release.wait(10)
        return NAMESPACES["shop"]

    server = start(namespaces=slow, handler_timeout=0.3)
    began = time.monotonic()
    response = response_of(*post(server.port, review(pod()), pki.ca))
    release.set()
    assert time.monotonic() - began < 5
    assert response["allowed"] is True and "no answer within 0.3s" in response["warnings"][0]
    assert 'reason="timeout"} 1.0' in admin_get(server.admin_port, "/metrics")[1]


def test_warnings_for_ignored_annotation_values(start: Start, pki: Pki) -> None:
    server = start()
    obj = pod(annotations={"config.linkerd.io/proxy-cpu-limit": "lots"})
    response = response_of(*post(server.port, review(obj), pki.ca))
    assert response["patchType"] == "JSONPatch"
    assert any("config.linkerd.io/proxy-cpu-limit" in w for w in response["warnings"])


# --- HTTP and TLS -------------------------------------------------------------------------------------------


def test_keep_alive_serves_several_requests(start: Start, pki: Pki) -> None:
    server = start()
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(pki.ca), timeout=10)
    try:
        for uid in ("a", "b", "c"):
            conn.request("POST", "/", json.dumps(review(pod(), uid=uid)).encode())
            response = conn.getresponse()
            assert response_of(response.status, response.read(), uid)["allowed"] is True
    finally:
        conn.close()


def test_webhook_port_takes_only_post(start: Start, pki: Pki) -> None:
    server = start()
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(pki.ca), timeout=10)
    conn.request("GET", "/")
    assert conn.getresponse().status == 405
    conn.close()


def test_body_over_the_limit_is_refused(start: Start, pki: Pki) -> None:
    server = start(max_body=1024)
    status, body = post(server.port, review(pod(annotations={"x": "y" * 2000})), pki.ca)
    assert status == 413 and b"limit" in body


def test_tls_below_1_3_is_refused(start: Start, pki: Pki) -> None:
    server = start()
    context = client_context(pki.ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    with pytest.raises(ssl.SSLError):
        conn.request("POST", "/", b"{}")
    conn.close()


def test_certificate_is_reloaded_when_its_files_change(start: Start, tmp_path: Path) -> None:
    first = _make_pki(tmp_path / "first", "first")
    second = _make_pki(tmp_path / "second", "second")
    live = Pki(first.ca, tmp_path / "tls.crt", tmp_path / "tls.key")
    live.cert.write_bytes(first.cert.read_bytes())
    live.key.write_bytes(first.key.read_bytes())
    server = start(tls=live, cert_reload_interval=0.05)
    assert post(server.port, review(pod()), first.ca)[0] == 200
    live.cert.write_bytes(second.cert.read_bytes())
    live.key.write_bytes(second.key.read_bytes())
    os.utime(live.cert, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    deadline = time.monotonic() + 5
    while True:
        try:
            assert post(server.port, review(pod()), second.ca)[0] == 200
            break
        except ssl.SSLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# --- admin ----------------------------------------------------------------------------------------------------


def test_admin_endpoints(start: Start) -> None:
    server = start()
    assert admin_get(server.admin_port, "/ready") == (200, "ok\n")
    assert admin_get(server.admin_port, "/live") == (200, "live\n")
    assert admin_get(server.admin_port, "/ping") == (200, "pong\n")
    assert admin_get(server.admin_port, "/nope")[0] == 404
    status, metrics = admin_get(server.admin_port, "/metrics")
    assert status == 200
    assert "proxy_inject_admission_duration_seconds" in metrics


# --- the process ----------------------------------------------------------------------------------------------


class StderrLines:
    """Collects a process's stderr lines on a thread, so waiting for one never blocks on buffering."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.put(line)

    def port(self, what: str, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append(line)
            if f"{what} listening on" in line:
                return int(line.rsplit(":", 1)[1])
        raise AssertionError(f"no '{what} listening' line; stderr so far:\n{''.join(self.seen)}")

    def rest(self) -> str:
        self._thread.join(20)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)


def test_tether_injector_serve_process(pki: Pki, tmp_path: Path) -> None:
    namespaces = tmp_path / "namespaces.yaml"
    namespaces.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  annotations:\n"
                          "    linkerd.io/inject: enabled\n")  # fmt: skip
    values = tmp_path / "values.yaml"
    values.write_text("controllerNamespace: tether\nproxy:\n  logLevel: debug\n")
    proc = subprocess.Popen(
        [TETHER, "injector", "serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
         "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--values", str(values),
         "--identity-trust-anchors-file", str(ANCHOR_FILE), "--namespaces", str(namespaces)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    stderr = StderrLines(proc)
    try:
        admin_port = stderr.port("admin")  # the admin port listens first
        port = stderr.port("webhook")
        assert admin_get(admin_port, "/ready")[0] == 200
        obj = deployment()["spec"]["template"]
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1", **obj["metadata"]}, "spec": obj["spec"]}
        out = patched(obj, response_of(*post(port, review(obj), pki.ca)))
        assert out["metadata"]["labels"]["linkerd.io/control-plane-ns"] == "tether"
        proxy = out["spec"]["initContainers"][1]
        log = next(e["value"] for e in proxy["env"] if e["name"] == "LINKERD2_PROXY_LOG")
        assert log.startswith("debug,")
        # A namespace file edit applies without a restart.
        namespaces.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n")
        os.utime(namespaces, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        assert response_of(*post(port, review(pod(ports=())), pki.ca)) == {"uid": "uid-1", "allowed": True}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    log = stderr.rest()
    assert proc.returncode == 0, log
    assert "Traceback" not in log and "shutting down" in log


def test_serve_reports_bad_certificates_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    proc = subprocess.run(
        [TETHER, "injector", "serve", "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"),
         "--identity-trust-anchors-file", str(ANCHOR_FILE)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: cannot load the TLS certificate")
    assert "Traceback" not in proc.stderr
