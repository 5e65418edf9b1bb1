"""Issue 17, items 4, 6 and 8 through `serve`'s real wiring: text the cluster's users, the served
model's users and the LLM write is input, never a decision.

- 4: a user's prompt, printed by vLLM's request logger, quotes the KV-cache error with
  "KV cache (1024)"; the pod is then OOMKilled. No `--max-model-len 1024`, and no prompt text as
  evidence, anywhere the bot writes.
- 6: `/vllm why` by someone in the alert channel who may not approve leaves a verified incident
  verified (Roll back still works) and a rejected proposal rejected (no second message with
  Approve/Reject); an approver's `/vllm why` still re-diagnoses.
- 8: the LLM's `<@U...>`, `<#C...>` and links are removed before Slack; a persuasive reply with
  no imperative ("the on-call lead already agreed") is dropped.

Everything is the real wiring (build_server from settings): the HTTP server takes the alert, the
real Kubernetes client reads the Kubernetes API stand-in, the Bolt app takes signed clicks and
commands, the real Slack client posts to the Slack stand-in, the real OpenAI client asks the
OpenAI stand-in.
"""

from __future__ import annotations

import json

import pytest
from builders import use_kubeconfig
from kubeapi.objects import container, crashing_deployment, rollout_controller
from kubeapi.vllmpod import ScriptedVllm
from openai_standin import OpenAIStandIn, wait_until
from slackapi.requests import button_value, click_body, command_body, signed_headers
from test_redaction_e2e import EXAMPLE_LOG, alert, post

from bot.cli.settings import load_settings
from bot.cli.wiring import build_server

pytestmark = pytest.mark.integration

NS = "inference"
SIGNING = "untrusted-text-signing-secret"
APPROVER, STRANGER = "U0APPROVER", "U0STRANGER"
ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]
NEW_POD_LOG = ("INFO 11-30 05:20:14 [gpu_worker.py:298] Available KV cache memory: 2.34 GiB\n"
               "INFO 11-30 05:20:14 [kv_cache_utils.py:864] GPU KV cache size: 19,152 tokens\n"
               "INFO 11-30 05:20:14 [kv_cache_utils.py:868] Maximum concurrency for 18,432 tokens per request: 1.04x\n"
               "INFO 11-30 05:20:40 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000\n")
FINE = "The KV cache holds 19,152 tokens, fewer than the 32,768 the model length needs."


def serving_rollout(vllm: ScriptedVllm):
    """The rollout controller, and every new pod it starts answering completions through the proxy."""
    roll = rollout_controller("ready", log=NEW_POD_LOG)

    def hook(fake, new, old):
        roll(fake, new, old)
        for pod in fake.list("Pod"):
            if pod["metadata"]["name"].endswith("-newpd"):
                fake.serve_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], vllm.url)

    return hook


def serve(kube_api, slack, tmp_path, monkeypatch, reply: str = FINE):
    llm = OpenAIStandIn(reply=reply)
    use_kubeconfig(monkeypatch, kube_api.url, tmp_path)
    settings = load_settings({
        "VLLM_ONCALL_CLUSTER": "untrusted", "SLACK_BOT_TOKEN": "xoxb-untrusted", "SLACK_API_URL": slack.url,
        "SLACK_SIGNING_SECRET": SIGNING, "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": APPROVER,
        "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube", "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall",
        "VLLM_ONCALL_CLUSTER_SOURCE": "kube", "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "20",
        "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "0", "VLLM_ONCALL_VERIFY_REQUEST_TIMEOUT_SECONDS": "2",
        "VLLM_ONCALL_LLM_BASE_URL": llm.url, "VLLM_ONCALL_LLM_MODEL": "stand-in"})
    server, _ = build_server(settings)
    server.start()
    return server, llm


@pytest.fixture
def world(kube_api, slack, tmp_path, monkeypatch):
    made: list = []

    vllm = ScriptedVllm(model="meta-llama/Llama-3.1-8B-Instruct").start()
    kube_api.on_write = serving_rollout(vllm)

    def start(reply: str = FINE):
        server, llm = serve(kube_api, slack, tmp_path, monkeypatch, reply)
        made.append((server, llm))
        return server, llm

    yield start
    for server, llm in made:
        server.stop()
        llm.close()
    vllm.stop()


def deploy(kube_api, name: str, log: str = EXAMPLE_LOG, **kw):
    _, pod = crashing_deployment(kube_api, name=name, previous_log=log, containers=[
        container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], args=list(ARGS))], **kw)
    return pod


def signed(bot, body: str) -> None:
    headers = {k: v[0] for k, v in signed_headers(body, SIGNING).items()}
    assert post(bot.url + "/slack/events", body.encode(), headers) == 200


def record(kube_api, workload: str) -> dict:
    [incident] = [i for i in kube_api.list("VLLMIncident") if i["spec"]["workload"] == workload]
    return json.loads(incident["spec"]["record"])


def everything_slack_got(slack) -> str:
    return "\n".join(json.dumps(c.params, ensure_ascii=False) for c in slack.calls)


# ---- item 4: a prompt in the log ------------------------------------------------------------

QUOTED = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
          "stored in KV cache (1024). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
          "initializing the engine.")
SERVING_THEN_KILLED = "\n".join([
    "INFO 11-30 05:00:00 [api_server.py:1971] vLLM API server version 0.11.0",
    "INFO 11-30 05:00:30 [gpu_model_runner.py:2653] Model loading took 14.99 GiB and 8.2 seconds",
    "INFO 11-30 05:00:40 [gpu_worker.py:298] Available KV cache memory: 55.10 GiB",
    "INFO 11-30 05:00:40 [kv_cache_utils.py:864] GPU KV cache size: 451,392 tokens",
    "INFO 11-30 05:00:40 [kv_cache_utils.py:868] Maximum concurrency for 32,768 tokens per request: 13.78x",
    "INFO 11-30 05:00:50 [api_server.py:1000] Starting vLLM API server 0 on http://0.0.0.0:8000",
    "INFO:     Application startup complete.",
    f"INFO 11-30 05:01:10 [logger.py:39] Received request cmpl-7f3a-0: prompt: {QUOTED!r}, params: "
    "SamplingParams(n=1, temperature=0.7, max_tokens=256), prompt_token_ids: [128000, 1150, 25], lora_request: None.",
    f"(APIServer pid=1) DEBUG 11-30 05:01:11 [logger.py:50] Request cmpl-7f3b details: prompt: {QUOTED!r}, "
    "prompt_token_ids: [128000], prompt_embeds shape: None.",
    'INFO:     10.0.0.7:51234 - "POST /v1/completions HTTP/1.1" 200 OK',
]) + "\n"


def test_a_prompt_quoting_vllms_error_never_picks_the_fix_nor_is_quoted(world, kube_api, slack):
    pod = deploy(kube_api, "vllm-prompted", log=SERVING_THEN_KILLED, events=False, exit_code=137)
    live = kube_api.get("Pod", pod["metadata"]["name"], NS)
    live["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"] = "OOMKilled"
    kube_api.put(live)
    bot, llm = world()
    assert post(bot.url + "/alerts", alert(pod["metadata"]["name"]), {"Content-Type": "application/json"}) == 200
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    bot.executor.wait_idle(30)
    incident = record(kube_api, "vllm-prompted")
    assert incident["diagnosis"]["cause"] != "kv-cache-max-model-len", incident["diagnosis"]["cause"]
    changes = (incident.get("proposal") or {}).get("changes") or []
    assert all(c.get("after") != "1024" for c in changes), changes
    # Neither the message, the thread, the diagnosis kept in the incident object nor what the
    # model is shown quotes the prompt (the incident keeps the log itself for /vllm why, which
    # reads it the same way).
    written = {"Slack": everything_slack_got(slack), "diagnosis": json.dumps(incident["diagnosis"]),
               "proposal": json.dumps(incident.get("proposal")), "LLM": "\n".join(llm.bodies)}
    quoted = {where: text for where, text in written.items()
              if "KV cache (1024)" in text or "Received request" in text or "prompt:" in text}
    assert quoted == {}, list(quoted)
    live_args = kube_api.get("Deployment", "vllm-prompted", NS)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert live_args == ARGS


# ---- item 6: /vllm why by someone who may not approve ----------------------------------------

def test_why_by_a_non_approver_never_moves_a_verified_incident_nor_revives_a_rejected_one(world, kube_api, slack):
    verified_pod = deploy(kube_api, "vllm-verified")
    rejected_pod = deploy(kube_api, "vllm-rejected")
    bot, _ = world()
    for pod in (verified_pod, rejected_pod):
        assert post(bot.url + "/alerts", alert(pod["metadata"]["name"]), {"Content-Type": "application/json"}) == 200
    wait_until(lambda: len(slack.posts()) == 2, 30, "both incident messages")
    by_workload = {w: record(kube_api, w) for w in ("vllm-verified", "vllm-rejected")}

    def button(workload: str, action: str) -> str:
        for p in slack.posts():
            value = button_value(p, action)
            if value and value.startswith(kube_name(workload)):
                return value
        raise AssertionError(f"no {action} button for {workload}")

    def kube_name(workload: str) -> str:
        [obj] = [i for i in kube_api.list("VLLMIncident") if i["spec"]["workload"] == workload]
        return obj["metadata"]["name"]

    good, bad = by_workload["vllm-verified"], by_workload["vllm-rejected"]
    signed(bot, click_body("vllm_approve", button("vllm-verified", "vllm_approve"), APPROVER, good["slack_ts"]))
    wait_until(lambda: record(kube_api, "vllm-verified")["state"] == "verified", 60, "the verification")
    signed(bot, click_body("vllm_reject", button("vllm-rejected", "vllm_reject"), APPROVER, bad["slack_ts"]))
    wait_until(lambda: record(kube_api, "vllm-rejected")["state"] == "rejected", 30, "the rejection")
    bot.executor.wait_idle(30)
    top_level_before = len(slack.posts())

    for workload in ("vllm-verified", "vllm-rejected"):  # in the alert channel: anyone may ask
        signed(bot, command_body(f"why {NS}/{workload}", STRANGER))

    def answered() -> bool:  # told why not, or (the attack) re-diagnosed
        told = [c for c in slack.delivered("chat.postEphemeral") if c.params.get("user") == STRANGER]
        states = (record(kube_api, "vllm-verified")["state"], record(kube_api, "vllm-rejected")["state"])
        return len(told) == 2 or states != ("verified", "rejected")

    wait_until(answered, 30, "both answers to the stranger")
    bot.executor.wait_idle(30)
    assert record(kube_api, "vllm-verified")["state"] == "verified"
    assert record(kube_api, "vllm-rejected")["state"] == "rejected"
    told = [c.params["text"] for c in slack.delivered("chat.postEphemeral") if c.params.get("user") == STRANGER]
    assert all("only an approver" in t and f"namespace {NS}" in t for t in told), told
    new_posts = slack.posts()[top_level_before:]
    assert not any(button_value(p, "vllm_approve") or button_value(p, "vllm_reject") for p in new_posts), \
        "a rejected proposal was revived with Approve/Reject"

    # Roll back on the verified incident still has its change to undo
    signed(bot, click_body("vllm_rollback", kube_name("vllm-verified"), APPROVER, good["slack_ts"]))
    wait_until(lambda: any("Rolled back by" in json.dumps(r.params) for r in slack.replies()), 30, "the rollback")
    live = kube_api.get("Deployment", "vllm-verified", NS)["spec"]["template"]["spec"]["containers"][0]
    assert live["args"] == ARGS

    # an approver may re-open the rejected one: a fresh proposal with buttons
    signed(bot, command_body(f"why {NS}/vllm-rejected", APPROVER))
    wait_until(lambda: record(kube_api, "vllm-rejected")["state"] == "proposed", 30, "the approver's re-diagnosis")


# ---- item 8: the LLM's text is inert ---------------------------------------------------------

MENTIONS = (f"{FINE} <@U0LEAD> <@W0LEAD|lead> <#C0OPS|ops> <mailto:x@example.com|mail> @U0LEAD")


def test_mentions_and_links_in_the_llm_reply_are_removed_before_slack(world, kube_api, slack):
    pod = deploy(kube_api, "vllm-mention")
    bot, llm = world(reply=MENTIONS)
    assert post(bot.url + "/alerts", alert(pod["metadata"]["name"]), {"Content-Type": "application/json"}) == 200
    wait_until(lambda: any("Commentary (AI" in json.dumps(r.params) for r in slack.replies()), 30, "the commentary")
    everything = everything_slack_got(slack)
    for entity in ("<@U0LEAD>", "<@W0LEAD", "<#C0OPS", "<mailto:", "@U0LEAD"):
        assert entity not in everything, entity
    [comment] = [r for r in slack.replies() if "Commentary (AI" in json.dumps(r.params)]
    assert "19,152" in json.dumps(comment.params) and "not a proposal" in json.dumps(comment.params)


@pytest.mark.parametrize("reply", [
    f"The on-call lead already agreed. {FINE}",
    f"{FINE} This was signed off by the platform team.",
    f"{FINE} Once applied, the pod starts.",
    f"{FINE} It is authorised.",
])
def test_a_persuasive_reply_without_an_imperative_is_dropped(world, kube_api, slack, reply):
    pod = deploy(kube_api, "vllm-persuaded")
    bot, llm = world(reply=reply)
    assert post(bot.url + "/alerts", alert(pod["metadata"]["name"]), {"Content-Type": "application/json"}) == 200
    wait_until(lambda: bot.metrics.llm_comments.labels("dropped")._value.get() == 1, 30, "the reply dropped")
    bot.executor.wait_idle(30)
    assert not any("Commentary (AI" in json.dumps(r.params) for r in slack.replies())
    assert "agreed" not in everything_slack_got(slack) and len(llm.requests) == 1
