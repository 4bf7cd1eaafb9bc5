"""The local platform's pure parts: Deployment planning, names, rules, env (meshing: tests/injector/test_local_platform.py)."""

from __future__ import annotations

import json
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from tether.platform.local import deployments, services
from tether.platform.local.config import LocalPlatformConfig, PlatformConfigError, load
from tether.platform.local.containers import Backoff, build_env, command_line, expand, field_value

# -- Deployments ----------------------------------------------------------------------------------


def _deployment(replicas: int = 2, image_arg: str = "8080") -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "apps", "uid": "u-1", "generation": 3},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "web", "image": "x", "command": ["serve", image_arg]}]}},
        },
    }


def _pod(deployment: dict, name: str, is_ready: bool, created: str = "2024-01-01T00:00:00Z") -> dict:
    hash_ = deployments.template_hash(deployment["spec"]["template"])
    pod = deployments.new_pod(deployment, hash_, name, "local")
    pod["metadata"]["creationTimestamp"] = created
    pod["status"] = {"conditions": [{"type": "Ready", "status": "True" if is_ready else "False"}]}
    return pod


def test_new_pods_carry_owner_hash_and_node() -> None:
    d = _deployment()
    hash_ = deployments.template_hash(d["spec"]["template"])
    assert hash_ == deployments.template_hash(json.loads(json.dumps(d["spec"]["template"])))
    assert hash_ != deployments.template_hash(_deployment(image_arg="9090")["spec"]["template"])
    name = deployments.new_pod_name("web", hash_)
    assert name.startswith(f"web-{hash_}-") and len(name.rsplit("-", 1)[1]) == 5
    pod = deployments.new_pod(d, hash_, name, "local")
    assert pod["metadata"]["labels"] == {"app": "web", "pod-template-hash": hash_}
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("ReplicaSet", f"web-{hash_}", True)
    assert pod["spec"]["nodeName"] == "local" and pod["spec"]["serviceAccountName"] == "default"
    assert deployments.belongs_to(pod, d)
    assert not deployments.belongs_to(pod, {**d, "metadata": {**d["metadata"], "uid": "u-2"}})


def test_plan_scales_and_prefers_removing_unready_then_newest() -> None:
    d = _deployment(replicas=1)
    pods = [_pod(d, "a", True, "2024-01-01T00:00:00Z"), _pod(d, "b", True, "2024-01-02T00:00:00Z"),
            _pod(d, "c", False, "2024-01-01T00:00:00Z")]
    assert deployments.plan(d, pods) == deployments.Plan(0, ("c", "b"))
    assert deployments.plan(_deployment(replicas=4), pods[:1]) == deployments.Plan(3, ())
    assert deployments.plan(d, []) == deployments.Plan(1, ())


def test_plan_rolls_a_new_template_without_dropping_ready_replicas() -> None:
    old_d = _deployment(replicas=2)
    new_d = _deployment(replicas=2, image_arg="9090")
    old = [_pod(old_d, "o1", True), _pod(old_d, "o2", True)]
    assert deployments.plan(new_d, old) == deployments.Plan(2, ())
    one_ready = [*old, _pod(new_d, "n1", True), _pod(new_d, "n2", False)]
    assert deployments.plan(new_d, one_ready) == deployments.Plan(0, ("o1",))  # one new ready: one old goes
    all_ready = [*old, _pod(new_d, "n1", True), _pod(new_d, "n2", True)]
    assert set(deployments.plan(new_d, all_ready).delete) == {"o1", "o2"}


def test_deployment_status_counts() -> None:
    d = _deployment(replicas=2)
    status = deployments.status(d, [_pod(d, "a", True), _pod(d, "b", False)], "2024-01-01T00:00:00Z")
    assert status["replicas"] == 2 and status["readyReplicas"] == 1 and status["updatedReplicas"] == 2
    assert status["observedGeneration"] == 3
    assert status["conditions"][0]["status"] == "False"


# -- services: names and rules ---------------------------------------------------------------------


def _svc(name: str, ns: str, ip: str | None, target: int | str = 8080, selector: dict | None = None) -> dict:
    spec: dict = {"selector": selector or {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": target}]}
    if ip:
        spec["clusterIP"] = ip
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def _running(name: str, ns: str, ip: str, labels: dict, ready_: bool = True) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 9000}]}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready_ else "False"}]}}


def test_hosts_file_names_services_with_short_names_in_the_own_namespace() -> None:
    names = services.service_names([_svc("web", "apps", "10.214.0.5"), _svc("db", "data", "10.214.0.6"),
                                    _svc("headless", "apps", "None")])
    text = services.render_hosts("apps", "client-1", "10.213.0.9", names, "cluster.local")
    assert "10.213.0.9\tclient-1\n" in text
    assert "10.214.0.5\tweb.apps.svc.cluster.local web.apps.svc web.apps web\n" in text
    assert "10.214.0.6\tdb.data.svc.cluster.local db.data.svc db.data\n" in text
    assert "headless" not in text


def test_service_rules_spread_over_ready_endpoints_and_reject_without_any() -> None:
    pods = [_running("a", "apps", "10.213.0.3", {"app": "web"}), _running("b", "apps", "10.213.0.2", {"app": "web"}),
            _running("c", "apps", "10.213.0.4", {"app": "web"}, ready_=False),
            _running("d", "other", "10.213.0.5", {"app": "web"})]
    rules = services.service_rules([_svc("web", "apps", "10.214.0.5"), _svc("named", "apps", "10.214.0.7", "web",
                                                                            {"app": "web"}),
                                    _svc("empty", "apps", "10.214.0.8")], pods)
    by_name = {r.name: r for r in rules}
    assert by_name["web"].endpoints == (("10.213.0.2", 8080), ("10.213.0.3", 8080))
    assert by_name["named"].endpoints == (("10.213.0.2", 9000), ("10.213.0.3", 9000))
    text = services.render_rules(rules, add_jumps=True)
    assert text.count("-A OUTPUT") == 2
    assert ('-A TETHER-SERVICES -d 10.214.0.5/32 -p tcp -m tcp --dport 80 -m comment --comment "apps/web:http" '
            "-m statistic --mode random --probability 0.5000000000 -j DNAT --to-destination 10.213.0.2:8080") in text
    assert ('-A TETHER-SERVICES -d 10.214.0.5/32 -p tcp -m tcp --dport 80 -m comment --comment "apps/web:http" '
            "-j DNAT --to-destination 10.213.0.3:8080") in text
    assert "-d 10.214.0.8/32 -p tcp -m tcp --dport 80" in text and "REJECT" in text
    assert "-A OUTPUT" not in services.render_rules(rules, add_jumps=False)


def test_cluster_ips_are_allocated_once_and_kept(tmp_path: Path) -> None:
    ips = services.ClusterIps(tmp_path, IPv4Network("10.214.0.0/29"))
    svc = _svc("web", "apps", None)
    first = ips.wanted(svc)
    assert first == ips.wanted(svc) == "10.214.0.2"
    assert ips.wanted(_svc("own", "apps", "10.1.2.3")) == "10.1.2.3"
    assert ips.wanted(_svc("headless", "apps", "None")) is None
    updated = services.with_cluster_ip(svc, first)
    assert updated["spec"]["clusterIP"] == first and updated["spec"]["clusterIPs"] == [first]
    assert services.with_cluster_ip(updated, first) is None
    ips.release_except([])
    assert ips.wanted(_svc("next", "apps", None)) == "10.214.0.3"  # round robin: freed addresses wait


def test_service_env_variables() -> None:
    env = services.service_env([_svc("web-api", "apps", "10.214.0.5"), _svc("x", "other", "10.214.0.6")], "apps")
    assert env == {"WEB_API_SERVICE_HOST": "10.214.0.5", "WEB_API_SERVICE_PORT": "80",
                   "WEB_API_SERVICE_PORT_HTTP": "80"}


# -- containers ------------------------------------------------------------------------------------


def test_env_expansion_and_field_refs() -> None:
    pod = {"metadata": {"name": "p", "namespace": "n", "labels": {"app": "web"}},
           "spec": {"nodeName": "local"}, "status": {"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}]}}
    container = {"env": [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "WHO", "value": "$(POD)@$(IP) $$(POD) $(UNKNOWN)"},
    ], "command": ["echo", "$(WHO)"], "args": ["$(APP)"]}
    env = build_env(pod, container, {"PATH": "/bin"})
    assert env["WHO"] == "p@10.0.0.2 $(POD) $(UNKNOWN)"
    assert env["APP"] == "web" and env["PATH"] == "/bin"
    assert command_line(container, env) == ["echo", "p@10.0.0.2 $(POD) $(UNKNOWN)", "web"]
    assert field_value(pod, "status.podIPs") == "10.0.0.2"
    assert expand("$$$(A)", {"A": "x"}) == "$x"


def test_backoff_doubles_up_to_the_cap() -> None:
    backoff = Backoff(1.0, 5.0, 600.0)
    assert [backoff.delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


# -- settings file ---------------------------------------------------------------------------------


def test_config_round_trips_and_rejects_overlapping_ranges(tmp_path: Path) -> None:
    config = LocalPlatformConfig(state_dir=tmp_path, prefix="tx1", bridge="tx1br",
                                 pod_cidr=IPv4Network("10.9.0.0/24"), service_cidr=IPv4Network("10.9.1.0/24"))
    config.save()
    assert load(tmp_path) == config
    assert str(config.gateway) == "10.9.0.1/24" and config.address(8086) == "10.9.0.1:8086"
    assert config.layout.run_dir == Path("/run/tether/tx1")
    with pytest.raises(PlatformConfigError, match="overlaps"):
        config.with_changes(service_cidr=IPv4Network("10.9.0.128/25"))
    (tmp_path / "platform.json").write_text('{"bogus": 1}')
    with pytest.raises(PlatformConfigError, match="unknown settings bogus"):
        load(tmp_path)
