"""deploy/chart: Helm's own engine (helm-python-sdk embeds Helm v4's chart loader, renderer and
linter) lints and renders the chart for every values file in deploy/ (the chart's defaults, i.e.
proposals-only; values-approve.yaml; values-operator.yaml); every rendered object passes
kubernetes-validate --strict; the default role is read-only; approve mode adds exactly the verbs it
uses; the NetworkPolicy allows only what the bot needs; and the chart installs what the kustomize
base and overlays install.

"Write verb", as the RBAC tests mean it: any verb but get, list and watch, on anything but the
bot's own records (its VLLMIncident objects); and any access to pods/proxy, pods/exec,
pods/attach or pods/portforward (they reach into a workload). Outside CI a machine without
helm-python-sdk skips these tests; in CI (.ci/run) they fail.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from builders import kubeconfig_for
from manifests import built_objects

from bot.kube.rbac import APPROVE_ONLY, proposals_only_set, required_set

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "chart"
K8S_VERSION = "1.33.0"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}
READ_VERBS = {"get", "list", "watch"}
OWN_RECORDS = {("oncall.vllm.ai", "vllmincidents")}
INTO_WORKLOADS = {"pods/proxy", "pods/exec", "pods/attach", "pods/portforward"}
# What docs/install.md passes at install, besides a values file.
INSTALL = {"image": {"repository": "registry.example.com/ops/vllm-oncall"}, "cluster": "prod-eu",
           "slack": {"botToken": "xoxb-1-test", "appToken": "xapp-1-test", "channel": "C0TESTCHAN"}}
APPROVERS = {"approvers": ["U0ALICE", "U0BOB"]}
# Every values file in deploy/ (the chart's own values.yaml is the default) and what it needs added.
VALUES_FILES = {"default": (None, {}), "approve": ("values-approve.yaml", APPROVERS),
                "operator": ("values-operator.yaml", {})}


def helm():
    try:
        import helm_python
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("helm-python-sdk is required in CI (the dev extra installs it)")
        pytest.skip("helm-python-sdk is not installed (pip install -e '.[dev]')")
    return helm_python


def merged(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        for key, value in layer.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def values_for(variant: str, *extra: dict) -> dict:
    file, needs = VALUES_FILES[variant]
    from_file = yaml.safe_load((DEPLOY / file).read_text()) if file else {}
    return merged(from_file, INSTALL, needs, *extra)


def render(values: dict, name: str = "vllm-oncall", namespace: str = "vllm-oncall") -> list[dict]:
    with helm().Chart.load(CHART) as chart:
        manifests = chart.render(values, name=name, namespace=namespace, is_install=True)
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def granted(objects: list[dict]) -> dict[tuple[str, str, str], set[str | None]]:
    """(verb, apiGroup, resource) -> the namespaces it is granted in (None: cluster-wide), from
    every Role/ClusterRole bound to the bot's ServiceAccount."""
    bindings = [b for b in objects if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and {"kind": "ServiceAccount", "name": "vllm-oncall", "namespace": "vllm-oncall"} in b["subjects"]]
    out: dict[tuple[str, str, str], set[str | None]] = {}
    for binding in bindings:
        namespace = binding["metadata"].get("namespace")
        (role,) = [r for r in objects if r["kind"] == binding["roleRef"]["kind"]
                   and r["metadata"]["name"] == binding["roleRef"]["name"] and r["metadata"].get("namespace") == namespace]
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], "no wildcards"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.setdefault((verb, group, resource), set()).add(namespace)
    return out


def write_verbs(permissions) -> set[tuple[str, str, str]]:
    return {(verb, group, resource) for verb, group, resource in permissions
            if resource in INTO_WORKLOADS or (verb not in READ_VERBS and (group, resource) not in OWN_RECORDS)}


# ---- lint, render, validate: every values file --------------------------------------------


@pytest.mark.parametrize("variant", VALUES_FILES)
def test_the_chart_lints_clean_for_every_values_file(variant):
    report = helm().lint(CHART, values_for(variant), strict=True, namespace="vllm-oncall", kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == [] and report["total_charts_linted"] == 1
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # no warning, no error (icon: info)


@pytest.mark.parametrize("variant", VALUES_FILES)
def test_every_rendered_object_validates_strictly(variant, tmp_path):
    objects = render(values_for(variant))
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "ConfigMap", "Secret", "Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"} <= kinds
    assert OPERATOR_KINDS & kinds == (OPERATOR_KINDS if variant == "operator" else set())
    core = [o for o in objects if o["kind"] not in OPERATOR_KINDS]
    rendered = tmp_path / "core.yaml"
    rendered.write_text(yaml.safe_dump_all(core))
    validate = Path(sys.executable).with_name("kubernetes-validate")
    out = subprocess.run([str(validate), "--strict", "-k", K8S_VERSION, str(rendered)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed for resource") == len(core), out.stdout
    for obj in objects:
        if obj["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "vllm-oncall", obj["metadata"]["name"]


def test_the_charts_own_defaults_render_what_kustomize_does_with_no_secret():
    """`helm template deploy/chart` with no value given: the Secret is yours to make, as with kustomize."""
    objects = render({})
    assert "Secret" not in {o["kind"] for o in objects}
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in container(objects)["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"vllm-oncall-slack"}
    assert helm().lint(CHART, strict=True, namespace="vllm-oncall")["errors"] == []


def test_settings_that_cannot_work_stop_the_render_with_the_value_to_fix():
    errors = helm().HelmError
    cases = {
        "approvers or approverGroups: approve mode needs": values_for("approve", {"approvers": []}),
        'approvers: Slack user ids look like U0123ALICE (a U or W, then capitals and digits), not "alice"':
            values_for("approve", {"approvers": ["alice"]}),
        # values.schema.json: a value's shape, and a misspelt key
        "at '/mode': value must be one of 'proposals-only', 'approve'": values_for("default", {"mode": "auto"}),
        "at '/slack': additional properties 'bottoken' not allowed": values_for("default", {"slack": {"bottoken": "x"}}),
        "at '/image/digest': 'abc' does not match pattern": values_for("default", {"image": {"digest": "abc"}}),
        "slack.channel: the alert channel's id": values_for("default", {"slack": {"channel": ""}}),
        "slack.botToken and slack.existingSecret: set one": values_for("default", {"slack": {"existingSecret": "x"}}),
        "kubeconfigSecret: with clusters": values_for("default", {"clusters": {"prod-eu": "ctx-eu"}}),
        'cluster: the default cluster must be one of clusters (a, b), not "prod-eu"':
            values_for("default", {"clusters": {"a": "x", "b": "y"}, "kubeconfigSecret": "k"}),
    }
    for message, values in cases.items():
        with pytest.raises(errors) as info:
            render(values)
        assert message in str(info.value), str(info.value)


# ---- RBAC by mode ----------------------------------------------------------------------------


def test_the_default_renders_a_role_with_no_write_verb():
    permissions = granted(render(values_for("default")))
    assert write_verbs(permissions) == set()
    assert set(permissions) == proposals_only_set()
    # what it does write: its own incident records, in its own namespace only
    assert {p for p in permissions if p[0] not in READ_VERBS} == {("create", "oncall.vllm.ai", "vllmincidents"),
                                                                 ("patch", "oncall.vllm.ai", "vllmincidents")}
    assert permissions[("create", "oncall.vllm.ai", "vllmincidents")] == {"vllm-oncall"}
    assert all(namespaces == {None} for p, namespaces in permissions.items() if p[1:] not in OWN_RECORDS)


def test_the_write_verb_check_catches_each_write_the_approve_mode_adds():
    """The definition above, applied to approve mode: exactly APPROVE_ONLY are write verbs."""
    assert write_verbs(required_set()) == set(APPROVE_ONLY)


def test_approve_mode_adds_exactly_the_verbs_it_uses_cluster_wide_by_default():
    permissions = granted(render(values_for("approve")))
    assert set(permissions) == required_set()
    assert all(permissions[p] == {None} for p in APPROVE_ONLY)


def test_approve_mode_verifying_by_pod_ip_needs_no_pod_proxy():
    permissions = granted(render(values_for("approve", {"verifyRequestVia": "pod-ip"})))
    assert set(permissions) == required_set() - {("get", "", "pods/proxy"), ("create", "", "pods/proxy")}


def test_approve_mode_with_namespaces_grants_the_writes_there_only():
    permissions = granted(render(values_for("approve", {"rbac": {"namespaces": ["inference", "batch"]}})))
    assert set(permissions) == required_set()
    for permission in APPROVE_ONLY:
        assert permissions[permission] == {"inference", "batch"}, permission
    assert permissions[("get", "apps", "deployments")] == {None}  # reads stay cluster-wide


def test_the_kustomize_default_and_the_chart_default_grant_the_same():
    assert set(granted(built_objects())) == set(granted(render(values_for("default"))))


# ---- the NetworkPolicy ---------------------------------------------------------------------


def ports(rule: dict) -> set[tuple[str, int | str]]:
    return {(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]}


def egress(values: dict) -> list[dict]:
    policy = one(render(values), "NetworkPolicy")
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    for rule in policy["spec"]["egress"]:  # a rule with no `to` or no `ports` would allow anywhere / any port
        assert rule.get("to") and rule.get("ports"), rule
    return policy["spec"]["egress"]


def test_the_default_policy_allows_dns_the_api_server_and_slack_and_nothing_else():
    rules = egress(values_for("default"))
    assert len(rules) == 3
    dns, api, slack = rules
    assert ports(dns) == {("UDP", 53), ("TCP", 53)}
    assert {"k8s-app": "kube-dns"} == dns["to"][0]["podSelector"]["matchLabels"]
    assert {"cidr": "169.254.20.10/32"} in [t.get("ipBlock") for t in dns["to"]]  # NodeLocal DNSCache
    assert ports(api) == {("TCP", 443), ("TCP", 6443), ("TCP", 8443)}
    # helm template cannot read the cluster: the API server falls back to the private ranges, never anywhere
    assert all(ipaddress.ip_network(t["ipBlock"]["cidr"]).is_private for t in api["to"])
    assert ports(slack) == {("TCP", 443)}
    (public,) = slack["to"]
    assert public["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(public["ipBlock"]["except"])


def test_the_api_server_address_from_the_values_replaces_the_fallback():
    rules = egress(values_for("default", {"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.1/32"], "ports": [6443]}}}))
    assert rules[1]["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}] and ports(rules[1]) == {("TCP", 6443)}


def test_prometheus_the_llm_and_pod_ip_verification_are_allowed_only_when_configured():
    configured = values_for("default", {"prometheus": {"url": "http://prometheus.monitoring.svc:9090"},
                                        "llm": {"baseUrl": "http://llm.inference.svc:8000/v1"},
                                        "verifyRequestVia": "pod-ip",
                                        "networkPolicy": {"vllmPods": {"to": [{"namespaceSelector": {
                                            "matchLabels": {"kubernetes.io/metadata.name": "inference"}}}]}}})
    rules = egress(configured)
    assert len(rules) == 6
    prometheus, llm, pods = rules[3:]
    assert ports(prometheus) == {("TCP", 9090)}
    assert prometheus["to"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert ports(llm) == {("TCP", 8000)}
    assert ports(pods) == {("TCP", 8000)} and pods["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "inference"}
    settings = next(o for o in render(configured) if o["metadata"]["name"] == "vllm-oncall-settings")["data"]
    assert settings["VLLM_ONCALL_PROMETHEUS_URL"] == "http://prometheus.monitoring.svc:9090"
    assert settings["VLLM_ONCALL_LLM_BASE_URL"] == "http://llm.inference.svc:8000/v1"
    assert settings["VLLM_ONCALL_VERIFY_REQUEST_VIA"] == "pod-ip"


def test_only_the_configured_sources_reach_the_bots_port():
    objects = render(values_for("default"))
    policy, service = one(objects, "NetworkPolicy"), one(objects, "Service")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    (rule,) = policy["spec"]["ingress"]
    assert ports(rule) == {("TCP", "http")} and [p["name"] for p in service["spec"]["ports"]] == ["http"]
    assert sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in rule["from"]) == \
        ["alertmanager", "prometheus"]


def test_the_kustomize_base_policy_denies_the_same_way():
    policy = one(built_objects(), "NetworkPolicy")
    for rule in policy["spec"]["egress"]:
        assert rule.get("to") and rule.get("ports"), rule
    assert [ports(r) for r in policy["spec"]["egress"]] == [ports(r) for r in egress(values_for("default"))]


# ---- image, Secret, settings -------------------------------------------------------------


def container(objects: list[dict]) -> dict:
    (found,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return found


def test_image_by_tag_or_by_digest_and_pull_secrets():
    assert container(render(values_for("default")))["image"] == "registry.example.com/ops/vllm-oncall:0.1.0"
    digest = "sha256:" + "ab" * 32
    objects = render(values_for("default", {"image": {"digest": digest, "tag": "ignored"},
                                            "imagePullSecrets": [{"name": "my-registry"}]}))
    assert container(objects)["image"] == f"registry.example.com/ops/vllm-oncall@{digest}"
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "my-registry"}]


def test_the_chart_makes_the_secret_from_the_tokens_or_reads_yours():
    objects = render(values_for("default"))
    secret = one(objects, "Secret")["stringData"]
    assert secret["bot-token"] == "xoxb-1-test" and secret["channel"] == "C0TESTCHAN"
    assert len(secret["alert-token"]) == 48  # generated: Alertmanager reads it from here
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container(objects)["env"] if "secretKeyRef" in
            e.get("valueFrom", {})}
    assert {r["name"] for r in refs.values()} == {"vllm-oncall-slack"} and not refs["VLLM_ONCALL_ALERT_TOKEN"].get("optional")
    yours = render(values_for("default", {"slack": {"botToken": "", "existingSecret": "team-slack"}}))
    assert not [o for o in yours if o["kind"] == "Secret"]
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in container(yours)["env"]
            if "secretKeyRef" in e.get("valueFrom", {})} == {"team-slack"}


def test_probes_are_the_images_healthcheck_for_kubernetes():
    bot = container(render(values_for("default")))
    assert bot["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert bot["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_several_clusters_mount_the_kubeconfig_and_name_every_context():
    objects = render(values_for("default", {"clusters": {"prod-eu": "ctx-eu", "prod-us": "ctx-us"},
                                            "kubeconfigSecret": "kubeconfigs"}))
    settings = next(o for o in objects if o["metadata"]["name"] == "vllm-oncall-settings")["data"]
    assert settings["VLLM_ONCALL_CLUSTERS"] == "prod-eu=ctx-eu,prod-us=ctx-us"
    assert settings["VLLM_ONCALL_CLUSTER"] == "prod-eu" and settings["VLLM_ONCALL_CLUSTER_SOURCE"] == "kube"
    mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "kubeconfig")
    assert settings["KUBECONFIG"] == mount["mountPath"] + "/config"


# ---- the same install as kustomize ---------------------------------------------------------


def kustomize_settings() -> dict[str, str]:
    return next(o for o in built_objects() if o["metadata"]["name"].startswith("vllm-oncall-settings"))["data"]


def test_the_chart_installs_what_kustomize_installs():
    chart, kustomize = render(values_for("default", {"cluster": "my-cluster"})), built_objects()
    assert {o["kind"] for o in kustomize} - {"Namespace"} == {o["kind"] for o in chart} - {"Secret"}
    assert one(chart, "CustomResourceDefinition")["spec"] == one(kustomize, "CustomResourceDefinition")["spec"]
    settings = next(o for o in chart if o["metadata"]["name"] == "vllm-oncall-settings")["data"]
    assert {k: v for k, v in settings.items() if k != "VLLM_ONCALL_VERIFY_REQUEST_VIA"} == kustomize_settings()
    ours, theirs = container(chart), container(kustomize)
    for key in ("args", "ports", "readinessProbe", "livenessProbe", "resources", "securityContext", "volumeMounts"):
        assert ours[key] == theirs[key], key
    assert [e["name"] for e in ours["env"]] == [e["name"] for e in theirs["env"]]
    pod = one(chart, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == one(kustomize, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert one(chart, "Deployment")["spec"]["replicas"] == 2 and one(chart, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_the_operator_objects_are_the_kustomize_components():
    chart = render(values_for("operator"))
    component = built_objects(DEPLOY / "overlays" / "prometheus-operator")
    assert one(chart, "PrometheusRule")["spec"] == one(component, "PrometheusRule")["spec"]
    assert one(chart, "AlertmanagerConfig")["spec"] == one(component, "AlertmanagerConfig")["spec"]
    ours, theirs = one(chart, "ServiceMonitor"), one(component, "ServiceMonitor")
    assert ours["spec"]["endpoints"] == theirs["spec"]["endpoints"]
    assert ours["metadata"]["labels"]["release"] == theirs["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = one(chart, "Service")
    assert all(service["metadata"]["labels"].get(k) == v for k, v in ours["spec"]["selector"]["matchLabels"].items())


def test_the_default_install_passes_serve_check(kube_api, tmp_path):
    """The bot's own configuration check on the chart's Deployment, with the chart's Secret."""
    from test_deploy_overlays import container_environment

    objects = render(values_for("default"))
    secret = one(objects, "Secret")["stringData"]
    env = container_environment(objects, secret, tmp_path / "mounts")
    env.update({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": kubeconfig_for(kube_api.url, tmp_path / "k")})
    done = subprocess.run([sys.executable, "-m", "bot.cli", *container(objects)["args"], "--check", "--offline"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "configuration OK: cluster prod-eu; mode proposals-only; Slack via Socket Mode" in done.stdout
