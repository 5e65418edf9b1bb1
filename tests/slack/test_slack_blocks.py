"""Block Kit content and escaping: a log line can never ping anyone or break the layout."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from slack_sdk.models.blocks import Block, SectionBlock

from bot.app.records import Incident, Note, NoteKind
from bot.diagnosis.models import Change, DiagnosisResult, revised
from bot.remedy.models import Proposal, WorkloadRef
from bot.slack.blocks import blocks_to_text, incident_message, incident_thread, note_message
from bot.slack.escape import code_block, escape

NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
HOSTILE = "boom <!channel> <@U0BOSS> <!here|here> @here @channel @everyone a&b ```x``` <https://evil|click>"


def diagnosis(**kw) -> DiagnosisResult:
    fields = dict(cause="kv-cache-max-model-len", title="The KV cache cannot hold one request",
                  explanation="32768 tokens x 128 KiB/token = 4.00 GiB needed > 2.34 GiB available",
                  evidence=["Available KV cache memory: 2.34 GiB", HOSTILE],
                  memory_picture="[weights 14.99 GiB][activations][KV 2.34 GiB]",
                  changes=[Change(kind="flag", name="--max-model-len", before="32768", after="18432")],
                  command_before=["vllm", "serve", "m", "--max-model-len", "32768"],
                  command_after=["vllm", "serve", "m", "--max-model-len", "18432"],
                  container="vllm", pod="vllm-llama3-8b-7d9f8c6b5-x2k4p", node="gpu-l4-node-3",
                  gpu="NVIDIA-L4, 22 GiB", restarts=7)
    fields.update(kw)
    return DiagnosisResult(**fields)


def incident(state="proposed", blocked=None, cause="kv-cache-max-model-len", with_proposal=True, **kw) -> Incident:
    d = diagnosis(cause=cause)
    proposal = Proposal(
        id="p1", cluster="prod-eu", cause=cause or "", title=d.title, changes=d.changes,
        workload=WorkloadRef(kind="Deployment", namespace="inference", name="vllm-llama3-8b", container="vllm",
                             live_patch_blocked=blocked, repository_hint="values.yaml: vllmConfig.maxModelLen: 18432"
                             if blocked else None),
        command_before=d.command_before, command_after=d.command_after, created_at=NOW,
        expires_at=NOW + timedelta(hours=1), json_patch=[{"op": "test", "path": "/x", "value": 1}],
        dry_run_ok=True).sealed()
    return Incident(name="prod-eu-inference-vllm-llama3-8b-kv-cache-max-model-len-1a2b3c4d", cluster="prod-eu",
                    namespace="inference", workload="vllm-llama3-8b", cause=cause, state=state,
                    pods=["vllm-llama3-8b-7d9f8c6b5-x2k4p"], restarts=7, first_seen=NOW, last_seen=NOW,
                    diagnosis=d, proposal=proposal if with_proposal else None, **kw)


def all_text(blocks) -> str:
    return json.dumps(blocks, ensure_ascii=False)


def buttons(blocks):
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


def test_escape_neutralises_mentions_and_entities():
    out = escape(HOSTILE)
    for raw in ("<!channel>", "<@U0BOSS>", "<!here", "<https://evil"):
        assert raw not in out
    assert "&lt;!channel&gt;" in out and "a&amp;b" in out
    assert "@here" not in out and "@channel" not in out and "@everyone" not in out


def test_code_block_cannot_be_closed_by_the_log():
    block = code_block("line one\n``` now outside?\n`````")
    assert block.startswith("```\n") and block.endswith("\n```")
    assert block[3:-3].count("```") == 0


def test_message_and_its_thread_have_everything_an_on_call_engineer_needs():
    text, blocks = incident_message(incident())
    body = all_text(blocks) + all_text(incident_thread(incident())[1])
    for expected in ("prod-eu", "inference/vllm-llama3-8b", "vllm-llama3-8b-7d9f8c6b5-x2k4p", "vllm",
                     "gpu-l4-node-3", "NVIDIA-L4, 22 GiB", "*Restarts*\\n7", "The KV cache cannot hold",
                     "4.00 GiB needed", "Available KV cache memory: 2.34 GiB", "[weights 14.99 GiB]",
                     "--max-model-len 32768", "--max-model-len 18432", "--max-model-len: 32768 → 18432"):
        assert expected in body, expected
    assert "prod-eu" in text
    approve, reject = buttons(blocks)
    assert approve["action_id"] == "vllm_approve" and reject["action_id"] == "vllm_reject"
    # the incident's name and the digest of exactly the proposal shown, which the dialog names too
    digest = incident().proposal.digest
    assert len(digest) == 64 and approve["value"] == reject["value"] == f"{incident().name}|{digest}"
    confirm = approve["confirm"]["text"]["text"]
    assert "Deployment inference/vllm-llama3-8b" in confirm and "32768 → 18432" in confirm
    assert f"proposal {digest[:12]}" in confirm
    assert "rolling restart" in confirm and "longer than 18,432 tokens will be refused" in confirm
    assert "Roll back" in confirm
    assert approve["style"] == "primary" and "style" not in reject  # Slack's convention: the harmless one plain


def test_log_text_in_the_message_is_escaped():
    _, blocks = incident_message(incident())
    body = all_text(blocks)
    assert "<!channel>" not in body and "<@U0BOSS>" not in body and "<https://evil" not in body
    assert "@here" not in body and "@everyone" not in body


def test_no_buttons_when_gitops_manages_the_workload():
    _, blocks = incident_message(incident(state="diagnosed", blocked="managed by Argo CD; self-heal would revert"))
    assert buttons(blocks) == []
    assert "No live patch" in all_text(blocks)
    thread = all_text(incident_thread(incident(state="diagnosed", blocked="managed by Argo CD"))[1])
    assert "vllmConfig.maxModelLen: 18432" in thread


def test_no_buttons_without_a_known_cause():
    _, blocks = incident_message(incident(state="diagnosed", cause=None, with_proposal=False))
    assert buttons(blocks) == [] and "No change proposed" in all_text(blocks)


def test_decided_states_lose_the_buttons_and_say_who():
    decided = NOW + timedelta(minutes=3)
    for state, words in (("applied", "Applied by <@U0APPROVER>"), ("rejected", "Rejected by <@U0APPROVER>"),
                         ("expired", "expired"), ("resolved", "Resolved")):
        _, blocks = incident_message(incident(state=state, approver="U0APPROVER", decided_at=decided))
        assert buttons(blocks) == [] and words in all_text(blocks), state


def test_thread_note_with_rollback_and_terminal_rendering():
    _, blocks = note_message(Note(kind=NoteKind.CRASHED_AGAIN, pod="p", message="crashed again", diagnosis=diagnosis(), rollback_incident="inc-1"))
    assert buttons(blocks)[0]["action_id"] == "vllm_rollback" and buttons(blocks)[0]["value"] == "inc-1"
    text = blocks_to_text(incident_message(incident())[1])
    assert "[Approve] (asks: --max-model-len: 32768 → 18432 on Deployment inference/vllm-llama3-8b" in text and "[Reject]" in text
    assert "<!channel>" in text  # the terminal shows the literal log text; only Slack needs escaping


def long_incident() -> Incident:
    """Everything that comes from outside, far longer than Slack accepts."""
    lines = [f"line {n}: " + "x" * 300 + " <!here> ```" for n in range(60)]
    long = incident(state="proposed")
    return long.model_copy(update={
        "namespace": "n" * 120, "workload": "w" * 120, "pods": [f"pod-{n}-" + "p" * 200 for n in range(12)],
        "diagnosis": diagnosis(title="T" * 4000, explanation="e" * 5000, evidence=lines, memory_picture="m" * 4000,
                               node="node-" * 500, gpu="g" * 3000)})


def validated(blocks) -> list[dict]:
    """Each block read back into slack_sdk's model and written out again, which checks Slack's limits."""
    return [Block.parse(block).to_dict() for block in blocks]


@pytest.mark.parametrize("state", ["proposed", "diagnosed", "applied", "rejected", "rolled-back", "resolved"])
def test_blocks_validate_through_slack_sdk(state):
    _, blocks = incident_message(incident(state=state, approver="U0APPROVER", decided_at=NOW))
    assert validated(blocks) == blocks
    _, note = note_message(Note(kind=NoteKind.CRASHED_AGAIN, pod="p", message="crashed again", diagnosis=diagnosis(), rollback_incident="inc-1"))
    assert validated(note) == note


def test_texts_longer_than_slack_allows_are_cut_before_posting():
    text, blocks = incident_message(long_incident())
    assert validated(blocks) == blocks  # nothing raises: every text was fitted first
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b]
    assert all(len(t) <= SectionBlock.text_max_length for t in sections)
    assert all(len(f["text"]) <= 2000 for b in blocks for f in b.get("fields") or [])
    _, thread = incident_thread(long_incident())
    assert validated(thread) == thread
    evidence = next(b["text"]["text"] for b in thread if b["type"] == "section" and "text" in b
                    and b["text"]["text"].startswith("*Evidence*"))
    assert evidence.startswith("*Evidence* (from the previous container's log and the pod, oldest first)\n```\n"
                               "line 59: xxx")
    assert evidence.endswith("… (truncated)")
    assert len(blocks[0]["text"]["text"]) == 150  # the header, cut to Slack's 150
    assert buttons(blocks)[0]["value"] == f"{incident().name}|{incident().proposal.digest}"
    _, note = note_message(Note(kind=NoteKind.COMMENTARY, message="z" * 5000, diagnosis=long_incident().diagnosis,
                                rollback_incident="inc-1"))
    assert validated(note) == note and note[0]["text"]["text"].endswith("… (truncated)")


def test_an_empty_note_still_makes_a_valid_block():
    _, blocks = note_message(Note(kind=NoteKind.COMMENTARY))
    assert validated(blocks) == blocks and blocks[0]["text"]["text"].strip() == ""


def test_proposals_only_message_has_no_approve_button_and_says_why():
    inc = incident(state="diagnosed")
    inc = inc.model_copy(update={"proposal": inc.proposal.model_copy(update={
        "approvals_off": "proposals-only mode: this is the change the bot would make; nothing will be applied."})})
    _, blocks = incident_message(inc)
    assert buttons(blocks) == []
    text = all_text(blocks)
    assert "*Change:*" in text and "No Approve button" in text and "proposals-only mode" in text


def test_advice_is_shown_without_a_button_when_no_change_fits():
    inc = incident(state="diagnosed", with_proposal=False)
    # a record stored before advice had kinds: one sentence, read as one note
    inc = inc.revised(diagnosis=DiagnosisResult(**{**inc.diagnosis.model_dump(), "changes": [],
                                                   "advice": "8 of these 22 GiB GPUs would hold the weights <!channel>"}))
    _, blocks = incident_message(inc)
    assert buttons(blocks) == [] and "advice in the thread" in all_text(blocks)
    _, blocks = incident_thread(inc)
    advice = next(b for b in blocks if b.get("block_id") == "advice")
    assert "What would fit" in advice["text"]["text"] and "<!channel>" not in advice["text"]["text"]


def test_long_names_never_push_the_change_or_digest_out_of_the_confirm_dialog():
    long = incident()
    namespace, name = "n" * 63, "vllm-" + "w" * 248  # Kubernetes' limits: 63 and 253 characters
    p = long.proposal.model_copy(update={"workload": long.proposal.workload.model_copy(
        update={"namespace": namespace, "name": name})}).sealed()
    long = long.model_copy(update={"namespace": namespace, "workload": name, "proposal": p})
    _, blocks = incident_message(long)
    assert validated(blocks) == blocks
    confirm = buttons(blocks)[0]["confirm"]
    assert len(confirm["title"]["text"]) <= 100 and len(confirm["text"]["text"]) <= 300
    text = confirm["text"]["text"]
    assert "--max-model-len: 32768 → 18432" in text and f"proposal {p.digest[:12]}" in text
    assert "longer than 18,432 tokens will be refused" in text and "Roll back" in text


def test_pod_spec_findings_in_the_message_and_the_thread():
    from bot.diagnosis.models import Finding, FindingKind

    shm = Finding(kind=FindingKind.SHM_MISSING, title="No /dev/shm volume for several ranks",
                  text="2 vLLM processes exchange tensors through /dev/shm " + HOSTILE,
                  changes=[Change(kind="volume", name="/dev/shm", after="2Gi")])
    inc = incident()
    inc = inc.revised(diagnosis=DiagnosisResult(**{**inc.diagnosis.model_dump(), "findings": [shm]}))
    _, blocks = incident_message(inc)
    section = next(b for b in blocks if b.get("block_id") == "findings")
    assert "No /dev/shm volume for several ranks" in section["text"]["text"]
    assert "/dev/shm: (unset) → 2Gi" in section["text"]["text"]
    assert [b["type"] for b in blocks].index("actions") < blocks.index(section)  # the decision stays first
    _, thread = incident_thread(inc)
    detail = next(b for b in thread if b.get("block_id") == "findings")["text"]["text"]
    assert "2 vLLM processes exchange tensors through /dev/shm" in detail
    assert "<!channel>" not in detail and "<@U0BOSS>" not in detail  # escaped like any log text


def test_secrets_in_the_proposal_are_shown_redacted_and_a_clean_proposal_unchanged():
    """The proposal keeps its change values exact (the apply path needs them); the message and its
    thread show them redacted, as the workload's block reason and repository hint."""
    token = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
    clean = incident(blocked="owned by Argo CD")
    p = clean.proposal
    secret = clean.revised(proposal=revised(
        p, workload=revised(p.workload, live_patch_blocked=f"owned by Argo CD, token={token}",
                            repository_hint=f"values.yaml: hfToken: {token}"),
        changes=[Change(kind="flag", name="--hf-token", before=token, after=None), *p.changes]))
    shown = all_text(incident_message(secret)[1]) + all_text(incident_thread(secret)[1])
    assert token[:8] not in shown
    assert "--hf-token: *** → (removed)" in shown and "owned by Argo CD, token=***" in shown
    assert "values.yaml: hfToken: ***" in shown
    assert secret.proposal.changes[0].before == token  # the record itself is not changed
    assert incident_message(clean) == incident_message(incident(blocked="owned by Argo CD"))
