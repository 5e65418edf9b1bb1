"""eval's per-era and per-accelerator counts, from expected.json's vllm_version and accelerator."""

from __future__ import annotations

import json

import pytest
from builders import make_pod, write_bundle

from bot.diagnosis.evaluate import ERAS, era_of, evaluate, format_report, score_case
from bot.diagnosis.models import BundleError

V0_MAXLEN = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
             "stored in KV cache (23648). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
             "when initializing the engine.\n")
NOT_MEMORY = "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n"
MAXLEN_LEVER = [{"kind": "flag", "name": "--max-model-len", "direction": "down"}]


def labelled(folder, log, label, pod=None):
    write_bundle(folder, log, pod or make_pod(args=["--model", "m", "--max-model-len", "32768"]))
    (folder / "expected.json").write_text(json.dumps(label))
    return folder


@pytest.mark.parametrize(("version", "era"), [
    ("0.1.4", "0.1-0.3"), ("0.3.3", "0.1-0.3"), ("0.4.0.post1", "0.4-0.6"), ("v0.6.3.post1", "0.4-0.6"),
    ("0.7.0", "0.7-0.10"), ("0.10.1.1", "0.7-0.10"), ("0.11.0", "0.11-0.19"), ("0.19.2", "0.11-0.19"),
    ("0.20.0", "0.20+"), ("0.33.1", "0.20+"), ("1.0.0", "0.20+"),
    (None, "unknown"), ("latest", "unknown"), ("main", "unknown"), ("0.0.1", "unknown"),
])
def test_era_of_a_reported_version(version, era):
    assert era_of(version) == era


def test_eras_cover_every_minor_once():
    minors = [m for _, first, last in ERAS for m in range(first, (last if last is not None else 40) + 1)]
    assert minors == list(range(1, 41))


def test_summary_counts_per_era_and_accelerator(tmp_path):
    labelled(tmp_path / "a", V0_MAXLEN, {"cause": "kv-cache-max-model-len", "levers": MAXLEN_LEVER,
                                         "vllm_version": "0.5.4", "accelerator": "nvidia"})
    labelled(tmp_path / "b", NOT_MEMORY, {"cause": None, "levers": [], "vllm_version": "0.6.1", "accelerator": "amd"})
    labelled(tmp_path / "c", NOT_MEMORY, {"cause": "shm-too-small", "levers": [], "vllm_version": "0.2.7",
                                          "accelerator": "nvidia"})
    labelled(tmp_path / "d", V0_MAXLEN, {"cause": "kv-cache-max-model-len", "levers": MAXLEN_LEVER})  # old label
    results, summary = evaluate(tmp_path)
    assert [(r.case, r.era, r.accelerator, r.right_change) for r in results] == [
        ("a", "0.4-0.6", "nvidia", True), ("b", "0.4-0.6", "amd", True),
        ("c", "0.1-0.3", "nvidia", False), ("d", "unknown", "unknown", True)]
    assert summary["by_era"] == {
        "0.1-0.3": {"cases": 1, "causes_right": 0, "right_change": 0, "wrong_confident_fixes": 0},
        "0.4-0.6": {"cases": 2, "causes_right": 2, "right_change": 2, "wrong_confident_fixes": 0},
        "unknown": {"cases": 1, "causes_right": 1, "right_change": 1, "wrong_confident_fixes": 0}}
    assert summary["by_accelerator"] == {
        "nvidia": {"cases": 2, "causes_right": 1, "right_change": 1, "wrong_confident_fixes": 0},
        "amd": {"cases": 1, "causes_right": 1, "right_change": 1, "wrong_confident_fixes": 0},
        "unknown": {"cases": 1, "causes_right": 1, "right_change": 1, "wrong_confident_fixes": 0}}
    assert summary["right_change"] == 3


def test_a_change_for_a_wrong_cause_counts_in_its_era(tmp_path):
    labelled(tmp_path / "w", V0_MAXLEN, {"cause": None, "levers": [], "vllm_version": "0.3.0", "accelerator": "nvidia"})
    _, summary = evaluate(tmp_path)
    assert summary["by_era"]["0.1-0.3"]["wrong_confident_fixes"] == 1
    assert summary["by_accelerator"]["nvidia"]["right_change"] == 0


def test_a_right_cause_with_a_lever_the_wrong_way_is_not_a_right_change(tmp_path):
    up_only = [{"kind": "flag", "name": "--max-model-len", "direction": "up"}]
    case = labelled(tmp_path / "x", V0_MAXLEN, {"cause": "kv-cache-max-model-len", "levers": up_only})
    result = score_case(case)
    assert result.cause_right and result.lever_pulled is False and not result.right_change


def test_text_report_has_a_table_per_era_and_accelerator_before_the_summary(tmp_path):
    labelled(tmp_path / "a", V0_MAXLEN, {"cause": "kv-cache-max-model-len", "levers": MAXLEN_LEVER,
                                         "vllm_version": "0.5.4", "accelerator": "nvidia"})
    labelled(tmp_path / "b", NOT_MEMORY, {"cause": None, "levers": []})
    lines = format_report(*evaluate(tmp_path)).splitlines()
    era = lines.index("by vLLM era:")
    assert lines[era + 1].split() == ["0.4-0.6", "1", "cases,", "1", "causes", "right,", "1", "right", "change,",
                                      "0", "wrong", "confident", "fixes"]
    assert lines[era + 2].split()[:2] == ["unknown", "1"]
    assert lines[lines.index("by accelerator:") + 1].split()[:2] == ["nvidia", "1"]
    assert lines[-1].startswith("summary: 2/2 causes right")


def test_no_tables_when_no_case_says_its_era_or_accelerator(tmp_path):
    labelled(tmp_path / "a", V0_MAXLEN, {"cause": "kv-cache-max-model-len", "levers": MAXLEN_LEVER})
    report = format_report(*evaluate(tmp_path))
    assert "by vLLM era" not in report and "by accelerator" not in report


@pytest.mark.parametrize(("label", "message"), [
    ({"cause": None, "accelerator": "cuda"}, "field `accelerator`"),
    ({"cause": None, "vllm_version": 6}, "field `vllm_version`"),
])
def test_a_bad_label_is_one_line_naming_the_field(tmp_path, label, message):
    case = labelled(tmp_path / "a", NOT_MEMORY, label)
    with pytest.raises(BundleError) as err:
        score_case(case)
    assert message in str(err.value) and "expected.json" in str(err.value) and "\n" not in str(err.value)


def test_expected_json_that_is_not_json_is_one_line(tmp_path):
    case = labelled(tmp_path / "a", NOT_MEMORY, {"cause": None})
    (case / "expected.json").write_text("{cause: nope")
    with pytest.raises(BundleError, match="expected.json: not JSON"):
        score_case(case)


def test_an_unknown_where_the_log_lacks_the_decisive_line_is_shown_apart(tmp_path):
    labelled(tmp_path / "cut", NOT_MEMORY, {"cause": "shm-too-small", "levers": [], "evidence_in_log": False})
    labelled(tmp_path / "kept", NOT_MEMORY, {"cause": "shm-too-small", "levers": []})
    results, summary = evaluate(tmp_path)
    lines = format_report(results, summary).splitlines()
    assert lines[0].startswith("--  cut") and "acceptable" in lines[0]
    assert lines[1].startswith("BAD kept")
    assert [r.unknown_acceptable for r in results] == [True, False]
