"""Stored copies are redacted; what is applied or restored is exact (bot.remedy.plan)."""

from __future__ import annotations

import json

import pytest

from bot.diagnosis.models import Change
from bot.remedy import plan
from bot.remedy.models import WorkloadRef

ARGS = ["--max-model-len", "32768", "--api-key", "sk-live-secret-value-123456", "--hf-token=hf_abcdefghijklmnopqrstuvwx"]
ENV = [{"name": "HF_TOKEN", "value": "hf_envsecretenvsecretenvsecret"}, {"name": "MODE", "value": "prod"}]


def workload(args=ARGS, env=ENV, rv="7", generation=3):
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "w", "namespace": "ns", "resourceVersion": rv, "generation": generation},
            "spec": {"template": {"spec": {"containers": [{"name": "vllm", "image": "i", "args": list(args),
                                                           "env": [dict(e) for e in env]}]}}}}


def proposal(current):
    from bot.diagnosis.models import DiagnosisResult

    d = DiagnosisResult(cause="kv-cache-max-model-len", title="t", explanation="e",
                        changes=[Change(kind="flag", name="--max-model-len", before="32768", after="18432")])
    return plan.make_proposal("c", WorkloadRef(kind="Deployment", namespace="ns", name="w", container="vllm"),
                              current, d)


def test_a_redacted_patch_compares_equal_and_is_applied_exactly():
    current = workload()
    p = proposal(current)
    stored = plan.redact_proposal(p)
    text = json.dumps(stored.model_dump(mode="json"))
    assert "sk-live-secret" not in text and "hf_abcdefgh" not in text and "hf_envsecret" not in text
    assert plan.redacted_equal(stored.json_patch, p.json_patch)
    assert plan.not_allowed(stored, current) is None and plan.conflict_with(stored, current) is None
    assert plan.rebase(stored.json_patch, current) == p.json_patch  # the exact ops, secrets restored
    assert plan.exact_patch(stored, current) == p.json_patch


def test_an_edit_is_a_conflict_and_its_diff_shows_no_secret():
    p = plan.redact_proposal(proposal(workload()))
    # A rotated secret is invisible to the masked compare; the spec edit moved the generation,
    # which the stored patch tests, so the patch is still refused.
    rotated = workload(args=ARGS[:3] + ["sk-rotated-secret-value-999999"] + ARGS[4:], generation=4)
    assert plan.rebase(p.json_patch, rotated) is None and plan.exact_patch(p, rotated) is None
    edited = workload(args=["--max-model-len", "16384"] + ARGS[2:], generation=4)
    diff = plan.conflict_with(p, edited)
    assert diff is not None and "16384" in diff and "sk-live" not in diff and "hf_abc" not in diff


def test_the_annotation_is_redacted_and_the_rollback_restores_the_exact_spec():
    import jsonpatch

    current = workload()
    p = proposal(current)
    audit, _ = plan.change_ops(p, current, "me")
    after = jsonpatch.apply_patch(current, p.json_patch + audit)
    annotation = after["metadata"]["annotations"][plan.AUDIT_ANNOTATION]
    assert "sk-live-secret" not in annotation and "hf_envsecret" not in annotation and "***" in annotation
    ops, record = plan.rollback_ops(after, "me")
    restored = jsonpatch.apply_patch(after, ops)
    c = restored["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ARGS and c["env"] == ENV
    assert "sk-live" not in plan.describe_record(record)
    event = plan.event_for(restored, "VllmOncallRollback", "args " + " ".join(ARGS))
    assert "sk-live" not in json.dumps(event)


def test_a_rollback_whose_secret_is_gone_is_refused_not_written_as_stars():
    current = workload()
    p = proposal(current)
    audit, _ = plan.change_ops(p, current, "me")
    import jsonpatch

    after = jsonpatch.apply_patch(current, p.json_patch + audit)
    assert plan.unmask(["--api-key", "***"], ["--api-key", "x", "--other", "y"]) == ["--api-key", "x"]
    with pytest.raises(plan.Unrestorable):
        plan.unmask(["***", "***"], ["a", "b", "c"])  # ambiguous: refuse rather than guess
    record = plan.read_audit(after)[-1]
    record["before"]["args"] = ["--max-model-len", "32768", "***", "***"]  # no anchor to find them by
    with pytest.raises(plan.RollbackRefused):
        plan.restored_value(record, "args", after["spec"]["template"]["spec"]["containers"][0]["args"])
