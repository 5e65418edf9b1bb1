"""A bounded, honest log read (issue 20): the previous container's log is read as its head
(limitBytes) and its tail (tailLines); when the middle was not read, the incident's message says
so (NoteKind.LOG_CUT, worded in bot/slack). Through the real wiring against the stand-ins."""

from __future__ import annotations

import json

import pytest
from builders import EXAMPLE_LOG
from kubeapi.objects import container, crashing_deployment
from kubeapi.server import FakeKube
from slackapi import SlackStandIn

from bot.app.records import AlertTarget
from bot.app.service import OncallService, Policy
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.slack.chat import SlackChat, make_client

NS = "inference"
FILLER = "".join(f"INFO 11-30 05:00:{i % 60:02d} [logger.py:39] Received request cmpl-{i:06d}: prompt: 'hi'\n"
                 for i in range(4000))


@pytest.fixture
def stand_ins():
    kube, slack = FakeKube().start(), SlackStandIn().start()
    yield kube, slack
    slack.stop()
    kube.stop()


def alert_with_log(kube: FakeKube, slack: SlackStandIn, log: str) -> tuple[object, list[dict]]:
    vllm = container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                     args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])
    head, _, tail = EXAMPLE_LOG.partition("\n")
    _, pod = crashing_deployment(kube, name="vllm-llama3-8b", previous_log=head + "\n" + log + tail,
                                 exit_code=1, containers=[vllm])
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=2, sleep=lambda s: None))
    chat = SlackChat(make_client("xoxb-cut", slack.url), "C0ALERTS", backoff_seconds=0.01)
    service = OncallService(LiveCluster(api, name="cut", head_bytes=64 * 1024, tail_lines=200),
                            KubeIncidentStore(api, "vllm-oncall"), chat, Policy(approver_users=frozenset({"U0A"})),
                            metrics=chat.metrics)
    incident = service.handle_alert(AlertTarget(namespace=NS, pod=pod["metadata"]["name"], container="vllm"))
    blocks = slack.posts()[0].params["blocks"]
    return incident, json.loads(blocks) if isinstance(blocks, str) else blocks


def test_a_log_longer_than_the_read_is_diagnosed_from_both_ends_and_the_message_says_it_was_cut(stand_ins):
    kube, slack = stand_ins
    incident, blocks = alert_with_log(kube, slack, FILLER)  # ~330 KB: more than the 64 KiB head
    assert incident is not None and incident.log_cut and incident.cause == "kv-cache-max-model-len"
    cut = [b for b in blocks if b.get("block_id") == "log-cut"]
    assert len(cut) == 1 and "middle was not read" in cut[0]["text"]["text"]
    logs = [c for c in kube.calls if c.resource == "pods/log"]
    assert [c.query.get("limitBytes") for c in logs] == [str(64 * 1024 + 1), None]
    assert [c.query.get("tailLines") for c in logs] == [None, "200"]


def test_a_log_read_whole_says_nothing_about_cuts(stand_ins):
    kube, slack = stand_ins
    incident, blocks = alert_with_log(kube, slack, "")
    assert incident is not None and not incident.log_cut
    assert not [b for b in blocks if b.get("block_id") == "log-cut"]
    assert len([c for c in kube.calls if c.resource == "pods/log"]) == 1
