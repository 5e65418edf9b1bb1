"""One Slack message per incident, whatever Slack answers and wherever the bot dies: the message's
identity (post_key) is stored with the post lease before the post and travels in the message's
metadata; after an ambiguous answer (timeout, 5xx, dropped connection) or a kill mid-post, whoever
takes the lease over looks for it in the channel's history before posting again.

Through the real SlackChat / WebClient against the Slack stand-in (which keeps the messages and
answers conversations.history) and the real KubeIncidentStore against the Kubernetes stand-in."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

import pytest
from builders import EXAMPLE_LOG
from kubeapi.objects import container, crashing_deployment
from slackapi import Chaos

from bot.app.ports import ChatUnavailable
from bot.app.records import AlertTarget, Incident, MessageRef, Note, NoteKind
from bot.app.service import OncallService, Policy
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.slack.chat import EVENT_TYPE, SlackChat, make_client

NS, CHANNEL = "inference", "C0ALERTS"
LEASE_OVER = timedelta(seconds=61)  # a little more than the default post lease (bot.app.policy)


class Clock:
    """The service's clock, moved on by the test instead of sleeping out a lease."""

    def __init__(self):
        self.offset = timedelta(0)

    def __call__(self):
        return datetime.now(UTC) + self.offset


class Killed(BaseException):
    """The process died: nothing after this point of the post runs (not an Exception: nobody catches it)."""


class DiesMidPost:
    """The real SlackChat, in a process that is killed during the post: `before` the request
    reaches Slack, or `after` Slack posted but before the bot read the answer and stored the ts."""

    def __init__(self, chat: SlackChat, when: str):
        self.chat, self.when = chat, when

    def post_incident(self, incident, channel=None, thread=None):
        if self.when == "before":
            raise Killed()
        self.chat.post_incident(incident, channel, thread)
        raise Killed()

    def __getattr__(self, name):
        return getattr(self.chat, name)


class PostWorld:
    """One bot instance over the shared stand-ins: several are replicas (or a restarted process)."""

    def __init__(self, kube, slack, clock: Clock, workloads=("vllm-a",), fresh=True, slack_timeout=10,
                 wrap=lambda chat: chat):
        self.kube, self.slack, self.clock = kube, slack, clock
        for name in workloads if fresh else ():
            crashing_deployment(kube, name=name, previous_log=EXAMPLE_LOG, containers=[container(
                command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])])
        api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=3, initial=0.001, maximum=0.002,
                                                           sleep=lambda s: None), request_timeout=2)
        self.store = KubeIncidentStore(api, "vllm-oncall")
        self.chat = SlackChat(make_client("xoxb-test", slack.url, timeout=slack_timeout), CHANNEL, max_attempts=2,
                              backoff_seconds=0.001, sleep=lambda s: None)
        self.service = OncallService(LiveCluster(api, name="prod", poll_seconds=0.01), self.store, wrap(self.chat),
                                     Policy(approver_users=frozenset({"U0APPROVER"}), verify_timeout_seconds=0.05),
                                     metrics=self.chat.metrics, clock=clock)

    def alert(self, workload: str):
        pod = next(p["metadata"]["name"] for p in self.kube.list("Pod", NS)
                   if p["metadata"]["name"].startswith(workload + "-"))
        return self.service.handle_alert(AlertTarget(namespace=NS, pod=pod, container="vllm"))

    def counted(self, metric: str) -> float:
        return getattr(self.chat.metrics, metric)._value.get()

    def messages_of(self, incident_name: str) -> list[dict]:
        """The top-level messages in the channel that belong to this incident (by their metadata)."""
        return [m for m in self.slack.channel_messages(CHANNEL)
                if (m.get("metadata") or {}).get("event_payload", {}).get("incident") == incident_name]

    def sweep_past_the_lease(self):
        self.clock.offset += LEASE_OVER
        self.service.sweep()


def assert_one_message(world: PostWorld, name: str) -> dict:
    stored = world.store.get(name)
    messages = world.messages_of(name)
    assert len(messages) == 1, f"{name}: {len(messages)} messages in the channel"
    assert stored.message_id == messages[0]["ts"] and stored.chat_channel == CHANNEL
    assert messages[0]["metadata"] == {"event_type": EVENT_TYPE,
                                       "event_payload": {"incident": name, "post_key": stored.post_key}}
    assert stored.post_lease is None
    return messages[0]


def test_the_message_carries_the_post_key_stored_before_the_post(kube_api, slack):
    world = PostWorld(kube_api, slack, Clock())
    incident = world.alert("vllm-a")
    assert incident.post_key and incident.post_key.startswith(incident.name + "/")
    assert_one_message(world, incident.name)
    assert slack.attempts("conversations.history") == []  # a first attempt has nothing to look for
    assert world.counted("incidents_posted") == 1 and world.counted("posts_recovered") == 0


def ambiguous_then_recovered(world: PostWorld) -> None:
    incident = world.alert("vllm-a")
    assert incident.message_id is None
    stored = world.store.get(incident.name)
    assert stored.post_lease is not None, "an ambiguous answer keeps the lease"
    assert "post answer unclear" in stored.history[-1]
    assert len(world.messages_of(incident.name)) == 1  # Slack did post it
    world.service.sweep()  # within the lease: nobody posts again
    assert world.store.get(incident.name).message_id is None and len(world.messages_of(incident.name)) == 1
    world.sweep_past_the_lease()
    assert_one_message(world, incident.name)
    assert len(top_level_posts(world.slack)) == 1, "found in the history, never posted again"
    assert world.counted("incidents_posted") == 1 and world.counted("posts_recovered") == 1
    assert "found in the history of" in world.store.get(incident.name).history[-1]
    # the earlier attempt's answer was lost before it could post the details: the recovery posts them, once
    assert_details_once(world, incident.name)


def assert_details_once(world: PostWorld, name: str) -> None:
    """The message's thread holds exactly one details reply for the incident (by its metadata)."""
    message = world.store.get(name).message_id
    details = [c for c in world.slack.details() if c.params.get("thread_ts") == message]
    assert len(details) == 1, f"{len(details)} details replies under the message"
    assert details[0].params["metadata"]["event_payload"] == {"incident": name}
    world.sweep_past_the_lease()  # a later sweep finds the message posted: nothing more in its thread
    assert len([c for c in world.slack.details() if c.params.get("thread_ts") == message]) == 1


def test_slack_slower_than_the_client_timeout_gives_one_message(kube_api, slack):
    world = PostWorld(kube_api, slack, Clock(), slack_timeout=1)
    slack.slow_next("chat.postMessage", 2)  # posted at once, answered after 2 s: the client gave up at 1 s
    ambiguous_then_recovered(world)


@pytest.mark.parametrize("drop", [False, True], ids=["500-after-posting", "connection-dropped-after-posting"])
def test_a_5xx_or_a_dropped_connection_after_posting_gives_one_message(kube_api, slack, drop):
    world = PostWorld(kube_api, slack, Clock())
    slack.fail_next("chat.postMessage", status=500, error="internal_error", retry_after=None, after_commit=True,
                    drop=drop)
    ambiguous_then_recovered(world)


def test_a_kill_after_slack_posted_is_recovered_by_a_second_instance_without_a_second_message(kube_api, slack):
    clock = Clock()
    dying = PostWorld(kube_api, slack, clock, wrap=lambda chat: DiesMidPost(chat, "after"))
    with pytest.raises(Killed):
        dying.alert("vllm-a")
    [stored] = dying.store.list()
    assert stored.post_key and stored.post_lease is not None and stored.message_id is None
    assert len(dying.messages_of(stored.name)) == 1
    second = PostWorld(kube_api, slack, clock, fresh=False)  # another replica, or the restarted process
    second.service.sweep()
    assert second.store.get(stored.name).message_id is None, "the dead holder's lease still runs"
    second.sweep_past_the_lease()
    assert_one_message(second, stored.name)
    assert len(top_level_posts(slack)) == 1
    assert second.counted("incidents_posted") == 1 and second.counted("posts_recovered") == 1
    assert slack.delivered("chat.update"), "the recovered message is re-rendered from the incident as it is now"
    # the dying attempt had posted its details before the kill: the recovery looks and posts none
    assert slack.attempts("conversations.replies")
    assert_details_once(second, stored.name)


def test_a_recovered_message_whose_thread_cannot_be_read_gets_no_second_details(kube_api, slack):
    clock = Clock()
    dying = PostWorld(kube_api, slack, clock, wrap=lambda chat: DiesMidPost(chat, "after"))
    with pytest.raises(Killed):
        dying.alert("vllm-a")
    [stored] = dying.store.list()
    slack.fail_next("conversations.replies", status=503, error="service_unavailable", retry_after=None, times=100)
    second = PostWorld(kube_api, slack, clock, fresh=False)
    second.sweep_past_the_lease()
    assert_one_message(second, stored.name)
    assert len(slack.details()) == 1, "cannot tell whether the details are there: none posted again"


def test_a_kill_before_the_post_reached_slack_gives_exactly_one_message_after_the_sweep(kube_api, slack):
    clock = Clock()
    dying = PostWorld(kube_api, slack, clock, wrap=lambda chat: DiesMidPost(chat, "before"))
    with pytest.raises(Killed):
        dying.alert("vllm-a")
    [stored] = dying.store.list()
    assert slack.channel_messages(CHANNEL) == []
    second = PostWorld(kube_api, slack, clock, fresh=False)
    second.sweep_past_the_lease()
    message = assert_one_message(second, stored.name)
    assert message["metadata"]["event_payload"]["post_key"] == stored.post_key  # the same key, kept
    assert len(slack.attempts("conversations.history")) == 1  # looked first, found nothing, posted
    assert second.counted("incidents_posted") == 1 and second.counted("posts_recovered") == 0
    second.sweep_past_the_lease()
    assert len(slack.channel_messages(CHANNEL)) == 1


def test_while_the_history_cannot_be_read_nothing_is_posted_again(kube_api, slack):
    world = PostWorld(kube_api, slack, Clock())
    slack.fail_next("chat.postMessage", status=503, error="service_unavailable", retry_after=None)  # unclear
    incident = world.alert("vllm-a")
    assert incident.message_id is None and slack.channel_messages(CHANNEL) == []
    slack.fail_next("conversations.history", status=503, error="service_unavailable", retry_after=None, times=100)
    for _ in range(3):
        world.sweep_past_the_lease()
        stored = world.store.get(incident.name)
        assert stored.message_id is None and stored.post_lease is None  # looked, could not tell, let go
        assert "could not check the channel" in stored.history[-1]
    assert len(top_level_posts(slack)) == 1 and slack.channel_messages(CHANNEL) == []
    slack.clear_faults()
    world.service.sweep()  # the lease was released: the very next sweep looks again, then posts
    assert_one_message(world, incident.name)
    assert world.counted("incidents_posted") == 1 and world.counted("posts_recovered") == 0


def test_under_30_percent_injected_post_failures_each_incident_has_exactly_one_message(kube_api, slack):
    names = [f"vllm-{i}" for i in range(10)]
    world = PostWorld(kube_api, slack, Clock(), workloads=names, slack_timeout=1)
    chaos = slack.chaos = Chaos(0.3, seed=8, slow=1.5)
    incidents = [world.alert(name) for name in names]
    for _ in range(6):  # sweeps after the leases ran out, still under faults
        world.sweep_past_the_lease()
    slack.chaos = None
    world.sweep_past_the_lease()
    world.sweep_past_the_lease()
    for incident in incidents:
        assert_one_message(world, incident.name)
    assert len(slack.channel_messages(CHANNEL)) == len(names)
    kinds = {kind for _, kind in chaos.injected}
    assert {"before", "after"} <= kinds and kinds & {"drop", "slow"}, chaos.injected  # all kinds really happened
    assert world.counted("incidents_posted") == len(names)
    # every post that took effect but whose answer the bot never got (500, dropped, too slow) was
    # found in the history instead of posted again
    unanswered = [c for c in top_level_posts(slack) if c.committed and (not c.ok or c.delay)]
    assert world.counted("posts_recovered") == len(unanswered) >= 1


# ---- SlackChat.find_posted against the stand-in's conversations.history ---------------------------------

def chat_for(slack) -> SlackChat:
    return SlackChat(make_client("xoxb-test", slack.url), CHANNEL, max_attempts=2, backoff_seconds=0.001,
                     sleep=lambda s: None)


def fill(slack, channel: str, n: int, start: float, key_at: int | None = None, bot_id: str = "B0BOT") -> None:
    """n messages one second apart from `start`; the one at `key_at` carries post_key "inc/k"."""
    messages = slack.messages.setdefault(channel, [])
    for i in range(n):
        message = {"type": "message", "ts": f"{start + i:.6f}", "user": "U0OTHER", "text": f"chatter {i}"}
        if i == key_at:
            message.update(bot_id=bot_id, metadata={"event_type": EVENT_TYPE,
                                                    "event_payload": {"incident": "inc", "post_key": "inc/k"}})
        messages.append(message)


def test_find_posted_reads_back_page_by_page_to_the_attempts_start(slack):
    start = datetime.now(UTC) - timedelta(minutes=20)
    fill(slack, CHANNEL, 450, start.timestamp(), key_at=3)  # the oldest few: three pages back
    found = chat_for(slack).find_posted(None, "inc/k", start)
    assert found is not None and found.message_id == f"{start.timestamp() + 3:.6f}" and found.channel == CHANNEL
    pages = slack.attempts("conversations.history")
    assert len(pages) == 3 and all(p.params["include_all_metadata"] in ("1", "true") for p in pages)
    assert float(pages[0].params["oldest"]) == pytest.approx((start - timedelta(minutes=10)).timestamp())
    assert chat_for(slack).find_posted(None, "inc/other-key", start) is None


def test_find_posted_ignores_the_key_in_another_apps_message(slack):
    start = datetime.now(UTC) - timedelta(minutes=1)
    fill(slack, CHANNEL, 5, start.timestamp(), key_at=2, bot_id="B0IMPOSTOR")
    assert chat_for(slack).find_posted(None, "inc/k", start) is None


def test_find_posted_in_a_history_longer_than_its_bound_cannot_tell(slack):
    start = datetime.now(UTC) - timedelta(hours=2)
    fill(slack, CHANNEL, 2100, start.timestamp())
    with pytest.raises(ChatUnavailable, match="cannot tell"):
        chat_for(slack).find_posted(None, "inc/k", start)


def test_find_reply_finds_the_bots_own_keyed_reply_in_the_thread_and_nothing_else(slack):
    chat = chat_for(slack)
    parent = chat.client.chat_postMessage(channel=CHANNEL, text="incident")
    thread = MessageRef(channel=CHANNEL, message_id=parent["ts"])
    chat.reply(thread, Note(kind=NoteKind.COMMENTARY, message="chatter"))
    assert not chat.find_reply(thread, "applied/d1")
    chat.reply(thread, Note(kind=NoteKind.APPLIED, actor="U0SOMEONE", key="applied/d1"))
    assert chat.find_reply(thread, "applied/d1") and not chat.find_reply(thread, "applied/d2")
    (keyed,) = [m for m in slack.threads[(CHANNEL, parent["ts"])] if m.get("metadata")]
    keyed["bot_id"] = "B0IMPOSTOR"  # the same key in another app's reply does not count
    assert not chat.find_reply(thread, "applied/d1")
    with pytest.raises(ChatUnavailable):  # a thread that cannot be read: cannot tell
        chat.find_reply(MessageRef(channel=CHANNEL, message_id="1.000001"), "applied/d1")


@pytest.mark.parametrize("fault, ambiguous", [
    ({"status": 500, "error": "internal_error"}, True),
    ({"status": 503, "error": "service_unavailable"}, True),
    ({"status": 200, "error": "channel_not_found"}, False),
    ({"status": 429, "error": "ratelimited", "times": 2}, False),
    ({"status": 500, "error": "internal_error", "after_commit": True}, True),
], ids=["500", "503", "channel_not_found", "429-after-retries", "500-after-commit"])
def test_a_failed_post_says_whether_slack_may_have_posted(slack, fault, ambiguous):
    now = datetime.now(UTC)
    incident = Incident(name="inc", cluster="prod", namespace=NS, workload="w", cause=None, state="diagnosed",
                        first_seen=now, last_seen=now, post_key="inc/k")
    slack.fail_next("chat.postMessage", retry_after=0, **fault)
    with pytest.raises(ChatUnavailable) as err:
        chat_for(slack).post_incident(incident)
    assert err.value.ambiguous is ambiguous


def test_a_refused_connection_is_not_ambiguous():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    now = datetime.now(UTC)
    incident = Incident(name="inc", cluster="prod", namespace=NS, workload="w", cause=None, state="diagnosed",
                        first_seen=now, last_seen=now, post_key="inc/k")
    chat = SlackChat(make_client("xoxb-test", f"http://127.0.0.1:{port}/api/", timeout=2), CHANNEL, max_attempts=2,
                     backoff_seconds=0.001, sleep=lambda s: None)
    with pytest.raises(ChatUnavailable) as err:
        chat.post_incident(incident)
    assert err.value.ambiguous is False


def top_level_posts(slack) -> list:
    """The attempts to post an incident's message (not the details reply posted in its thread)."""
    return [c for c in slack.attempts("chat.postMessage") if not c.params.get("thread_ts")]
