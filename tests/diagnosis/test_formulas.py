"""Each formula on small hand-built evidence: the value it proposes, the arithmetic it shows,
and no value when the evidence lacks the numbers. Numbers are from the vLLM/PyTorch message
formats in ../shared/reference (log-formats.md, vllm-facts.md)."""

from __future__ import annotations

import json

import pytest
from builders import make_node, make_pod

from bot.diagnosis import cmdline
from bot.diagnosis.evidence import node_view, pod_view
from bot.diagnosis.formulas import FORMULAS, Context, NoSafeChange, Target, parameters, run_formula
from bot.diagnosis.logfacts import LogFacts
from bot.diagnosis.models import Evidence, LogText
from bot.diagnosis.signals import Signals


def context(signals=None, args=("m",), pod=None, node=None) -> Context:
    pod = pod if pod is not None else make_pod(command=["vllm", "serve"], args=list(args))
    container = pod["spec"]["containers"][0]
    evidence = Evidence(log=LogText(text=""), pod=pod, node=node or make_node())
    return Context(signals=Signals(values=dict(signals or {})), facts=LogFacts(),
                   cmd=cmdline.parse(container.get("command"), container.get("args")),
                   pod=pod_view(evidence), node=node_view(evidence), raw_pod=pod)


def run(name, ctx, kind="flag", target="--x", **params):
    return run_formula(name, ctx, Target(kind, target), params)


def value_and_sentence(name, ctx, **params):
    result = run(name, ctx, **params)
    assert result is not None
    return result.before, result.after, result.arithmetic


# ---- --max-model-len ----------------------------------------------------------------------


def test_max_model_len_from_vllm_estimate():
    # V1: "... the estimated maximum model length is 18256."
    ctx = context({"max_model_len": 32768, "estimated_max_len": 18256})
    assert value_and_sentence("max_model_len_that_fits", ctx) == (
        "32768", "17408",
        "vLLM estimates the longest context that fits at 18,256 tokens; rounded down to 17,408 (was 32,768).")


def test_max_model_len_from_v0_kv_capacity_keeps_the_manifest_spelling():
    # V0: "The model's max seq len (8192) is larger than ... stored in KV cache (2400)."
    ctx = context({"max_model_len": 8192, "kv_capacity_tokens": 2400}, args=["m", "--max-model-len", "8k"])
    assert value_and_sentence("max_model_len_that_fits", ctx) == (
        "8k", "2304", "the KV cache holds 2,400 tokens; rounded down to 2,304 (was 8,192).")


def test_max_model_len_scaled_by_kv_memory():
    ctx = context({"max_model_len": 32768, "kv_needed_gib": 4.0, "available_kv_gib": 2.23})
    before, after, sentence = value_and_sentence("max_model_len_that_fits", ctx)
    assert (before, after) == ("32768", "17408")  # 32768 x 2.225 / 4.005 = 18,204 -> 17 x 1024
    assert "32,768 x 2.225 / 4.005 = 18,204 tokens fit" in sentence


def test_max_model_len_scaled_by_kv_memory_stays_below_what_the_rounded_sizes_allow():
    # 1.01 / 1.00 GiB as printed may be 1.0149 needed and 0.9951 available: 98,049 tokens fit, so
    # the naive 100000 x 1.00 / 1.01 = 99,009 (98,304 once rounded to 1024) would fail again
    ctx = context({"max_model_len": 100000, "kv_needed_gib": 1.01, "available_kv_gib": 1.00})
    _, after, _ = value_and_sentence("max_model_len_that_fits", ctx)
    assert int(after) <= 100000 * 0.9951 / 1.0149
    assert after == "97280"


def test_max_model_len_from_gpu_blocks():
    # V0 <= 0.6.3: "# GPU blocks: 150, # CPU blocks: 512" x block size 16
    ctx = context({"max_model_len": 4096, "kv_capacity_tokens_effective": 2400, "gpu_blocks": 150})
    assert value_and_sentence("max_model_len_that_fits", ctx)[1:] == (
        "2304", "150 KV blocks x 16 tokens = 2,400 tokens; rounded down to 2,304 (was 4,096).")


@pytest.mark.parametrize("signals", [
    {"max_model_len": 8192},  # no capacity in the log
    {"max_model_len": 8192, "kv_capacity_tokens": 9000},  # it already fits
    {"max_model_len": 8192, "kv_capacity_tokens": 0},
])
def test_max_model_len_has_no_value_without_a_smaller_capacity(signals):
    assert run("max_model_len_that_fits", context(signals)) is None


# ---- --gpu-memory-utilization --------------------------------------------------------------

FREE_CHECK = {"free_at_start_gib": 13.8, "gpu_total_gib": 23.57, "gpu_memory_utilization": 0.9}  # 0.9-0.10 message


def test_utilization_for_free_memory_from_the_free_memory_check():
    assert value_and_sentence("utilization_for_free_memory", context(FREE_CHECK)) == (
        "0.9", "0.58",
        "13.80 GiB of 23.57 GiB was free at start-up but utilization 0.9 asks for 0.9 x 23.57 GiB = 21.21 GiB; "
        "(13.8 - 0.1 GiB margin) / 23.57 = 0.5812, rounded down to 0.58.")


def test_utilization_for_free_memory_takes_its_margin_from_the_playbook():
    before, after, sentence = value_and_sentence("utilization_for_free_memory", context(FREE_CHECK), margin_gib=1.0)
    assert after == "0.54"  # (13.8 - 1.0) / 23.57 = 0.5431
    assert "(13.8 - 1.0 GiB margin) / 23.57 = 0.5431" in sentence


def test_utilization_for_free_memory_from_other_processes():
    ctx = context({"other_processes_gib": 6.0, "gpu_total_gib": 23.57}, args=["m", "--gpu-memory-utilization", "0.90"])
    assert value_and_sentence("utilization_for_free_memory", ctx) == (
        "0.90", "0.72",
        "other processes held 6.00 GiB of the 23.57 GiB GPU; (23.57 - 6.0 - 0.5 GiB margin) / 23.57 = 0.7242, "
        "rounded down to 0.72.")


def test_utilization_for_free_memory_refuses_when_nothing_is_free():
    ctx = context({**FREE_CHECK, "free_at_start_gib": 0.9})
    with pytest.raises(NoSafeChange, match="another process holds this GPU"):
        run("utilization_for_free_memory", ctx)


def test_utilization_for_free_memory_has_no_value_without_free_numbers():
    assert run("utilization_for_free_memory", context({"gpu_total_gib": 23.57})) is None


def test_utilization_raise_for_kv_from_the_kv_shortfall():
    ctx = context({"kv_needed_gib": 4.0, "available_kv_gib": 2.23, "total_gpu_gib": 23.57},
                  args=["m", "--gpu-memory-utilization", "0.8"])
    assert value_and_sentence("utilization_raise_for_kv", ctx) == (
        "0.8", "0.89",
        "one request needs 4.00 GiB of KV cache and 2.23 GiB is available: 0.8 + (4.0 - 2.23) / 23.57 = 0.8751, "
        "rounded up plus 0.01 headroom.")
    assert run("utilization_raise_for_kv", ctx, cap=0.85) is None  # more than the playbook allows


def test_utilization_raise_for_kv_one_step_without_a_breakdown():
    ctx = context({"gpu_total_gib": 23.57, "gpu_memory_utilization": 0.9})
    assert value_and_sentence("utilization_raise_for_kv", ctx) == (
        "0.9", "0.95", "raising 0.9 to 0.95 gives the KV cache 0.05 x 23.57 GiB = 1.18 GiB more.")
    assert run("utilization_raise_for_kv", context({"gpu_memory_utilization": 0.95})) is None


def test_utilization_lower_for_headroom_for_graph_capture():
    ctx = context({"gpu_total_gib": 23.57, "gpu_memory_utilization": 0.9, "oom_tried_gib": 0.5})
    assert value_and_sentence("utilization_lower_for_headroom", ctx) == (
        "0.9", "0.85", "0.9 - 1.00 GiB / 23.57 GiB = 0.8576, rounded down to 0.85.")


def test_utilization_lower_for_headroom_defers_to_the_free_memory_check():
    assert run("utilization_lower_for_headroom", context(FREE_CHECK)) is None
    assert run("utilization_lower_for_headroom", context({"gpu_memory_utilization": 0.9})) is None  # GPU size unknown


# ---- switches and counts --------------------------------------------------------------------


def test_enforce_eager_on():
    before, after, sentence = value_and_sentence("enforce_eager_on", context())
    assert (before, after) == (None, "true")
    assert "CUDA graphs can take additional 1~3 GiB memory per GPU" in sentence
    assert run("enforce_eager_on", context({"enforce_eager": True})) is None


def test_max_num_seqs_below_the_warmup_count():
    # V1: "CUDA out of memory occurred when warming up sampler with 256 dummy requests."
    ctx = context({"sampler_oom_requests": 256}, args=["m", "--max-num-seqs", "512"])
    assert value_and_sentence("max_num_seqs_below_warmup", ctx) == (
        "512", "128",
        "the sampler warm-up ran out of memory with 256 dummy requests; half of that, rounded down to a power of two, "
        "is 128.")


def test_max_num_seqs_below_the_default_when_the_count_is_not_logged():
    ctx = context({"vllm_version": "0.9.2", "gpu_total_gib": 22.0})  # an L4: the default is 256
    assert value_and_sentence("max_num_seqs_below_warmup", ctx)[:2] == ("256", "128")
    assert "(256, the default here)" in run("max_num_seqs_below_warmup", ctx).arithmetic


def test_profiling_shrinks_by_the_oom_ratio():
    # "Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 23.57 GiB of which 1.00 GiB is free."
    ctx = context({"oom_tried_gib": 4.0, "oom_free_gib": 1.0}, args=["Qwen/Qwen2.5-VL-7B-Instruct"])
    assert value_and_sentence("profile_max_num_seqs", ctx) == (
        "256", "64",
        "the failed allocation was 4.00 GiB with 1.00 GiB available, so the profiling batch must shrink to at most "
        "1.00/4.00 = 0.25 of its size (capped at 0.5); 256 x 0.25 = 64.0, rounded down to a power of two: 64.")
    assert run("profile_max_num_seqs", context({"oom_tried_gib": 4.0, "oom_free_gib": 1.0})) is None  # not multimodal


def test_profile_max_num_batched_tokens():
    ctx = context({"engine": "v1", "gpu_total_gib": 23.57})
    before, after, sentence = value_and_sentence("profile_max_num_batched_tokens", ctx)
    assert (before, after) == ("2048", "512")
    assert sentence.startswith("the log does not say how much was missing; a quarter of the batch")
    assert run("profile_max_num_batched_tokens", context({"engine": "v0"})) is None  # V0: --max-model-len is the lever


def test_profile_max_model_len_only_on_v0():
    assert value_and_sentence("profile_max_model_len", context({"engine": "v0", "max_model_len": 32768}))[:2] == (
        "32768", "8192")
    assert run("profile_max_model_len", context({"engine": "v1", "max_model_len": 32768})) is None


# ---- parallelism, GPUs, dtype ----------------------------------------------------------------


def test_tensor_parallel_for_pod_gpus():
    ctx = context({"pod_gpus": 2, "pipeline_parallel_size": 1}, args=["m", "--tensor-parallel-size", "4"])
    assert value_and_sentence("tensor_parallel_for_pod_gpus", ctx) == (
        "4", "2", "the pod gets 2 GPU(s), so --tensor-parallel-size 2 (was 4).")
    assert run("tensor_parallel_for_pod_gpus", context({})) is None


def test_tensor_parallel_for_weights_and_its_gpu_limit():
    # a 70B model in bfloat16 is about 130 GiB; an 80 GiB card holds 64 GiB of it
    node = make_node("NVIDIA-A100-SXM4-80GB", 81920, 8)
    ctx = context({"weights_estimate_gib": 130.4, "gpu_total_gib": 79.33, "world_size": 1}, node=node)
    before, after, sentence = value_and_sentence("tensor_parallel_for_weights_on_node", ctx)
    assert (before, after) == ("1", "4")
    assert "one GPU can hold 80% x 79.33 GiB = 63.46 GiB of them" in sentence
    assert "130.4 / 63.5 = 2.05 -> 4 GPUs" in sentence
    assert value_and_sentence("gpu_limit_for_tensor_parallel", ctx) == (
        "1", "4", "the pod needs one GPU per tensor-parallel rank: 4 x PP 1 = 4.")
    small_node = context(ctx.signals.values, node=make_node("NVIDIA-A100-SXM4-80GB", 81920, 2))
    assert run("tensor_parallel_for_weights_on_node", small_node) is None


def test_gpu_limit_for_world_size():
    ctx = context({"world_size_required": 2}, node=make_node(count=4))
    assert value_and_sentence("gpu_limit_for_world_size", ctx) == (
        "1", "2", "TP x PP = 2 processes need 2 GPUs and the node has 4.")
    assert run("gpu_limit_for_world_size", context({"world_size_required": 8}, node=make_node(count=4))) is None


@pytest.mark.parametrize("product, want", [("Tesla-T4", "float16"), ("NVIDIA-A100-SXM4-80GB", "bfloat16")])
def test_half_precision_dtype(product, want):
    ctx = context({"weights_estimate_gib": 26.8}, args=["m", "--dtype", "float32"], node=make_node(product))
    before, after, sentence = value_and_sentence("half_precision_dtype", ctx)
    assert (before, after) == ("float32", want)
    assert "half the memory (26.80 GiB -> 13.40 GiB)" in sentence
    assert run("half_precision_dtype", context({}, args=["m", "--dtype", "bfloat16"])) is None


def test_cpu_offload_for_weights():
    # an L4 leaves 0.9 x 22.49 - 2 = 18.24 GiB for weights; 40 x 1.1 = 44 GiB would offload more than half: no
    ctx = context({"weights_estimate_gib": 40.0, "gpu_total_gib": 22.49, "gpu_memory_utilization": 0.9})
    assert run("cpu_offload_for_weights", ctx) is None
    assert run("cpu_offload_for_weights", context({"gpu_total_gib": 22.49})) is None  # weights unknown
    ctx = context({"weights_estimate_gib": 18.0, "gpu_total_gib": 22.49, "gpu_memory_utilization": 0.9})
    before, after, sentence = value_and_sentence("cpu_offload_for_weights", ctx)
    assert (before, after) == (None, "2")  # 18 x 1.1 = 19.8 - 18.24 = 1.56 -> 2 GiB
    assert "19.80 - 18.24 = 1.56, rounded up: offload 2 GiB per GPU" in sentence


# ---- host memory, shm, probes, env -------------------------------------------------------------


def test_memory_limit_raise():
    ctx = context(pod=make_pod(command=["vllm", "serve"], args=["m"], memory="32Gi"))
    assert value_and_sentence("memory_limit_raise", ctx) == (
        "32Gi", "48Gi", "32Gi x 1.5, rounded up to a multiple of 8 GiB = 48Gi.")
    assert value_and_sentence("memory_limit_raise", ctx, factor=2.0)[1:] == (
        "64Gi", "32Gi x 2, rounded up to a multiple of 8 GiB = 64Gi.")


def test_memory_limit_raise_at_the_node_capacity_refuses():
    ctx = context(pod=make_pod(args=["m"], memory="240Gi"), node=make_node(allocatable_memory="251Gi"))
    with pytest.raises(NoSafeChange, match="already at the node's capacity"):
        run("memory_limit_raise", ctx)
    pod = make_pod(args=["m"])
    del pod["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert run("memory_limit_raise", context(pod=pod)) is None


def test_swap_space_off():
    ctx = context({"world_size": 2}, args=["m", "--swap-space", "16"])
    assert value_and_sentence("swap_space_off", ctx) == (
        "16", "0", "--swap-space 16 pins 16 GiB of host RAM per GPU worker (32 GiB for 2).")
    assert run("swap_space_off", context({"engine": "v1"})) is None


def test_shm_size():
    ctx = context({"world_size": 4, "memory_limit_bytes": 64 * 2**30})
    before, after, sentence = value_and_sentence("shm_size", ctx)
    assert (before, after) == (None, "4Gi")
    assert sentence.startswith("the container runtime gives /dev/shm 64 MiB by default; 4 communicating processes")
    assert run("shm_size", context({"has_shm_volume": True})) is None


def test_startup_probe_for_load():
    liveness = {"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 60, "periodSeconds": 10,
                "failureThreshold": 3}
    pod = make_pod(command=["vllm", "serve"], args=["m"], liveness=liveness)
    ctx = context({"weights_progress_pct": 40}, pod=pod)
    before, after, sentence = value_and_sentence("startup_probe_for_load", ctx)
    assert before is None
    # killed after 60 + 10 x 3 = 90 s at 40%: 90 / 40% x 1.5 = 338 s -> at least 10 minutes
    assert json.loads(after) == {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10,
                                 "failureThreshold": 60}
    assert "90 / 40% x 1.5 for profiling and CUDA graphs = 338 s" in sentence
    with_startup = make_pod(args=["m"], liveness=liveness, startup={"httpGet": {"path": "/health", "port": 8000}})
    assert run("startup_probe_for_load", context({}, pod=with_startup)) is None  # its startup probe did not fail


def test_expandable_segments():
    # "... 3.00 GiB is reserved by PyTorch but unallocated." with "Tried to allocate 1.16 GiB"
    ctx = context({"oom_reserved_unallocated_gib": 3.0, "oom_tried_gib": 1.16})
    assert value_and_sentence("expandable_segments", ctx) == (
        None, "expandable_segments:True",
        "3.00 GiB was reserved by PyTorch but unallocated, more than the 1.16 GiB requested: the memory was there but "
        "fragmented; expandable segments let the allocator grow blocks instead of splitting them.")
    assert run("expandable_segments", context({"sleep_mode": True})) is None


# ---- values written in the playbook -------------------------------------------------------------


def test_constant_proposes_the_playbook_value_with_its_reason():
    result = run("constant", context(), "flag", "--enforce-eager", value="true", reason="skip graph capture")
    assert (result.before, result.after, result.arithmetic) == (None, "true", "skip graph capture.")


@pytest.mark.parametrize("kind, target, pod_args, value", [
    ("flag", "--enforce-eager", dict(args=["m", "--enforce-eager"]), "true"),
    ("flag", "--enforce-eager", dict(args=["m", "--enforce-eager=True"]), "true"),
    ("flag", "--max-model-len", dict(args=["m", "--max-model-len", "4096"]), "4096"),
    ("env", "VLLM_WORKER_MULTIPROC_METHOD", dict(args=["m"], env={"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}), "spawn"),
    ("resources", "limits.memory", dict(args=["m"], memory="64Gi"), "64Gi"),
])
def test_constant_has_nothing_to_change_when_the_value_is_in_place(kind, target, pod_args, value):
    ctx = context(pod=make_pod(command=["vllm", "serve"], **pod_args))
    assert run("constant", ctx, kind, target, value=value, reason="r") is None


def test_constant_reads_the_current_value_of_its_target():
    ctx = context(pod=make_pod(command=["vllm", "serve"], args=["m", "--max-model-len", "8192"], memory="32Gi",
                               env={"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"},
                               volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
                               mounts=[{"name": "dshm", "mountPath": "/dev/shm"}]))
    befores = {(kind, name): run("constant", ctx, kind, name, value="2Gi", reason="r").before for kind, name in [
        ("flag", "--max-model-len"), ("resources", "limits.memory"), ("resources", "requests.memory"),
        ("env", "PYTORCH_CUDA_ALLOC_CONF"), ("volume", "/dev/shm"), ("probe", "startupProbe")]}
    assert befores == {("flag", "--max-model-len"): "8192", ("resources", "limits.memory"): "32Gi",
                       ("resources", "requests.memory"): None,
                       ("env", "PYTORCH_CUDA_ALLOC_CONF"): "garbage_collection_threshold:0.6",
                       ("volume", "/dev/shm"): "1Gi", ("probe", "startupProbe"): None}


def test_formula_parameters_are_their_keyword_arguments():
    assert {n: (p.type, p.required) for n, p in parameters("constant").items()} == {
        "value": (str, True), "reason": (str, True)}
    assert parameters("utilization_for_free_memory")["margin_gib"].default == 0.1
    assert parameters("enforce_eager_on") == {}
    assert all(p.type in (str, int, float, bool) for name in FORMULAS for p in parameters(name).values())


def test_one_sentence_helper_keeps_names_spelt_on_purpose():
    """diagnose's proposals, podspec's findings and flag_drift's refusals start sentences the same way."""
    from bot.diagnosis.formulas import sentence

    assert sentence("the pod gets 2 GPU(s)") == "The pod gets 2 GPU(s)"
    assert sentence("vLLM estimates 4,096 tokens") == "vLLM estimates 4,096 tokens"
    assert sentence("") == "" and sentence("x") == "X"
