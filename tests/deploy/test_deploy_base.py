"""deploy/: the kustomize base builds, every object validates against the Kubernetes schemas, and the
incident custom resource the bot writes validates against the CRD's own schema."""

from __future__ import annotations

from datetime import UTC, datetime

import jsonschema
import kubernetes_validate
import pytest
import yaml
from manifests import DEPLOY, built_objects

K8S_VERSION = "1.33"


@pytest.fixture(scope="module")
def objects():
    return built_objects()


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def test_every_object_validates_strictly(objects):
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                            "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "ConfigMap", "Deployment",
                            "Service", "NetworkPolicy", "PodDisruptionBudget"])
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_namespaced_objects_land_in_the_bots_namespace_and_no_secret_is_shipped(objects):
    assert not by_kind(objects, "Secret")
    assert [ns["metadata"]["name"] for ns in by_kind(objects, "Namespace")] == ["vllm-oncall"]
    for obj in objects:
        if obj["kind"] not in ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "vllm-oncall"


def test_bot_deployment_two_replicas_service_account_and_secret_references(objects):
    (dep,) = by_kind(objects, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "vllm-oncall"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["SLACK_BOT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "vllm-oncall-slack"
    assert all("value" not in env[n] for n in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET",
                                               "VLLM_ONCALL_ALERT_TOKEN"))
    assert not env["VLLM_ONCALL_ALERT_TOKEN"]["valueFrom"]["secretKeyRef"].get("optional")  # the token is required
    (svc,) = by_kind(objects, "Service")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())


def crd_schema(objects):
    (crd,) = by_kind(objects, "CustomResourceDefinition")
    (version,) = crd["spec"]["versions"]
    return crd, version


def test_crd_names_and_printer_columns(objects):
    crd, version = crd_schema(objects)
    assert crd["metadata"]["name"] == "vllmincidents.oncall.vllm.ai"
    assert crd["spec"]["names"]["plural"] == "vllmincidents" and crd["spec"]["scope"] == "Namespaced"
    assert version["name"] == "v1" and version["served"] and version["storage"]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"State", "Cause", "Approver", "Change", "Age"} <= set(columns)


def test_incident_objects_validate_against_the_crd_schema(objects):
    _, version = crd_schema(objects)
    schema = version["schema"]["openAPIV3Schema"]
    sample = {"apiVersion": "oncall.vllm.ai/v1", "kind": "VLLMIncident", "metadata": {"name": "x"},
              "spec": {"cluster": "prod", "namespace": "inference", "workload": "llama", "cause": "kv",
                       "state": "proposed", "approver": "", "change": "--max-model-len: 32768 -> 8192",
                       "record": "{}"}}
    jsonschema.validate(sample, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**sample, "spec": {**sample["spec"], "state": "exploded"}}, schema)

    from bot.app.records import Incident
    from bot.kube.incidents import to_custom_object

    now = datetime.now(UTC)
    for state in ("proposed", "approved", "rolled-back", "resolved"):
        obj = to_custom_object(Incident(name="n", cluster="c", namespace="ns", workload="w",
                                       cause=None, state=state, first_seen=now, last_seen=now))
        assert obj["kind"] == "VLLMIncident" and obj["apiVersion"] == "oncall.vllm.ai/v1"
        jsonschema.validate(obj, schema)


def test_alertmanager_receiver_example_points_at_the_bot():
    config = yaml.safe_load((DEPLOY / "alertmanager-receiver-example.yaml").read_text())
    receiver = next(r for r in config["receivers"] if r["name"] == "vllm-oncall")
    hook = receiver["webhook_configs"][0]
    assert hook["url"] == "http://vllm-oncall.vllm-oncall.svc:8080/alerts" and hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["type"] == "Bearer"
    test_route, route = config["route"]["routes"][:2]
    # first the test alert (vllm-oncall test-incident's Alertmanager twin), stopping at the bot
    assert test_route["receiver"] == "vllm-oncall" and test_route["continue"] is False
    assert test_route["matchers"] == [route["matchers"][0], 'vllm_oncall_test = "true"']
    assert route["receiver"] == "vllm-oncall"
    assert route["matchers"] == ['alertname =~ "KubePodCrashLooping|VLLMCrashLooping|VLLMOOMKilled"']


def test_slack_secret_example_is_a_valid_secret_with_placeholders_only():
    secret = yaml.safe_load((DEPLOY / "slack-secret.example.yaml").read_text())
    kubernetes_validate.validate(secret, K8S_VERSION, strict=True)
    assert all("REPLACE-ME" in v for v in secret["stringData"].values())
    # every key the Deployment requires is in the example
    dep = yaml.safe_load((DEPLOY / "base" / "deployment.yaml").read_text())
    required = {e["valueFrom"]["secretKeyRef"]["key"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
                if "secretKeyRef" in e.get("valueFrom", {}) and not e["valueFrom"]["secretKeyRef"].get("optional")}
    assert required == {"bot-token", "channel", "alert-token"} and required <= set(secret["stringData"])
