"""The blocks are written as plain JSON (bot/slack/blocks.py), no longer through slack_sdk's Block
Kit models; these tests hold them to what those models would send. For every fixture bundle
(and the shared corpus when it is there), in every state, with its thread, its group line and
a note: each block read into slack_sdk's model and written out again (which runs its limit
checks) gives the same bytes, key order included. And the limits the builders check refuse,
with one line, what Slack would refuse."""

from __future__ import annotations

import json

import pytest
from slack_sdk.models.blocks import Block
from test_message_first_screen import NOW, rendered
from test_one_number_one_source import BUNDLES, CORPUS_BUNDLES

from bot.app.links import IncidentLinks, Link, LinkKind
from bot.app.records import Note, NoteKind
from bot.app.state import IncidentState
from bot.slack.blocks import (
    group_message,
    incident_message,
    incident_thread,
    note_message,
    rollback_button,
)

LINKS = IncidentLinks(links=[Link(kind=LinkKind.RUNBOOK, url="https://runbooks.example/kv?a=<b>&c"),
                             Link(kind=LinkKind.DASHBOARD, url="https://grafana.example/d/vllm")],
                      commands=["kubectl -n inference logs pod --previous"])


def as_slack_sdk_sends(blocks: list[dict]) -> str:
    """The bytes WebClient sends for these blocks once slack_sdk's models have read and checked them."""
    return json.dumps([Block.parse(block).to_dict() for block in blocks])


@pytest.mark.parametrize("bundle", BUNDLES + CORPUS_BUNDLES, ids=[b.name for b in BUNDLES]
                         + [f"corpus-{b.name}" for b in CORPUS_BUNDLES])
def test_every_message_is_the_json_slack_sdk_would_send(bundle, tmp_path):
    incident = rendered(bundle, tmp_path)
    messages = [incident_message(incident.revised(state=state, approver="U0APPROVER", decided_at=NOW))
                for state in IncidentState]
    messages += [incident_message(incident.revised(log_cut=True, pods=[f"pod-{n}" for n in range(7)])),
                 incident_thread(incident), incident_thread(incident.revised(links=LINKS)),
                 group_message([incident, incident.revised(namespace="other")])]
    if incident.diagnosis is not None:
        messages.append(note_message(Note(kind=NoteKind.CRASHED_AGAIN, pod="p", message="crashed again",
                                          diagnosis=incident.diagnosis, rollback_incident=incident.name)))
    for _, blocks in messages:
        assert json.dumps(blocks) == as_slack_sdk_sends(blocks)


def test_the_comparison_sees_the_key_order():
    """Not vacuous: the same block with its keys in another order is other bytes."""
    block = rollback_button("inc-1")
    reordered = {key: block[key] for key in reversed(block)}
    assert reordered == block and json.dumps([reordered]) != as_slack_sdk_sends([reordered])


def test_a_value_longer_than_slack_allows_is_refused_in_one_line():
    assert rollback_button("i" * 2000)["elements"][0]["value"] == "i" * 2000
    with pytest.raises(ValueError, match=r"^a button's value has 2001 characters; Slack allows 2000$"):
        rollback_button("i" * 2001)
