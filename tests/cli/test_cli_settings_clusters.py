"""VLLM_ONCALL_CLUSTERS: several clusters (kubeconfig contexts) in one process; every problem one
line naming the variable; unset, exactly the one cluster of VLLM_ONCALL_CLUSTER as before."""

from __future__ import annotations

import pytest
import yaml
from builders import kubeconfig_with
from kubeapi.objects import node

from bot.cli.settings import SettingsError, load_settings
from bot.cli.wiring import CheckFailed, check_dependencies

BASE = {"SLACK_BOT_TOKEN": "xoxb-1-2-abc", "SLACK_SIGNING_SECRET": "s", "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS",
        "VLLM_ONCALL_APPROVERS": "U0AAA", "VLLM_ONCALL_ALERT_TOKEN": "alert-tok"}


@pytest.fixture
def kubeconfig(tmp_path):
    return kubeconfig_with({"ctx-eu": "http://127.0.0.1:1", "ctx-us": "http://127.0.0.1:2"}, tmp_path / "kubeconfig")


def test_unset_is_the_one_cluster_as_before():
    s = load_settings({**BASE, "VLLM_ONCALL_CLUSTER": "prod", "VLLM_ONCALL_KUBE_CONTEXT": "ctx"})
    assert s.clusters == {} and s.contexts == {"prod": "ctx"} and s.cluster_label == "cluster"


def test_clusters_name_contexts_and_the_first_is_the_default(kubeconfig):
    s = load_settings({**BASE, "KUBECONFIG": kubeconfig, "VLLM_ONCALL_CLUSTERS": "prod-eu=ctx-eu, prod-us=ctx-us"})
    assert s.cluster_name == "prod-eu" and s.contexts == {"prod-eu": "ctx-eu", "prod-us": "ctx-us"}
    s = load_settings({**BASE, "KUBECONFIG": kubeconfig, "VLLM_ONCALL_CLUSTERS": "prod-eu=ctx-eu;prod-us=ctx-us",
                       "VLLM_ONCALL_CLUSTER": "prod-us", "VLLM_ONCALL_CLUSTER_LABEL": "k8s_cluster"})
    assert s.cluster_name == "prod-us" and list(s.contexts) == ["prod-us", "prod-eu"]
    assert s.cluster_label == "k8s_cluster"


def test_clusters_as_a_mapping_in_the_file(kubeconfig, tmp_path):
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"vllm_oncall_clusters": {"prod-eu": "ctx-eu", "prod-us": "ctx-us"}}))
    s = load_settings({**BASE, "KUBECONFIG": kubeconfig}, config_file=config)
    assert s.contexts == {"prod-eu": "ctx-eu", "prod-us": "ctx-us"}


def test_every_cluster_problem_is_one_line_naming_the_variable(kubeconfig):
    env = {**BASE, "KUBECONFIG": kubeconfig, "VLLM_ONCALL_CLUSTER": "gamma", "VLLM_ONCALL_KUBE_CONTEXT": "ctx-eu",
           "VLLM_ONCALL_CLUSTERS": "prod-eu=ctx-eu,prod-eu=ctx-us,Prod_US=ctx-us,lonely,prod-ap=ctx-ap"}
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    assert sorted(err.value.problems) == sorted([
        "VLLM_ONCALL_CLUSTERS: cluster name 'prod-eu' is given twice",
        "VLLM_ONCALL_CLUSTERS: cluster name 'Prod_US' must be a DNS label (lower-case letters, digits and '-', "
        "at most 63 characters)",
        "VLLM_ONCALL_CLUSTERS: 'lonely' is not NAME=CONTEXT (a cluster name and its kubeconfig context)",
        f"VLLM_ONCALL_CLUSTERS: cluster prod-ap: context 'ctx-ap' is not in the kubeconfig {kubeconfig} "
        "(it has ctx-eu, ctx-us)",
        "VLLM_ONCALL_KUBE_CONTEXT: not with VLLM_ONCALL_CLUSTERS (there each cluster names its context)",
        "VLLM_ONCALL_CLUSTER: the default cluster must be one of VLLM_ONCALL_CLUSTERS (prod-eu, prod-ap), "
        "not 'gamma'"])
    assert all("\n" not in p for p in err.value.problems)


@pytest.mark.parametrize("extra, expected", [
    ({"VLLM_ONCALL_STORE": "folder"}, "VLLM_ONCALL_CLUSTERS: needs VLLM_ONCALL_STORE=kube"),
    ({"VLLM_ONCALL_CLUSTER_SOURCE": "local", "VLLM_ONCALL_BUNDLE_DIR": "."},
     "VLLM_ONCALL_CLUSTERS: needs VLLM_ONCALL_CLUSTER_SOURCE=kube"),
    ({"KUBECONFIG": "/nonexistent/kubeconfig"}, "VLLM_ONCALL_CLUSTERS: no kubeconfig with contexts at "
                                                "/nonexistent/kubeconfig"),
    ({"VLLM_ONCALL_CLUSTER_LABEL": "k8s-cluster"}, "VLLM_ONCALL_CLUSTER_LABEL: must be a Prometheus label name"),
], ids=["folder-store", "local-source", "no-kubeconfig", "bad-label"])
def test_clusters_need_kube(kubeconfig, extra, expected):
    env = {**BASE, "KUBECONFIG": kubeconfig, "VLLM_ONCALL_CLUSTERS": "prod-eu=ctx-eu", **extra}
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    assert any(p.startswith(expected) for p in err.value.problems), err.value.problems


def test_serve_check_asks_every_cluster_and_names_the_one_that_refuses(kube_api, kube_api_b, tmp_path, monkeypatch):
    for kube in (kube_api, kube_api_b):
        kube.put(node())
    kubeconfig = kubeconfig_with({"ctx-eu": kube_api.url, "ctx-us": kube_api_b.url}, tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    settings = load_settings({**BASE, "KUBECONFIG": kubeconfig, "VLLM_ONCALL_CLUSTERS": "prod-eu=ctx-eu,prod-us=ctx-us",
                              "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall"})
    out = check_dependencies(settings, offline=True)
    assert "kubernetes OK: cluster prod-eu (context ctx-eu)" in out
    assert "kubernetes OK: cluster prod-us (context ctx-us)" in out
    kube_api_b.fail("list", "vllmincidents", 403)
    with pytest.raises(CheckFailed, match="the Kubernetes API of cluster prod-us \\(context ctx-us\\) refused"):
        check_dependencies(settings, offline=True)
