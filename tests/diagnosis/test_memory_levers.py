"""The memory model's guards (issue 12): a pinned KV pool, MIG slices, and the physical sanity check."""

from __future__ import annotations

import pytest
from builders import make_node, make_pod
from test_formulas import context, run

from bot.diagnosis import levers
from bot.diagnosis.budget import BudgetInputs, Config, LogFigures, build_budget
from bot.diagnosis.catalogue import resolve_model
from bot.diagnosis.gpus import gpu_grant
from bot.diagnosis.logfacts import extract
from bot.diagnosis.models import LogText, advice_text
from bot.diagnosis.signals import Signals


@pytest.mark.parametrize(("raw", "value"), [("4G", 4 * 2**30), ("4g", 4 * 10**9), ("512M", 512 * 2**20),
                                            ("1.5g", 1_500_000_000), ("4294967296", 4294967296), (8000, 8000)])
def test_human_bytes_reads_vllms_suffixes(raw, value):
    assert levers.human_bytes(raw) == value


@pytest.mark.parametrize("raw", ["1.5G", "lots", "", None, "4 GiB"])
def test_human_bytes_refuses_what_vllm_refuses(raw):
    assert levers.human_bytes(raw) is None


def test_utilization_is_never_proposed_for_a_pinned_kv_pool():
    facts = {"gpu_total_gib": 23.57, "gpu_memory_utilization": 0.9, "oom_tried_gib": 0.5}
    assert run("utilization_raise_for_kv", context(facts)) is not None  # the same numbers without a pin
    assert run("utilization_lower_for_headroom", context(facts)) is not None
    pinned = {**facts, "kv_pool_pinned": True}  # vLLM's 'reserved ... as specified by kv_cache_memory_bytes' line
    assert run("utilization_raise_for_kv", context(pinned)) is None
    assert run("utilization_lower_for_headroom", context(pinned)) is None


def _model(pod, node, model="meta-llama/Llama-3.1-8B-Instruct", **ran):
    grant = gpu_grant(pod, node, "vllm")
    config = Config(**ran)
    spec = resolve_model(model, None)
    budget = build_budget(BudgetInputs(log=LogFigures(), ran=config, model=spec, gpus=grant))
    return levers.MemoryModel(grant=grant, spec=spec, ran=config, budget=budget)


def _mig_node(count=7):
    node = make_node(product="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", memory_mib=9728, count=count)
    node["metadata"]["labels"]["nvidia.com/mig.strategy"] = "single"
    return node


def test_tensor_parallel_search_never_spans_mig_slices():
    model = _model(make_pod(command=["vllm", "serve", "m"]), _mig_node(), tensor_parallel_size=1, gpu_count=1,
                   max_model_len=8192)
    assert model.grant.mig_profile == "1g.10gb"
    assert not model.grant.can_tensor_parallel  # CUDA and NCCL cannot run one model across slices
    advice = advice_text(levers.advice_for_weights(model, node_gpus=7))
    assert "TP cannot span MIG slices" in advice
    assert "limits.nvidia.com/gpu: 2" not in advice  # more slices never hold a bigger model


def test_whole_gpus_do_get_the_tensor_parallel_advice():
    node = make_node(product="NVIDIA-L4", memory_mib=23034, count=1)
    model = _model(make_pod(command=["vllm", "serve", "m"]), node, model="Qwen/Qwen2.5-32B-Instruct",
                   tensor_parallel_size=1, gpu_count=1, max_model_len=8192)
    assert "limits.nvidia.com/gpu: 4" in advice_text(levers.advice_for_weights(model, node_gpus=1))


def _l40s_model():
    node = make_node(product="NVIDIA-L40S", memory_mib=46068, count=1)
    return _model(make_pod(command=["vllm", "serve", "m"]), node, tensor_parallel_size=1, gpu_count=1,
                  max_model_len=8192)


def test_software_problem_one_allocation_larger_than_the_card():
    s = Signals(values={"oom_any": True, "oom_tried_gib": 96.0, "oom_free_gib": 20.9, "gpu_total_gib": 44.39,
                        "stage": "profiling"})
    text = levers.software_problem(_l40s_model(), s)
    assert text is not None and "96.00 GiB is larger than the whole" in text and levers.SOFTWARE in text


def test_software_problem_oom_on_the_first_shards_of_a_model_that_fits():
    s = Signals(values={"oom_any": True, "oom_tried_gib": 1.96, "oom_free_gib": 1.2, "oom_allocated_gib": 3.9,
                        "gpu_total_gib": 44.39, "stage": "weights"})
    text = levers.software_problem(_l40s_model(), s)
    assert text is not None and "first shards" in text and "3.90 GiB held" in text
    # the same OOM with most of the weights held is an ordinary weights OOM
    held = Signals(values={**s.values, "oom_allocated_gib": 14.0})
    assert levers.software_problem(_l40s_model(), held) is None


def test_software_problem_whole_card_request_with_nothing_loaded():
    s = Signals(values={"oom_any": True, "oom_tried_gib": 44.39, "oom_free_gib": 0.0, "oom_allocated_gib": 0.0,
                        "gpu_total_gib": 44.39, "stage": "startup"})
    text = levers.software_problem(_l40s_model(), s)
    assert text is not None and "0 bytes free before any weights" in text
    loaded = Signals(values={**s.values, "weights_gib": 14.99})
    assert levers.software_problem(_l40s_model(), loaded) is None


def test_an_ordinary_oom_is_not_a_software_problem():
    s = Signals(values={"oom_any": True, "oom_tried_gib": 0.25, "oom_free_gib": 0.17, "oom_allocated_gib": 43.6,
                        "gpu_total_gib": 44.39, "stage": "kv_allocation"})
    assert levers.software_problem(_l40s_model(), s) is None


# ---- the newer messages (issue 12), as vLLM prints them ------------------------------------------

MRV2_FRAME = ('(EngineCore pid=79)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/model_runner.py", '
              'line 455, in _dummy_sampler_run')


@pytest.mark.parametrize(("line", "expected"), [
    (MRV2_FRAME, {"model_runner_v2": True}),
    ("(EngineCore pid=79) WARNING 11-28 09:31:02 [config/vllm.py:752] Model Runner V2 does not yet support "
     "speculative decoding; using the V1 model runner instead.", {"model_runner_v1_fallback": True}),
    ("(EngineCore_DP0 pid=112) ERROR 11-30 08:15:40 [model_executor/layers/linear.py:227] Failed to create "
     "unquantized linear weights: CUDA out of memory. Tried to allocate 448.00 MiB.", {"weights_create_failed": True}),
    ("(EngineCore pid=79) INFO 11-30 10:02:11 [v1/worker/gpu_worker.py:104] Sleep mode freed 71.25 GiB memory, "
     "1.38 GiB memory is still in use.", {"sleep_freed_gib": 71.25, "sleep_held_gib": 1.38}),
    ("(EngineCore pid=79) INFO 11-30 10:12:05 [v1/worker/gpu_worker.py:318] Initial free memory 43.91 GiB, reserved "
     "4.00GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.",
     {"kv_pool_pinned": True, "available_kv_gib": 4.0}),
    ("(APIServer pid=1) INFO 11-30 10:12:01 [entrypoints/utils.py:301] non-default args: {'model': 'm', "
     "'kv_cache_memory_bytes': 4294967296}", {"config_kv_cache_memory_bytes": 4294967296}),
    ("(EngineCore pid=79) INFO 11-30 10:41:07 [v1/core/kv_cache_utils.py:1443] Auto-fit max_model_len: reduced from "
     "131072 to 38656 to fit in available KV cache memory (4.73 GiB)", {"autofit_len": 38656}),
    ("(Worker_TP1 pid=61) INFO 11-30 07:02:11 [v1/worker/gpu_worker.py:276] Available KV cache memory: -1.21 GiB",
     {"available_kv_gib": -1.21}),
    ("(EngineCore pid=79) ValueError: Free memory on device cuda:0 (8.84/79.25 GiB) on startup is less than desired GPU "
     "memory utilization (0.9, 71.33 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     {"free_at_start_gib": 8.84, "total_gpu_gib": 79.25, "requested_gib": 71.33}),
])
def test_newer_vllm_messages(line, expected):
    facts = extract(LogText(text=line + "\n"))
    assert {name: facts.get(name) for name in expected} == expected


def test_a_model_runner_v2_sampler_oom_is_the_warm_up_without_vllms_wrapper():
    facts = extract(LogText(text=MRV2_FRAME + "\n(EngineCore pid=79) torch.OutOfMemoryError: CUDA out of memory. "
                                              "Tried to allocate 594.00 MiB.\n"))
    assert facts.get("model_runner_v2") and "warmup" in facts.frame_stages
    assert facts.get("sampler_oom_requests") is None  # V2 has no 'warming up sampler with N dummy requests'


def test_tp_search_finds_nothing_across_mig_slices_or_time_sliced_replicas():
    mig = _model(make_pod(command=["vllm", "serve", "m"], gpus="2"), _mig_node(), tensor_parallel_size=1, gpu_count=1,
                 max_model_len=8192)
    found, tried = levers.tp_search(mig, node_gpus=7, start=2)
    assert found is None and tried  # TP 2 and 4 were tried on the budget, and every one fails at NCCL
    assert all(c.fit.first_failure == "nccl_init" for c in mig.considered)
    shared = make_node(product="NVIDIA-A100-SXM4-80GB-SHARED", memory_mib=81920, count=4)
    shared["metadata"]["labels"].update({"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    sliced = _model(make_pod(command=["vllm", "serve", "m"]), shared, model="meta-llama/Llama-3.3-70B-Instruct",
                    tensor_parallel_size=1, gpu_count=1, max_model_len=8192)
    assert levers.tp_search(sliced, node_gpus=4, start=2)[0] is None
    whole = make_node(product="NVIDIA-A100-SXM4-80GB", memory_mib=81920, count=4)
    cards = _model(make_pod(command=["vllm", "serve", "m"]), whole, model="meta-llama/Llama-3.3-70B-Instruct",
                   tensor_parallel_size=1, gpu_count=1, max_model_len=8192)
    assert levers.tp_search(cards, node_gpus=4, start=2)[0] is not None  # whole GPUs: TP works


def test_an_oom_after_the_server_was_ready_is_run_time_not_warm_up(tmp_path):
    from builders import FIXTURE_BUNDLES, write_bundle

    from bot.diagnosis.diagnose import diagnose
    from bot.diagnosis.evidence import load_bundle

    source = FIXTURE_BUNDLES / "frag-runtime-after-ready-graphs"
    served = diagnose(load_bundle(source))
    assert (served.stage, served.cause) == ("ready", "allocator-fragmentation")
    # the same OOM without any sign that start-up finished: graphs were captured, so it reads as the warm-up
    log = "\n".join(line for line in (source / "previous.log").read_text().splitlines()
                    if not any(k in line for k in ("init engine", "Starting vLLM API server", "Application startup",
                                                   "Started server process", "Avg prompt throughput")))
    bundle = write_bundle(tmp_path / "b", log + "\n")
    for name in ("pod.yaml", "node.yaml"):
        (bundle / name).write_text((source / name).read_text())
    assert diagnose(load_bundle(bundle)).stage == "warmup"
