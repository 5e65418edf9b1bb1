"""One Approve walk (click -> patch -> verified) crosses package boundaries inside bot/ at most 250
times (issue 16; 438 on the tree before the decisions moved into the core and redaction stopped
redoing what it had done), measured by benchmarks/approve_calls.py through the real wiring against
the stand-ins. The count is of calls, not time: it does not depend on the machine's speed."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import approve_calls  # noqa: E402

MAX_CROSSINGS = 250


def test_one_approve_walk_makes_at_most_250_cross_package_calls():
    state, crossings = approve_calls.approve_walk_crossings()
    assert state == "verified"
    total = sum(crossings.values())
    assert 0 < total <= MAX_CROSSINGS, "\n".join(f"{a} -> {b}: {n}" for (a, b), n in crossings.most_common())
    # the adapters do I/O only: the remedy plan is the core's to call, not the cluster adapter's
    assert crossings[("kube", "remedy")] <= 10, crossings


def test_a_crossing_is_a_call_between_two_bot_packages():
    assert approve_calls.package_of(str(ROOT / "bot" / "app" / "rollout.py")) == "app"
    assert approve_calls.package_of(str(ROOT / "bot" / "__init__.py")) is None
    assert approve_calls.package_of(str(ROOT / "tests" / "fakes.py")) is None

    from bot.app import verdict
    from bot.app.redaction import redacted_diagnosis
    from bot.diagnosis.models import DiagnosisResult

    _, crossings = approve_calls.count_crossings(lambda: verdict.restarts({}, "vllm"))
    assert crossings == {}  # called from tests/, and bot.app calls no other bot package there
    _, crossings = approve_calls.count_crossings(
        lambda: redacted_diagnosis(DiagnosisResult(cause=None, title="t", explanation="e")))
    assert crossings[("app", "diagnosis")] >= 3  # title, explanation, ...: each a call into the redactor
