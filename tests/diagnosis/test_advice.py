"""Advice a person can act on when nothing approvable fits (issue 21): structured items naming
GPU products and instance types that hold the model, the quantized variant and its size, and the
node selector / NodePool requirement as YAML; in diagnose's JSON, the terminal and the thread."""

from __future__ import annotations

import yaml
from builders import FIXTURE_BUNDLES

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.instances import catalogue, gpus_needed, placements
from bot.diagnosis.models import AdviceKind, DiagnosisResult, advice_text
from bot.diagnosis.render import render_text


def names(weights: float) -> list[tuple[int, str, str]]:
    return [(p.gpus, p.instance.gpu_product, p.instance.instance_type) for p in placements(weights)]


def test_instance_types_that_hold_the_weights():
    # 61 GiB (a 32B model in bf16): 61 / 4 = 15.3 GiB per A10G, within 80% of 22.49
    assert (4, "NVIDIA A10G", "g5.12xlarge") in names(61.0)
    # 131 GiB (a 70B model in bf16): 4 A100 40GB would carry 32.8 GiB each, above 80% of 39.39 -> 8
    assert (8, "NVIDIA A100 40GB", "p4d.24xlarge") in names(131.0)
    assert gpus_needed(131.0, 39.39) == 8 and gpus_needed(150.0, 22.49) is None  # 18.75 > 17.99
    assert names(5000.0) == []  # nothing in the catalogue holds it: no instance advice at all
    assert all(i.gpu_count in (1, 2, 4, 8) and i.gpu_memory_gib > 10 for i in catalogue())


def test_weights_on_a_too_small_node_get_structured_advice():
    result = diagnose(load_bundle(FIXTURE_BUNDLES / "weights-v100-no-fp8-1gpu"))
    assert result.changes == []
    kinds = [a.kind for a in result.advice]
    assert AdviceKind.INSTANCE_TYPE in kinds and AdviceKind.QUANTIZED_VARIANT in kinds
    instance = next(a for a in result.advice if a.kind == AdviceKind.INSTANCE_TYPE)
    selector = yaml.safe_load(instance.yaml.split("# or")[0])
    assert list(selector["nodeSelector"]) == ["node.kubernetes.io/instance-type"]
    assert instance.changes and {c.name for c in instance.changes} == {"--tensor-parallel-size", "limits.nvidia.com/gpu"}
    quantized = next(a for a in result.advice if a.kind == AdviceKind.QUANTIZED_VARIANT)
    assert "4-bit variant of Qwen/Qwen3-32B (AWQ or GPTQ) needs about 17.1 GiB" in quantized.text
    public = result.to_public_json()["advice"]
    assert {"kind", "text", "changes", "yaml"} <= set(public[0])
    text = render_text(result)
    assert "Advice (not a change to approve):" in text and "node.kubernetes.io/instance-type:" in text


def test_a_stored_sentence_is_read_as_one_note():
    d = DiagnosisResult(cause="x", title="t", explanation="", advice="Advice (not a change to approve): buy GPUs.")
    assert [(a.kind, a.text) for a in d.advice] == [(AdviceKind.NOTE, "buy GPUs")]
    assert advice_text(d.advice) == "Advice (not a change to approve): buy GPUs."
