"""Approver scopes and the `/vllm why` scope through signed requests and the real Bolt app;
the Web API is the local stand-in."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from fakes import FakeCluster, kv_diagnosis
from slack_bolt.request import BoltRequest
from slackapi.requests import CHANNEL, SECRET, click_body, decision_value, signed_headers

from bot.app.records import AlertTarget
from bot.app.service import OncallService, Policy
from bot.local.store import FolderIncidentStore
from bot.slack.app import build_app
from bot.slack.chat import SlackChat, make_client
from bot.slack.ids import parse_scopes

DEPLOY, POD = "vllm-llama3-8b", "vllm-llama3-8b-7d9f8c6b5-x2k4p"


def command(text: str, user: str, channel: str) -> str:
    return urlencode({"token": "legacy", "team_id": "T0STANDIN", "team_domain": "standin", "channel_id": channel,
                      "channel_name": "somewhere", "user_id": user, "user_name": "asker", "command": "/vllm",
                      "text": text, "api_app_id": "A0APP", "response_url": "https://hooks.slack.invalid/commands/1",
                      "trigger_id": "1.2.3"})


@pytest.fixture
def bot(slack, tmp_path):
    cluster = FakeCluster()
    for ns in ("ml-serve", "prod"):
        cluster.add_pod(ns, POD, DEPLOY)
    client = make_client("xoxb-test-token", slack.url)
    chat = SlackChat(client, CHANNEL, max_attempts=2, backoff_seconds=0.01)
    policy = Policy(approver_scopes=parse_scopes("ml-*=U0ML;prod=U0PROD"), why_scope="channel",
                    alert_channel=CHANNEL)
    service = OncallService(cluster, FolderIncidentStore(tmp_path), chat, policy, metrics=chat.metrics,
                            diagnose=kv_diagnosis)
    app = build_app(service, client, signing_secret=SECRET, default_namespace="prod")
    return cluster, service, lambda body: app.dispatch(BoltRequest(body=body, headers=signed_headers(body)))


def test_an_ml_approver_clicking_approve_on_a_prod_incident_changes_nothing(bot, slack):
    cluster, service, dispatch = bot
    incident = service.handle_alert(AlertTarget(namespace="prod", pod=POD, container="vllm"))
    assert dispatch(click_body("vllm_approve", decision_value(incident), "U0ML", incident.message_id)).status == 200
    assert slack.wait_for(lambda: slack.delivered("chat.postEphemeral"))
    told = slack.delivered("chat.postEphemeral")[0].params
    assert told["user"] == "U0ML" and "not allowed" in told["text"] and "namespace prod" in told["text"]
    assert cluster.applied == [] and service.store.get(incident.name).state == "proposed"
    dispatch(click_body("vllm_approve", decision_value(incident), "U0PROD", incident.message_id))
    assert slack.wait_for(lambda: cluster.applied)


def test_why_elsewhere_is_refused_for_a_non_approver_and_answered_for_an_approver(bot, slack):
    _, service, dispatch = bot
    assert dispatch(command(f"why prod/{DEPLOY}", "U0ML", "C0ELSEWHERE")).status == 200
    assert slack.wait_for(lambda: slack.delivered("chat.postEphemeral"))
    told = slack.delivered("chat.postEphemeral")[0].params
    assert told["user"] == "U0ML" and told["channel"] == "C0ELSEWHERE" and "namespace prod" in told["text"]
    assert slack.posts() == [] and service.store.list() == []
    dispatch(command(f"why prod/{DEPLOY}", "U0PROD", "C0ELSEWHERE"))
    assert slack.wait_for(lambda: len(slack.posts()) == 1)
    assert slack.posts()[0].params["channel"] == "C0ELSEWHERE"
