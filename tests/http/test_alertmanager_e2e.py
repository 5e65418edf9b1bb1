"""End to end with a real Alertmanager: its webhook receiver points at the running bot.

Alertmanager (Debian's prometheus-alertmanager, started here from a temporary config) delivers
KubePodCrashLooping to the bot's /alerts with a bearer token; the bot collects evidence through
the real Kubernetes client from the Kubernetes API stand-in, keeps incidents as vllmincidents
objects there, and posts to the Slack Web API stand-in. The assertion is the product promise:
one alert is one Slack message, and repeats (re-posts, Alertmanager's own repeat_interval, a
second pod of the same Deployment) never post a second one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from builders import EXAMPLE_LOG, free_port
from kubeapi.objects import container, crashing_deployment, rollout_controller, start_pod
from kubeapi.server import FakeKube
from slackapi import SlackStandIn
from slackapi.requests import click_body, decision_value, signed_headers
from standin_http import bound

from bot.app.service import OncallService, Policy
from bot.http.server import BotServer
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.slack.app import build_app
from bot.slack.chat import SlackChat, make_client

ALERTMANAGER = os.environ.get("ALERTMANAGER_BIN") or shutil.which("prometheus-alertmanager") or \
    shutil.which("alertmanager")
# Outside CI a machine without Alertmanager skips these; in CI (.ci/run installs it) they must run.
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(ALERTMANAGER is None and not os.environ.get("CI"),
                                 reason="prometheus-alertmanager is not installed "
                                 "(apt-get install prometheus-alertmanager; .ci/run does)")]

TOKEN = "am-webhook-token"
SIGNING_SECRET = "e2e-signing-secret"
NEW_POD_LOG = ("INFO 11-30 05:20:14 [gpu_worker.py:298] Available KV cache memory: 2.34 GiB\n"
               "INFO 11-30 05:20:14 [kv_cache_utils.py:864] GPU KV cache size: 19,152 tokens\n"
               "INFO 11-30 05:20:14 [kv_cache_utils.py:868] Maximum concurrency for 18,432 tokens per request: 1.04x\n"
               "INFO 11-30 05:20:40 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000\n")
NS = "inference"



def wait_until(predicate, timeout: float = 90, what: str = "condition") -> None:
    deadline = time.monotonic() + bound(timeout)  # only bounds a failure
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Alertmanager:
    def __init__(self, webhook_url: str, folder: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = folder / "alertmanager.yml"
        config.write_text(f"""
route:
  receiver: vllm-oncall
  group_by: [alertname, namespace, pod]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 2s
receivers:
  - name: vllm-oncall
    webhook_configs:
      - url: {webhook_url}
        send_resolved: true
        http_config:
          authorization:
            credentials: {TOKEN}
""")
        (folder / "data").mkdir()
        self.log = open(folder / "alertmanager.log", "w")
        self.proc = subprocess.Popen(
            [ALERTMANAGER, f"--config.file={config}", f"--storage.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=", "--log.level=info"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self._ready, 120, "Alertmanager to be ready")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"Alertmanager exited with {self.proc.returncode}; see {self.log.name}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def fire(self, pod: str, ends_in: timedelta = timedelta(minutes=5)) -> None:
        now = datetime.now(UTC)
        alert = [{"labels": {"alertname": "KubePodCrashLooping", "namespace": NS, "pod": pod, "container": "vllm",
                             "job": "kube-state-metrics", "severity": "warning"},
                  "annotations": {"summary": "Pod is crash looping."},
                  "startsAt": (now - timedelta(minutes=1)).isoformat(), "endsAt": (now + ends_in).isoformat()}]
        req = urllib.request.Request(self.url + "/api/v2/alerts", data=json.dumps(alert).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def world(tmp_path):
    kube = FakeKube().start()
    slack = SlackStandIn().start()
    dep, pod_a = crashing_deployment(kube, name="vllm-llama3-8b", previous_log=EXAMPLE_LOG, containers=[container(
        command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
        args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])])
    pod_b = start_pod(kube, dep, "crashloop", previous_log=EXAMPLE_LOG, suffix="second", restarts=3)
    api_client = kube.api_client()
    retry = RetryPolicy(attempts=3, initial=0.01, maximum=0.05)
    api = KubeApi(api_client, retry=retry)
    cluster = LiveCluster(api, name="e2e-cluster", poll_seconds=0.1)
    store = KubeIncidentStore(api, "vllm-oncall")
    web = make_client("xoxb-e2e", slack.url)
    chat = SlackChat(web, "C0ALERTS", backoff_seconds=0.01)
    service = OncallService(cluster, store, chat, Policy(approver_users=frozenset({"U0APPROVER"}),
                                                         verify_timeout_seconds=30), metrics=chat.metrics)
    app = build_app(service, web, signing_secret=SIGNING_SECRET)
    bot = BotServer(service, alert_token=TOKEN, bolt_app=app, readiness_checks={"slack": chat.check,
                                                                               "kubernetes": store.list}).start()
    alertmanager = Alertmanager(bot.url + "/alerts", tmp_path)
    yield {"kube": kube, "slack": slack, "bot": bot, "store": store, "am": alertmanager,
           "pods": (pod_a["metadata"]["name"], pod_b["metadata"]["name"])}
    alertmanager.stop()
    bot.stop()
    slack.stop()
    kube.stop()


def received(bot: BotServer) -> float:
    return bot.metrics.alerts_received.labels("firing")._value.get()


def test_alert_through_alertmanager_is_one_slack_message(world):
    am, slack, bot, store = world["am"], world["slack"], world["bot"], world["store"]
    pod_a, pod_b = world["pods"]

    am.fire(pod_a)
    wait_until(lambda: len(slack.posts()) == 1, 90, "the incident message")
    post = slack.posts()[0]
    blocks = json.dumps(post.params["blocks"])
    assert "e2e-cluster" in blocks and pod_a in blocks and "--max-model-len" in blocks
    assert any(b["type"] == "actions" for b in post.params["blocks"])

    am.fire(pod_a)  # the same alert again (as a second, HA Alertmanager would)
    am.fire(pod_b)  # a second pod of the same Deployment
    wait_until(lambda: received(bot) >= 4, 90, "Alertmanager's repeats and the second pod's alert")
    bot.executor.wait_idle(30)
    incidents = store.list()
    assert len(incidents) == 1
    assert set(incidents[0].pods) == {pod_a, pod_b} and incidents[0].alert_count >= 4
    assert len(slack.posts()) == 1, "a repeat posted a second message"
    assert slack.delivered("chat.update"), "repeats update the one message"
    assert world["kube"].get("VLLMIncident", incidents[0].name, "vllm-oncall")["spec"]["state"] == "proposed"


def test_resolved_alert_marks_the_message_resolved(world):
    am, slack = world["am"], world["slack"]
    pod_a, _ = world["pods"]
    am.fire(pod_a)
    wait_until(lambda: len(slack.posts()) == 1, 90, "the incident message")
    am.fire(pod_a, ends_in=timedelta(seconds=0))  # Alertmanager resolves it and tells the bot
    wait_until(lambda: any("Resolved" in json.dumps(c.params.get("blocks")) for c in slack.delivered("chat.update")),
               30, "the resolved update")
    assert len(slack.posts()) == 1


def test_approve_over_signed_http_patches_the_deployment_and_reports_the_rollout(world):
    am, slack, bot, kube = world["am"], world["slack"], world["bot"], world["kube"]
    kube.on_write = rollout_controller("ready", log=NEW_POD_LOG)  # the Deployment controller's part
    am.fire(world["pods"][0])
    wait_until(lambda: any(i.message_id for i in world["store"].list()), 90, "the incident message")
    incident = world["store"].list()[0]
    body = click_body("vllm_approve", decision_value(incident), "U0APPROVER", incident.message_id)
    headers = {k: v[0] for k, v in signed_headers(body, SIGNING_SECRET).items()}
    req = urllib.request.Request(bot.url + "/slack/events", data=body.encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    wait_until(lambda: any("GPU KV cache size: 19,152 tokens" in c.params["text"] for c in slack.replies()), 60,
               "the rollout report")
    args = kube.get("Deployment", "vllm-llama3-8b", NS)["spec"]["template"]["spec"]["containers"][0]["args"]
    new_value = incident.proposal.changes[0].after
    assert args[args.index("--max-model-len") + 1] == new_value != "32768"
    # the report is posted first, then the outcome is stored and the message re-rendered
    wait_until(lambda: world["store"].get(incident.name).state == "verified", 90, "the verified state")
    wait_until(lambda: "Applied by <@U0APPROVER>" in json.dumps(slack.delivered("chat.update")[-1].params["blocks"]),
               30, "the message re-rendered as verified")
    final = slack.delivered("chat.update")[-1]
    assert "Applied by <@U0APPROVER>" in json.dumps(final.params["blocks"]) and final.params["ts"] == incident.message_id
