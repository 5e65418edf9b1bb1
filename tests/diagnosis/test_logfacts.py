"""One-pass log reading: every format in ../shared/reference, across vLLM and PyTorch versions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.diagnosis.logfacts import CHUNK_BYTES, MAX_LINE_BYTES, extract
from bot.diagnosis.logformats import FACTS, FORMATS, LOG_FACTS, PATTERNS, LogFormat, LogFormatError, Put, to_int
from bot.diagnosis.models import LogText
from bot.diagnosis.signals import LOG_FACTS as SIGNAL_FACTS
from bot.diagnosis.signals import SIGNALS


def facts_of(text: str):
    return extract(LogText(text=text))


@pytest.mark.parametrize("line, expected", [
    # weights: GB label (GiB value, <=0.7), GiB (0.8+), format_gib (0.14+), with V1 process prefixes
    ("INFO 08-19 07:51:03 model_runner.py:732] Loading model weights took 2.3463 GB", {"weights_gib": 2.3463}),
    ("INFO 04-07 15:52:21 [model_runner.py:1146] Model loading took 17.6110 GiB and 12.273077 seconds", {"weights_gib": 17.611}),
    ("(EngineCore_DP0 pid=61) INFO 10-13 09:06:25 [v1/worker/gpu_model_runner.py:3906] Model loading took 15.0 GiB memory and 8.2 seconds",
     {"weights_gib": 15.0}),
    ("(Worker_TP1 pid=62) INFO 10-13 09:06:25 [gpu_model_runner.py:2653] Model loading took 7.5 GiB and 8.2 seconds", {"weights_gib": 7.5}),
    # KV sizing: V0 blocks, V0 0.7+ cuda blocks, V1 comma token counts, 0.28+ one line
    ("INFO 01-11 15:51:18 llm_engine.py:275] # GPU blocks: 229, # CPU blocks: 512", {"gpu_blocks": 229}),
    ("INFO 02-01 10:00:00 [executor_base.py:111] # cuda blocks: 12,345, # CPU blocks: 2048", {"gpu_blocks": 12345}),
    ("(EngineCore_DP0 pid=7) INFO 06-01 10:00:00 [kv_cache_utils.py:864] GPU KV cache size: 230,528 tokens", {"kv_tokens": 230528}),
    ("INFO 06-01 10:00:00 [kv_cache_utils.py:868] Maximum concurrency for 100,000 tokens per request: 2.31x",
     {"concurrency_len": 100000, "max_concurrency": 2.31}),
    ("(EngineCore pid=7) INFO 11-01 10:00:00 [v1/core/kv_cache_utils.py:1148] GPU KV cache size: 52,416 tokens, Maximum concurrency for 32,768 tokens per request: 1.60x",
     {"kv_tokens": 52416, "concurrency_len": 32768, "max_concurrency": 1.6}),
    ("INFO 06-01 10:00:00 [gpu_worker.py:298] Available KV cache memory: 10.55 GiB", {"available_kv_gib": 10.55}),
    ("INFO 06-01 10:00:00 [gpu_worker.py:437] Available KV cache memory: 61.5 GiB", {"available_kv_gib": 61.5}),
    # V0 profiling block (0.6.5-0.10.2) and the 0.6.4 one-liner
    ("INFO 04-07 15:54:56 [worker.py:267] the current vLLM instance can use total_gpu_memory (79.10GiB) x gpu_memory_utilization (0.90) = 71.19GiB",
     {"total_gpu_gib": 79.1, "gpu_memory_utilization": 0.9, "budget_gib": 71.19}),
    ("model weights take 14.99GiB; non_torch_memory takes 0.31GiB; PyTorch activation peak memory takes 1.19GiB; the rest of the memory reserved for KV Cache is 54.70GiB.",
     {"weights_gib": 14.99, "non_torch_gib": 0.31, "activation_gib": 1.19, "available_kv_gib": 54.7}),
    # max-model-len errors: V0, V1 with the 'models's' typo and estimate, 0.8.4 without, 0.22 fixed typo
    ("ValueError: The model's max seq len (8192) is larger than the maximum number of tokens that can be stored in KV cache (2400). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
     {"required_len": 8192, "kv_capacity_tokens": 2400}),
    ("ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (2.34 GiB). Based on the available memory, the estimated maximum model length is 19152. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
     {"required_len": 131072, "kv_needed_gib": 16.0, "available_kv_gib": 2.34, "estimated_max_len": 19152}),
    ("ValueError: To serve at least one request with the models's max seq len (32768), (4.00 GiB KV cache is needed, which is larger than the available KV cache memory (1.10 GiB). Based on the available memory,  Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
     {"required_len": 32768, "kv_needed_gib": 4.0, "available_kv_gib": 1.1}),
    ("(EngineCore pid=9) ValueError: To serve at least one request with the model's max seq len (65536), (8 GiB KV cache is needed, which is larger than the available KV cache memory (3.5 GiB). Based on the available memory, the estimated maximum model length is 28672. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.",
     {"required_len": 65536, "estimated_max_len": 28672}),
    ("ValueError: To serve at least one request with the models's max seq len (8192), (1.00 GB KV cache is needed, which is larger than the available KV cache memory (0.50 GB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
     {"kv_needed_gib": 1.0, "available_kv_gib": 0.5}),
    # free-memory check: 0.9-0.13 and 0.14+ with device
    ("ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than desired GPU memory utilization (0.95, 45.01 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     {"free_at_start_gib": 31.44, "total_gpu_gib": 47.38, "gpu_memory_utilization": 0.95, "requested_gib": 45.01}),
    ("(EngineCore pid=79) ValueError: Free memory on device cuda:0 (22.76/24.0 GiB) on startup is less than desired GPU memory utilization (0.97, 23.28 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     {"free_at_start_gib": 22.76, "requested_gib": 23.28}),
    # the same check reworded by a downstream ROCm build
    ("(EngineCore_DP0 pid=12) ERROR 02-10 09:00:00 [core.py:900] ValueError: Available memory on device cuda:0 (40.5/96.0 GiB) is below required GPU memory utilization (0.9, 86.4 GiB). Reduce GPU memory utilization or decrease GPU memory used by other processes.",
     {"free_at_start_gib": 40.5, "total_gpu_gib": 96.0, "gpu_memory_utilization": 0.9, "requested_gib": 86.4,
      "free_memory_check_failed": True}),
    # sampler warm-up
    ("RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.",
     {"sampler_oom_requests": 1024}),
    ("RuntimeError: CUDA out of memory occurred when warming up pooler (task='embed') with 256 dummy requests. Please try lowering `max_num_seqs`",
     {"sampler_oom_requests": 256, "sampler_kind": "pooler"}),
    # TP vs GPUs
    ("ValueError: World size (4) is larger than the number of available GPUs (2) in this node. If this is intentional and you are using:",
     {"world_size_required": 4, "gpus_visible": 2}),
    ("ValueError: please set tensor_parallel_size (8) to less than max local gpu count (4)", {"world_size_required": 8, "gpus_visible": 4}),
    # /dev/shm
    ("RuntimeError: Insufficient space in /dev/shm for shm_broadcast: 256 MiB required, 60 MiB free. Increase /dev/shm (e.g. --shm-size or --ipc=host).",
     {"shm_error": True, "shm_required_mib": 256.0, "shm_free_mib": 60.0}),
    # graphs
    ("INFO 06-01 10:00:00 [gpu_model_runner.py:3480] Graph capturing finished in 12 secs, took 0.58 GiB", {"graph_capture_finished": True, "graph_gib": 0.58}),
    ("(EngineCore pid=5) INFO 11-01 10:00:00 [gpu_model_runner.py:5956] Estimated CUDA graph memory: 1.25 GiB total", {"graph_gib": 1.25}),
    # engine config lines
    ("INFO 01-11 15:51:02 llm_engine.py:70] Initializing an LLM engine (v0.6.3) with config: model='Qwen/Qwen2-7B', dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=2, quantization=None, enforce_eager=False",
     {"vllm_version": "0.6.3", "config_model": "Qwen/Qwen2-7B", "config_max_model_len": 32768, "config_tensor_parallel_size": 2, "config_dtype": "bfloat16"}),
    ("(APIServer pid=1) INFO 10-25 13:00:01 [api_server.py:1839] vLLM API server version 0.11.0", {"vllm_version": "0.11.0"}),
    ("(APIServer pid=1) INFO 10-25 13:00:01 [utils.py:233] non-default args: {'model': 'meta-llama/Llama-3.1-8B', 'max_model_len': 65536, 'gpu_memory_utilization': 0.95}",
     {"config_max_model_len": 65536, "config_gpu_memory_utilization": 0.95}),
])
def test_line_formats(line, expected):
    facts = facts_of(line + "\n")
    for key, value in expected.items():
        assert facts.get(key) == pytest.approx(value) if isinstance(value, float) else facts.get(key) == value, key


@pytest.mark.parametrize("line, tried, total, free", [
    # PyTorch 2.0
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb",
     1.63, 44.56, 565.31 / 1024),
    # PyTorch 2.1 typo "capacty"
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.00 MiB. GPU 0 has a total capacty of 44.35 GiB of which 53.38 MiB is free. Process 3663367 has 44.28 GiB memory in use. Of the allocated memory 37.38 GiB is allocated by PyTorch, and 275.68 MiB is reserved by PyTorch but unallocated.",
     112 / 1024, 44.35, 53.38 / 1024),
    # PyTorch 2.5+ private pools, 2.11 docs URL
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in use. Of the allocated memory 75.20 GiB is allocated by PyTorch, with 1.10 GiB allocated in private pools (e.g., CUDA Graphs), and 1.30 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
     2.0, 79.19, 1.02),
])
def test_pytorch_oom_versions(line, tried, total, free):
    facts = facts_of(line + "\n")
    assert facts.get("oom") is True
    assert facts.get("oom_tried_gib") == pytest.approx(tried, rel=1e-3)
    assert facts.get("oom_total_gib") == pytest.approx(total, rel=1e-3)
    assert facts.get("oom_free_gib") == pytest.approx(free, rel=1e-3)
    assert facts.get("oom_reserved_unallocated_gib") is not None


def test_other_process_memory_listed_by_pytorch():
    facts = facts_of("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
                     "23.55 GiB of which 200.00 MiB is free. Process 1111 has 9.00 GiB memory in use. Including non-PyTorch "
                     "memory, this process has 14.30 GiB memory in use. Of the allocated memory 13.90 GiB is allocated by "
                     "PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.\n")
    assert facts.get("oom_processes_gib") == [9.0]
    assert facts.get("oom_this_process_gib") == pytest.approx(14.3)


def test_stages_from_frames_and_markers():
    log = "\n".join([
        "INFO 06-01 10:00:00 [gpu_model_runner.py:1801] Model loading took 14.99 GiB and 9.1 seconds",
        "INFO 06-01 10:00:10 [kv_cache_utils.py:716] GPU KV cache size: 100,000 tokens",
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2309, in capture_model',
        '  File "/usr/local/lib/python3.12/dist-packages/torch/cuda/graphs.py", line 84, in capture_end',
        "RuntimeError: CUDA error: out of memory",
    ])
    facts = facts_of(log)
    assert "graph_capture" in facts.frame_stages
    assert facts.get("cuda_driver_oom") is True
    assert facts.furthest_marker() == "graph_capture"


def test_user_code_frames_do_not_count_as_vllm_stages():
    facts = facts_of('  File "/app/my_server.py", line 12, in load_model\nValueError: bad config\n')
    assert facts.frame_stages == []


def test_tqdm_carriage_returns_and_ansi_colours():
    log = ("Loading safetensors checkpoint shards:   0% Completed | 0/4\rLoading safetensors checkpoint shards:  25% "
           "Completed | 1/4\rLoading safetensors checkpoint shards:  50% Completed | 2/4\n"
           "\x1b[1;36m(EngineCore_DP0 pid=5)\x1b[0;0m INFO 06-01 10:00:10 [gpu_worker.py:298] Available KV cache memory: 3.00 GiB\n")
    facts = facts_of(log)
    assert facts.get("weights_progress_pct") == 50
    assert facts.get("available_kv_gib") == 3.0


def test_host_oom_is_not_confused_with_cuda_oom_error_name():
    facts = facts_of("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n")
    assert facts.get("host_oom") is None
    assert facts.get("oom") is True


def test_binary_and_empty_logs():
    assert extract(LogText(text="")).byte_count == 0
    binary = extract(LogText(text="\x00\x01\x02" * 1000))
    assert binary.binary is True


def test_numbers_repeated_by_workers_keep_the_worst():
    log = "\n".join(f"(VllmWorker rank={r} pid={100 + r}) INFO 03-16 06:12:38 [gpu_worker.py:232] Available KV cache memory: {v} GiB"
                    for r, v in enumerate([10.5, 9.75, 10.25]))
    assert facts_of(log).get("available_kv_gib") == 9.75


def test_a_crash_after_a_long_noisy_run_is_found(tmp_path):
    path = tmp_path / "big.log"
    with path.open("w") as fh:
        fh.write("INFO 06-01 10:00:00 [gpu_model_runner.py:1801] Model loading took 14.99 GiB and 9.1 seconds\n")
        noise = "(APIServer pid=1) INFO 06-01 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 12.0 tokens/s, GPU KV cache usage: 1.0%, Error count 0\n"
        fh.write(noise * 60_000)  # ~9 MB, five chunks, each line holding a keyword
        fh.write("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n")
    facts = extract(LogText(path=path))
    assert facts.get("no_kv_memory") is True
    assert facts.get("weights_gib") == 14.99
    assert facts.line_count == 60_002
    assert any("No available memory" in line for _, line in facts.hit_lines)


def test_messages_wrapped_over_lines_are_joined():
    log = ("ValueError: To serve at least one request with the models's max seq len (221000), (10.12 GiB KV cache is\n"
           "needed, which is larger than the available KV cache memory (5.59 GiB). Based on the available memory, the\n"
           "estimated maximum model length is 122080. Try increasing `gpu_memory_utilization`\n")
    facts = facts_of(log)
    assert facts.get("required_len") == 221000
    assert facts.get("estimated_max_len") == 122080


def test_an_oom_message_broken_after_its_first_sentence_is_read_whole():
    # PyTorch prints one line; a paste that breaks it puts the capacity and the process list below
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB.\n"
           "GPU 3 has a total capacity of 44.42 GiB of which 900.00 MiB is free.\n"
           "Process 4711 has 2.50 GiB memory in use. Process 4712 has 40.90 GiB memory in use.\n")
    facts = facts_of(log)
    assert facts.get("oom_total_gib") == 44.42
    assert facts.get("oom_free_gib") == pytest.approx(900 / 1024)
    assert facts.get("oom_processes_gib") == [2.5, 40.9]


def test_a_quoted_estimate_with_its_sentence_start_elided_is_read():
    log = ("ValueError: To serve at least one request with the model's max seq len (90000),\n"
           "1.71 GiB KV cache is needed, which is larger than the available KV cache memory (1.66 GiB).\n"
           "... estimated maximum model length is 87360.\n")
    assert facts_of(log).get("estimated_max_len") == 87360


@pytest.mark.parametrize("line, fact", [
    ("NCCL WARN Error: failed to extend /dev/shm/nccl-aXb3 to 9637892 bytes", "shm_error"),
    ("misc/shmutils.cc:72 NCCL WARN Call to posix_fallocate failed : No space left on device", "shm_error"),
    ("RuntimeError: unable to write to file </torch_1234_567_0>: No space left on device (28)", "shm_error"),
    ("[12345.6] Memory cgroup out of memory: Killed process 4242 (python3) total-vm:99GB", "host_oom"),
    ('  File "/usr/lib/python3/dist-packages/torch/cuda/graphs.py", line 183, in __exit__', None),
])
def test_more_shm_and_host_memory_wordings(line, fact):
    facts = facts_of(line + "\n")
    if fact:
        assert facts.get(fact) is True
    else:
        assert facts.frame_stages == ["graph_capture"]


def test_a_runtime_warning_about_the_shared_memory_queue_is_not_a_shm_error():
    line = ("(EngineCore pid=5) INFO 11-01 10:00:00 [shm_broadcast.py:466] No available shared memory broadcast block "
            "found in 60 seconds. This typically happens when some processes are hanging.")
    assert facts_of(line + "\n").get("shm_error") is None


# ---- log formats as data ------------------------------------------------------------------


@pytest.mark.parametrize("changes, problem", [
    ({"puts": (Put("kv_tokenz", (0,), to_int),)}, "unknown fact 'kv_tokenz' (did you mean 'kv_tokens'?)"),
    ({"handler": "frame_stages"}, "unknown handler 'frame_stages' (did you mean 'frame_stage'?)"),
    ({"marks": "kv_size"}, "unknown stage 'kv_size'"),
    ({"puts": (Put("kv_tokens", (1,), to_int),)}, "capture group 1 does not exist"),
    ({"puts": (Put("kv_tokens", (0,), to_int, keep="newest"),)}, "keep='newest'"),
    ({"pattern": r"KV cache size: (\d+"}, "not a valid regex"),
    ({"versions": ""}, "record `versions` and `source`"),
    ({"literals": ()}, "at least one non-empty literal"),
])
def test_a_bad_declaration_fails_loudly_and_names_itself(changes, problem):
    fields = dict(name="my_new_kv_line", pattern=r"KV cache size: (\d+) tokens", literals=("KV cache size:",),
                  puts=(Put("kv_tokens", (0,), to_int),), versions="unknown", source="unknown")
    fields.update(changes)
    with pytest.raises(LogFormatError) as err:
        LogFormat(**fields).regex  # noqa: B018  (the pattern and its groups are checked when first compiled)
    assert "'my_new_kv_line'" in str(err.value)
    assert problem in str(err.value)


def test_every_shipped_format_compiles_and_its_puts_name_groups_it_has():
    # the reader compiles a format when a line first reaches it (issue 20): here every one is
    for fmt in FORMATS:
        assert fmt.regex.pattern == fmt.pattern, fmt.name
        assert all(i < fmt.regex.groups for put in fmt.puts for i in put.groups), fmt.name
    assert set(PATTERNS) == {fmt.name for fmt in FORMATS} and len(PATTERNS) == len(FORMATS)
    assert PATTERNS["version"] is next(fmt.regex for fmt in FORMATS if fmt.name == "version")


def test_every_format_records_versions_and_source_and_every_fact_is_documented():
    for fmt in FORMATS:
        assert fmt.versions.strip() and fmt.source.strip(), fmt.name
    assert LOG_FACTS == set(FACTS)


def test_signals_read_the_facts_the_formats_yield():
    assert SIGNAL_FACTS == LOG_FACTS
    assert {"weights_gib", "kv_tokens", "oom_processes_gib", "config_max_model_len"} <= SIGNALS


# ---- bounded memory on pathological logs --------------------------------------------------

_PEAK_OF_EXTRACT = """
import sys, tracemalloc
from pathlib import Path
from bot.diagnosis.logfacts import extract
from bot.diagnosis.models import LogText
tracemalloc.start()
facts = extract(LogText(path=Path(sys.argv[1])))
peak = tracemalloc.get_traced_memory()[1]
print(peak, facts.get("no_kv_memory"), facts.line_count, facts.get("weights_gib"))
"""
_NO_KV = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."


def _peak_and_facts(path):
    out = subprocess.run([sys.executable, "-c", _PEAK_OF_EXTRACT, str(path)], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    return int(out[0]), out[1], int(out[2]), out[3]


@pytest.mark.parametrize("ending", ["\r", "\n"])
def test_a_log_of_one_huge_line_is_read_in_bounded_memory(tmp_path, ending):
    # 40 MB of progress-bar frames that never print a newline (the old reader held ~4 bytes of
    # memory per byte of the line: 160 MB here), then the message that decides the diagnosis.
    path = tmp_path / "one-line.log"
    frame = b"Processed prompts:  42%|####      | 4242/10000 [00:42<00:58, 99.9it/s]\r"
    with path.open("wb") as fh:
        fh.write(b"INFO 06-01 10:00:00 [gpu_model_runner.py:1801] Model loading took 14.99 GiB and 9.1 seconds\r")
        fh.write(frame * (40 * 2**20 // len(frame)))
        fh.write(ending.encode() + _NO_KV.encode())
    peak, no_kv, line_count, weights = _peak_and_facts(path)
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    assert no_kv == "True"  # the decisive message at the end still counts
    assert weights == "14.99"  # and so does the start of the huge line
    assert line_count == (1 if ending == "\r" else 2)


def test_a_long_line_under_the_cap_is_read_whole_across_chunks(tmp_path):
    # 1.5 MB of progress frames starting 1 MB into the log (so across the reader's first chunk
    # boundary), with a fact in a middle frame: below the cap nothing of a line is dropped.
    frames = [f"Loading safetensors checkpoint shards: {i % 100:3d}% Completed | {i}/9999\r" for i in range(24_000)]
    frames[12_000] = "INFO 06-01 10:00:10 [gpu_worker.py:298] Available KV cache memory: 3.00 GiB\r"
    line = "".join(frames)
    assert CHUNK_BYTES < 2**20 + len(line) < MAX_LINE_BYTES + 2**20
    path = tmp_path / "long-line.log"
    path.write_text("INFO 06-01 10:00:00 noise\n" * (2**20 // 26) + line + "\n" + _NO_KV + "\n")
    facts = extract(LogText(path=path))
    assert facts.get("available_kv_gib") == 3.0
    assert facts.get("weights_progress_pct") == 23_999 % 100
    assert facts.get("no_kv_memory") is True


def _word(i: int) -> str:
    """A distinct lower-case word per number (digits are not part of a line's shape)."""
    out = ""
    while True:
        i, r = divmod(i, 26)
        out += chr(97 + r)
        if not i:
            return out


def test_the_shape_table_is_bounded_and_the_repeat_guard_stays_on(tmp_path):
    """More distinct keyword-line shapes than the table holds: the table stays at its cap, a
    noise line repeated all along is still not re-parsed every time, and the crash at the end is
    found (issue 20: past 100,000 shapes the guard used to switch off, and memory grew)."""
    from bot.diagnosis.logfacts import MAX_SHAPES, REPEATS_PARSED, _Reader

    noise = b"(APIServer pid=1) INFO 06-01 10:00:00 [loggers.py:123] Engine 000: Error count 0\n"
    lines = []
    for i in range(2 * MAX_SHAPES + 5000):
        lines.append(f"(APIServer pid=1) WARNING 06-01 10:00:00 [x.py:1] Error {_word(i)}\n".encode())
        if i % 10 == 0:
            lines.append(noise)
    crash = b"ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.\n"
    reader = _Reader(["Error", "No available memory"])
    peak = 0
    block = b"".join(lines)
    start = 0
    while start < len(block):  # blocks of whole lines, as the reader gets them
        end = block.rfind(b"\n", start, start + (1 << 20)) + 1
        reader.consume(block[start:end])
        peak = max(peak, len(reader.shapes))
        start = end
    assert peak <= MAX_SHAPES
    noise_shape = noise.rstrip(b"\n").translate(None, b"0123456789")
    assert reader.shapes[noise_shape] >= REPEATS_PARSED  # kept through every eviction: still noise

    path = tmp_path / "shapes.log"
    path.write_bytes(block + crash)
    facts = extract(LogText(path=path))
    assert facts.get("no_kv_memory") is True
