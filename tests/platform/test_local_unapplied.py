"""Pod fields the local platform cannot apply are named (``tether.platform.local.unapplied``), none missed."""

from __future__ import annotations

from tether.platform.local.unapplied import pod_spec, unapplied_fields


def test_every_kind_of_unapplied_field_is_named_with_its_path() -> None:
    spec = {
        "hostNetwork": True,
        "initContainers": [{"name": "proxy", "lifecycle": {"preStop": {"tcpSocket": {"port": 80}}},
                            "startupProbe": {"httpGet": {"port": 4191}}}],
        "containers": [{"name": "app", "ports": [{"containerPort": 80}, {"containerPort": 53, "hostPort": 53}],
                        "readinessProbe": {"grpc": {"port": 9000}}, "lifecycle": {"postStart": {"exec": {}}}}],
    }
    assert [f.split(":")[0] for f in unapplied_fields(spec)] == [
        "spec.hostNetwork", "spec.initContainers[0].lifecycle.preStop", "spec.containers[0].ports[1].hostPort",
        "spec.containers[0].readinessProbe.grpc", "spec.containers[0].lifecycle.postStart"]


def test_what_the_platform_applies_is_not_named() -> None:
    spec = {"hostNetwork": False, "containers": [{"name": "app", "ports": [{"containerPort": 80, "hostPort": 0}],
                                                  "livenessProbe": {"tcpSocket": {"port": 80}},
                                                  "lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}],
            "initContainers": [{"name": "proxy",
                                "lifecycle": {"preStop": {"exec": {"command": ["/bin/sleep", "5"]}}}}]}
    assert unapplied_fields(spec) == []


def test_a_deployments_template_is_read_and_other_kinds_are_not() -> None:
    template_spec = {"hostNetwork": True, "containers": []}
    deployment = {"kind": "Deployment", "spec": {"template": {"spec": template_spec}}}
    assert pod_spec(deployment) is template_spec
    assert pod_spec({"kind": "Service", "spec": {"hostNetwork": True}}) is None
    assert pod_spec({"kind": "Pod", "spec": "bad"}) is None
