"""Signals computed from small logs, pods and nodes: the derived facts playbooks read.

Log lines follow the vLLM/PyTorch message formats in ../shared/reference (log-formats.md,
vllm-facts.md)."""

from __future__ import annotations

import pytest
from builders import make_node, make_pod

from bot.diagnosis import cmdline
from bot.diagnosis.evidence import node_view, pod_view
from bot.diagnosis.logfacts import extract
from bot.diagnosis.models import Evidence, LogText
from bot.diagnosis.signals import SIGNALS, Signals, bytes_per_param, compute, gib, params_billions

V1 = "(EngineCore_DP0 pid=79) "
OOM_21 = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of "
          "{total} of which {free} is free. {procs}Of the allocated memory {alloc} is allocated by PyTorch, and "
          "{unalloc} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n")


def signals_of(log: str, pod=None, node=None, events=None) -> Signals:
    pod = pod if pod is not None else make_pod(command=["vllm", "serve"], args=["m"])
    evidence = Evidence(log=LogText(text=log), pod=pod, node=node or make_node(), events=events or [])
    container = pod["spec"]["containers"][0]
    parsed = cmdline.parse(container.get("command"), container.get("args"))
    return compute(extract(evidence.log), pod_view(evidence), node_view(evidence), parsed)


def oom(tried="1.00 GiB", total="23.57 GiB", free="20.00 MiB", procs="", alloc="21.00 GiB", unalloc="100.00 MiB"):
    return OOM_21.format(tried=tried, total=total, free=free, procs=procs, alloc=alloc, unalloc=unalloc)


def test_memory_held_by_others_is_total_minus_free_minus_this_process():
    log = oom(procs="Process 2251 has 8.00 GiB memory in use. Including non-PyTorch memory, this process has "
                    "15.50 GiB memory in use. ", alloc="15.00 GiB")
    s = signals_of(log)
    assert s.get("oom_any") is True
    assert s.get("other_processes_gib") == pytest.approx(23.57 - 0.02 - 15.5, abs=0.01)  # 8.05 GiB
    assert "Tried to allocate 1.00 GiB" in s.lines["other_processes_gib"]
    assert s.get("gpu_total_gib") == 23.57


def test_the_only_process_a_container_sees_is_vllm_itself():
    s = signals_of(oom(procs="Process 1 has 22.67 GiB memory in use. ", total="23.69 GiB", free="1.01 GiB"))
    assert s.get("other_processes_gib") == 0.0


def test_a_lone_small_process_beside_a_full_card_is_another_process():
    # vLLM holds most of the card; the one entry listed (the 'this process' clause cut) is someone else
    s = signals_of(oom(procs="Process 4711 has 1.25 GiB memory in use. ", total="44.42 GiB", free="310.00 MiB"))
    assert s.get("other_processes_gib") == 1.25


def test_fragmented_when_reserved_but_unallocated_covers_the_request():
    assert signals_of(oom(tried="1.16 GiB", unalloc="3.00 GiB")).get("fragmented") is True
    assert signals_of(oom(tried="1.16 GiB", unalloc="300.00 MiB")).get("fragmented") is False


def test_large_single_allocation_is_at_least_2_gib_and_8_percent_of_the_gpu():
    assert signals_of(oom(tried="4.00 GiB")).get("large_single_allocation") is True
    assert signals_of(oom(tried="1.90 GiB")).get("large_single_allocation") is False


def test_kv_capacity_from_v0_gpu_blocks_and_the_max_model_len_flag():
    log = "INFO 01-11 15:51:18 llm_engine.py:275] # GPU blocks: 150, # CPU blocks: 512\n"
    s = signals_of(log, pod=make_pod(command=["vllm", "serve"], args=["m", "--max-model-len", "4096"]))
    assert s.get("engine") == "v0"
    assert s.get("kv_capacity_tokens_effective") == 2400  # 150 blocks x 16 tokens
    assert s.get("max_model_len") == 4096
    assert s.get("kv_short") is True
    assert "# GPU blocks: 150" in s.lines["kv_capacity_tokens_effective"]


def test_kv_capacity_from_the_v1_token_count_fits():
    log = V1 + "INFO 10-13 09:06:40 [kv_cache_utils.py:1087] GPU KV cache size: 230,528 tokens\n"
    s = signals_of(log, pod=make_pod(command=["vllm", "serve"], args=["m", "--max-model-len", "32768"]))
    assert s.get("engine") == "v1"
    assert s.get("kv_capacity_tokens_effective") == 230528
    assert s.get("kv_short") is False


def test_parallelism_from_the_command_line_against_the_pod():
    pod = make_pod(command=["vllm", "serve"], args=["m", "-tp", "4", "--pipeline-parallel-size", "2"], gpus="4")
    s = signals_of("", pod=pod)
    assert (s.get("tensor_parallel_size"), s.get("pipeline_parallel_size"), s.get("world_size")) == (4, 2, 8)
    assert s.get("pod_gpus") == 4
    assert s.get("world_exceeds_pod_gpus") is True
    assert s.get("multi_process") is True
    single = signals_of("", pod=make_pod(command=["vllm", "serve"], args=["m"]))
    assert (single.get("world_size"), single.get("multi_process"), single.get("world_exceeds_pod_gpus")) == (1, False, False)


def test_weights_estimate_from_the_model_name_and_dtype():
    pod = make_pod(command=["vllm", "serve"], args=["meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "2"])
    s = signals_of("", pod=pod, node=make_node("NVIDIA-L4", 23034))
    assert s.get("weights_estimate_gib") == 7.5  # 8e9 x 2 bytes / 2**30 / 2 GPUs
    assert s.get("weights_exceed_gpu_estimate") is False
    fp32 = make_pod(command=["vllm", "serve"], args=["Qwen/Qwen2.5-14B", "--dtype", "float32"])
    assert signals_of("", pod=fp32).get("weights_exceed_gpu_estimate") is True  # 52.2 GiB on a 22.5 GiB L4


@pytest.mark.parametrize("model, billions", [
    ("meta-llama/Llama-3.1-8B-Instruct", 8.0), ("mistralai/Mixtral-8x7B-v0.1", 56.0), ("Qwen/Qwen2-1.5B", 1.5),
    ("facebook/opt-125m", None), (None, None),
])
def test_params_billions(model, billions):
    assert params_billions(model) == billions


def test_bytes_per_param_reads_quantization_before_dtype():
    assert bytes_per_param("TheBloke/Llama-2-7B-AWQ", "float16", None) == 0.55
    assert bytes_per_param("m", "float32", None) == 4.0
    assert bytes_per_param("m", None, "fp8") == 1.05
    assert bytes_per_param("m", None, None) == 2.0


def test_pod_signals():
    pod = make_pod(command=["vllm", "serve"], args=["m"], memory="64Gi", exit_code=137, reason="OOMKilled",
                   env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                   volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                   mounts=[{"name": "dshm", "mountPath": "/dev/shm"}])
    s = signals_of("", pod=pod)
    assert s.get("exit_code") == 137
    assert s.get("oom_killed") is True
    assert s.get("memory_limit_bytes") == 64 * 2**30
    assert s.get("alloc_conf_set") is True
    assert s.get("has_shm_volume") is True
    assert s.get("has_liveness_probe") is False
    bare = signals_of("", pod=make_pod(command=["vllm", "serve"], args=["m"]))
    assert (bare.get("oom_killed"), bare.get("alloc_conf_set"), bare.get("has_shm_volume")) == (False, False, False)


def test_probe_failures_come_from_the_pod_events():
    events = [{"reason": "Unhealthy", "message": "Liveness probe failed: Get \"http://10.0.0.5:8000/health\": "
                                                 "dial tcp 10.0.0.5:8000: connect: connection refused"}]
    s = signals_of("", events=events)
    assert s.get("liveness_failed") is True
    assert s.lines["liveness_failed"].startswith("Liveness probe failed")
    assert s.get("startup_probe_failed") is False


def test_a_bare_killed_is_host_oom_only_without_an_exception():
    assert signals_of("INFO 01-11 15:51:18 llm_engine.py:275] starting\nKilled\n").get("host_oom") is True
    with_error = "Traceback (most recent call last):\nValueError: something else\nKilled\n"
    s = signals_of(with_error)
    assert s.get("fatal_error") is True
    assert not s.get("host_oom")


def test_activation_peak_of_vllm_0_6_4_excludes_the_weights():
    # 0.6.4 prints the torch peak including the weights
    log = ("INFO 11-20 10:00:00 worker.py:232] Memory profiling results: total_gpu_memory=23.58GiB "
           "initial_memory_usage=15.34GiB peak_torch_memory=17.98GiB memory_usage_post_profile=15.35GiB "
           "non_torch_memory=0.35GiB kv_cache_size=2.89GiB gpu_memory_utilization=0.90\n"
           "INFO 11-20 09:59:00 model_runner.py:1077] Loading model weights took 14.99 GB\n")
    s = signals_of(log)
    assert s.get("weights_gib") == 14.99
    assert s.get("activation_gib") == pytest.approx(17.98 - 14.99)


def test_every_derived_signal_is_known_to_playbooks():
    s = signals_of(oom(), pod=make_pod(command=["vllm", "serve"], args=["m"]))
    assert set(s.values) <= SIGNALS


def test_gib_formats_like_the_messages():
    assert (gib(None), gib(2.5), gib(123.456)) == ("?", "2.50 GiB", "123.5 GiB")
