"""The labelled real crashes in ../shared/corpus: the numbers the issue asks for."""

from __future__ import annotations

from bot.diagnosis.evaluate import evaluate


def test_corpus_accuracy(corpus_dir):
    results, summary = evaluate(corpus_dir)
    wrong = [f"{r.case}: expected {r.expected}, got {r.got}" for r in results if not r.cause_right]
    assert summary["causes_right"] >= 30, wrong
    assert summary["wrong_confident_fixes"] == 0, [r.case for r in results if r.wrong_fix]


def test_every_corpus_proposal_pulls_a_lever(corpus_dir):
    results, _ = evaluate(corpus_dir)
    missing = [r.case for r in results if r.got is not None and r.cause_right and r.lever_pulled is False]
    assert missing == []
