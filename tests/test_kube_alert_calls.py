"""How many Kubernetes API requests one new alert costs, through the real wiring.

OncallService with LiveCluster and KubeIncidentStore over the real kubernetes client, against
the Kubernetes API stand-in, posting to the Slack Web API stand-in. One alert goes all the way:
evidence, diagnosis, proposal with its server-side dry run, incident created, message posted,
incident updated with the message's ts. The stand-in records every request it receives.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bot.app.records import AlertTarget
from bot.app.service import OncallService, Policy
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.slack.chat import SlackChat, make_client
from kubeapi.objects import container, crashing_deployment
from kubeapi.server import FakeKube
from slackapi import SlackStandIn

EXAMPLE_LOG = (Path(__file__).resolve().parents[1] / "examples" / "incident" / "bundle" / "previous.log").read_text()
NS = "inference"
MAX_CALLS_PER_NEW_ALERT = 8


@pytest.fixture
def world():
    kube = FakeKube().start()
    slack = SlackStandIn().start()
    dep, pod = crashing_deployment(kube, name="vllm-llama3-8b", previous_log=EXAMPLE_LOG, containers=[container(
        command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
        args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])])
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=3, sleep=lambda s: None))
    chat = SlackChat(make_client("xoxb-count", slack.url), "C0ALERTS", backoff_seconds=0.01)
    service = OncallService(LiveCluster(api, name="count"), KubeIncidentStore(api, "vllm-oncall"), chat,
                            Policy(approver_users=frozenset({"U0A"})), metrics=chat.metrics)
    yield {"kube": kube, "slack": slack, "service": service, "pod": pod["metadata"]["name"]}
    slack.stop()
    kube.stop()


def breakdown(calls) -> str:
    counted = Counter(f"{c.verb} {c.resource}{' (dry run)' if c.dry_run else ''}" for c in calls)
    return ", ".join(f"{what} x{n}" for what, n in sorted(counted.items()))


def test_one_new_alert_costs_at_most_eight_kubernetes_calls(world):
    kube, slack = world["kube"], world["slack"]
    before = len(kube.calls)
    incident = world["service"].handle_alert(AlertTarget(namespace=NS, pod=world["pod"], container="vllm"))
    calls = kube.calls[before:]
    # The whole job was done: a proposal that passed its dry run, one message, its ts stored.
    assert incident is not None and incident.state == "proposed" and incident.proposal.dry_run_ok
    assert len(slack.posts()) == 1 and incident.slack_ts
    assert any(c.dry_run and c.verb == "patch" for c in calls), "the proposal was not dry-run checked"
    assert len(calls) <= MAX_CALLS_PER_NEW_ALERT, (
        f"{len(calls)} Kubernetes API calls for one new alert (at most {MAX_CALLS_PER_NEW_ALERT}): "
        f"{breakdown(calls)}")
