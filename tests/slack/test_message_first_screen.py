"""The decision on the first screen (issue 18), over every fixture bundle: the message `serve`
posts has its Approve/Reject buttons within the first 4 blocks with at most 700 characters of
text above them; the memory picture, the budget, the command lines and the full evidence are in
the thread posted with it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from builders import FIXTURE_BUNDLES

from bot.app.records import Incident
from bot.app.state import IncidentState
from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.local.cluster import LocalCluster
from bot.slack.blocks import incident_message, incident_thread, top_evidence, trimmed

BUNDLES = sorted(p for p in FIXTURE_BUNDLES.iterdir() if p.is_dir())
NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
TEXT_ABOVE_BUTTONS = 700


def rendered(bundle, tmp_path) -> Incident:
    evidence = load_bundle(bundle)
    d = diagnose(evidence)
    proposal = LocalCluster(bundle, tmp_path / "cluster", name="prod-eu").propose(d, evidence)
    state = IncidentState.PROPOSED if proposal is not None else IncidentState.DIAGNOSED
    return Incident(name="inc-1", cluster="prod-eu", namespace=proposal.workload.namespace if proposal else "default",
                    workload=proposal.workload.name if proposal else (d.pod or "vllm"), cause=d.cause, state=state,
                    pods=[d.pod or "pod"], restarts=3, first_seen=NOW, last_seen=NOW, diagnosis=d, proposal=proposal)


def block_text(block: dict) -> str:
    parts = [block.get("text", {}).get("text", "")] + [f["text"] for f in block.get("fields") or []]
    return "".join(parts)


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_the_decision_is_on_the_first_screen(bundle, tmp_path):
    incident = rendered(bundle, tmp_path)
    _, blocks = incident_message(incident)
    kinds = [b["type"] for b in blocks]
    if incident.proposal is not None:
        assert "actions" in kinds[:4], kinds
        above = blocks[:kinds.index("actions")]
    else:  # no button: the cause and "no change" are what the first screen must carry
        above = [b for b in blocks if b.get("block_id") not in ("evidence", "context")]
    assert sum(len(block_text(b)) for b in above) <= TEXT_ABOVE_BUTTONS
    # at most three evidence lines on top, the decisive one (the diagnosis lists it first) whole and last
    evidence = [b for b in blocks if b.get("block_id") == "evidence"]
    d = incident.diagnosis
    if d.evidence:
        quoted = evidence[0]["text"]["text"]
        assert quoted.count("\n") <= 3 + 2  # the heading, the fences and at most three lines
        assert top_evidence(d.evidence)[-1] == trimmed(d.evidence[0])
    # the rest is in the thread
    _, thread = incident_thread(incident)
    body = "".join(block_text(b) for b in thread)
    if d.memory_picture:
        assert d.memory_picture.splitlines()[0][:40] in body.replace("&gt;", ">").replace("&lt;", "<")


def test_prefixes_are_trimmed_from_evidence_lines():
    line = "(EngineCore_DP0 pid=87) ERROR 11-30 04:52:14 [core.py:718] ValueError: the KV cache is too small"
    assert trimmed(line) == "ValueError: the KV cache is too small"
    assert trimmed("INFO 08-21 09:14:04 [utils.py:326] non-default args: {}") == "non-default args: {}"
    assert trimmed("RuntimeError: Engine process failed") == "RuntimeError: Engine process failed"
    assert top_evidence(["newest", "middle", "older", "oldest"]) == ["older", "middle", "newest"]
