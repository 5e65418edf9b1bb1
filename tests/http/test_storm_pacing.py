"""Issue 17, item 9 (storms): the bot writes within Slack's posting rate.

The Slack stand-in enforces about one chat.postMessage per second per channel and about 50
chat.update a minute (429 with Retry-After) on a virtual clock; the bot's chat is the one
`serve` builds (bot.cli.wiring.paced_chat: pacing, retries) waiting on the same clock, behind the
real HTTP server and work queue, over a FakeCluster and a folder store (thousands of alerts
through the Kubernetes stand-in would take minutes here).

Measured: 300 crashing workloads are each named once at the top level (their message, or a line
of a grouped message when the channel's backlog is a storm, bot/app/grouping.py), each with its
own message and details (in its group's thread), with 0 rate-limit answers; a
10,000-alert storm over 50 workloads folds its repeats into far fewer chat.update calls than
the 785 of the unfolded bot (the number is printed); 100 crashes over 25 workloads meet no 429.
"""

from __future__ import annotations

import json
import threading

import pytest
from fakes import FakeCluster, kv_diagnosis
from slackapi import RateLimit
from test_server_hardening import NS, TOKEN, alert, batch, pod_name, request

from bot.app.metrics import Metrics
from bot.app.service import OncallService, Policy
from bot.app.work import WorkQueue
from bot.cli.settings import load_settings
from bot.cli.wiring import ChatClock, paced_chat
from bot.diagnosis.redact import Redactor
from bot.http.server import BotServer
from bot.local.store import FolderIncidentStore
from bot.slack.chat import GROUP_EVENT_TYPE, make_client

pytestmark = pytest.mark.integration

SETTINGS = {"VLLM_ONCALL_CLUSTER": "storm", "SLACK_BOT_TOKEN": "xoxb-storm", "SLACK_SIGNING_SECRET": "s",
            "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0APPROVER",
            "VLLM_ONCALL_ALERT_TOKEN": TOKEN, "VLLM_ONCALL_SLACK_MAX_ATTEMPTS": "3"}


@pytest.fixture
def slack(slack, clock):
    slack.rate = RateLimit(clock.now)  # Slack's rate, on the virtual clock the bot's pacing waits on
    return slack


@pytest.fixture
def world(slack, clock, tmp_path):
    servers = []

    def make(workloads: int, replicas: int = 1, workers: int = 4, queue_size: int = 64):
        cluster = FakeCluster()
        for w in range(workloads):
            for r in range(replicas):
                cluster.add_pod(NS, pod_name(w, r), f"vllm-w{w}")
        settings = load_settings({**SETTINGS, "SLACK_API_URL": slack.url})
        chat = paced_chat(settings, make_client("xoxb-storm", slack.url), Metrics(), Redactor(),
                          ChatClock(clock.now, clock.sleep))
        service = OncallService(cluster, FolderIncidentStore(tmp_path / f"s{len(servers)}"), chat,
                                Policy(approver_users=frozenset({"U0APPROVER"})), metrics=chat.metrics,
                                diagnose=kv_diagnosis)
        server = BotServer(service, alert_token=TOKEN, work=WorkQueue(workers=workers, queue_size=queue_size),
                           sweep_interval=0.5).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def posted_workloads(slack) -> list[str]:
    """The workload each top-level message is about (its fallback text names it), or each line of a
    grouped message (a storm's backlog, bot/app/grouping.py) is about."""
    named = []
    for m in slack.channel_messages("C0ALERTS"):
        if (m.get("metadata") or {}).get("event_type") == GROUP_EVENT_TYPE:
            named += [b["text"]["text"].split("`")[1].split("/", 1)[1] for b in m["blocks"]
                      if b.get("block_id", "").startswith("group-line-")]
        else:
            named.append(m["text"].split("/", 1)[1].split(":", 1)[0])
    return named


def last_shown(slack) -> dict[str, str]:
    """Each message's blocks as last sent (posted, top-level or in a thread; then updated), by its ts."""
    posted = slack.channel_messages("C0ALERTS") + [m for replies in slack.threads.values() for m in replies]
    shown = {m["ts"]: json.dumps(m.get("blocks")) for m in posted}
    for call in slack.delivered("chat.update"):
        shown[call.params["ts"]] = json.dumps(call.params["blocks"])
    return shown


def send_all(server, bodies: list[bytes]) -> list[int]:
    answers: list[int] = []
    threads = [threading.Thread(target=lambda b=b: answers.append(request(server, "/alerts", b, timeout=60)[0]))
               for b in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return answers


def test_300_crashing_workloads_are_each_posted_once_within_slacks_rate(world, slack):
    server = world(workloads=300)
    bodies = [batch([alert(pod_name(w, 0)) for w in range(i, i + 50)]) for i in range(0, 300, 50)]
    assert send_all(server, bodies) == [200] * 6
    assert slack.wait_for(lambda: len(posted_workloads(slack)) >= 300 and server.executor.wait_idle(1),
                          120), len(posted_workloads(slack))
    named = posted_workloads(slack)
    assert sorted(named) == sorted(f"vllm-w{w}" for w in range(300))  # every workload, no duplicates
    assert slack.rate.limited == [] and slack.rate.early == []
    # each incident's own message (in its group's thread, for a grouped one) and its details, within the rate too
    store = server.service.store
    assert slack.wait_for(lambda: all(i.message_id for i in store.list()) and len(slack.details()) == 300, 300), \
        len(slack.details())
    assert slack.rate.limited == [] and slack.rate.early == []


def test_a_10000_alert_storm_over_50_workloads_folds_its_updates(world, slack):
    server = world(workloads=50, replicas=2, workers=2, queue_size=8)
    pods = [pod_name(w, r) for w in range(50) for r in range(2)]
    bodies = [batch([alert(pods[(i * 7 + j) % len(pods)]) for j in range(1000)]) for i in range(10)]
    assert send_all(server, bodies) == [200] * 10
    assert server.executor.wait_idle(120)
    assert sorted(posted_workloads(slack)) == sorted(f"vllm-w{w}" for w in range(50))
    store = server.service.store
    assert slack.wait_for(lambda: all(i.message_id for i in store.list()), 300)  # grouped: in the group's thread
    updates = slack.attempts("chat.update")
    print(f"\n10,000 alerts over 50 workloads: {len(updates)} chat.update calls, "
          f"{len(slack.rate.limited)} rate-limit answers")
    assert len(updates) < 785 // 3
    assert slack.rate.early == []  # each 429 (if any) waited out before the next try
    # each message as last sent shows its incident's final count: no repeat lost
    shown = last_shown(slack)
    for incident in server.service.store.list():
        if incident.alert_count > 1:
            assert f"{incident.alert_count} alert(s)" in shown[incident.message_id], incident.name


def test_100_crashes_over_25_workloads_meet_no_rate_limit(world, slack):
    server = world(workloads=25, replicas=4)
    assert send_all(server, [batch([alert(pod_name(w, r)) for w in range(25) for r in range(4)])]) == [200]
    assert server.executor.wait_idle(120)
    assert sorted(posted_workloads(slack)) == sorted(f"vllm-w{w}" for w in range(25))
    store = server.service.store
    assert slack.wait_for(lambda: all(i.message_id for i in store.list()) and len(slack.details()) == 25, 300)
    assert slack.rate.limited == [] and slack.rate.early == []


def test_a_429_from_a_shared_limit_is_waited_out_once(world, slack, clock):
    """Another app used the channel's turn: the bot's post meets one 429, waits its Retry-After
    and posts once; nothing else of the bot runs into the same wall."""
    server = world(workloads=2)
    slack.rate.check("chat.postMessage", "C0ALERTS")  # someone else just posted in the channel
    assert send_all(server, [batch([alert(pod_name(0, 0)), alert(pod_name(1, 0))])]) == [200]
    assert server.executor.wait_idle(60)
    assert sorted(posted_workloads(slack)) == ["vllm-w0", "vllm-w1"]
    assert len(slack.rate.limited) == 1 and slack.rate.early == []
