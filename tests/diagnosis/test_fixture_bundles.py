"""Our own evidence bundles (tests/fixtures/bundles), written from ../shared/reference formats.

Each is diagnosed like a real incident and scored like the shared corpus: the right cause,
a change that pulls a labelled lever, --max-model-len within what the log says fits, and no
change at all when the cause is unknown. The causes come from the playbooks themselves: a
new playbook without a bundle fails here.
"""

from __future__ import annotations

import json
import re

import pytest
from builders import FIXTURE_BUNDLES

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evaluate import score_case
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import advice_text
from bot.diagnosis.playbooks import load_dir

CASES = sorted(p for p in FIXTURE_BUNDLES.glob("*") if (p / "expected.json").is_file())
PLAYBOOKS = load_dir()
EXPECTED = {p.name: json.loads((p / "expected.json").read_text())["cause"] for p in CASES}


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_fixture_bundle(case):
    result = score_case(case)
    assert result.got == result.expected, result
    assert not result.wrong_fix
    expected = json.loads((case / "expected.json").read_text())
    if result.expected is not None and not expected.get("no_change"):
        assert result.lever_pulled, result


@pytest.mark.parametrize("book", PLAYBOOKS, ids=[b.id for b in PLAYBOOKS])
def test_every_playbook_has_a_fixture_bundle(book):
    """A new cause is a YAML file plus a test case: this keeps the second half honest."""
    assert book.id in EXPECTED.values(), f"no bundle under {FIXTURE_BUNDLES} expects {book.id!r}"


def test_every_bundle_expects_a_playbook_or_no_cause():
    known = {b.id for b in PLAYBOOKS}
    assert {name: cause for name, cause in EXPECTED.items() if cause is not None and cause not in known} == {}
    assert None in EXPECTED.values()  # the "no known cause" path has bundles too


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_fixture_bundle_memory_outcome(case):
    """expected.json may also say: no_change (no button), advice (a text, no button), margin_at_least
    (the budget check's margin for the proposed change, as the message shows it), software_problem."""
    expected = json.loads((case / "expected.json").read_text())
    result = diagnose(load_bundle(case))
    if expected.get("no_change"):
        assert result.changes == [], result.changes
    if expected.get("advice"):
        assert advice_text(result.advice).startswith("Advice (not a change to approve)"), result.advice
    if "margin_at_least" in expected:
        margins = [float(m) for m in re.findall(r"fits with (-?[\d.]+) GiB to spare", result.explanation)]
        assert margins and min(margins) >= expected["margin_at_least"], result.explanation
        assert "to spare" in result.memory_picture
    if expected.get("software_problem"):
        assert "this looks like a software problem, not a memory setting" in result.explanation
        assert result.changes == []
    for change in expected.get("changes", []):
        assert any(c.name == change["name"] and c.after == change["after"] for c in result.changes), result.changes
    for text in expected.get("explanation_has", []):
        assert text in result.explanation + result.memory_picture + advice_text(result.advice), text


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_never_echoes_vllms_utilization_advice_for_weights(case):
    """vLLM 0.13+ says 'Try lowering --gpu-memory-utilization to free memory for weights': wrong
    (utilization caps vLLM's budget, it frees nothing), so no text the bot sends repeats it."""
    result = diagnose(load_bundle(case))
    sent = " ".join([result.explanation, advice_text(result.advice), result.memory_picture, *result.evidence])
    assert "Try lowering --gpu-memory-utilization" not in sent
    assert "lowering --gpu-memory-utilization to free memory" not in sent
