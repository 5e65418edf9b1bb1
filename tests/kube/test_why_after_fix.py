"""`/vllm why` on a workload whose fix was applied says so: the verification's result and a link
to the incident's thread, never the same change suggested again (issue 18). Against the stand-ins:
the Kubernetes API (the old crashed pod is still listed), a scripted vLLM pod, Slack (whose
chat.getPermalink gives the link)."""

from __future__ import annotations

import json

from test_verify_steps import APPROVER, NS, World

from bot.slack.blocks import blocks_to_text

HERE = "C0HERE"


def _text(call) -> str:
    blocks = call.params.get("blocks")
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    return blocks_to_text(blocks or []) if blocks else str(call.params.get("text", ""))


def _ask_about_the_old_pod(w: World, user: str):
    before = len(w.slack.posts())
    answer = w.service.answer_why(f"{NS}/{w.pod['metadata']['name']}", HERE, user)
    return answer, w.slack.posts()[before:]


def test_why_on_the_old_pod_after_a_verified_fix_says_it_was_applied_with_a_link():
    w = World(soak=0.2)
    try:
        name = w.open_and_approve()
        incident = w.service.store.get(name)
        assert incident.state == "verified"
        answer, posts = _ask_about_the_old_pod(w, APPROVER)
        assert answer is not None and answer.name == name and answer.state == "verified"  # not re-opened
        assert len(posts) == 1 and posts[0].params["channel"] == HERE
        shown = _text(posts[0])
        assert "Suggested change" not in shown and "[Approve]" not in shown, shown
        assert "the new pod is Ready" in shown
        reply = next(c for c in w.slack.replies() if "already applied" in str(c.params.get("text")))
        text = str(reply.params["text"])
        assert "`--max-model-len 32768 → 18432`" in text and f"by <@{APPROVER}>" in text, text
        assert "Verification: verified (ready): new pod" in text and "is Ready" in text
        ref = incident.message_ref()
        link = f"https://standin.slack.local/archives/{ref.channel}/p{ref.message_id.replace('.', '')}"
        assert f"<{link}|the incident's thread>" in text, text
        assert reply.params["channel"] == HERE
    finally:
        w.stop()


def test_without_an_applied_fix_why_still_rediagnoses():
    w = World(soak=0.2)
    try:
        answer, posts = _ask_about_the_old_pod(w, APPROVER)
        assert answer is not None and answer.state == "proposed"
        assert "[Approve]" in _text(posts[0])
        assert not any("already applied" in str(c.params.get("text")) for c in w.slack.replies())
    finally:
        w.stop()


def test_a_non_approver_is_shown_the_applied_fix_too_and_nothing_moves():
    w = World(soak=0.2)
    try:
        name = w.open_and_approve()
        answer, posts = _ask_about_the_old_pod(w, "U0STRANGER")
        assert answer is not None and answer.name == name and answer.state == "verified"
        assert len(posts) == 1 and "[Approve]" not in _text(posts[0])
        assert any("already applied" in str(c.params.get("text")) and c.params["channel"] == HERE
                   for c in w.slack.replies())
    finally:
        w.stop()
