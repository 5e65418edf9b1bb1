"""The HTTP server over real sockets: /alerts (auth, validation, partial batches, backpressure),
/healthz, /readyz, /metrics. Slack is the local Web API stand-in; the cluster a port fake."""

from __future__ import annotations

import copy
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fakes import FakeCluster, kv_diagnosis

from bot.app.service import OncallService, Policy
from bot.app.work import WorkQueue
from bot.http.server import BotServer
from bot.local.store import FolderIncidentStore
from bot.slack.chat import SlackChat, make_client

ALERT = json.loads((Path(__file__).resolve().parents[2] / "examples" / "incident" / "alert.json").read_text())
NS, POD = "inference", "vllm-llama3-8b-7d9f8c6b5-x2k4p"


def request(url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def cluster():
    c = FakeCluster()
    c.add_pod(NS, POD, "vllm-llama3-8b")
    c.add_pod(NS, "vllm-llama3-8b-7d9f8c6b5-q9z7w", "vllm-llama3-8b")
    return c


def make_server(slack, cluster, tmp_path, **kw) -> BotServer:
    chat = SlackChat(make_client("xoxb-test", slack.url), "C0ALERTS", max_attempts=3, backoff_seconds=0.01)
    service = OncallService(cluster, FolderIncidentStore(tmp_path), chat,
                            Policy(approver_users=frozenset({"U0APPROVER"})), metrics=chat.metrics,
                            diagnose=kv_diagnosis)
    kw.setdefault("readiness_checks", {"slack": chat.check, "kubernetes": lambda: service.store.list()})
    return BotServer(service, **kw).start()


@pytest.fixture
def server(slack, cluster, tmp_path):
    srv = make_server(slack, cluster, tmp_path, alert_token="s3cret")
    yield srv
    srv.stop()


AUTH = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}


def post_alerts(server, payload, headers=AUTH) -> tuple[int, str]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return request(server.url + "/alerts", body, headers)


def test_health_and_readiness(server):
    assert request(server.url + "/healthz") == (200, "ok\n")
    server.readiness.run_once()  # the background loop does this too; no need to wait for it
    assert request(server.url + "/readyz") == (200, "ready\n")


def test_not_ready_says_what_it_waits_for(slack, cluster, tmp_path):
    def kube_down():
        raise ConnectionRefusedError("kubernetes API at 127.0.0.1:1 refused the connection")

    srv = make_server(slack, cluster, tmp_path, readiness_checks={"kubernetes": kube_down})
    try:
        srv.readiness.run_once()
        status, text = request(srv.url + "/readyz")
        assert status == 503 and "kubernetes" in text and "refused" in text
    finally:
        srv.stop()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}])
def test_wrong_or_missing_token_is_401(server, slack, headers):
    status, _ = post_alerts(server, ALERT, headers)
    assert status == 401
    assert slack.posts() == []


def test_malformed_json_is_400_with_one_line_reason(server):
    status, body = post_alerts(server, b'{"version": "4", "alerts": [')
    reason = json.loads(body)["error"]
    assert status == 400 and reason.startswith("malformed JSON:") and "\n" not in reason


def test_not_a_webhook_payload_is_400(server):
    status, body = post_alerts(server, {"version": "4", "status": "firing"})
    assert status == 400 and "alerts" in json.loads(body)["error"]


def test_one_odd_alert_does_not_lose_the_others(server, slack):
    payload = copy.deepcopy(ALERT)
    good = payload["alerts"][0]
    second_pod = copy.deepcopy(good)
    second_pod["labels"]["pod"] = "vllm-llama3-8b-7d9f8c6b5-q9z7w"
    odd = {"status": "exploding", "labels": ["not", "a", "map"]}
    other_alert = copy.deepcopy(good)
    other_alert["labels"]["alertname"] = "KubePodNotReady"
    no_pod = copy.deepcopy(good)
    del no_pod["labels"]["pod"]
    payload["alerts"] = [odd, good, other_alert, second_pod, no_pod]
    status, body = post_alerts(server, payload)
    answer = json.loads(body)
    assert status == 200 and answer["accepted"] == 2
    assert [s["index"] for s in answer["skipped"]] == [0, 2, 4]
    assert "ignored alertname: KubePodNotReady" in answer["skipped"][1]["reason"]
    server.executor.wait_idle(10)
    assert len(slack.posts()) == 1  # both pods belong to one Deployment: one incident


def test_alert_becomes_one_slack_message_and_metrics(server, slack):
    assert post_alerts(server, ALERT)[0] == 200
    server.executor.wait_idle(10)
    assert post_alerts(server, ALERT)[0] == 200  # the repeat
    server.executor.wait_idle(10)
    assert len(slack.posts()) == 1 and len(slack.delivered("chat.update")) == 1
    post = slack.posts()[0]
    assert post.params["channel"] == "C0ALERTS"
    actions = [b for b in post.params["blocks"] if b["type"] == "actions"][0]
    assert [e["action_id"] for e in actions["elements"]] == ["vllm_approve", "vllm_reject"]
    status, text = request(server.url + "/metrics")
    assert status == 200
    assert 'vllm_oncall_alerts_received_total{status="firing"} 2.0' in text
    assert 'vllm_oncall_diagnoses_total{cause="kv-cache-max-model-len"} 1.0' in text
    assert "vllm_oncall_proposals_total 1.0" in text
    assert "vllm_oncall_alert_to_post_seconds_count 1.0" in text
    for name in ("approvals", "rejections", "patches_applied", "patches_failed", "rollbacks", "retries"):
        assert f"vllm_oncall_{name}" in text


def test_resolved_alert_updates_the_message(server, slack):
    post_alerts(server, ALERT)
    server.executor.wait_idle(10)
    resolved = copy.deepcopy(ALERT)
    resolved["status"] = resolved["alerts"][0]["status"] = "resolved"
    post_alerts(server, resolved)
    server.executor.wait_idle(10)
    update = slack.delivered("chat.update")[-1]
    assert "Resolved" in json.dumps(update.params["blocks"]) and len(slack.posts()) == 1


def test_a_full_queue_folds_the_batch_instead_of_refusing_it(slack, cluster, tmp_path):
    """A batch larger than the queue is still accepted (Alertmanager's retries of a 503 would
    never fit either): the alerts wait, folded per workload, and are all handled once the
    cluster answers again. Only max_pending_alerts makes the bot answer 503 (see
    test_server_hardening)."""
    gate = threading.Event()
    collect = cluster.collect
    cluster.collect = lambda *a, **k: (gate.wait(10), collect(*a, **k))[1]  # a stuck Kubernetes API
    srv = make_server(slack, cluster, tmp_path, work=WorkQueue(workers=1, queue_size=1))
    try:
        two = copy.deepcopy(ALERT)
        two["alerts"] = two["alerts"] * 2
        assert post_alerts(srv, two, {"Content-Type": "application/json"})[0] == 200
        second = copy.deepcopy(ALERT)
        second["alerts"][0]["labels"]["pod"] = "vllm-llama3-8b-7d9f8c6b5-q9z7w"
        for payload in (ALERT, second, ALERT):
            status, body = post_alerts(srv, payload, {"Content-Type": "application/json"})
            assert status == 200 and json.loads(body)["accepted"] == 1
    finally:
        gate.set()
        assert srv.executor.wait_idle(10)
        srv.stop()
    assert len(slack.posts()) == 1
    assert srv.service.store.list()[0].pods == [POD, "vllm-llama3-8b-7d9f8c6b5-q9z7w"]
