"""Acceptance: nothing leaks. Every secret format of issue 9, placed in the crashing pod's log,
its container args and its env, never reaches the Slack stand-in, an Event, the audit
annotation, the incident object or the LLM stand-in; `<!channel>` / `@here` from the cluster
reach Slack only escaped. And yet Approve and Roll back write the exact spec, secrets included.

Everything is the real wiring (`serve`'s build_server from settings): the HTTP server takes the
alert, the real Kubernetes client reads the Kubernetes API stand-in, the Bolt app takes signed
clicks, the real Slack client posts to the Slack stand-in, the real OpenAI client asks the LLM
stand-in.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from builders import use_kubeconfig
from kubeapi.objects import container, crashing_deployment, rollout_controller
from openai_standin import OpenAIStandIn, wait_until
from slackapi.requests import button_value, click_body, signed_headers

from bot.cli.settings import load_settings
from bot.cli.wiring import build_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_LOG = (ROOT / "examples" / "incident" / "bundle" / "previous.log").read_text()
NEW_POD_LOG = "INFO 11-30 05:20:40 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000\n"
NS = "inference"
SIGNING = "redaction-signing-secret"

# Each secret appears in the log, and the argv/env ones in the container spec too.
SECRETS = {
    "aws key id": "AKIAQWERTYUIOPASDFGH",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvbmNhbGwtdGVzdCJ9.c2lnbmF0dXJlLXNlY3JldC12YWx1ZQ",
    "vllm api_key list": "vllmkey-LOGLIST-4f9a8b7c",
    "json password": "JsonPassw0rd-8c7d6e",
    "url password": "UrlPassw0rd-5b4a39",
    "x-api-key header": "xak-HEADER-1a2b3c4d5e",
    "google api key": "AIzaSyB-redactiontest0123456789abcdefgh",
    "pem key line": "MIIEowIBAAKCAQEA7redactionPEMbodyLINEsecretXYZ0123456789abcdefghijklmnopq",
    "--api-key arg": "argkey-SPACE-77aa88bb",
    "--hf-token arg": "hf_ArgTokenRedactionTest0123456789",
    "HF_TOKEN env": "hf_EnvTokenRedactionTest9876543210",
    "*_KEY env": "envkey-SERVICE-0f1e2d3c",
    "*PASSWORD* env": "envpw-DATABASE-9a8b7c",
    "*SECRET* env": "envsecret-CLIENT-6d5e4f",
    "url userinfo env": "EnvUrlPassw0rd-3c2b1a",
    "configured pattern": "acme-901234567",
}
S = SECRETS
SECRET_LOG = "\n".join([
    f"INFO 11-30 05:10:01 [s3.py:12] using AWS key {S['aws key id']} for the weights bucket",
    f"DEBUG 11-30 05:10:01 [auth.py:40] bearer token accepted: {S['jwt']}",
    f"INFO 11-30 05:10:01 [utils.py:326] non-default args: {{'model': 'meta-llama/Llama-3.1-8B-Instruct', "
    f"'api_key': ['{S['vllm api_key list']}'], 'max_model_len': 32768}}",
    f'INFO 11-30 05:10:02 [cfg.py:3] loaded {{"user": "svc", "password": "{S["json password"]}"}}',
    f"INFO 11-30 05:10:02 [db.py:9] connecting to postgres://svc:{S['url password']}@db.internal:5432/vllm",
    f"DEBUG 11-30 05:10:02 [http.py:88] request headers: x-api-key: {S['x-api-key header']}",
    f"INFO 11-30 05:10:03 [gcs.py:5] maps key {S['google api key']} loaded",
    "-----BEGIN RSA PRIVATE KEY-----",
    S["pem key line"],
    "-----END RSA PRIVATE KEY-----",
    f"INFO 11-30 05:10:03 [lic.py:1] license {S['configured pattern']} ok",
    "WARNING 11-30 05:10:04 [x.py:1] <!channel> @here please look",
]) + "\n"
ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9", "--api-key", S["--api-key arg"],
        f"--hf-token={S['--hf-token arg']}", "--served-model-name", "<!channel> @here",
        f"--download-dir=s3://k:{S['url password']}@bucket/x"]
ENV = [{"name": "HF_TOKEN", "value": S["HF_TOKEN env"]}, {"name": "SERVICE_KEY", "value": S["*_KEY env"]},
       {"name": "DB_PASSWORD", "value": S["*PASSWORD* env"]}, {"name": "CLIENT_SECRET", "value": S["*SECRET* env"]},
       {"name": "MIRROR", "value": f"https://svc:{S['url userinfo env']}@mirror.internal/"},
       {"name": "LICENSE", "value": S["configured pattern"]}]
COMMENT = "The KV cache holds 19,152 tokens, fewer than the 32,768 the model length needs."



@pytest.fixture
def world(kube_api, slack, tmp_path, monkeypatch):
    llm = OpenAIStandIn(reply=COMMENT)
    dep, pod = crashing_deployment(kube_api, name="vllm-secret", previous_log=EXAMPLE_LOG + SECRET_LOG,
                                   containers=[container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                                                         args=list(ARGS), env=[dict(e) for e in ENV])])
    kube_api.on_write = rollout_controller("ready", log=NEW_POD_LOG)
    use_kubeconfig(monkeypatch, kube_api.url, tmp_path)
    settings = load_settings({
        "VLLM_ONCALL_CLUSTER": "redaction-test", "SLACK_BOT_TOKEN": "xoxb-redaction", "SLACK_API_URL": slack.url,
        "SLACK_SIGNING_SECRET": SIGNING, "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0APPROVER",
        "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube", "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall",
        "VLLM_ONCALL_CLUSTER_SOURCE": "kube", "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "20",
        "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "0", "VLLM_ONCALL_VERIFY_REQUEST_TIMEOUT_SECONDS": "2",
        "VLLM_ONCALL_REDACT_PATTERNS": r"acme-\d{9}", "VLLM_ONCALL_LLM_BASE_URL": llm.url,
        "VLLM_ONCALL_LLM_MODEL": "stand-in",
        "VLLM_ONCALL_LLM_TIMEOUT_SECONDS": "60"})  # the stand-in answers at once; a loaded machine is slow
    server, _ = build_server(settings)
    server.start()
    yield {"kube": kube_api, "slack": slack, "bot": server, "llm": llm, "pod": pod["metadata"]["name"]}
    server.stop()
    llm.close()


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def alert(pod: str) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "receiver": "vllm-oncall", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am", "groupKey": "k", "alerts": [{"status": "firing", "labels": {
        "alertname": "KubePodCrashLooping", "namespace": NS, "pod": pod, "container": "vllm"}}]}).encode()


def click(world, action: str, incident: str, ts: str) -> None:
    body = click_body(action, incident, "U0APPROVER", ts)
    headers = {k: v[0] for k, v in signed_headers(body, SIGNING).items()}
    assert post(world["bot"].url + "/slack/events", body.encode(), headers) == 200


def slack_outputs(slack) -> list[str]:
    return [json.dumps(c.params, ensure_ascii=False) for c in slack.calls]


def cluster_outputs(kube) -> dict[str, list[str]]:
    events = [json.dumps(e, ensure_ascii=False) for e in kube.list("Event")
              if (e.get("source") or {}).get("component") == "vllm-oncall"]
    annotations = [json.dumps((d["metadata"].get("annotations") or {}), ensure_ascii=False)
                   for d in kube.list("Deployment")]
    incidents = [json.dumps(i, ensure_ascii=False) for i in kube.list("VLLMIncident")]
    return {"Event": events, "annotation": annotations, "incident object": incidents}


def test_no_secret_reaches_any_output_and_pings_are_escaped(world):
    kube, slack, bot, llm = world["kube"], world["slack"], world["bot"], world["llm"]
    assert post(bot.url + "/alerts", alert(world["pod"]), {"Content-Type": "application/json"}) == 200
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    wait_until(lambda: any("Commentary (AI" in json.dumps(r.params) for r in slack.replies()), 30,
               "the commentary in the thread")
    incident = kube.list("VLLMIncident")[0]
    name, ts = incident["metadata"]["name"], json.loads(incident["spec"]["record"])["slack_ts"]
    assert incident["spec"]["cause"] == "kv-cache-max-model-len" and incident["spec"]["state"] == "proposed"

    approve = button_value(slack.posts()[0], "vllm_approve")  # what the posted button carries
    assert approve and approve.startswith(name)
    click(world, "vllm_approve", approve, ts)  # the patch and its audit record and Event
    # Verification reports on the new pod (this stand-in's pod prints no KV-cache line, so the
    # verification stops at "Ready, no KV figures"): every reply it posts is searched too.
    wait_until(lambda: any("new pod" in json.dumps(r.params) for r in slack.replies()), 60,
               "the verification's report on the new pod")
    live = kube.get("Deployment", "vllm-secret", NS)["spec"]["template"]["spec"]["containers"][0]
    assert live["args"][:2] == ["--max-model-len", "18432"], live["args"]
    assert live["args"][2:] == ARGS[2:] and live["env"] == ENV, "the applied patch must keep every secret exact"

    click(world, "vllm_rollback", name, ts)  # the rollback restores the exact previous spec
    wait_until(lambda: any("Rolled back by" in json.dumps(r.params) for r in slack.replies()), 30,
               "the rollback's reply")
    live = kube.get("Deployment", "vllm-secret", NS)["spec"]["template"]["spec"]["containers"][0]
    assert live["args"] == ARGS and live["env"] == ENV
    bot.executor.wait_idle(30)

    outputs = {"Slack": slack_outputs(slack), **cluster_outputs(kube), "LLM": llm.bodies}
    assert all(outputs.values()), {k: len(v) for k, v in outputs.items()}  # every output was exercised
    assert len(outputs["Event"]) == 2, [(json.loads(e)["reason"], json.loads(e)["metadata"]["name"]) for e in outputs["Event"]]
    assert len(llm.bodies) == 1
    leaks = [(what, where) for what, secret in SECRETS.items() for where, texts in outputs.items()
             if any(secret in text for text in texts)]
    assert leaks == []
    # what the reader still sees: which settings were there, and the evidence
    slack_text = "\n".join(outputs["Slack"])
    assert "--api-key ***" in slack_text and "--hf-token=***" in slack_text
    assert "19,152" in slack_text or "19152" in slack_text
    # `<!channel>` from the log and the args: escaped in every Slack call; @here inert
    assert "<!channel>" not in slack_text and "&lt;!channel&gt;" in slack_text
    assert not re.search(r"@here\b", slack_text.replace("@\u2060here", "")), "an @here reached Slack bare"
