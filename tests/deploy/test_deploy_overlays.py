"""deploy/: the base and every overlay render with `kubectl kustomize`; every object passes
`kubernetes-validate --strict` (the Prometheus Operator's kinds, which it has no schema for, are
checked by promtool / amtool and by their cross-references); the default install's Deployment
passes the bot's own `serve --check` with only the Slack Secret created.

Outside CI a missing kubectl / promtool / amtool skips its test; in CI (CI set, see .ci/run) it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from builders import kubeconfig_for, require

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VARIANTS = ["base", "overlays/proposals-only", "overlays/approve", "overlays/prometheus-operator", "."]
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}
K8S_VERSION = "1.33.0"
# The one Secret a person creates (docs/install.md): nothing else.
SLACK_SECRET = {"bot-token": "xoxb-1-test", "app-token": "xapp-1-test", "channel": "C0TESTCHAN",
                "alert-token": "test-alert-token"}




def render(variant: str | Path) -> list[dict]:
    kubectl = require("kubectl")
    folder = variant if isinstance(variant, Path) else DEPLOY / variant
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_renders_and_validates_strictly(variant, tmp_path):
    objects = render(variant)
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "Deployment", "Service", "ConfigMap", "NetworkPolicy", "PodDisruptionBudget"} <= kinds
    assert "Secret" not in kinds  # Secret references only
    core = [o for o in objects if o["kind"] not in OPERATOR_KINDS]
    rendered = tmp_path / "core.yaml"
    rendered.write_text(yaml.safe_dump_all(core))
    validate = Path(sys.executable).with_name("kubernetes-validate")
    out = subprocess.run([str(validate), "--strict", "-k", K8S_VERSION, str(rendered)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed for resource") == len(core), out.stdout
    assert OPERATOR_KINDS & kinds == (OPERATOR_KINDS if variant.endswith("prometheus-operator") else set())
    for obj in objects:
        if obj["kind"] not in ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"].get("namespace") == "vllm-oncall", obj["metadata"]["name"]


def test_the_default_install_is_proposals_only():
    settings = next(o for o in render(".")
                    if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("vllm-oncall-settings"))
    assert settings["data"]["VLLM_ONCALL_MODE"] == "proposals-only"
    approve = next(o for o in render("overlays/approve")
                   if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("vllm-oncall-settings"))
    assert approve["data"]["VLLM_ONCALL_MODE"] == "approve"


def test_an_overlays_images_entry_sets_the_image(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "overlays" / "proposals-only", tmp_path)],
        "images": [{"name": "ghcr.io/your-org/vllm-oncall", "newName": "registry.example.com/ops/vllm-oncall",
                    "newTag": "1.2.3"}]}))
    container = one(render(tmp_path), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/ops/vllm-oncall:1.2.3"


def test_network_policy_lets_only_alertmanager_and_prometheus_in():
    objects = render(".")
    policy = one(objects, "NetworkPolicy")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    (rule,) = policy["spec"]["ingress"]
    assert sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in rule["from"]) == \
        ["alertmanager", "prometheus"]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and one(objects, "Deployment")["spec"]["replicas"] == 2


# ---- the bot's own config check on the rendered Deployment --------------------------------


def container_environment(objects: list[dict], secret: dict[str, str], mounts: Path) -> dict[str, str]:
    """The environment the kubelet would give the bot's container: envFrom ConfigMaps, then env
    (values, the namespace fieldRef, Secret keys; a missing required key stops the pod)."""
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config_maps = {o["metadata"]["name"]: o.get("data") or {} for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]])
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var["valueFrom"]:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            env[var["name"]] = "vllm-oncall"
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "vllm-oncall-slack"
            if ref["key"] in secret:
                env[var["name"]] = secret[ref["key"]]
            else:
                assert ref.get("optional"), f"the pod cannot start without the Secret key {ref['key']}"
    # ConfigMap volumes: written to a folder, and the paths in the environment pointed there.
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        cm = volumes[mount["name"]].get("configMap")
        if cm is None:
            continue
        folder = mounts / mount["name"]
        folder.mkdir(parents=True)
        for name, text in config_maps[cm["name"]].items():
            (folder / name).write_text(text)
        env = {k: v.replace(mount["mountPath"], str(folder)) for k, v in env.items()}
    return env



def serve_check(objects: list[dict], secret: dict[str, str], tmp_path: Path, server: str):
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = container_environment(objects, secret, tmp_path / "mounts")
    # The pod uses its service account; here the same calls go to the API stand-in.
    env.update({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": kubeconfig_for(server, tmp_path / "k")})
    return subprocess.run([sys.executable, "-m", "bot.cli", *container["args"], "--check", "--offline"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("variant", [".", "overlays/proposals-only", "overlays/prometheus-operator"])
def test_the_default_install_passes_serve_check_with_only_the_slack_secret(variant, kube_api, tmp_path):
    result = serve_check(render(variant), SLACK_SECRET, tmp_path, kube_api.url)
    assert result.returncode == 0, result.stderr
    assert "configuration OK: cluster my-cluster; mode proposals-only; Slack via Socket Mode" in result.stdout
    assert "(bearer token required)" in result.stdout and "kubernetes OK" in result.stdout


def test_the_approve_overlay_refuses_to_start_until_approvers_are_set(kube_api, tmp_path):
    objects = render("overlays/approve")
    result = serve_check(objects, SLACK_SECRET, tmp_path / "a", kube_api.url)
    assert result.returncode == 2 and "VLLM_ONCALL_APPROVERS: Slack user ids start with U or W" in result.stderr
    for obj in objects:
        if obj["kind"] == "ConfigMap" and "VLLM_ONCALL_APPROVERS" in (obj.get("data") or {}):
            obj["data"]["VLLM_ONCALL_APPROVERS"] = "U0ALICE,U0BOB"
    result = serve_check(objects, SLACK_SECRET, tmp_path / "b", kube_api.url)
    assert result.returncode == 0 and "mode approve" in result.stdout and "U0ALICE, U0BOB" in result.stdout


def test_without_the_alert_token_the_pod_does_not_start(tmp_path):
    secret = {k: v for k, v in SLACK_SECRET.items() if k != "alert-token"}
    with pytest.raises(AssertionError, match="cannot start without the Secret key alert-token"):
        container_environment(render("."), secret, tmp_path)


# ---- the Prometheus Operator objects -------------------------------------------------------


def operator_objects() -> list[dict]:
    return render("overlays/prometheus-operator")


def test_service_monitor_scrapes_the_bots_service():
    objects = operator_objects()
    monitor, service = one(objects, "ServiceMonitor"), one(objects, "Service")
    assert all(service["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_prometheus_rule_passes_promtool_and_its_alerts_fire_fast(tmp_path):
    promtool = require("promtool")
    rule = one(operator_objects(), "PrometheusRule")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    checked = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    settings = next(o for o in operator_objects() if o["metadata"]["name"].startswith("vllm-oncall-settings"))
    assert names == {"VLLMCrashLooping", "VLLMOOMKilled"}
    assert names <= set(settings["data"]["VLLM_ONCALL_ALERTNAMES"].split(","))  # the bot takes them
    annotations = {r["alert"]: expanded(r["annotations"]) for g in rule["spec"]["groups"] for r in g["rules"]}
    for case in RULE_TESTS["tests"][0]["alert_rule_test"]:
        for alert in case["exp_alerts"]:
            alert["exp_annotations"] = annotations[case["alertname"]]
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(RULE_TESTS))
    tested = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def expanded(annotations: dict[str, str]) -> dict[str, str]:
    """The annotations as Prometheus fills them in for ALERT_LABELS."""
    out = {}
    for key, text in annotations.items():
        for label, value in ALERT_LABELS.items():
            text = text.replace("{{ $labels." + label + " }}", value)
        out[key] = text
    return out


KSM = 'job="kube-state-metrics", namespace="inference", pod="llama-0", container="vllm"'
ALERT_LABELS = {"namespace": "inference", "pod": "llama-0", "container": "vllm", "severity": "warning"}
RULE_TESTS = {
    "rule_files": ["rules.yaml"],
    "evaluation_interval": "30s",
    "tests": [{
        "interval": "30s",
        "input_series": [
            {"series": f'kube_pod_container_status_waiting_reason{{{KSM}, reason="CrashLoopBackOff"}}',
             "values": "0 0 1x10"},
            {"series": f'kube_pod_container_info{{{KSM}, image="vllm/vllm-openai:v0.10.2"}}', "values": "1x12"},
            {"series": f'kube_pod_container_status_last_terminated_reason{{{KSM}, reason="OOMKilled"}}',
             "values": "0 0 1x10"},
            {"series": f"kube_pod_container_status_restarts_total{{{KSM}}}", "values": "0 0 1 1 2 2 3 3 3 3 3 3"},
            # the same crash in a container that is not vLLM: no alert
            {"series": 'kube_pod_container_status_waiting_reason{job="kube-state-metrics", namespace="web", '
                       'pod="nginx-0", container="nginx", reason="CrashLoopBackOff"}', "values": "1x12"},
            {"series": 'kube_pod_container_info{job="kube-state-metrics", namespace="web", pod="nginx-0", '
                       'container="nginx", image="nginx:1.27"}', "values": "1x12"},
        ],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "VLLMCrashLooping", "exp_alerts": []},
            # in CrashLoopBackOff from 1m: pending for one minute, firing at 2m
            {"eval_time": "2m", "alertname": "VLLMCrashLooping", "exp_alerts": [{"exp_labels": ALERT_LABELS}]},
            {"eval_time": "1m30s", "alertname": "VLLMOOMKilled", "exp_alerts": [{"exp_labels": ALERT_LABELS}]},
        ],
    }],
}


def test_alertmanager_examples_pass_amtool(tmp_path):
    amtool = require("amtool")
    plain = subprocess.run([amtool, "check-config", str(DEPLOY / "alertmanager-receiver-example.yaml")],
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    # The AlertmanagerConfig, written as the Alertmanager configuration the operator makes of it.
    config = tmp_path / "from-alertmanagerconfig.yaml"
    config.write_text(yaml.safe_dump(as_alertmanager_config(one(operator_objects(), "AlertmanagerConfig"))))
    converted = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert converted.returncode == 0, converted.stdout + converted.stderr


def as_alertmanager_config(amc: dict) -> dict:
    """The fields this AlertmanagerConfig uses, in alertmanager.yml's spelling."""
    route = amc["spec"]["route"]
    (receiver,) = amc["spec"]["receivers"]
    (hook,) = receiver["webhookConfigs"]
    auth = hook["httpConfig"]["authorization"]
    assert auth["type"] == "Bearer" and auth["credentials"] == {"name": "vllm-oncall-slack", "key": "alert-token"}
    return {
        "route": {"receiver": "default", "routes": [{
            "receiver": route["receiver"],
            "matchers": [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in route["matchers"]],
            "group_by": route["groupBy"], "group_wait": route["groupWait"], "group_interval": route["groupInterval"],
            "repeat_interval": route["repeatInterval"], "continue": route["continue"]}]},
        "receivers": [{"name": "default"}, {"name": receiver["name"], "webhook_configs": [{
            "url": hook["url"], "send_resolved": hook["sendResolved"], "max_alerts": hook["maxAlerts"],
            "http_config": {"authorization": {"type": auth["type"], "credentials": "from-the-secret"}}}]}],
    }


def test_the_alertmanagerconfig_and_the_plain_example_send_the_same_alerts_to_the_same_url():
    amc = one(operator_objects(), "AlertmanagerConfig")
    plain = yaml.safe_load((DEPLOY / "alertmanager-receiver-example.yaml").read_text())
    (matcher,) = amc["spec"]["route"]["matchers"]
    # The route for real alerts (the one before it stops the test alert at the bot).
    route = next(r for r in plain["route"]["routes"] if r.get("continue"))
    assert route["matchers"] == [f'alertname =~ "{matcher["value"]}"']
    url = next(r for r in plain["receivers"] if r["name"] == "vllm-oncall")["webhook_configs"][0]["url"]
    assert amc["spec"]["receivers"][0]["webhookConfigs"][0]["url"] == url
