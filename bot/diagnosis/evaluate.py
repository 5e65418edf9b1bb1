"""Score the diagnoser against labelled evidence bundles (the format of ../shared/corpus).

Each case folder holds an evidence bundle and expected.json: the right cause (or null), the
levers a correct change may pull ({kind, name, direction}), optionally the largest
--max-model-len that fits. A case is right when the cause matches; a proposal is good when
one of its changes pulls a lever in the labelled direction; a change proposed for a wrong
cause is a wrong confident fix, the number that must stay at zero.

expected.json may also say which vLLM release (`vllm_version`, as reported) and which accelerator
(`accelerator`) the crash came from; the summary then counts the same numbers per vLLM era and per
accelerator, so a gain on one era's log wording cannot hide a loss on another's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import BundleError, Change, DiagnosisResult, empty_list
from bot.diagnosis.vllm_versions import version_key

Accelerator = Literal["nvidia", "amd", "intel", "ascend", "tpu", "gaudi", "other"]
UNKNOWN = "unknown"

# vLLM eras, (name, first minor, last minor) of 0.x, oldest first. Defined here only, so the corpus
# README, the text report and the json agree. Roughly: 2023, 2024 (both V0), V1's arrival (0.7) to
# V0's removal (0.11), V1 only, and the newest line. A release past the last bound (1.x included)
# falls in the last era; an unreported or unparsable version is UNKNOWN.
ERAS: tuple[tuple[str, int, int | None], ...] = (
    ("0.1-0.3", 1, 3),
    ("0.4-0.6", 4, 6),
    ("0.7-0.10", 7, 10),
    ("0.11-0.19", 11, 19),
    ("0.20+", 20, None),
)


def era_of(version: str | None) -> str:
    """'0.6.3.post1' -> '0.4-0.6'; '1.0.0' -> '0.20+'; None or 'latest' -> 'unknown'."""
    key = version_key(version) if version else None
    if key is None or key[:2] == (0, 0):
        return UNKNOWN
    major, minor = key[0], key[1]
    if major >= 1:
        return ERAS[-1][0]
    for name, first, last in ERAS:
        if minor >= first and (last is None or minor <= last):
            return name
    return UNKNOWN


class Lever(BaseModel):
    kind: str
    name: str
    direction: str


class Expected(BaseModel):
    cause: str | None
    levers: list[Lever] = Field(default_factory=empty_list)
    max_model_len_at_most: int | None = None
    evidence_in_log: bool = True
    vllm_version: str | None = None
    accelerator: Accelerator | None = None


class CaseResult(BaseModel):
    case: str
    expected: str | None
    got: str | None
    cause_right: bool
    lever_pulled: bool | None  # None when no lever is expected, or no change is offered (refused)
    right_change: bool  # the cause is right and so is what was proposed (a labelled lever, or no change)
    wrong_fix: bool
    unknown_acceptable: bool = False  # "unknown" where the label says the decisive line is not in the log
    era: str = UNKNOWN
    accelerator: str = UNKNOWN
    note: str = ""


def read_expected(folder: Path) -> Expected:
    """The label, or one BundleError line naming the file and the first problem."""
    path = folder / "expected.json"
    try:
        return Expected.model_validate(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise BundleError(f"{path}: field `{where}`: {first['msg']}") from None


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
    expected = read_expected(folder)
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
    if lever is not None:
        right_change = cause_right and lever
    else:  # a null label, a label with no levers, or a refusal: right only when nothing was proposed
        right_change = cause_right and not changes and not refused
    unknown_acceptable = got is None and expected.cause is not None and not expected.evidence_in_log
    if unknown_acceptable:
        note = note or "unknown (decisive line outside the log window: acceptable)"
    return CaseResult(case=folder.name, expected=expected.cause, got=got, cause_right=cause_right,
                      lever_pulled=lever, right_change=right_change, wrong_fix=wrong_fix, unknown_acceptable=unknown_acceptable,
                      era=era_of(expected.vllm_version), accelerator=expected.accelerator or UNKNOWN, note=note)


def _tally(results: list[CaseResult]) -> dict[str, int]:
    return {
        "cases": len(results),
        "causes_right": sum(r.cause_right for r in results),
        "right_change": sum(r.right_change for r in results),
        "wrong_confident_fixes": sum(r.wrong_fix for r in results),
    }


def _grouped(results: list[CaseResult], key: str, order: list[str]) -> dict[str, dict[str, int]]:
    """Tallies per value of `key`, in `order` (then unknown), only for values some case has."""
    present = {getattr(r, key) for r in results}
    return {value: _tally([r for r in results if getattr(r, key) == value])
            for value in [*order, UNKNOWN] if value in present}


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
        "right_change": sum(r.right_change for r in results),
        "by_era": _grouped(results, "era", [name for name, _, _ in ERAS]),
        "by_accelerator": _grouped(results, "accelerator", list(get_args(Accelerator))),
    }
    return results, summary


def format_report(results: list[CaseResult], summary: dict[str, Any]) -> str:
    lines = []
    for r in results:
        mark = "ok " if r.cause_right and r.lever_pulled is not False else "BAD"
        if r.unknown_acceptable:
            mark = "-- "  # not right, not wrong: the log holds no decisive line
        lever = "" if r.lever_pulled is None or r.unknown_acceptable else (" lever ok" if r.lever_pulled else " lever MISSING")
        lines.append(f"{mark} {r.case:<24} expected {str(r.expected):<28} got {str(r.got):<28}{lever}"
                     f"{' WRONG FIX' if r.wrong_fix else ''}{' - ' + r.note if r.note else ''}")
    for title, groups in (("vLLM era", summary["by_era"]), ("accelerator", summary["by_accelerator"])):
        if set(groups) == {UNKNOWN}:
            continue  # no case says: the table would repeat the summary
        lines.append(f"by {title}:")
        lines.extend(f"  {name:<10} {t['cases']:>3} cases, {t['causes_right']:>3} causes right, "
                     f"{t['right_change']:>3} right change, {t['wrong_confident_fixes']} wrong confident fixes"
                     for name, t in groups.items())
    lines.append(
        f"summary: {summary['causes_right']}/{summary['cases']} causes right, "
        f"{summary['levers_pulled']}/{summary['with_a_proposal']} proposals pull a labelled lever, "
        f"{summary['wrong_confident_fixes']} wrong confident fixes"
        + (f", {summary['refused_by_budget']} with no change because no lever fits the memory budget"
           if summary["refused_by_budget"] else ""))
    return "\n".join(lines)
