"""The memory budget against numbers vLLM printed, and the fit check on the issue's scenarios.

Tolerances (stated once, used everywhere below):
- KV: tokens predicted from a logged KV size and the catalogue's bytes per token within 2 % of the
  tokens vLLM printed (vLLM rounds GiB to 2 decimals and tokens down to whole blocks);
- weights: the catalogue estimate (parameters x bytes / TP) within 5 % of "Model loading took";
  for 4-bit checkpoints within 12 %: their group size (32 / 64 / 128) is not in the name, and the
  estimate assumes 128, the AutoAWQ/GPTQ default, so a checkpoint with smaller groups is heavier.
"""

from __future__ import annotations

import pytest

from bot.diagnosis.budget import (
    GIB,
    BudgetInputs,
    Config,
    LogFigures,
    build_budget,
    kv_bytes_per_token,
    kv_dtype_bytes,
    rules_for,
    weights_total_gib,
)
from bot.diagnosis.catalogue import match_model
from bot.diagnosis.gpus import GpuGrant

KV_TOLERANCE = 0.02
WEIGHTS_TOLERANCE = 0.05
WEIGHTS_TOLERANCE_4BIT = 0.12

# (model argument, TP, weights vLLM printed per GPU in GiB) -- from real crash reports
REAL_WEIGHTS = [
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 14.9888),  # vLLM 0.6.4 (V0), RTX-class 24 GiB card
    ("meta-llama/Llama-3.2-11B-Vision-Instruct", 2, 10.0714),  # vLLM 0.6.3 (V0), 2 x A10
    ("/models/LLM/Llama-3.2-11B-Vision", 1, 19.8557),  # vLLM 0.6.3 (V0), H100 NVL, local path
]
# the same figures in the fixture bundles, which were composed from vLLM's format strings (not real logs)
COMPOSED_WEIGHTS = [
    ("Qwen/Qwen2.5-14B-Instruct", 1, 27.5700),  # vLLM 0.8.5 (V0)
    ("mistralai/Mistral-Small-24B-Instruct-2501", 1, 43.92),  # vLLM 0.22.1
    ("Qwen/Qwen3-8B", 1, 15.2683),  # vLLM 0.11.0
    ("Qwen/Qwen3-14B", 1, 27.52),  # vLLM 0.30.1
    ("meta-llama/Llama-3.3-70B-Instruct", 2, 65.7211),  # vLLM 0.9.2, TP 2
    ("Qwen/Qwen2.5-32B-Instruct", 2, 30.5311),  # vLLM 0.11.0, TP 2
    ("google/gemma-2-9b-it", 1, 17.2167),  # vLLM 0.7.3 (V0)
    ("mistralai/Mistral-7B-Instruct-v0.3", 1, 13.5083),  # vLLM 0.6.3 (V0)
    ("Qwen/Qwen2-VL-7B-Instruct", 1, 15.5083),  # vLLM 0.6.3 (V0)
]


@pytest.mark.parametrize("model, tp, logged", REAL_WEIGHTS + COMPOSED_WEIGHTS)
def test_weights_estimate_matches_model_loading_took(model, tp, logged):
    spec = match_model(model)
    per_gpu = weights_total_gib(spec, spec.quantization) / tp
    assert per_gpu == pytest.approx(logged, rel=WEIGHTS_TOLERANCE)


def test_weights_estimate_of_a_4bit_awq_checkpoint():
    # vLLM 0.8.x (V0) on an RTX 4090, real report: "Model loading took 17.6110 GiB"
    spec = match_model("gaunernst/gemma-3-27b-it-int4-awq")
    assert spec.quantization.method == "awq"
    assert weights_total_gib(spec, spec.quantization) == pytest.approx(17.6110, rel=WEIGHTS_TOLERANCE_4BIT)


# (model, TP, KV GiB vLLM printed, tokens it printed) -- V0 tokens = blocks x 16
REAL_KV = [
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 2.89, 1478 * 16),  # vLLM 0.6.4 (V0): kv_cache_size=2.89GiB, 1478 blocks
]
COMPOSED_KV = [
    ("Qwen/Qwen2.5-14B-Instruct", 1, 5.94, 2027 * 16),  # vLLM 0.8.5 (V0)
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 6.10, 3123 * 16),  # vLLM 0.6.6 (V0)
    ("Qwen/Qwen3-8B", 1, 56.74, 413_152),  # vLLM 0.11.0
    ("mistralai/Mistral-Small-24B-Instruct-2501", 1, 24.56, 160_976),  # vLLM 0.22.1
    ("Qwen/Qwen3-14B", 1, 11.38, 74_576),  # vLLM 0.30.1
    ("meta-llama/Llama-3.3-70B-Instruct", 2, 6.84, 44_816),  # vLLM 0.9.2, TP 2: 4 KV heads per GPU
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 3.62, 29_648),  # vLLM 0.10.1: estimated maximum model length
]


@pytest.mark.parametrize("model, tp, kv_gib, tokens", REAL_KV + COMPOSED_KV)
def test_kv_tokens_from_catalogue_bytes_per_token(model, tp, kv_gib, tokens):
    per_token = kv_bytes_per_token(match_model(model), tp=tp)
    assert kv_gib * GIB / per_token == pytest.approx(tokens, rel=KV_TOLERANCE)


def test_kv_needed_for_one_sequence_matches_the_valueerror():
    # vLLM 0.10.1, Llama-3.1-8B at 131072: "(16.00 GiB KV cache is needed"
    per_token = kv_bytes_per_token(match_model("meta-llama/Llama-3.1-8B-Instruct"))
    assert 131072 * per_token / GIB == pytest.approx(16.00, rel=KV_TOLERANCE)


def test_logged_kv_line_gives_bytes_per_token_and_the_longest_context():
    # real report, vLLM 0.9.1-0.12 (V1), unnamed local model with --kv-cache-dtype fp8: "max seq len (221000),
    # (10.12 GiB KV cache is needed ... available KV cache memory (5.59 GiB) ... estimated maximum model length is 122080"
    log = LogFigures(vllm_version="0.10.2", kv_needed_gib=10.12, required_len=221000, available_kv_gib=5.59)
    ran = Config(max_model_len=221000, kv_cache_dtype="fp8")
    budget = build_budget(BudgetInputs(log=log, ran=ran))
    per_token = budget.figures(ran)["kv_bytes_per_token"]
    assert per_token.source == "log"
    assert 5.59 * GIB / per_token.value == pytest.approx(122080, rel=KV_TOLERANCE)
    # back to a 16-bit cache: twice the bytes (model unknown: rescaled by dtype only)
    auto = budget.figures(ran.model_copy(update={"kv_cache_dtype": "auto"}))["kv_bytes_per_token"]
    assert auto.value == pytest.approx(2 * per_token.value, rel=1e-4) and auto.source == "log, rescaled"


def test_utilization_budget_is_total_times_utilization():
    # real report, vLLM 0.8.x (V0): "total_gpu_memory (21.99GiB) x gpu_memory_utilization (0.98) = 21.55GiB"
    log = LogFigures(vllm_version="0.8.3", engine="v0", total_gpu_gib=21.99, gpu_memory_utilization=0.98)
    budget = build_budget(BudgetInputs(log=log, model=match_model("gaunernst/gemma-3-27b-it-int4-awq")))
    assert budget.figures(budget.inputs.ran)["budget"].value == pytest.approx(21.55, abs=0.01)


# ---- the whole budget on the real 0.6.4 report ----------------------------------------------------

LLAMA_064 = BudgetInputs(
    # vLLM 0.6.4 (V0), Llama-3.1-8B-Instruct, --max-model-len 29000: "Memory profiling results:
    # total_gpu_memory=23.58GiB ... peak_torch_memory=17.98GiB ... non_torch_memory=0.35GiB kv_cache_size=2.89GiB
    # gpu_memory_utilization=0.90", "# GPU blocks: 1478", then max seq len (29000) > KV cache (23648)
    log=LogFigures(vllm_version="0.6.4", engine="v0", total_gpu_gib=23.58, gpu_memory_utilization=0.9,
                   weights_gib=14.9888, activation_gib=17.98 - 14.9888, non_torch_gib=0.35, available_kv_gib=2.89,
                   gpu_blocks=1478),
    ran=Config(max_model_len=29000),
    model=match_model("meta-llama/Llama-3.1-8B-Instruct"),
)


def test_the_budget_reproduces_the_crash_it_was_built_from():
    fit = build_budget(LLAMA_064).baseline()
    assert fit.verdict == "fails" and fit.first_failure == "kv_sizing"
    assert fit.weights_fit is True and fit.kv_fits is False
    assert fit.kv_available_gib == pytest.approx(2.89, abs=0.01)  # total x util - weights - activation - non-torch
    assert fit.max_len_that_fits == pytest.approx(23648, rel=KV_TOLERANCE)
    assert fit.kv_needed_gib == pytest.approx(29008 * 131072 / GIB, abs=0.01)
    assert fit.margin_gib == pytest.approx(2.89 - 3.54, abs=0.02)
    assert fit.figures["weights"].source == "log" and fit.figures["capacity"].source == "log"


def test_candidates_on_the_same_evidence():
    budget = build_budget(LLAMA_064)
    assert budget.fits(Config(max_model_len=16384)).fits
    fp8_kv = budget.fits(Config(max_model_len=29000, kv_cache_dtype="fp8"))
    assert fp8_kv.fits and fp8_kv.figures["kv_bytes_per_token"].value == pytest.approx(65610, rel=0.01)
    fp8_weights = budget.fits(Config(max_model_len=29000, quantization="fp8"))
    assert fp8_weights.fits and fp8_weights.figures["weights"].value < 9.0
    assert fp8_weights.figures["weights"].source == "log"  # rescaled from the logged figure, same world size
    assert not budget.fits(Config(max_model_len=29000, gpu_memory_utilization=0.8)).fits


def test_a_budget_answers_a_configuration_once_and_as_a_budget_asked_nothing_before():
    """A diagnosis asks the same configurations again and again (issue 20): the first answer is
    kept, and it is the answer a fresh budget gives, whatever was asked in between."""
    asked = build_budget(LLAMA_064)
    shorter = asked.fits(Config(max_model_len=16384))
    for config in (Config(max_model_len=29000, kv_cache_dtype="fp8"), Config(max_model_len=29000, quantization="fp8"),
                   Config(max_model_len=29000, gpu_memory_utilization=0.8), asked.inputs.ran):
        asked.fits(config)
    assert asked.fits(Config(max_model_len=16384)) is shorter
    fresh = build_budget(LLAMA_064)
    assert fresh.fits(Config(max_model_len=16384)) == shorter and fresh.baseline() == asked.baseline()
    assert shorter.fits and not asked.baseline().fits
    assert fresh.figures(Config(max_model_len=16384)) == shorter.figures


# ---- the scenarios ---------------------------------------------------------------------------

H100 = GpuGrant(vendor="nvidia", resource="nvidia.com/gpu", granted=1, on_node=8, cards_on_node=8,
                product="NVIDIA-H100-80GB-HBM3", memory_gib=79.65, memory_source="node label",
                compute_capability=(9, 0), compute_source="node label")
LLAMA_70B = match_model("meta-llama/Llama-3.3-70B-Instruct")


def seventy_b(grant: GpuGrant) -> BudgetInputs:
    return BudgetInputs(log=LogFigures(vllm_version="0.11.0"), model=LLAMA_70B, gpus=grant,
                        ran=Config(tensor_parallel_size=4, gpu_count=1, max_model_len=16384))


def test_70b_tp4_in_a_one_gpu_pod_on_an_eight_gpu_node():
    budget = build_budget(seventy_b(H100))
    ran = budget.baseline()
    assert ran.first_failure == "startup"  # world size 4 > 1 GPU
    tp1 = budget.fits(Config(tensor_parallel_size=1, gpu_count=1, max_model_len=16384))
    assert tp1.first_failure == "weights" and tp1.weights_fit is False
    assert tp1.figures["weights"].value == pytest.approx(131.4, abs=0.1) and tp1.figures["weights"].source == "catalogue"
    raised = budget.fits(Config(tensor_parallel_size=4, gpu_count=4, max_model_len=16384))
    assert raised.fits and raised.margin_gib > 1.0
    assert raised.figures["weights"].value == pytest.approx(32.85, abs=0.05)


def test_70b_on_a_node_with_a_single_gpu_cannot_schedule_four():
    one = H100.model_copy(update={"on_node": 1, "cards_on_node": 1})
    fit = build_budget(seventy_b(one)).fits(Config(tensor_parallel_size=4, gpu_count=4, max_model_len=16384))
    assert fit.first_failure == "scheduling" and not fit.fits


MIG_1G = GpuGrant(vendor="nvidia", resource="nvidia.com/mig-1g.10gb", granted=1, on_node=7, product="NVIDIA-A100-SXM4-80GB",
                  memory_gib=9.5, memory_source="node label", mig_profile="1g.10gb", mig_strategy="mixed",
                  compute_capability=(8, 0), compute_source="catalogue")


def test_8b_in_a_mig_slice():
    budget = build_budget(BudgetInputs(log=LogFigures(vllm_version="0.16.0"), gpus=MIG_1G,
                                       model=match_model("meta-llama/Llama-3.1-8B-Instruct"), ran=Config(max_model_len=8192)))
    assert budget.capacity.value == 9.5 and budget.capacity.source == "node label"
    assert budget.baseline().first_failure == "weights"  # 14.96 GiB of bf16 weights in 9.5 GiB
    tp2 = budget.fits(Config(tensor_parallel_size=2, gpu_count=2, max_model_len=8192))
    assert tp2.first_failure in {"scheduling", "startup", "nccl_init"} and not tp2.fits
    assert any(c.stage == "nccl_init" and not c.ok for c in tp2.checks)  # never across MIG slices


def test_time_sliced_card_with_too_little_free_memory_has_no_utilization_that_fits():
    # the shape of vLLM 0.16's "Free memory on device cuda:0 (8.84/19.5 GiB) ... (0.9, 17.55 GiB)"
    grant = MIG_1G.model_copy(update={"memory_gib": 19.5, "mig_profile": "3g.20gb", "shared": True, "replicas": 2})
    log = LogFigures(vllm_version="0.16.0", total_gpu_gib=19.5, free_at_start_gib=8.84)
    budget = build_budget(BudgetInputs(log=log, gpus=grant, model=match_model("Qwen/Qwen2.5-7B-Instruct"),
                                       ran=Config(max_model_len=16384)))
    assert budget.baseline().first_failure == "startup"  # 17.55 GiB asked, 8.84 free
    for utilization in (0.22, 0.4, 0.45):
        fit = budget.fits(Config(max_model_len=16384, gpu_memory_utilization=utilization))
        assert not fit.fits and fit.first_failure in {"weights", "kv_sizing"}
    assert budget.fits(Config(max_model_len=16384, gpu_memory_utilization=0.22)).figures["others"].value == pytest.approx(10.66)


def test_cpu_offload_takes_weights_off_the_gpu():
    budget = build_budget(BudgetInputs(log=LogFigures(vllm_version="0.10.1"), gpus=H100.model_copy(update={"memory_gib": 44.99}),
                                       model=match_model("Qwen/Qwen2.5-32B-Instruct"), ran=Config(max_model_len=16384)))
    assert budget.baseline().first_failure == "weights"
    fit = budget.fits(Config(max_model_len=16384, cpu_offload_gb=24))
    assert fit.figures["weights"].value == pytest.approx(61.02 - 24, abs=0.05) and fit.weights_fit


def test_pinned_kv_pool_ignores_utilization_for_the_kv_cache():
    budget = build_budget(BudgetInputs(log=LogFigures(vllm_version="0.11.0"), gpus=H100,
                                       model=match_model("Qwen/Qwen3-8B"), ran=Config(max_model_len=40960)))
    # 40960 tokens x 147456 bytes = 5.63 GiB for one sequence
    pinned = budget.fits(Config(max_model_len=40960, kv_cache_memory_bytes=6 * GIB))
    assert pinned.kv_available_gib == 6.0 and pinned.fits
    assert budget.fits(Config(max_model_len=40960, kv_cache_memory_bytes=6 * GIB, gpu_memory_utilization=0.3)).kv_available_gib == 6.0
    too_small = budget.fits(Config(max_model_len=40960, kv_cache_memory_bytes=2 * GIB))
    assert too_small.first_failure == "kv_sizing" and too_small.max_len_that_fits < 40960


def test_v1_overhead_is_derived_from_the_kv_line_and_rescaled_for_a_new_tp():
    # composed fixture figures, vLLM 0.9.2 TP 2 on H100s at 0.95: weights 65.7211 GiB, KV 6.84 GiB
    log = LogFigures(vllm_version="0.9.2", total_gpu_gib=79.19, gpu_memory_utilization=0.95, weights_gib=65.7211,
                     available_kv_gib=6.84, kv_tokens=44_816)
    budget = build_budget(BudgetInputs(log=log, gpus=H100, model=LLAMA_70B,
                                       ran=Config(tensor_parallel_size=2, gpu_count=2, max_model_len=32768)))
    ran = budget.baseline()
    assert ran.figures["overhead"].source == "log"
    assert ran.kv_available_gib == pytest.approx(6.84, abs=0.01) and ran.max_len_that_fits == pytest.approx(44_816, rel=0.01)
    tp4 = budget.fits(Config(tensor_parallel_size=4, gpu_count=4, max_model_len=32768, gpu_memory_utilization=0.95))
    assert tp4.figures["weights"].value == pytest.approx(65.7211 / 2, abs=0.01) and tp4.figures["weights"].source == "log, rescaled"
    assert tp4.figures["kv_bytes_per_token"].value == pytest.approx(6.84 * GIB / 44_816 / 2, rel=0.001)
    assert tp4.kv_available_gib > 35 and tp4.fits


# ---- version rules and small arithmetic -------------------------------------------------------------


def test_version_rules():
    assert rules_for("0.6.4").subtracts_others and not rules_for("0.6.6").subtracts_others
    assert rules_for("0.8.5").subtracts_others and not rules_for("0.9.2").subtracts_others
    assert not rules_for("0.9.0").free_memory_check and rules_for("0.9.1").free_memory_check
    assert not rules_for("0.8.5", engine="v0").free_memory_check
    assert rules_for("0.19.1").default_utilization == 0.9 and rules_for("0.22.1").default_utilization == 0.92
    assert not rules_for("0.19.1").counts_graphs and rules_for("0.22.1").counts_graphs
    assert rules_for("0.7.3").engine == "v0" and rules_for("0.8.0").engine == "v1"
    assert rules_for(None).default_utilization == 0.9 and not rules_for(None).counts_graphs


def test_graphs_inside_the_budget_from_0_21():
    def kv(version: str) -> float:
        log = LogFigures(vllm_version=version, graph_estimate_gib=2.0)
        b = build_budget(BudgetInputs(log=log, gpus=H100, model=match_model("Qwen/Qwen3-8B"), ran=Config(max_model_len=8192)))
        return b.baseline().kv_available_gib

    assert kv("0.19.1") - kv("0.22.1") == pytest.approx(2.0 - (0.92 - 0.9) * 79.65, abs=0.01)


def test_kv_arithmetic_edges():
    qwen72 = match_model("Qwen/Qwen2.5-72B-Instruct")
    assert kv_bytes_per_token(qwen72) == 327_680  # 80 layers x 8 KV heads x 128 x 2 x 2 bytes
    assert kv_bytes_per_token(qwen72, tp=8) == kv_bytes_per_token(qwen72, tp=16) == 40_960  # heads replicated
    v3 = match_model("deepseek-ai/DeepSeek-V3")
    assert kv_bytes_per_token(v3) == kv_bytes_per_token(v3, tp=8) == 70_272  # MLA: (512 + 64) x 61 x 2
    assert kv_bytes_per_token(qwen72, pp=2) == 327_680 / 2
    assert kv_dtype_bytes("fp8_e4m3", "bfloat16") == 1.0 and kv_dtype_bytes("auto", "float32") == 4.0


def test_unknown_capacity_is_not_judged_but_topology_still_is():
    budget = build_budget(BudgetInputs(model=LLAMA_70B, ran=Config(tensor_parallel_size=4, gpu_count=1)))
    assert budget.capacity is None
    fit = budget.baseline()
    assert fit.verdict == "fails" and fit.first_failure == "startup"
    assert build_budget(BudgetInputs(model=LLAMA_70B)).baseline().verdict == "unknown"


def test_scheduling_counts_time_sliced_replicas_but_not_exclusive_cards_twice():
    spec = match_model("Qwen/Qwen3-8B")
    shared = H100.model_copy(update={"shared": True, "replicas": 4})  # 8 cards x 4 replicas = 32 allocatable
    b = build_budget(BudgetInputs(gpus=shared, model=spec, ran=Config(gpu_count=20)))
    assert next(c for c in b.baseline().checks if c.stage == "scheduling").ok
    assert not next(c for c in b.fits(Config(gpu_count=40)).checks if c.stage == "scheduling").ok
    exclusive = H100.model_copy(update={"replicas": 4})  # a stray replicas figure on an exclusive grant
    b = build_budget(BudgetInputs(gpus=exclusive, model=spec, ran=Config(gpu_count=20)))
    assert b.baseline().first_failure == "scheduling"
