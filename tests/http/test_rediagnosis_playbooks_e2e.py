"""A new pod that crashes during verification is diagnosed with the operator's own playbooks
(VLLM_ONCALL_PLAYBOOKS), like the first crash: one diagnoser, passed from the service to the
rollout's every step (issue 16). Through `serve`'s own wiring (build_server from settings): the
alert over HTTP, the real Kubernetes client against the API stand-in, a signed Approve click, the
Slack stand-in."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from builders import EXAMPLE_LOG, use_kubeconfig
from kubeapi.objects import container, crashing_deployment, rollout_controller
from openai_standin import wait_until
from slackapi.requests import button_value, click_body, signed_headers

from bot.cli.settings import load_settings
from bot.diagnosis.playbooks import DEFAULT_DIR

try:  # main moved the composition root to bot/cli/wiring.py while this branch was open
    from bot.cli.wiring import build_server
except ImportError:
    from bot.cli.serve import build_server  # type: ignore[attr-defined,no-redef]

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GRAPH_LOG = (ROOT / "tests" / "fixtures" / "bundles" / "graph-v1-0.11-piecewise-hint" / "previous.log").read_text()
SITE_TITLE = "Site runbook RB-17 - CUDA graph capture ran out of GPU memory"
SIGNING, NS = "rediagnosis-signing-secret", "inference"


@pytest.fixture
def world(kube_api, slack, tmp_path, monkeypatch):
    books = tmp_path / "site-playbooks"
    books.mkdir()
    bundled = (DEFAULT_DIR / "cuda-graph-capture.yaml").read_text()
    (books / "cuda-graph-capture.yaml").write_text(bundled.replace(bundled.splitlines()[1], f"title: {SITE_TITLE}"))
    _, pod = crashing_deployment(kube_api, name="vllm-site", previous_log=EXAMPLE_LOG, containers=[
        container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                  args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])])
    kube_api.on_write = rollout_controller("crashloop", previous_log=GRAPH_LOG)  # the fixed pod crashes otherwise
    use_kubeconfig(monkeypatch, kube_api.url, tmp_path)
    settings = load_settings({
        "VLLM_ONCALL_CLUSTER": "site", "SLACK_BOT_TOKEN": "xoxb-site", "SLACK_API_URL": slack.url,
        "SLACK_SIGNING_SECRET": SIGNING, "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0APPROVER",
        "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube", "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall",
        "VLLM_ONCALL_CLUSTER_SOURCE": "kube", "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "20",
        "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "0", "VLLM_ONCALL_PLAYBOOKS": str(books)})
    server, _ = build_server(settings)
    server.start()
    yield {"kube": kube_api, "slack": slack, "bot": server, "pod": pod["metadata"]["name"]}
    server.stop()


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as answer:
        return answer.status


def test_a_pod_crashing_in_verification_is_diagnosed_with_the_operators_playbooks(world):
    kube, slack, bot = world["kube"], world["slack"], world["bot"]
    alert = {"version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {
        "alertname": "KubePodCrashLooping", "namespace": NS, "pod": world["pod"], "container": "vllm"}}]}
    assert post(bot.url + "/alerts", json.dumps(alert).encode(), {"Content-Type": "application/json"}) == 200
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    incident = kube.list("VLLMIncident")[0]
    ts = json.loads(incident["spec"]["record"])["slack_ts"]

    body = click_body("vllm_approve", button_value(slack.posts()[0], "vllm_approve"), "U0APPROVER", ts)
    headers = {k: v[0] for k, v in signed_headers(body, SIGNING).items()}
    assert post(bot.url + "/slack/events", body.encode(), headers) == 200
    wait_until(lambda: any("crashed again" in json.dumps(r.params) for r in slack.replies()), 60,
               "the verification's report of the new crash")

    crashed = next(json.dumps(r.params) for r in slack.replies() if "crashed again" in json.dumps(r.params))
    assert SITE_TITLE in crashed  # the operator's playbook, not only the bundled one
    bot.executor.wait_idle(30)
