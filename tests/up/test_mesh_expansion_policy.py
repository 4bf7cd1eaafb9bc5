"""Policy for a VM in the mesh, on the local platform: its inbound policy, and its identity checked by a pod's.

The VM joins as in ``test_mesh_expansion`` (its own network namespace, ``tether init``, ``tether
proxy`` with a token identity, an ExternalWorkload behind the ``billing`` Service).  Its proxy asks
the policy controller for its ports as ``{"ns":"billing","external_workload":"legacy-billing"}``:
a Server selecting it by ``externalWorkloadSelector`` with an AuthorizationPolicy decides which
meshed callers it answers, and a change to that policy reaches the VM's proxy at once.  The other
way, a meshed pod's Server admits the VM's calls only once its MeshTLSAuthentication names the
VM's identity.
"""

from __future__ import annotations

from up import uplab
from up.uplab import client, wait_for, web_server

from .test_mesh_expansion import VM_IDENTITY, VM_NS, Vm, join_the_mesh, vm  # noqa: F401 (vm: the fixture)
from .test_meshed import NAMESPACE

CALLER_IDENTITY = "default.meshed.serviceaccount.identity.linkerd.cluster.local"  # the caller's service account
NOBODY = "nobody.meshed.serviceaccount.identity.linkerd.cluster.local"


def guarded(name: str, ns: str, selector: str, port: str, identity: str) -> str:
    """A Server (HTTP/1, deny by default), a MeshTLSAuthentication of one identity and the policy joining them."""
    return f"""
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {{name: {name}, namespace: {ns}}}
spec:
  {selector}: {{matchLabels: {{app: {name}}}}}
  port: {port}
  proxyProtocol: HTTP/1
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {{name: {name}-clients, namespace: {ns}}}
spec:
  identities: ["{identity}"]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: {name}-authz, namespace: {ns}}}
spec:
  targetRef: {{group: policy.linkerd.io, kind: Server, name: {name}}}
  requiredAuthenticationRefs:
  - {{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: {name}-clients}}
"""


def clients(name: str, ns: str, identity: str) -> str:
    return f"""
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {{name: {name}-clients, namespace: {ns}}}
spec:
  identities: ["{identity}"]
"""


def last_answer(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(("ok ", "error "))]
    return lines[-1] if lines else ""


def test_the_vm_answers_only_whom_its_policy_names_and_a_pod_admits_the_vm_by_its_identity(
        running: uplab.Platform, vm: Vm) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("web", "meshed", 1))
    p.ready_pods("meshed", 1, "web-")
    with p.store() as store:
        web_ip = store.get("Service", "meshed", "web")["spec"]["clusterIP"]
    join_the_mesh(p, vm)

    # The VM's inbound policy: its Server admits one identity, not the caller's.
    p.apply(guarded("billing", VM_NS, "externalWorkloadSelector", "http", NOBODY))
    p.apply(client("caller", "meshed", f"http://billing.{VM_NS}.svc.cluster.local/"))
    (caller,) = p.ready_pods("meshed", 1, "caller-")
    name = caller["metadata"]["name"]

    def caller_sees(answer: str) -> bool:
        return last_answer(p.logs("meshed", name)) == answer

    wait_for("the VM's proxy refuses the caller", lambda: caller_sees("error HTTP Error 403: Forbidden"), timeout=60)
    p.apply(clients("billing", VM_NS, CALLER_IDENTITY))
    wait_for("the VM's proxy admits the caller once named", lambda: caller_sees("ok 200"), timeout=60)

    # The VM's identity checked by a meshed pod's policy.
    p.apply(guarded("web", "meshed", "podSelector", "http", NOBODY))
    vm.run("client", [uplab.PYTHON, "-u", "-c", uplab.CLIENT_SCRIPT, f"http://{web_ip}/"], uid=4242)
    wait_for("the pod refuses the VM", lambda: last_answer(vm.log("client")) == "error HTTP Error 403: Forbidden",
             timeout=60)
    p.apply(clients("web", "meshed", VM_IDENTITY))
    wait_for("the pod admits the VM by its identity", lambda: last_answer(vm.log("client")) == "ok 200", timeout=60)
    assert "Traceback" not in vm.log("proxy")
