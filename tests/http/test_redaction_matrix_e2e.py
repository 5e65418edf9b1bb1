"""Issue 17 item 7 through `serve`'s real wiring: each of the 49 secret formats of
tests/secret_formats.py placed in the crashing pod (its log, the vLLM container's args and env,
a sidecar's `sh -c` command), the incident taken from alert to Approve, verification and Roll
back, and then no secret at any sink: the Slack message, its thread replies, Events, the
workload's audit annotation, the incident object, the LLM request, the bot's own log, /metrics.
"""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
from builders import use_kubeconfig
from kubeapi.objects import container, crashing_deployment
from kubeapi.vllmpod import ScriptedVllm
from openai_standin import OpenAIStandIn, wait_until
from secret_formats import FORMATS
from slackapi.requests import button_value
from test_redaction_e2e import EXAMPLE_LOG, click, cluster_outputs, post
from test_redaction_e2e import alert as alert_body
from test_untrusted_text_e2e import serving_rollout

from bot.cli.settings import load_settings
from bot.cli.wiring import build_server

pytestmark = pytest.mark.integration

NS = "inference"
SIGNING = "redaction-signing-secret"  # what test_redaction_e2e.click signs with
ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]
LOG = EXAMPLE_LOG + "\n".join(f"INFO 11-30 05:10:{i:02d} [x.py:1] {f.log}" for i, f in enumerate(FORMATS)
                              if f.log is not None) + "\n"
FLAG_ARGS = [a for f in FORMATS if f.args and f.args[0].startswith("--") for a in f.args]
SIDECAR = next(list(f.args) for f in FORMATS if f.args and not f.args[0].startswith("--"))
ENV = [{"name": f.env[0], "value": f.env[1]} for f in FORMATS if f.env is not None]
SINKS = ("Slack message", "thread reply", "Event", "annotation", "incident object", "LLM", "logs", "metrics")


@pytest.fixture
def world(kube_api, slack, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    llm = OpenAIStandIn(reply="The KV cache holds 19,152 tokens, fewer than the 32,768 the model length needs.")
    vllm = ScriptedVllm(model="meta-llama/Llama-3.1-8B-Instruct").start()
    _, pod = crashing_deployment(kube_api, name="vllm-matrix", previous_log=LOG, containers=[
        container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], args=ARGS + FLAG_ARGS,
                  env=[dict(e) for e in ENV]),
        container(command=SIDECAR, name="db-init")])
    kube_api.on_write = serving_rollout(vllm)
    use_kubeconfig(monkeypatch, kube_api.url, tmp_path)
    settings = load_settings({
        "VLLM_ONCALL_CLUSTER": "matrix", "SLACK_BOT_TOKEN": "xoxb-matrix", "SLACK_API_URL": slack.url,
        "SLACK_SIGNING_SECRET": SIGNING, "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0APPROVER",
        "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube", "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall",
        "VLLM_ONCALL_CLUSTER_SOURCE": "kube", "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "20",
        "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "0", "VLLM_ONCALL_VERIFY_REQUEST_TIMEOUT_SECONDS": "2",
        "VLLM_ONCALL_LLM_BASE_URL": llm.url, "VLLM_ONCALL_LLM_MODEL": "stand-in"})
    server, _ = build_server(settings)
    server.start()
    yield {"kube": kube_api, "slack": slack, "bot": server, "llm": llm, "pod": pod["metadata"]["name"]}
    server.stop()
    llm.close()
    vllm.stop()


def test_no_format_reaches_any_sink(world, caplog):
    kube, slack, bot, llm = world["kube"], world["slack"], world["bot"], world["llm"]
    assert post(bot.url + "/alerts", alert_body(world["pod"]), {"Content-Type": "application/json"}) == 200
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    wait_until(lambda: any("Commentary (AI" in json.dumps(r.params) for r in slack.replies()), 30, "the commentary")
    incident = kube.list("VLLMIncident")[0]
    name, ts = incident["metadata"]["name"], json.loads(incident["spec"]["record"])["slack_ts"]
    click(world, "vllm_approve", button_value(slack.posts()[0], "vllm_approve"), ts)
    wait_until(lambda: json.loads(kube.list("VLLMIncident")[0]["spec"]["record"])["state"] == "verified", 60,
               "the verification")
    live = kube.get("Deployment", "vllm-matrix", NS)["spec"]["template"]["spec"]["containers"]
    assert live[0]["args"][:2] == ["--max-model-len", "18432"] and live[0]["env"] == ENV  # applied exactly
    click(world, "vllm_rollback", name, ts)
    wait_until(lambda: any("Rolled back by" in json.dumps(r.params) for r in slack.replies()), 30, "the rollback")
    bot.executor.wait_idle(30)
    with urllib.request.urlopen(bot.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()

    cluster = cluster_outputs(kube)
    sinks = {
        "Slack message": [json.dumps(c.params, ensure_ascii=False) for c in slack.calls
                          if not c.params.get("thread_ts")],
        "thread reply": [json.dumps(c.params, ensure_ascii=False) for c in slack.calls if c.params.get("thread_ts")],
        "Event": cluster["Event"], "annotation": cluster["annotation"], "incident object": cluster["incident object"],
        "LLM": llm.bodies, "logs": [r.getMessage() + (r.exc_text or "") for r in caplog.records], "metrics": [metrics],
    }
    assert set(sinks) == set(SINKS) and all(sinks.values()), {k: len(v) for k, v in sinks.items()}
    # a sink's JSON escapes some characters: compare with both spellings
    leaks = [(fmt.name, sink) for fmt in FORMATS for secret in fmt.secrets for sink, texts in sinks.items()
             if any(secret in text or json.dumps(secret)[1:-1] in text for text in texts)]
    assert leaks == [], f"{len(set(leaks))} (format, sink) leaks: {sorted(set(leaks))}"
