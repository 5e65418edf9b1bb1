"""The project's own labelled real crashes (tests/fixtures/real, issue 21): their layout, and the numbers.

Each folder is one crash from a public issue thread, labelled from what fixed it in the thread.
The floor on causes right is what held when the cases were added; a change that lowers it, or
that makes the bot propose a change for a wrong cause, fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from builders import SHARED_CORPUS

from bot.diagnosis.evaluate import evaluate, read_expected

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
CASES = sorted(p for p in REAL.iterdir() if p.is_dir()) if REAL.is_dir() else []
CAUSES_RIGHT_AT_LEAST = 88  # what held when the cases were added (tests/fixtures/real/README.md); raise it, never lower it
THREAD_URL = re.compile(r"https://github\.com/[\w.-]+/([\w.-]+)/(?:issues|pull|discussions)/(\d+)")


def test_no_wrong_confident_fix_and_the_floor_on_causes_right():
    results, summary = evaluate(REAL)
    assert summary["wrong_confident_fixes"] == 0, [f"{r.case}: expected {r.expected}, proposed for {r.got}"
                                                   for r in results if r.wrong_fix]
    assert summary["causes_right"] >= CAUSES_RIGHT_AT_LEAST, [f"{r.case}: expected {r.expected}, got {r.got}"
                                                              for r in results if not r.cause_right]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_case_is_a_labelled_bundle_named_after_its_thread(case):
    assert {"previous.log", "pod.yaml", "node.yaml", "expected.json", "SOURCE.md"} <= {p.name for p in case.iterdir()}
    expected = read_expected(case)  # one line naming the field when the label is malformed
    raw = json.loads((case / "expected.json").read_text())
    assert "vllm_version" in raw and expected.accelerator is not None, "the label says which release and device"
    assert raw.get("why"), "the label says why, from the thread"
    url = THREAD_URL.search((case / "SOURCE.md").read_text())
    assert url, "SOURCE.md names the thread's URL"
    assert case.name.lower() == f"{url.group(1)}-{url.group(2)}".lower()


def test_no_case_repeats_a_thread_of_the_shared_corpus():
    if not SHARED_CORPUS.is_dir():
        pytest.skip(f"shared corpus not present at {SHARED_CORPUS}")
    shared = {m.group(0) for source in SHARED_CORPUS.glob("*/SOURCE.md") for m in THREAD_URL.finditer(source.read_text())}
    ours = {THREAD_URL.search((case / "SOURCE.md").read_text()).group(0) for case in CASES}  # type: ignore[union-attr]
    assert ours & shared == set()
