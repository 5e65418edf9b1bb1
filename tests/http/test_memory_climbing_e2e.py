"""A climbing GPU memory trend never ends as verified (issue 18). Through `serve`'s own wiring
(build_server from settings, VLLM_ONCALL_PROMETHEUS_URL set): the alert over HTTP, the real
Kubernetes client against the API stand-in, a scripted vLLM pod answering the completion, a real
Prometheus (Debian's `prometheus`) scraping a stand-in dcgm-exporter, a signed Approve click.

Ready, the KV-cache line, the completion and a clean soak all hold in both cases; only the memory
trend differs: climbing ends as "running, memory climbing" with the numbers and a suggestion,
flat ends as verified."""

from __future__ import annotations

import json
import urllib.request

import pytest
from builders import use_kubeconfig
from kubeapi.dcgm import DcgmExporter, Gpu
from kubeapi.objects import container, crashing_deployment, rollout_controller
from kubeapi.prometheus import RealPrometheus
from kubeapi.vllmpod import ScriptedVllm
from openai_standin import wait_until
from slackapi.requests import button_value, click_body, signed_headers

from bot.cli.settings import load_settings
from bot.cli.wiring import build_server

pytestmark = pytest.mark.integration

SIGNING, NS, MODEL = "climbing-signing-secret", "inference", "meta-llama/Llama-3.1-8B-Instruct"
CRASH_LOG = (
    "ValueError: To serve at least one request with the models's max seq len (32768), (4.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (2.34 GiB). Based on the available memory, the estimated "
    "maximum model length is 18432. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine.\n")
READY_LOG = ("INFO 11-30 05:10:01 [kv_cache_utils.py:1087] GPU KV cache size: 86,432 tokens\n"
             "INFO 11-30 05:10:01 [kv_cache_utils.py:1091] Maximum concurrency for 18,432 tokens per request: 4.69x\n")
CLIMB = ("climbing", lambda t: 18432 + 200 * t)  # 200 MiB a second on a 22.5 GiB card: full within minutes
FLAT = ("flat", lambda t: 20000.0)


def _prometheus(exporter: DcgmExporter, folder) -> RealPrometheus:
    return RealPrometheus(exporter.address, folder)


@pytest.fixture(params=[CLIMB, FLAT], ids=lambda p: p[0])
def world(request, kube_api, slack, tmp_path, monkeypatch):
    name, used = request.param
    exporter = DcgmExporter([Gpu(hostname="gpu-node-1", used_mib=used)]).start()  # by node: no pod mapping
    prom = _prometheus(exporter, tmp_path)
    vllm = ScriptedVllm(model=MODEL).start()
    kube_api.default_pod_backend = vllm.url
    _, pod = crashing_deployment(kube_api, name="vllm-climb", previous_log=CRASH_LOG, exit_code=1, containers=[
        container(command=["vllm", "serve", MODEL], args=["--max-model-len", "32768"])])
    kube_api.on_write = rollout_controller("ready", log=READY_LOG)
    use_kubeconfig(monkeypatch, kube_api.url, tmp_path)
    settings = load_settings({
        "VLLM_ONCALL_CLUSTER": "gpu", "SLACK_BOT_TOKEN": "xoxb-climb", "SLACK_API_URL": slack.url,
        "SLACK_SIGNING_SECRET": SIGNING, "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0APPROVER",
        "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube", "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall",
        "VLLM_ONCALL_CLUSTER_SOURCE": "kube", "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": "30",
        "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "3", "VLLM_ONCALL_PROMETHEUS_URL": prom.url})
    server, _ = build_server(settings)
    server.start()
    try:
        prom.wait_for_series('DCGM_FI_DEV_FB_USED{Hostname="gpu-node-1"}')
        yield {"case": name, "kube": kube_api, "slack": slack, "bot": server, "pod": pod["metadata"]["name"]}
    finally:
        server.stop()
        vllm.stop()
        prom.stop()
        exporter.stop()


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as answer:
        return answer.status


def _state(kube) -> str:
    return json.loads(kube.list("VLLMIncident")[0]["spec"]["record"])["state"]


def test_a_climbing_memory_trend_never_ends_as_verified(world):
    kube, slack, bot = world["kube"], world["slack"], world["bot"]
    alert = {"version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {
        "alertname": "KubePodCrashLooping", "namespace": NS, "pod": world["pod"], "container": "vllm"}}]}
    assert post(bot.url + "/alerts", json.dumps(alert).encode(), {"Content-Type": "application/json"}) == 200
    wait_until(lambda: len(slack.posts()) == 1, 30, "the incident message")
    ts = json.loads(kube.list("VLLMIncident")[0]["spec"]["record"])["slack_ts"]
    body = click_body("vllm_approve", button_value(slack.posts()[0], "vllm_approve"), "U0APPROVER", ts)
    headers = {k: v[0] for k, v in signed_headers(body, SIGNING).items()}
    assert post(bot.url + "/slack/events", body.encode(), headers) == 200
    wait_until(lambda: _state(kube) not in ("proposed", "applying", "applied"), 120, "the verification's end")
    # the record moves first, then the reply and the message's refresh follow: wait for the last of them
    ending = "running, memory climbing: not verified" if world["case"] == "climbing" else "the new pod is Ready"
    wait_until(lambda: any(ending in json.dumps(u.params) for u in slack.delivered("chat.update")), 60,
               "the message's refresh with the ending")
    bot.executor.wait_idle(30)

    replies = [json.dumps(r.params) for r in slack.replies()]
    assert any("3/4" in r and "returned" in r for r in replies), replies  # the completion was answered
    assert any("4/4" in r and "no restart" in r for r in replies), replies  # the soak was clean
    record = json.loads(kube.list("VLLMIncident")[0]["spec"]["record"])
    outcome = record["applied"]["rollout"]["outcome"] if record["applied"].get("rollout") else None
    updates = slack.delivered("chat.update")
    top = json.dumps(updates[-1].params) if updates else ""
    if world["case"] == "climbing":
        assert record["state"] == "memory-climbing" and outcome == "memory-climbing", record["state"]
        climbing = next(r for r in replies if "Running, memory climbing" in r)
        assert "GPU 0 (GPU-5f1c5e58" in climbing and "GiB/h" in climbing and "full in about" in climbing
        assert "Suggestion" in climbing and "roll back" in climbing and "Not verified" in climbing
        assert "vllm_rollback" in climbing  # Roll back is offered with it
        assert "running, memory climbing: not verified" in top, top
    else:
        assert record["state"] == "verified" and outcome == "ready", record["state"]
        assert not any("memory climbing" in r for r in replies)
