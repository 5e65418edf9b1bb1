"""Score the diagnoser against labelled evidence bundles (the format of ../shared/corpus).

Each case folder holds an evidence bundle and expected.json: the right cause (or null), the
levers a correct change may pull ({kind, name, direction}), optionally the largest
--max-model-len that fits. A case is right when the cause matches; a proposal is good when
one of its changes pulls a lever in the labelled direction; a change proposed for a wrong
cause is a wrong confident fix, the number that must stay at zero.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import BundleError, Change, DiagnosisResult


class Lever(BaseModel):
    kind: str
    name: str
    direction: str


class Expected(BaseModel):
    cause: str | None
    levers: list[Lever] = Field(default_factory=list)
    max_model_len_at_most: int | None = None
    evidence_in_log: bool = True


class CaseResult(BaseModel):
    case: str
    expected: str | None
    got: str | None
    cause_right: bool
    lever_pulled: bool | None  # None when no lever is expected, or no change is offered (refused)
    wrong_fix: bool
    note: str = ""


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    digits = "".join(ch for ch in text if ch.isdigit() or ch == ".")
    try:
        return float(digits) if digits else None
    except ValueError:
        return None


def pulls(change: Change, lever: Lever) -> bool:
    if change.kind != lever.kind or change.name != lever.name:
        return False
    if lever.direction == "set":
        return change.after is not None
    if lever.direction == "remove":
        return change.after is None
    before, after = _number(change.before), _number(change.after)
    if after is None:
        return False
    if before is None:
        return True  # flag absent from the manifest and not stated in the log: direction unknowable
    return after < before if lever.direction == "down" else after > before


def score_case(folder: Path, playbooks: Any = None) -> CaseResult:
    expected = Expected.model_validate(json.loads((folder / "expected.json").read_text()))
    note = ""
    try:
        result: DiagnosisResult | None = diagnose(load_bundle(folder), playbooks)
    except BundleError as exc:
        result = None
        note = f"unreadable: {exc}"
    got = result.cause if result else None
    changes = result.changes if result else []
    cause_right = got == expected.cause
    lever = None
    refused = bool(result and cause_right and not changes and (result.advice or "software problem" in result.explanation))
    if refused:  # the budget check found no lever that fits: no proposal to score, said so with advice
        note = "no change offered: the memory budget says no lever fits here (advice given)"
    elif expected.cause is not None and expected.levers:  # no levers: the label says no change can work
        lever = any(pulls(c, lv) for c in changes for lv in expected.levers)
        if expected.max_model_len_at_most:
            for c in changes:
                if c.name == "--max-model-len" and (_number(c.after) or 0) > expected.max_model_len_at_most:
                    lever, note = False, f"--max-model-len {c.after} > {expected.max_model_len_at_most}"
    wrong_fix = bool(changes) and not cause_right
    if got is None and expected.cause is not None and not expected.evidence_in_log:
        note = note or "unknown (decisive line outside the log window: acceptable)"
    return CaseResult(case=folder.name, expected=expected.cause, got=got, cause_right=cause_right,
                      lever_pulled=lever, wrong_fix=wrong_fix, note=note)


def evaluate(corpus: Path, playbooks: Any = None) -> tuple[list[CaseResult], dict[str, Any]]:
    """playbooks: None for the bundled ones."""
    cases = sorted(p for p in corpus.iterdir() if (p / "expected.json").is_file())
    results = [score_case(p, playbooks) for p in cases]
    with_cause = [r for r in results if r.expected is not None]
    summary = {
        "cases": len(results),
        "causes_right": sum(r.cause_right for r in results),
        "levers_pulled": sum(bool(r.lever_pulled) for r in with_cause if r.got is not None),
        "with_a_proposal": sum(1 for r in with_cause if r.got is not None and r.cause_right
                               and not r.note.startswith("no change offered")),
        "refused_by_budget": sum(1 for r in results if r.note.startswith("no change offered")),
        "wrong_confident_fixes": sum(r.wrong_fix for r in results),
    }
    return results, summary


def format_report(results: list[CaseResult], summary: dict[str, Any]) -> str:
    lines = []
    for r in results:
        mark = "ok " if r.cause_right and r.lever_pulled is not False else "BAD"
        lever = "" if r.lever_pulled is None else (" lever ok" if r.lever_pulled else " lever MISSING")
        lines.append(f"{mark} {r.case:<24} expected {str(r.expected):<28} got {str(r.got):<28}{lever}"
                     f"{' WRONG FIX' if r.wrong_fix else ''}{' - ' + r.note if r.note else ''}")
    lines.append(
        f"summary: {summary['causes_right']}/{summary['cases']} causes right, "
        f"{summary['levers_pulled']}/{summary['with_a_proposal']} proposals pull a labelled lever, "
        f"{summary['wrong_confident_fixes']} wrong confident fixes"
        + (f", {summary['refused_by_budget']} with no change because no lever fits the memory budget"
           if summary["refused_by_budget"] else ""))
    return "\n".join(lines)
