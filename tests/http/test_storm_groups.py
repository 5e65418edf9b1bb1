"""Issue 20's burst line and issue 17's grouped messages: a storm of crashing workloads is named in
grouped messages within Slack's rate, each incident's own message (Approve / Reject, details)
following in its group's thread; a storm of 2-3 crashes keeps its usual messages.

The Slack stand-in enforces about one chat.postMessage per second per channel (429 with
Retry-After) on a virtual clock; the bot's chat is the one `serve` builds (bot.cli.wiring.paced_chat:
pacing, retries) waiting on the same clock, behind the real HTTP server and work queue, over a
FakeCluster and a folder store (as tests/http/test_storm_pacing.py).

On the virtual clock a turn takes no real time, while on Slack it takes a second in which a burst
piles up. So the burst tests hold the answer to the storm's first post until every incident of
the burst is in the store (an event, not a wait): the second the bot really waits for its turn.
"""

from __future__ import annotations

import json
import threading

import pytest
from fakes import FakeCluster, kv_diagnosis
from slackapi import RateLimit, VirtualClock
from standin_http import bound
from test_server_hardening import TOKEN, batch, request

from bot.app.grouping import GROUP_LINES
from bot.app.metrics import Metrics
from bot.app.records import MessageRef
from bot.app.service import OncallService, Policy
from bot.app.state import IncidentState, Outcome
from bot.app.work import WorkQueue
from bot.cli.settings import load_settings
from bot.cli.wiring import ChatClock, paced_chat
from bot.diagnosis.redact import Redactor
from bot.http.server import BotServer
from bot.local.store import FolderIncidentStore
from bot.slack.chat import EVENT_TYPE, GROUP_EVENT_TYPE, make_client

pytestmark = pytest.mark.integration

CHANNEL = "C0ALERTS"
SETTINGS = {"VLLM_ONCALL_CLUSTER": "storm", "SLACK_BOT_TOKEN": "xoxb-storm", "SLACK_SIGNING_SECRET": "s",
            "VLLM_ONCALL_SLACK_CHANNEL": CHANNEL, "VLLM_ONCALL_APPROVERS": "U0APPROVER",
            "VLLM_ONCALL_ALERT_TOKEN": TOKEN, "VLLM_ONCALL_SLACK_MAX_ATTEMPTS": "3"}
NAMESPACES = ("team-a", "team-b")


def pod(w: int) -> str:
    return f"vllm-w{w}-7d9f8c6b5-x{w:04d}"


def namespace(w: int) -> str:
    return NAMESPACES[w % len(NAMESPACES)]


def alert(w: int) -> dict:
    return {"status": "firing", "labels": {"alertname": "KubePodCrashLooping", "namespace": namespace(w),
                                           "pod": pod(w), "container": "vllm"}, "annotations": {}}


class HeldFirstPost:
    """The chat `serve` builds, with the answer to its first post held until `release` is set; it
    notes when each grouped message was posted on the virtual clock (the stand-in's calls carry
    real time)."""

    def __init__(self, chat, release: threading.Event, clock: VirtualClock):
        self.chat, self.release, self.clock, self.held = chat, release, clock, False
        self.groups: list[tuple[float, str]] = []  # (virtual time, ts) of each grouped message posted

    def post_group(self, incidents, channel=None):
        message = self.chat.post_group(incidents, channel)
        self.groups.append((self.clock.now(), message.message_id))  # when its turn came, on the virtual clock
        return message

    def post_incident(self, incident, channel=None, thread=None):
        message = self.chat.post_incident(incident, channel, thread)
        if not self.held:
            self.held = True
            assert self.release.wait(bound(60)), "the burst never got into the store"
        return message

    def __getattr__(self, name):
        return getattr(self.chat, name)


@pytest.fixture
def slack(slack, clock):
    slack.rate = RateLimit(clock.now)  # Slack's rate, on the virtual clock the bot's pacing waits on
    return slack


@pytest.fixture
def world(slack, clock, tmp_path):
    servers = []

    def make(workloads: int, release: threading.Event | None = None, group_storms: bool = True):
        cluster = FakeCluster()
        for w in range(workloads):
            cluster.add_pod(namespace(w), pod(w), f"vllm-w{w}")
        settings = load_settings({**SETTINGS, "SLACK_API_URL": slack.url})
        # a long client timeout: the held answer must not time out while the burst comes in
        chat = paced_chat(settings, make_client("xoxb-storm", slack.url, timeout=600), Metrics(), Redactor(),
                          ChatClock(clock.now, clock.sleep))
        held = HeldFirstPost(chat, release, clock) if release is not None else chat
        service = OncallService(cluster, FolderIncidentStore(tmp_path / f"s{len(servers)}"), held,
                                Policy(approver_users=frozenset({"U0APPROVER"}), group_storms=group_storms),
                                metrics=chat.metrics,
                                diagnose=kv_diagnosis)
        # an item per workload (queue_size): the storm's leader holds only its own while it posts
        server = BotServer(service, alert_token=TOKEN, work=WorkQueue(workers=4, queue_size=1000),
                           sweep_interval=0.5).start()
        servers.append(server)
        return server, cluster, held

    yield make
    for server in servers:
        server.stop()


def send_all(server, bodies: list[bytes]) -> list[int]:
    answers: list[int] = []
    threads = [threading.Thread(target=lambda b=b: answers.append(request(server, "/alerts", b, timeout=60)[0]))
               for b in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(bound(120))
    return answers


def kind(message: dict) -> str | None:
    return (message.get("metadata") or {}).get("event_type")


def group_lines(slack) -> list[str]:
    """`namespace/name` per line of every grouped message, from the blocks Slack received."""
    lines = []
    for call in slack.delivered("chat.postMessage"):
        if (call.params.get("metadata") or {}).get("event_type") != GROUP_EVENT_TYPE:
            continue
        for block in call.params["blocks"]:
            if block.get("block_id", "").startswith("group-line-"):
                lines.append(block["text"]["text"].split("`")[1])
    return lines


def own_messages_in_threads(slack) -> dict[str, tuple[str, dict]]:
    """incident name -> (the group's ts, its own message) for every incident message in a thread."""
    found = {}
    for (_channel, parent), replies in slack.threads.items():
        for message in replies:
            if kind(message) == EVENT_TYPE:
                found[message["metadata"]["event_payload"]["incident"]] = (parent, message)
    return found


def test_a_250_workload_burst_is_named_in_grouped_lines_within_10_s(world, slack, clock):
    release = threading.Event()
    server, cluster, held = world(workloads=250, release=release)
    store = server.service.store
    bodies = [batch([alert(w) for w in range(i, i + 50)]) for i in range(0, 250, 50)]
    sender = threading.Thread(target=lambda: send_all(server, bodies))
    sender.start()
    assert slack.wait_for(lambda: len(store.list()) == 250, 120), len(store.list())
    release.set()
    sender.join(bound(120))
    assert slack.wait_for(lambda: sum(1 for i in store.list() if i.group or i.message_id) == 250
                          and not server.service.posting.gathering.busy(""), 120)

    # Every workload named once at the top level: the storm's first post as its usual message (the
    # backlog was empty then), every other one as a line of a grouped message.
    top = slack.channel_messages(CHANNEL)
    singles = [m for m in top if kind(m) == EVENT_TYPE]
    groups = [m for m in top if kind(m) == GROUP_EVENT_TYPE]
    lines = group_lines(slack)
    named = lines + [m["text"].split("] ", 1)[1].split(":", 1)[0] for m in singles]
    assert sorted(named) == sorted(f"{namespace(w)}/vllm-w{w}" for w in range(250))
    assert len(singles) == 1 and len(lines) == 249
    assert len(groups) == -(-249 // GROUP_LINES) and len(top) == len(groups) + 1
    assert all(len(g["blocks"]) <= 50 for g in groups)
    assert "By namespace:* team-a" in json.dumps(groups[0]["blocks"])
    assert [ts for _, ts in held.groups] == [g["ts"] for g in groups]
    assert held.groups[-1][0] - held.groups[0][0] <= 10  # the last line within 10 s of the first, virtual clock
    assert slack.rate.limited == [] and slack.rate.early == []

    # Every grouped incident's own message, then its details, follow in its group's thread.
    assert slack.wait_for(lambda: len(own_messages_in_threads(slack)) == 249 and len(slack.details()) == 250, 300), \
        (len(own_messages_in_threads(slack)), len(slack.details()))
    threads = own_messages_in_threads(slack)
    details = {c.params["metadata"]["event_payload"]["incident"]: c.params["thread_ts"] for c in slack.details()}
    group_ts = {g["ts"] for g in groups}
    for incident in store.list():
        if incident.group is None:  # the storm's first post: its details under it
            assert details[incident.name] == incident.message_id
            continue
        parent, message = threads[incident.name]
        assert parent == incident.group.message_id in group_ts and message["ts"] == incident.message_id
        assert any(b.get("type") == "actions" for b in message["blocks"])  # its Approve / Reject
        assert details[incident.name] == parent  # beside it: a thread has one level
    assert slack.rate.limited == [] and slack.rate.early == []

    # A click on one of them, in its group's thread, approves that change and patches that workload only.
    chosen = next(i for i in store.list() if i.group is not None and i.workload == "vllm-w17")
    message = threads[chosen.name][1]
    value = next(e["value"] for b in message["blocks"] if b.get("type") == "actions"
                 for e in b["elements"] if e["action_id"] == "vllm_approve")
    name, _, digest = value.partition("|")
    assert name == chosen.name
    outcome = server.service.approve(name, "U0APPROVER", MessageRef(channel=CHANNEL, message_id=message["ts"]),
                                     digest)
    assert outcome == Outcome.APPLIED
    assert cluster.applied == [(chosen.proposal.id, cluster.applied[0][1])]
    assert chosen.proposal.workload.name == "vllm-w17"
    assert store.get(chosen.name).state in (IncidentState.APPLIED, IncidentState.VERIFIED)
    # the outcome is said in the group's thread (a thread has one level), the message re-rendered in place
    assert slack.wait_for(lambda: any(c.params.get("thread_ts") == chosen.group.message_id
                                      and "U0APPROVER" in json.dumps(c.params.get("blocks"))
                                      for c in slack.delivered("chat.postMessage")), 60)
    assert any(c.params["ts"] == chosen.message_id for c in slack.delivered("chat.update"))


@pytest.mark.parametrize("crashes", [2, 3])
def test_a_storm_of_a_few_crashes_keeps_its_usual_messages(world, slack, crashes):
    release = threading.Event()
    server, _, _ = world(workloads=crashes, release=release)
    sender = threading.Thread(target=lambda: send_all(server, [batch([alert(w) for w in range(crashes)])]))
    sender.start()
    assert slack.wait_for(lambda: len(server.service.store.list()) == crashes, 60)
    release.set()  # the others waited for the channel's turn meanwhile: still not a storm
    sender.join(bound(60))
    assert slack.wait_for(lambda: all(i.message_id for i in server.service.store.list()), 60)
    top = slack.channel_messages(CHANNEL)
    assert [kind(m) for m in top] == [EVENT_TYPE] * crashes
    assert all(i.group is None for i in server.service.store.list())
    assert slack.wait_for(lambda: len(slack.details()) == crashes, 60)
    assert slack.rate.limited == [] and slack.rate.early == []


def test_without_storm_grouping_every_crash_of_a_burst_gets_its_own_message(world, slack):
    """Unpaced (VLLM_ONCALL_SLACK_POST_INTERVAL=0: an endpoint without Slack's rate) the bot does
    not group: a burst that would be a storm posts one top-level message per workload."""
    crashes = 8
    release = threading.Event()
    server, _, _ = world(workloads=crashes, release=release, group_storms=False)
    sender = threading.Thread(target=lambda: send_all(server, [batch([alert(w) for w in range(crashes)])]))
    sender.start()
    assert slack.wait_for(lambda: len(server.service.store.list()) == crashes, 60)
    release.set()
    sender.join(bound(60))
    assert slack.wait_for(lambda: all(i.message_id for i in server.service.store.list()), 60)
    assert [kind(m) for m in slack.channel_messages(CHANNEL)] == [EVENT_TYPE] * crashes
    assert all(i.group is None for i in server.service.store.list())
