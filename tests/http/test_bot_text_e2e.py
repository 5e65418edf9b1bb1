"""Issue 17, item 9 (the rest), through `serve`'s real wiring:

- "before" is the live workload's value: the crashed pod ran `--max-model-len 32768`, someone has
  since set 30000 on the Deployment; the proposal, the message and the confirm dialog say
  `30000 -> ...`, and the patch's `test` op holds the live arguments (a later edit refuses it).
- the bot's own text wins over incident text: an edited VLLMIncident (title, changes, workload
  shown) never reaches the message or the confirm dialog: the bot refuses to render the edited
  copy and says so once, and Approve still applies only what the bot proposed.

The HTTP server takes the alert, the real Kubernetes client reads the Kubernetes API stand-in,
the Bolt app takes signed clicks, the real Slack client posts to the Slack stand-in.
"""

from __future__ import annotations

import json

import pytest
from builders import use_kubeconfig
from kubeapi.objects import container, crashing_deployment
from openai_standin import wait_until
from slackapi.requests import button_value, click_body, signed_headers
from test_redaction_e2e import EXAMPLE_LOG, alert, post

from bot.cli.settings import load_settings
from bot.cli.wiring import build_server

pytestmark = pytest.mark.integration

NS = "inference"
SIGNING = "bot-text-signing-secret"
APPROVER = "U0APPROVER"
ARGS = ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]


@pytest.fixture
def bot(kube_api, slack, tmp_path, monkeypatch):
    use_kubeconfig(monkeypatch, kube_api.url, tmp_path)
    settings = load_settings({
        "VLLM_ONCALL_CLUSTER": "bottext", "SLACK_BOT_TOKEN": "xoxb-bottext", "SLACK_API_URL": slack.url,
        "SLACK_SIGNING_SECRET": SIGNING, "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": APPROVER,
        "VLLM_ONCALL_ALERT_TOKEN": "alert-tok", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube",
        "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall", "VLLM_ONCALL_CLUSTER_SOURCE": "kube",
        "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "5", "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "0"})
    server, _ = build_server(settings)
    server.start()
    yield server
    server.stop()


def deploy(kube_api, name: str, live_args: list[str] | None = None):
    dep, pod = crashing_deployment(kube_api, name=name, previous_log=EXAMPLE_LOG, containers=[
        container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], args=list(ARGS))])
    if live_args is not None:  # edited on the Deployment since the pod crashed: no new pod yet
        live = kube_api.get("Deployment", name, NS)
        live["spec"]["template"]["spec"]["containers"][0]["args"] = live_args
        kube_api.put(live)
    return pod


def send_alert(bot, pod) -> None:
    assert post(bot.url + "/alerts", alert(pod["metadata"]["name"]),
                {"Content-Type": "application/json", "Authorization": "Bearer alert-tok"}) == 200


def incident_object(kube_api, workload: str) -> dict:
    [obj] = [i for i in kube_api.list("VLLMIncident") if i["spec"]["workload"] == workload]
    return obj


def record(kube_api, workload: str) -> dict:
    return json.loads(incident_object(kube_api, workload)["spec"]["record"])


def signed(bot, body: str) -> None:
    headers = {k: v[0] for k, v in signed_headers(body, SIGNING).items()}
    assert post(bot.url + "/slack/events", body.encode(), headers) == 200


def confirm_of(params: dict) -> dict:
    for block in params.get("blocks") or []:
        for element in block.get("elements") or []:
            if element.get("action_id") == "vllm_approve":
                return element["confirm"]
    raise AssertionError("no Approve button")


def live_args(kube_api, name: str) -> list[str]:
    return kube_api.get("Deployment", name, NS)["spec"]["template"]["spec"]["containers"][0]["args"]


# ---- "before" is the live workload's value -------------------------------------------------

def test_before_is_the_live_workloads_value_not_the_crashed_pods(bot, kube_api, slack):
    edited = ["--max-model-len", "30000", "--gpu-memory-utilization", "0.9"]
    pod = deploy(kube_api, "vllm-drifted", live_args=edited)
    send_alert(bot, pod)
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    proposal = record(kube_api, "vllm-drifted")["proposal"]
    [change] = [c for c in proposal["changes"] if c["name"] == "--max-model-len"]
    assert change["before"] == "30000" and int(change["after"]) < 30000, change
    shown = json.dumps(slack.posts()[0].params["blocks"], ensure_ascii=False)
    assert f"30000 → {change['after']}" in shown and "32768 →" not in shown
    dialog = json.dumps(confirm_of(slack.posts()[0].params), ensure_ascii=False)
    assert "30000" in dialog and "32768" not in dialog
    # the patch is guarded by the live arguments it replaces
    tests = [op for op in proposal["json_patch"] if op["op"] == "test" and op["path"].endswith("/args")]
    assert tests and tests[0]["value"] == edited

    # Approve applies the proposal over the live value, and only it
    value = button_value(slack.posts()[0], "vllm_approve")
    signed(bot, click_body("vllm_approve", value, APPROVER, record(kube_api, "vllm-drifted")["slack_ts"]))
    wait_until(lambda: live_args(kube_api, "vllm-drifted") != edited, 30, "the patch")
    assert live_args(kube_api, "vllm-drifted") == ["--max-model-len", change["after"], "--gpu-memory-utilization", "0.9"]


def test_an_edit_after_the_proposal_fails_its_test_op_and_nothing_is_patched(bot, kube_api, slack):
    pod = deploy(kube_api, "vllm-moved", live_args=["--max-model-len", "30000", "--gpu-memory-utilization", "0.9"])
    send_alert(bot, pod)
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    bot.executor.wait_idle(30)
    later = ["--max-model-len", "28000", "--gpu-memory-utilization", "0.9"]
    live = kube_api.get("Deployment", "vllm-moved", NS)
    live["spec"]["template"]["spec"]["containers"][0]["args"] = later
    kube_api.put(live)
    value = button_value(slack.posts()[0], "vllm_approve")
    signed(bot, click_body("vllm_approve", value, APPROVER, record(kube_api, "vllm-moved")["slack_ts"]))
    wait_until(lambda: record(kube_api, "vllm-moved")["state"] != "approved"
               and bool(slack.replies() or slack.delivered("chat.postEphemeral")), 30, "the answer to the click")
    bot.executor.wait_idle(30)
    assert live_args(kube_api, "vllm-moved") == later


# ---- the bot's own text wins over incident text ---------------------------------------------

FORGED = "All clear: approved by the platform lead, click Approve"


def edit_record(kube_api, workload: str, edit) -> None:
    obj = incident_object(kube_api, workload)
    doc = json.loads(obj["spec"]["record"])
    edit(doc)
    obj["spec"]["record"] = json.dumps(doc)
    kube_api.put(obj)


def forge(doc: dict) -> None:
    doc["diagnosis"]["title"] = FORGED
    doc["diagnosis"]["evidence"] = [FORGED]
    doc["proposal"]["title"] = FORGED
    doc["workload"] = "team-b-victim"


def test_an_unedited_incident_is_still_updated_by_a_repeat(bot, kube_api, slack):
    pod = deploy(kube_api, "vllm-plain")
    send_alert(bot, pod)
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    bot.executor.wait_idle(30)
    send_alert(bot, pod)
    wait_until(lambda: any("2 alert(s)" in json.dumps(c.params) for c in slack.delivered("chat.update")), 30,
               "the repeat shown")
    assert bot.metrics.refused_renders._value.get() == 0


def test_an_edited_incident_is_never_rendered_as_the_bots_message(bot, kube_api, slack):
    pod = deploy(kube_api, "vllm-edited")
    send_alert(bot, pod)
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    bot.executor.wait_idle(30)
    original = json.dumps(slack.posts()[0].params["blocks"], ensure_ascii=False)
    dialog = confirm_of(slack.posts()[0].params)
    edit_record(kube_api, "vllm-edited", forge)

    send_alert(bot, pod)  # a repeat would re-render the message from the incident object
    wait_until(lambda: bot.metrics.refused_renders._value.get() >= 1, 30, "the edited copy refused")
    bot.executor.wait_idle(30)
    everything = "\n".join(json.dumps(c.params, ensure_ascii=False) for c in slack.calls)
    assert FORGED not in everything and "team-b-victim" not in everything
    assert not slack.delivered("chat.update")  # the message keeps what the bot wrote
    assert json.dumps(slack.channel_messages("C0ALERTS")[0]["blocks"], ensure_ascii=False) == original
    assert confirm_of({"blocks": slack.channel_messages("C0ALERTS")[0]["blocks"]}) == dialog


def test_a_forged_seal_does_not_help(bot, kube_api, slack):
    """Copying a seal from another incident, or writing one without the key, is still refused."""
    pods = [deploy(kube_api, "vllm-one"), deploy(kube_api, "vllm-two")]
    for pod in pods:
        send_alert(bot, pod)
    wait_until(lambda: len(slack.posts()) == 2, 60, "both messages")
    bot.executor.wait_idle(30)
    other_seal = record(kube_api, "vllm-two")["text_seal"]
    edit_record(kube_api, "vllm-one", lambda doc: (forge(doc), doc.update(text_seal=other_seal)))
    send_alert(bot, pods[0])
    wait_until(lambda: bot.metrics.refused_renders._value.get() >= 1, 30, "the edited copy refused")
    bot.executor.wait_idle(30)
    assert FORGED not in "\n".join(json.dumps(c.params, ensure_ascii=False) for c in slack.calls)


def test_vllm_why_never_copies_an_edited_incident_into_a_channel(bot, kube_api, slack):
    from slackapi.requests import command_body

    pod = deploy(kube_api, "vllm-asked")
    send_alert(bot, pod)
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    bot.executor.wait_idle(30)
    edit_record(kube_api, "vllm-asked", forge)
    signed(bot, command_body(f"why {NS}/vllm-asked", "U0STRANGER"))  # shown as is: a copy of its message
    wait_until(lambda: bot.metrics.refused_renders._value.get() >= 1, 30, "the edited copy refused")
    bot.executor.wait_idle(30)
    assert len(slack.posts()) == 1
    assert FORGED not in "\n".join(json.dumps(c.params, ensure_ascii=False) for c in slack.calls)
