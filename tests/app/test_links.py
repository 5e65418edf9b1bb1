"""Links from settings (issue 18): the operator's runbook and dashboard URL templates per cluster,
checked when the settings are read, filled with URL-encoded names, and shown with the `kubectl`
commands that show the same evidence in the incident's details."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from builders import kubeconfig_with

from bot.app.links import LinkKind, LinkTemplates, expand, incident_links, template_problem
from bot.app.posting import with_links
from bot.app.records import Incident
from bot.app.state import IncidentState
from bot.cli.settings import SettingsError, load_settings
from bot.cli.wiring import policy_of
from bot.diagnosis.models import DiagnosisResult
from bot.diagnosis.redact import Redactor
from bot.slack.blocks import blocks_to_text, incident_thread

GOOD = {"VLLM_ONCALL_CLUSTER": "prod-eu", "SLACK_BOT_TOKEN": "xoxb-1-2-abc", "SLACK_SIGNING_SECRET": "s",
        "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0AAA"}
RUNBOOK = "https://wiki.example/runbooks/vllm/{namespace}/{workload}"
DASHBOARD = "https://grafana.example/d/vllm?var-namespace={namespace}&var-pod={pod}"


def incident(pod: str = "vllm-llama-7d9-abcde") -> Incident:
    now = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    return Incident(name="i-1", cluster="prod-eu", namespace="inference", workload="vllm-llama", cause="kv-cache",
                    state=IncidentState.DIAGNOSED, pods=[pod], first_seen=now, last_seen=now,
                    diagnosis=DiagnosisResult(cause="kv-cache", title="KV cache too small", explanation="",
                                              pod=pod, container="vllm"))


def test_names_are_url_encoded_whole():
    assert expand(RUNBOOK, {"namespace": "team a/b", "workload": "x&y=z"}) == \
        "https://wiki.example/runbooks/vllm/team%20a%2Fb/x%26y%3Dz"


@pytest.mark.parametrize(("template", "says"), [
    ("ftp://wiki.example/{namespace}", "must be an http:// or https:// URL with a host"),
    ("https:///{namespace}", "must be an http:// or https:// URL with a host"),
    ("{namespace}/runbook", "must be an http:// or https:// URL with a host"),
    ("https://wiki.example/{node}", "unknown placeholder {node}"),
    ("https://wiki.example/{namespace", "not a URL template"),
    ("https://wiki.example/a b/{pod}", "must not contain spaces"),
])
def test_a_bad_template_is_refused(template, says):
    assert says in (template_problem(template) or "")
    with pytest.raises(SettingsError) as info:
        load_settings({**GOOD, "VLLM_ONCALL_RUNBOOK_URL": template})
    assert "VLLM_ONCALL_RUNBOOK_URL" in str(info.value) and says in str(info.value) and "\n" not in str(info.value)


def test_templates_per_cluster_and_for_the_rest(tmp_path):
    kubeconfig = kubeconfig_with({"ctx-eu": "http://127.0.0.1:1", "ctx-us": "http://127.0.0.1:2"},
                                 tmp_path / "kubeconfig")
    settings = load_settings({**GOOD, "KUBECONFIG": kubeconfig, "VLLM_ONCALL_CLUSTERS": "prod-eu=ctx-eu,prod-us=ctx-us",
                              "VLLM_ONCALL_RUNBOOK_URL": RUNBOOK,
                              "VLLM_ONCALL_DASHBOARD_URL": json.dumps({"prod-us": DASHBOARD})})
    templates = policy_of(settings, Redactor()).links
    assert templates.template(LinkKind.RUNBOOK, "prod-us") == RUNBOOK
    assert templates.template(LinkKind.DASHBOARD, "prod-us") == DASHBOARD
    assert templates.template(LinkKind.DASHBOARD, "prod-eu") is None


def test_a_template_for_a_cluster_not_served_is_refused():
    with pytest.raises(SettingsError, match=r"VLLM_ONCALL_DASHBOARD_URL: no cluster named 'prod-us' is served"):
        load_settings({**GOOD, "VLLM_ONCALL_DASHBOARD_URL": json.dumps({"prod-us": DASHBOARD})})


def test_the_details_carry_the_links_and_the_kubectl_commands():
    settings = load_settings({**GOOD, "VLLM_ONCALL_RUNBOOK_URL": RUNBOOK, "VLLM_ONCALL_DASHBOARD_URL": DASHBOARD})
    shown = with_links(incident(), policy_of(settings, Redactor()).links)
    _, blocks = incident_thread(shown)
    [links] = [b for b in blocks if b.get("block_id") == "links"]
    text = links["text"]["text"]
    assert "<https://wiki.example/runbooks/vllm/inference/vllm-llama|Runbook>" in text
    assert "<https://grafana.example/d/vllm?var-namespace=inference&amp;var-pod=vllm-llama-7d9-abcde|Dashboard>" in text
    rendered = blocks_to_text(blocks)
    assert "kubectl -n inference logs vllm-llama-7d9-abcde -c vllm --previous" in rendered
    assert "kubectl -n inference describe pod vllm-llama-7d9-abcde" in rendered
    assert "kubectl -n inference get deployment vllm-llama -o yaml" in rendered


def test_without_templates_the_commands_are_still_shown_and_nothing_is_stored():
    shown = with_links(incident(), LinkTemplates())
    assert shown.links is not None and shown.links.links == [] and len(shown.links.commands) == 3
    assert "links" not in shown.model_dump(mode="json")  # derived from the settings when posting, never stored


def test_a_name_cannot_break_out_of_a_command():
    links = incident_links("c", "ns", "w", "StatefulSet", "p; rm -rf /", "vllm", LinkTemplates())
    assert "kubectl -n ns logs 'p; rm -rf /' -c vllm --previous" in links.commands
    assert "kubectl -n ns get statefulset w -o yaml" in links.commands
