"""Storms (bot/app/grouping.py): the backlog waiting for a channel's turn, its grouped messages,
and the incidents named in them (their own message in the group's thread, never top-level)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

from builders import wait_for
from fakes import FakeCluster, RecordingChat, kv_diagnosis
from standin_http import bound

from bot.app.grouping import GROUP_AFTER, GROUP_LINES, Gathering
from bot.app.records import AlertTarget, Incident, MessageRef, Note, NoteKind
from bot.app.service import OncallService, Policy
from bot.app.state import IncidentState
from bot.diagnosis.models import Change
from bot.local.store import FolderIncidentStore
from bot.remedy.models import Proposal, WorkloadRef
from bot.slack.blocks import MAX_BLOCKS, group_message

T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def incident(n: int, namespace: str = "team-a", before: str = "32768", changes: bool = True) -> Incident:
    workload = WorkloadRef(kind="Deployment", namespace=namespace, name=f"vllm-w{n}", container="vllm")
    proposal = Proposal(id=f"p{n}", cluster="c1", workload=workload, cause="kv-cache-max-model-len",
                        title="The KV cache cannot hold one request", json_patch=[], created_at=T0, command_before=[], command_after=[],
                        expires_at=T0 + timedelta(hours=1),
                        changes=[Change(kind="flag", name="--max-model-len", before=before, after="18432")]) \
        if changes else None
    return Incident(name=f"i{n}", cluster="c1", namespace=namespace, workload=f"vllm-w{n}",
                    cause="kv-cache-max-model-len", state=IncidentState.PROPOSED if changes else IncidentState.DIAGNOSED,
                    first_seen=T0, last_seen=T0, proposal=proposal, diagnosis=kv_diagnosis())


# ---- the backlog ------------------------------------------------------------------------

def test_the_first_to_wait_leads_and_posts_a_few_one_by_one():
    gathering = Gathering(Clock())
    assert gathering.join("C1", incident(0)) is True
    assert [gathering.join("C1", incident(n)) for n in range(1, GROUP_AFTER)] == [False] * (GROUP_AFTER - 1)
    assert gathering.busy("C1") and not gathering.busy("C2")
    singles = [gathering.next_batch("C1") for _ in range(GROUP_AFTER)]
    assert [(b.grouped, [i.name for i in b.incidents]) for b in singles] == \
        [(False, [f"i{n}"]) for n in range(GROUP_AFTER)]
    assert gathering.next_batch("C1") is None and not gathering.busy("C1")  # the leader stepped down
    assert gathering.join("C1", incident(9)) is True  # the next one to wait leads


def test_a_backlog_above_the_threshold_is_grouped_in_messages_of_at_most_group_lines():
    clock = Clock()
    gathering = Gathering(clock)
    for n in range(2 * GROUP_LINES + 1):
        gathering.join("C1", incident(n))
    batches = []
    while (batch := gathering.next_batch("C1")) is not None:
        batches.append(batch)
        clock.now += timedelta(seconds=1)
    assert [(b.grouped, len(b.incidents)) for b in batches] == [(True, GROUP_LINES), (True, GROUP_LINES), (True, 1)]
    names = [i.name for b in batches for i in b.incidents]
    assert names == [f"i{n}" for n in range(2 * GROUP_LINES + 1)]  # each once, oldest first


def test_during_a_storm_even_one_waiting_incident_joins_a_new_group_and_after_it_not():
    clock = Clock()
    gathering = Gathering(clock, storm_window=timedelta(minutes=2))
    for n in range(GROUP_AFTER + 1):
        gathering.join("C1", incident(n))
    assert gathering.next_batch("C1").grouped
    assert gathering.next_batch("C1") is None
    clock.now += timedelta(seconds=90)
    gathering.join("C1", incident(50))
    assert gathering.next_batch("C1").grouped  # the storm is still on
    gathering.next_batch("C1")
    clock.now += timedelta(minutes=3)
    gathering.join("C1", incident(51))
    assert not gathering.next_batch("C1").grouped  # over: its usual message


# ---- the grouped message ----------------------------------------------------------------

def test_the_grouped_message_has_a_line_per_workload_by_namespace_within_slacks_blocks():
    incidents = [incident(n, namespace="team-b" if n % 3 else "team-a") for n in range(GROUP_LINES - 1)]
    incidents.append(incident(99, changes=False))
    text, blocks = group_message(incidents)
    assert len(blocks) <= MAX_BLOCKS
    assert blocks[0]["text"]["text"] == f"c1 · {GROUP_LINES} vLLM workloads crashing"
    assert blocks[1]["text"]["text"] == "*By namespace:* team-a 16, team-b 29"
    lines = [b["text"]["text"] for b in blocks if b.get("block_id", "").startswith("group-line-")]
    assert len(lines) == GROUP_LINES
    assert lines[0] == "`team-a/vllm-w0` · The KV cache cannot hold one request of --max-model-len tokens · " \
                       "`--max-model-len: 32768 → 18432`"
    assert "`team-a/vllm-w99` · The KV cache cannot hold one request of --max-model-len tokens · no change" in lines
    assert not any(b.get("type") == "actions" for b in blocks)  # the buttons are on each one's own message
    assert text.startswith(f"[c1] {GROUP_LINES} vLLM workloads crashing: team-a/vllm-w0, ")


def test_the_grouped_message_redacts_and_escapes_what_came_from_the_cluster():
    token = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"
    text, blocks = group_message([incident(1, before=f"<!channel> {token} & co")])
    shown = json.dumps(blocks) + text
    assert token not in shown and "<!channel>" not in shown
    assert "&lt;!channel&gt;" in shown and "&amp; co" in shown


# ---- the incidents named in a group -----------------------------------------------------

class HeldChat(RecordingChat):
    """The chat, with the answer to its first post held until `release` is set: the second a real
    post waits for the channel's turn, in which the others pile up."""

    def __init__(self):
        super().__init__()
        self.release, self.held = threading.Event(), False
        self.threads: list[tuple[str, MessageRef | None]] = []  # (incident, thread) per post_incident

    def post_incident(self, incident, channel=None, thread=None):
        ref = super().post_incident(incident, channel, thread)
        self.threads.append((incident.name, thread))
        if not self.held:
            self.held = True
            assert self.release.wait(bound(60))
        return ref


def test_a_grouped_incident_is_posted_in_its_groups_thread_never_top_level(tmp_path):
    cluster, chat = FakeCluster(), HeldChat()
    for w in range(GROUP_AFTER + 2):
        cluster.add_pod("team-a", f"vllm-w{w}-7d9f8c6b5-x2k4p", f"vllm-w{w}")
    service = OncallService(cluster, FolderIncidentStore(tmp_path), chat,
                            Policy(approver_users=frozenset({"U0APPROVER"})), diagnose=kv_diagnosis)
    alerts = [AlertTarget(namespace="team-a", pod=f"vllm-w{w}-7d9f8c6b5-x2k4p", container="vllm")
              for w in range(GROUP_AFTER + 2)]
    leader = threading.Thread(target=service.handle_alert, args=(alerts[0],))
    leader.start()
    assert wait_for(lambda: chat.held, bound(60))
    for target in alerts[1:]:  # they wait for the channel's turn: handled, not posted
        assert service.handle_alert(target).message_id is None
    chat.release.set()
    leader.join(bound(60))
    assert len(chat.grouped) == 1 and sorted(chat.grouped[0][0]) == sorted(
        i.name for i in service.store.list() if i.workload != "vllm-w0")
    grouped = [i for i in service.store.list() if i.group is not None]
    assert len(grouped) == GROUP_AFTER + 1 and not any(i.message_id for i in grouped)

    service.sweep()  # the channel is free: each grouped one's own message, in the group's thread
    group = grouped[0].group
    assert sorted(chat.threads[1:]) == sorted((i.name, group) for i in grouped)
    assert chat.threads[0][1] is None  # the first: its usual message, top-level
    assert all(i.message_id and i.group == group for i in service.store.list() if i.workload != "vllm-w0")
    service.sweep()  # posted once: never again, never top-level
    assert len(chat.posts) == GROUP_AFTER + 2

    # A reply about it (a click on its message in the thread) goes in the group's thread: one level.
    one = next(i for i in service.store.list() if i.group is not None)
    service.posting.messages.reply(one, one.message_ref(), Note(kind=NoteKind.CRASHING_AGAIN, pod="p"))
    assert chat.replies[-1][0] == group
