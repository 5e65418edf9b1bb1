"""Rules that real reports taught us, each on a small bundle of our own."""

from __future__ import annotations

from builders import make_node, make_pod, write_bundle

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.models import advice_text


def changes_of(result):
    return {(c.kind, c.name): (c.before, c.after) for c in result.changes}


def test_weights_too_big_on_a_pod_that_already_has_the_gpus(tmp_path):
    """TP 1 on an 8-GPU pod: raise TP; the GPU limit needs no change; /dev/shm comes with TP > 1 (issue 12)."""
    log = ('  File "/usr/lib/python3/dist-packages/vllm/model_executor/models/qwen2.py", line 300, in __init__\n'
           "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacty of "
           "79.33 GiB of which 500.00 MiB is free. Of the allocated memory 78.33 GiB is allocated by PyTorch, and 10.00 MiB "
           "is reserved by PyTorch but unallocated.\n")
    pod = make_pod(command=["vllm", "serve"], args=["Qwen/Qwen2-72B-Instruct"], gpus="8")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, make_node("NVIDIA-A100-SXM4-80GB", 81920, 8))))
    assert result.cause == "weights-exceed-gpu"
    assert changes_of(result) == {("flag", "--tensor-parallel-size"): ("1", "4"), ("volume", "/dev/shm"): (None, "4Gi")}
    assert result.command_after == ["vllm", "serve", "Qwen/Qwen2-72B-Instruct", "--tensor-parallel-size", "4"]


def test_v1_sampler_oom_seen_only_in_its_frames(tmp_path):
    log = ('  File "/usr/local/lib/python3.10/dist-packages/vllm/v1/sample/ops/topk_topp_sampler.py", line 111, in '
           "apply_top_k_top_p\n    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 1 has a total capacity of "
           "23.69 GiB of which 1.01 GiB is free. Process 1 has 22.67 GiB memory in use. Of the allocated memory 21.9 GiB "
           "is allocated by PyTorch, and 300.00 MiB is reserved by PyTorch but unallocated.\n")
    pod = make_pod(command=["vllm", "serve"], args=["m", "--max-num-seqs", "512"])
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "sampler-warmup-max-num-seqs"
    assert changes_of(result) == {("flag", "--max-num-seqs"): ("512", "256")}


def test_v1_max_len_message_reformatted_over_lines(tmp_path):
    log = ("ValueError: To serve at least one request with the model's max seq len (1048576),\n"
           "22.5 GiB KV cache is needed, which is larger than the available KV cache memory (17.39 GiB).\n"
           "Based on the available memory, the estimated maximum model length is 810208.\n")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, make_pod(args=["--model", "m"]))))
    assert result.cause == "kv-cache-max-model-len"
    assert changes_of(result) == {("flag", "--max-model-len"): ("1048576", "809984")}


def test_a_busy_gpu_gets_the_value_and_an_honest_caution(tmp_path):
    log = ("(EngineCore pid=5) ValueError: Free memory on device cuda:0 (1.53/22.05 GiB) on startup is less than desired "
           "GPU memory utilization (0.9, 19.85 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
           "processes.\n")
    # a model whose size is unknown: the value, with the caution (issue 12 keeps this path)
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, make_pod(args=["--model", "my-org/in-house"]))))
    assert result.cause == "shared-gpu-free-memory"
    assert changes_of(result) == {("flag", "--gpu-memory-utilization"): ("0.9", "0.06")}
    assert result.confidence == "medium"
    assert "Caution:" in result.explanation and "free this GPU" in result.explanation


def test_the_reworded_free_memory_check_is_the_same_busy_gpu(tmp_path):
    # a downstream build words vLLM's start-up check "Available memory ... is below required ..."
    log = ("(EngineCore_DP0 pid=7) ERROR 02-10 09:00:00 [core.py:900] ValueError: Available memory on device cuda:0 "
           "(1.53/22.05 GiB) is below required GPU memory utilization (0.9, 19.85 GiB). Reduce GPU memory utilization "
           "or decrease GPU memory used by other processes.\n")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, make_pod(args=["--model", "my-org/in-house"]))))
    assert result.cause == "shared-gpu-free-memory"
    assert changes_of(result) == {("flag", "--gpu-memory-utilization"): ("0.9", "0.06")}


def test_a_busy_gpu_that_cannot_hold_the_weights_gets_no_change_and_advice(tmp_path):
    """Issue 12: 0.06 x 22.05 GiB cannot hold Llama-3.1-8B's ~15 GiB, so no button, the numbers, and advice."""
    log = ("(EngineCore pid=5) ValueError: Free memory on device cuda:0 (1.53/22.05 GiB) on startup is less than desired "
           "GPU memory utilization (0.9, 19.85 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
           "processes.\n")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, make_pod(args=["--model", "meta-llama/Llama-3.1-8B"]))))
    assert result.cause == "shared-gpu-free-memory"
    assert result.changes == []
    assert "0.06 x 22.05 GiB = 1.32 GiB cannot hold" in result.explanation
    assert advice_text(result.advice).startswith("Advice (not a change to approve)")


def test_a_gpu_with_nothing_free_gets_no_change(tmp_path):
    log = ("ValueError: Free memory on device (0.49/79.32 GiB) on startup is less than desired GPU memory utilization "
           "(0.6, 47.59 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, make_pod(args=["--model", "m"]))))
    assert result.cause == "shared-gpu-free-memory"
    assert result.changes == []
    assert "another process holds this GPU" in result.explanation and "No change is proposed" in result.explanation


def test_a_memory_limit_at_the_node_capacity_says_so(tmp_path):
    pod = make_pod(args=["--model", "m"], memory="240Gi", exit_code=137, reason="OOMKilled")
    node = make_node(allocatable_memory="251Gi")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", "INFO 06-01 10:00:00 [api_server.py:1] starting\n", pod, node)))
    assert result.cause == "host-oom-killed"
    assert result.changes == []
    assert "already at the node's capacity" in result.explanation


def test_one_huge_allocation_without_a_stage_is_the_profiling_batch(tmp_path):
    log = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 14.00 GiB. GPU 0 has a total capacty of "
           "14.58 GiB of which 9.93 GiB is free. Including non-PyTorch memory, this process has 4.64 GiB memory in use. Of "
           "the allocated memory 4.20 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.\n")
    pod = make_pod(args=["--model", "TheBloke/zephyr-7B-beta-AWQ", "--max-num-batched-tokens", "32768"])
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "profiling-activation-oom"
    assert changes_of(result) == {("flag", "--max-num-batched-tokens"): ("32768", "16384")}


def test_a_few_mib_of_unallocated_cache_is_not_fragmentation(tmp_path):
    log = ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 15.98 GiB "
           "of which 22.00 MiB is free. Of the allocated memory 15.69 GiB is allocated by PyTorch, and 92.65 MiB is "
           "reserved by PyTorch but unallocated.\n")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, make_pod(args=["--model", "m"]))))
    assert result.cause is None and result.changes == []  # no stage, no numbers that point anywhere: say so


def test_workers_that_reached_kv_sizing_had_their_gpus(tmp_path):
    """TP x PP above the pod's GPUs, but the ranks run on other Ray nodes: not a TP mismatch."""
    log = ('(RayWorkerWrapper pid=37396, ip=10.244.1.95) ERROR 04-17 15:11:18 [worker_base.py:620]   File '
           '"/usr/local/lib/python3.12/dist-packages/vllm/worker/worker.py", line 540, in raise_if_cache_size_invalid\n'
           '(RayWorkerWrapper pid=37396, ip=10.244.1.95) ERROR 04-17 15:11:18 [worker_base.py:620]     raise '
           'ValueError("No available memory for the cache blocks. "\n')
    pod = make_pod(command=["vllm", "serve"], args=["m", "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"],
                   gpus="8")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "no-kv-cache-memory"


def test_rays_small_dev_shm_warning_under_tensor_parallelism(tmp_path):
    log = ("2023-11-18 03:39:16,283 WARNING services.py:1996 -- WARNING: The object store is using /tmp instead of "
           "/dev/shm because /dev/shm has only 67108864 bytes available. This will harm performance!\n")
    pod = make_pod(args=["--model", "m", "--tensor-parallel-size", "2"], gpus="2")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "shm-too-small"
    assert changes_of(result) == {("volume", "/dev/shm"): (None, "2Gi")}


def test_probe_kill_told_by_vllm_itself(tmp_path):
    """No events collected, exit code 1: vLLM's "KeyboardInterrupt: terminated" mid-load still tells it."""
    log = ("INFO 06-01 10:00:00 [api_server.py:1] vLLM API server version 0.6.3\n"
           "Loading safetensors checkpoint shards:  40% Completed | 12/30 [01:03<01:34,  5.25s/it]\n"
           "KeyboardInterrupt: terminated\n")
    pod = make_pod(args=["--model", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "4"], gpus="4",
                   liveness={"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 60, "periodSeconds": 10,
                             "failureThreshold": 3})
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "probe-killed-during-load"
    assert [c.name for c in result.changes] == ["startupProbe"]


def test_a_shell_reporting_killed_after_kv_sizing_is_host_memory(tmp_path):
    log = ("INFO 01-20 10:00:00 llm_engine.py:275] # GPU blocks: 12453, # CPU blocks: 2730\n"
           "Killed\n")
    pod = make_pod(command=["/bin/sh", "-c"], args=["python3 -m vllm.entrypoints.openai.api_server --model m"],
                   memory="32Gi")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "host-oom-killed"
    assert changes_of(result) == {("resources", "limits.memory"): ("32Gi", "48Gi")}


def test_rays_own_out_of_memory_error_is_host_memory_not_gpu(tmp_path):
    log = ("ERROR 03-21 17:27:44 [core.py:340] ray.exceptions.OutOfMemoryError: Task was killed due to the node running "
           "low on memory.\n")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, make_pod(args=["--model", "m"]))))
    assert result.cause == "host-oom-killed"


def test_the_raylets_memory_pressure_summary_is_host_memory(tmp_path):
    # Ray's periodic raylet summary, hard-wrapped by a log sink: no "Ray killed this worker" line
    log = ("(raylet) node_manager.cc:3007: 2 Workers (tasks /\n"
           " actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: abd4\n"
           "(raylet) Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/"
           "ray-core/scheduling/ray-oom-prevention.html.\n")
    pod = make_pod(args=["--model", "m", "--tensor-parallel-size", "4"], gpus="4", memory="32Gi")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "host-oom-killed"
    assert changes_of(result) == {("resources", "limits.memory"): ("32Gi", "48Gi")}


def test_a_multi_node_ray_cluster_is_not_a_tensor_parallel_mismatch(tmp_path):
    log = ("2024-03-29 10:00:00,000 INFO worker.py:1567 -- Connecting to existing Ray cluster at address: 10.4.80.151:6379...\n"
           "WARNING 03-29 10:00:01 ray_utils.py:180] tensor_parallel_size=2 is bigger than a reserved number of GPUs (1 GPUs) "
           "in a node. Tensor parallel workers can be spread out to 2+ nodes which can degrade the performance.\n")
    pod = make_pod(args=["--model", "m", "--tensor-parallel-size", "2"], gpus="1")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause is None and result.changes == []


def test_a_non_memory_failure_right_after_graph_capture_is_not_cuda_graph_capture(tmp_path):
    """Custom all-reduce failing once the graphs are captured: the stage alone is no OOM."""
    log = ("Capturing CUDA graph shapes: 100%|##########| 35/35 [01:17<00:00,  2.20s/it]\n"
           "2025-04-23T03:35:43.635Z  INFO dynamo_engine_vllm::worker: VLLM: Failed: "
           "/workspace/csrc/custom_all_reduce.cuh:368 'invalid argument'\n")
    pod = make_pod(args=["--model", "m", "--tensor-parallel-size", "8"], gpus="8")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, make_node("NVIDIA-H20", 97871, 8))))
    assert result.cause is None and result.changes == []


def test_a_traceback_cut_inside_capture_model_proposes_nothing(tmp_path):
    """The exception line fell outside the paste: the stage is known, the cause is not."""
    log = ("INFO 04-29 01:09:49 [kv_cache_utils.py:634] GPU KV cache size: 198,784 tokens\n"
           "(VllmWorker rank=1 pid=106) ERROR 04-29 01:10:12 [multiproc_executor.py:470] WorkerProc hit an exception.\n"
           "(VllmWorker rank=1 pid=106) ERROR 04-29 01:10:12 [multiproc_executor.py:470]   File "
           "\"/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py\", line 242, in compile_or_warm_up_model\n"
           "(VllmWorker rank=1 pid=106) ERROR 04-29 01:10:12 [multiproc_executor.py:470]     self.model_runner.capture_model()\n")
    pod = make_pod(args=["--model", "m", "--tensor-parallel-size", "4"], gpus="4")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, make_node("NVIDIA-A10", 23028, 4))))
    assert result.stage == "graph_capture"
    assert result.cause is None and result.changes == []


def test_a_profile_run_traceback_without_an_oom_line_proposes_nothing(tmp_path):
    """A dtype error (bf16 on Turing) also dies in profile_run: no profiling-OOM change without the OOM."""
    log = ("(RayWorkerWrapper pid=1, ip=10.0.0.2) ERROR 02-26 07:57:27 [worker_base.py:340] File "
           "\"/venv/lib/python3.10/site-packages/vllm/v1/worker/gpu_model_runner.py\", line 5229, in profile_run\n"
           "(RayWorkerWrapper pid=1, ip=10.0.0.2) ERROR 02-26 07:57:27 [worker_base.py:340] outputs = self.model(\n")
    pod = make_pod(args=["--model", "m", "--tensor-parallel-size", "4"], gpus="4")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, make_node("NVIDIA-GeForce-RTX-2080-Ti", 22528, 4))))
    assert result.cause is None and result.changes == []


def test_local_world_size_over_visible_devices_on_a_ray_cluster_is_no_tp_mismatch(tmp_path):
    """TP 16 over a 2x8 Ray cluster tripping V1's local_world_size assertion: a vLLM bug, not the pod's GPU count."""
    log = ("(EngineCore_DP0 pid=570282)     assert self.parallel_config.local_world_size <= visible_device_count, (\n"
           "(EngineCore_DP0 pid=570282) AssertionError: local_world_size (16) must be less than or equal to the number "
           "of visible devices (8).\n")
    pod = make_pod(command=["vllm", "serve"],
                   args=["m", "--tensor-parallel-size", "16", "--distributed-executor-backend", "ray"], gpus="8")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, make_node("NVIDIA-H100-80GB-HBM3", 81559, 8))))
    assert result.cause is None and result.changes == []


def test_killed_after_a_worker_exception_is_not_host_memory(tmp_path):
    """vLLM V1 SIGKILLs its own front-end after a worker raised; the shell's 'Killed' is not the OOM killer."""
    log = ("ERROR 05-19 22:17:53 [core.py:386] RuntimeError: ('Worker failed with error %s, please check the stack "
           "trace above for the root cause', \"'tuple' object has no attribute 'ndim'\")\n"
           "CRITICAL 05-19 22:17:53 [core_client.py:359] Got fatal signal from worker processes, shutting down. See "
           "stack trace above for root cause issue.\n"
           "Killed\n")
    pod = make_pod(command=["vllm", "serve"], args=["m", "-tp", "4"], gpus="4")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause is None and result.changes == []


def test_limit_mm_per_prompt_marks_a_multimodal_profiling_batch(tmp_path):
    log = ('[rank0]:   File "/x/vllm/worker/model_runner.py", line 1236, in profile_run\n'
           "[rank0]: torch.OutOfMemoryError: Error in model execution: CUDA out of memory. Tried to allocate 1.88 GiB. "
           "GPU 0 has a total capacity of 21.96 GiB of which 1.29 GiB is free. Including non-PyTorch memory, this "
           "process has 0 bytes memory in use. Of the allocated memory 19.02 GiB is allocated by PyTorch, and 1.32 GiB "
           "is reserved by PyTorch but unallocated.\n")
    pod = make_pod(args=["--model", "rhymes-ai/Aria", "--limit-mm-per-prompt", "image=256",
                         "--tensor-parallel-size", "4"], gpus="4")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "profiling-activation-oom"
    assert changes_of(result) == {("flag", "--max-num-seqs"): ("256", "128")}


def test_memory_held_by_processes_the_container_cannot_see(tmp_path):
    """'this process has 18.80 GiB' of an 80 GiB card with 176 MiB free: 61 GiB belong to others."""
    log = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 234.00 MiB. GPU 0 has a total capacty "
           "of 80 GiB of which 176.38 MiB is free. Process 4683 has 11.05 GiB memory in use. Process 16753 has 1.71 GiB "
           "memory in use. Including non-PyTorch memory, this process has 18.80 GiB memory in use. Of the allocated "
           "memory 18.26 GiB is allocated by PyTorch, and 30.10 MiB is reserved by PyTorch but unallocated.\n")
    pod = make_pod(args=["--model", "Qwen/Qwen-7B-Chat"])
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, make_node("NVIDIA-A100-SXM4-80GB", 81920, 1))))
    assert result.cause == "shared-gpu-free-memory"
    assert changes_of(result) == {("flag", "--gpu-memory-utilization"): ("0.9", "0.23")}


def test_process_list_cut_before_vllms_own_allocation(tmp_path):
    """In a container vLLM is listed as just another PID; with the allocation line cut, it is the largest."""
    log = ("ERROR 05-21 13:04:20 engine.py:389]   File \"/x/vllm/worker/cache_engine.py\", line 103, in "
           "_allocate_kv_cache\n"
           "ERROR 05-21 13:04:20 engine.py:389] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 418.00 MiB. "
           "GPU 0 has a total capacity of 23.69 GiB of which 193.25 MiB is free. Process 1254 has 730.00 MiB memory in "
           "use. Process 1348 has 3.70 GiB memory in use. Process 1892152 has 2.96 GiB memory in use. Process 2167142 "
           "has 14.90 GiB memory in use. Of the allocated memory 14")
    pod = make_pod(command=["vllm", "serve"], args=["Qwen/Qwen2.5-VL-7B-Instruct-AWQ"])
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "shared-gpu-free-memory"
    assert changes_of(result) == {("flag", "--gpu-memory-utilization"): ("0.9", "0.66")}


def test_checkpoint_mmap_refused_by_the_host_is_host_memory(tmp_path):
    """safetensors mmaps each shard; ENOMEM on that mmap is the host/container RAM, not the GPU."""
    log = ('ERROR 06-02 09:39:03 [core.py:396]     with safe_open(st_file, framework="pt") as f:\n'
           "ERROR 06-02 09:39:03 [core.py:396] RuntimeError: unable to mmap 16933256392 bytes from file "
           "</root/.cache/huggingface/hub/models--Qwen--Qwen3-30B-A3B-GPTQ-Int4/snapshots/9b53/model.safetensors>: "
           "Cannot allocate memory (12)\n")
    pod = make_pod(command=["vllm", "serve"], args=["Qwen/Qwen3-30B-A3B-GPTQ-Int4"], memory="16Gi")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "host-oom-killed"
    assert ("resources", "limits.memory") in changes_of(result)


def test_a_flag_set_in_a_variable_the_shell_expands_is_the_value_the_change_starts_from(tmp_path):
    # V0's refusal with the flags in VLLM_ARGS, expanded by `sh -c` (a common docker-compose port)
    log = ("ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory for the cache blocks. "
           "Try increasing `gpu_memory_utilization` when initializing the engine.\n")
    pod = make_pod(command=["/bin/sh", "-c"], args=["python3 -m vllm.entrypoints.openai.api_server ${VLLM_ARGS}"],
                   env={"VLLM_ARGS": "--model=/models/m --gpu-memory-utilization=0.4 --max-model-len=512"})
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, make_node())))
    assert result.cause == "no-kv-cache-memory"
    [change] = result.changes
    assert (change.name, change.before) == ("--gpu-memory-utilization", "0.4")
    assert float(change.after or 0) > 0.4
    assert result.command_after == ["/bin/sh", "-c", "python3 -m vllm.entrypoints.openai.api_server ${VLLM_ARGS} "
                                    f"--gpu-memory-utilization {change.after}"]


# vLLM 0.18+ logs "Estimated CUDA graph memory: %.2f GiB total" (gpu_model_runner) and, by default since 0.21,
# counts that estimate inside the --gpu-memory-utilization budget before it sizes the KV cache.
_GRAPH_ESTIMATE = ("(Worker_TP0 pid=7) INFO 08-19 05:56:57 [gpu_model_runner.py:6936] Estimated CUDA graph memory: "
                   "{gib:.2f} GiB total\n")
_NO_KV = ("(EngineCore_DP0 pid=3) ERROR 08-19 05:56:57 [core.py:1346] ValueError: No available memory for the cache "
          "blocks. Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
          "memory reservation on the CPU backend, despite its name).\n")


def test_no_kv_memory_under_a_graph_estimate_larger_than_any_step_proposes_nothing(tmp_path):
    """30 GiB of estimated graphs on an 80 GB card: 0.9 -> 0.95 adds ~4 GiB, so neither guessed step is shown to work."""
    log = _GRAPH_ESTIMATE.format(gib=30.0) + _NO_KV
    pod = make_pod(args=["--model", "my-org/in-house", "--tensor-parallel-size", "2"], gpus="2")
    node = make_node(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, count=2)
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, node)))
    assert result.cause == "no-kv-cache-memory"
    assert result.changes == []
    assert "30.00 GiB of estimated CUDA-graph memory" in result.explanation
    assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in result.explanation
    assert result.explanation.count("estimated CUDA-graph memory") == 1  # both refused fixes say it once


def test_no_kv_memory_beside_a_small_graph_estimate_still_raises_the_utilization(tmp_path):
    """Half a GiB of graphs is less than the ~4 GiB the step adds on an 80 GB card: the step stays."""
    log = _GRAPH_ESTIMATE.format(gib=0.5) + _NO_KV
    pod = make_pod(args=["--model", "my-org/in-house", "--tensor-parallel-size", "2"], gpus="2")
    node = make_node(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, count=2)
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, node)))
    assert result.cause == "no-kv-cache-memory"
    assert changes_of(result) == {("flag", "--gpu-memory-utilization"): ("0.9", "0.95")}


def test_others_on_the_gpu_do_not_hide_weights_bigger_than_the_whole_gpu(tmp_path):
    """Other processes hold memory, but a 72B model at TP 1 needs more than the whole 80 GiB card:
    lowering --gpu-memory-utilization (or freeing the card) cannot fit it; the pod's other GPUs can."""
    log = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has a total capacty of "
           "79.15 GiB of which 752.31 MiB is free. Process 11 has 18.65 GiB memory in use. Process 12 has 19.11 GiB "
           "memory in use. Including non-PyTorch memory, this process has 40.00 GiB memory in use. Of the allocated "
           "memory 39.40 GiB is allocated by PyTorch, and 12.70 MiB is reserved by PyTorch but unallocated.\n")
    pod = make_pod(command=["vllm", "serve"], args=["Qwen/Qwen2-72B-Instruct"], gpus="4")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod, make_node("NVIDIA-A100-SXM4-80GB", 81920, 4))))
    assert result.cause == "weights-exceed-gpu"
    assert changes_of(result)[("flag", "--tensor-parallel-size")] == ("1", "4")


CPU_KV_REFUSAL = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
                  "stored in KV cache (8192). Try increasing `VLLM_CPU_KVCACHE_SPACE` or decreasing `max_model_len` "
                  "when initializing the engine.\n")


def test_cpu_backend_kv_refusal_scales_the_kv_space_that_sized_the_pool(tmp_path):
    """vLLM's V0 CPU worker names VLLM_CPU_KVCACHE_SPACE: the pool scales to the context when the memory limit holds it."""
    pod = make_pod(args=["--model", "org/Chat-7B"], memory="64Gi", env={"VLLM_CPU_KVCACHE_SPACE": "8"})
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", CPU_KV_REFUSAL, pod)))
    assert result.cause == "kv-cache-max-model-len"
    assert changes_of(result) == {("env", "VLLM_CPU_KVCACHE_SPACE"): ("8", "32")}


def test_cpu_backend_kv_space_that_would_outgrow_the_memory_limit_gives_way_to_a_shorter_context(tmp_path):
    pod = make_pod(args=["--model", "org/Chat-7B"], memory="32Gi", env={"VLLM_CPU_KVCACHE_SPACE": "8"})
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", CPU_KV_REFUSAL, pod)))
    assert result.cause == "kv-cache-max-model-len"
    assert [(c.kind, c.name) for c in result.changes] == [("flag", "--max-model-len")]
    assert int(result.changes[0].after) <= 8192


def test_gpu_kv_refusal_never_touches_the_cpu_kv_space(tmp_path):
    log = CPU_KV_REFUSAL.replace("`VLLM_CPU_KVCACHE_SPACE`", "`gpu_memory_utilization`")
    pod = make_pod(args=["--model", "org/Chat-7B"], memory="64Gi")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, pod)))
    assert result.cause == "kv-cache-max-model-len"
    assert ("env", "VLLM_CPU_KVCACHE_SPACE") not in changes_of(result)
