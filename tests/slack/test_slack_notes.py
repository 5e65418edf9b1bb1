"""How the use cases' notes read in Slack (bot/slack/notes.py): words, emoji, mentions, escaping."""

from __future__ import annotations

from datetime import datetime

import pytest

from bot.app.records import Note, NoteKind
from bot.app.state import IncidentState, VerificationStep, VerifyOutcome
from bot.diagnosis.redact import Redactor
from bot.slack.notes import mention, note_text

K = NoteKind


@pytest.mark.parametrize("note, text", [
    (Note(kind=K.APPLIED, actor="U0APPROVER", message="patched Deployment inference/vllm"),
     ":white_check_mark: Applied by <@U0APPROVER>. patched Deployment inference/vllm\nFollowing the rollout…"),
    (Note(kind=K.POD_READY, pod="vllm-2", message="", lines=["GPU KV cache size: 18,432 tokens"]),
     ":white_check_mark: 1/4 New pod vllm-2 is Ready.\n2/4 vLLM: GPU KV cache size: 18,432 tokens"),
    (Note(kind=K.NOT_CONFIRMED, outcome=VerifyOutcome.TIMEOUT, message="no new pod in 60 s"),
     ":hourglass: Rollout not confirmed (timeout): no new pod in 60 s"),
    (Note(kind=K.NO_KV_FIGURES, pod="vllm-2", state=IncidentState.APPLIED),
     ":warning: Ready, no KV figures: the new pod vllm-2 is Ready, but vLLM printed no KV-cache line, so the fix "
     "is not confirmed (the incident stays applied)."),
    (Note(kind=K.SOAK_STARTED, pod="vllm-2", seconds=600.0), ":hourglass_flowing_sand: 4/4 Soak: watching vllm-2 for 600 s."),
    (Note(kind=K.RESUMED, step=VerificationStep.SOAK),
     ":arrows_counterclockwise: The bot restarted during verification (step: soak), or the replica following it "
     "stopped; resuming it."),
    (Note(kind=K.ROLLED_BACK, actor="U0APPROVER", message="previous command line restored"),
     ":leftwards_arrow_with_hook: Rolled back by <@U0APPROVER>: previous command line restored"),
    (Note(kind=K.NOT_APPLIED, message="the target changed", workload="inference/vllm"),
     ":no_entry: Not applied, nothing was changed: the target changed. Run `/vllm why inference/vllm` for a fresh "
     "proposal."),
    (Note(kind=K.EDITED_NEW_CAUSE, workload="Deployment inference/vllm", changed=["containers[vllm].args"],
          message="resourceVersion 7 != 9", detail="Out of GPU memory"),
     ":warning: Not applied: Deployment inference/vllm was edited since the proposal (containers[vllm].args). "
     "resourceVersion 7 != 9\nRe-diagnosed: the cause is now Out of GPU memory; posted as a new incident."),
    (Note(kind=K.EVIDENCE_KEPT, at=datetime(2026, 12, 1, 9, 30, 5), detail="3 hours ago"),
     "The previous container's log is gone (the container restarted since), so this diagnosis is from the evidence "
     "collected at 2026-12-01 09:30:05 UTC (3 hours ago), kept with the incident."),
    (Note(kind=K.SOMEONE_ELSE_FIRST, state=IncidentState.APPLIED, actor="U0OTHER"),
     "Someone else acted on this first (it is now applied by <@U0OTHER>). Nothing was changed."),
    (Note(kind=K.SOMEONE_ELSE_FIRST), "Someone else acted on this first (it is now gone). Nothing was changed."),
    (Note(kind=K.ALREADY_DECIDED, state=IncidentState.REJECTED, actor="U0OTHER"),
     "This proposal is already rejected by <@U0OTHER>. Nothing was changed."),
])
def test_each_note_reads_as_before(note, text):
    assert note_text(note) == text


def test_every_fact_from_the_cluster_is_escaped_and_only_our_mentions_are_markup():
    note = Note(kind=K.CRASHED_AGAIN, pod="<!channel>", message="<@U0EVIL> &lt;b&gt; @here")
    text = note_text(note)
    assert text.startswith(":x: The new pod &lt;!channel&gt; crashed again: &lt;@U0EVIL&gt; &amp;lt;b&amp;gt; @\u2060here")
    assert "<" not in text and ">" not in text
    # An actor that is not a Slack user id is shown as text, never as a broken mention.
    assert note_text(Note(kind=K.APPLIED, actor="unknown")).startswith(":white_check_mark: Applied by unknown.")
    assert mention("<!channel>") == "&lt;!channel&gt;" and mention(None) == "someone"


def test_facts_are_redacted_with_the_operators_patterns():
    redactor = Redactor(extra_patterns=[r"hunter2"])
    text = note_text(Note(kind=K.PATCH_FAILED, message="token hunter2 refused"), redactor)
    assert "hunter2" not in text and text.startswith(":x: The patch failed, nothing was changed: token ")
