"""One streaming pass over a vLLM container log: every number and stage vLLM and PyTorch print.

Logs can be 100 MB of request noise around a short start-up. Running every regex on every
line would take seconds, so the pass works on byte chunks: one Aho-Corasick scan (C speed)
finds the lines that hold a keyword, and only those are decoded and parsed; a line shape
repeated many times is parsed once. Each parser declares its keywords ("gates"); playbooks
add their own literals (see `bot.playbooks`), so a new cause needs no change here.

Formats and version ranges: ../shared/reference/vllm-facts.md and log-formats.md.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from bot.diagnosis.models import LogText

CHUNK_BYTES = 2 * 1024 * 1024
REPEATS_PARSED = 50  # a line shape seen more often than this is noise (request logs, retries)
HEAD_LINES = 120
TAIL_LINES = 300
MAX_STORED_HITS = 2000  # kept from the start, and as many from the end
MAX_LINE_CHARS = 4000

# Stages of vLLM start-up, in the order they happen.
STAGES = ["startup", "nccl_init", "weights", "profiling", "kv_sizing", "kv_allocation",
          "graph_capture", "warmup", "ready"]

_NUM = r"((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)"  # 230,528 or 1478 (not the comma after it)
_SIZE = r"([\d.]+)\s*([KMGT]i?B|Gib|bytes|B)"


def to_gib(value: str, unit: str) -> float:
    """vLLM prints GiB values labelled 'GB' (bytes/2**30); PyTorch prints GiB/MiB/KiB."""
    v = float(value)
    unit = unit.strip()
    if unit in {"GiB", "GB", "Gib", "G"}:
        return v
    if unit in {"MiB", "MB", "M"}:
        return v / 1024
    if unit in {"KiB", "KB", "K"}:
        return v / 1024 / 1024
    if unit in {"TiB", "TB"}:
        return v * 1024
    return v / 2**30  # bytes


def to_int(text: str) -> int:
    return int(float(text.replace(",", "")))


class Fact(BaseModel):
    model_config = ConfigDict(frozen=True)
    value: Any
    line: str
    line_no: int


class LogFacts(BaseModel):
    """Everything one pass found. Values are GiB for memory and plain ints for tokens."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    facts: dict[str, Fact] = Field(default_factory=dict)
    markers: dict[str, int] = Field(default_factory=dict)  # stage marker -> first line number
    frame_stages: list[str] = Field(default_factory=list)  # stages named by traceback frames
    errors: list[Fact] = Field(default_factory=list)  # exception lines, in order
    hit_lines: list[tuple[int, str]] = Field(default_factory=list)  # lines holding a keyword
    head: list[str] = Field(default_factory=list)
    tail: list[str] = Field(default_factory=list)
    line_count: int = 0
    byte_count: int = 0
    binary: bool = False
    recognised: bool = False  # saw at least one vLLM or PyTorch line

    def get(self, name: str, default: Any = None) -> Any:
        fact = self.facts.get(name)
        return fact.value if fact is not None else default

    def line_of(self, name: str) -> str | None:
        fact = self.facts.get(name)
        return fact.line if fact is not None else None

    def furthest_marker(self) -> str | None:
        reached = [s for s in STAGES if s in self.markers]
        return reached[-1] if reached else None


@dataclass
class _State:
    facts: dict[str, Fact] = field(default_factory=dict)
    markers: dict[str, int] = field(default_factory=dict)
    frame_stages: list[str] = field(default_factory=list)
    errors: list[Fact] = field(default_factory=list)
    process_gib: dict[str, float] = field(default_factory=dict)
    recognised: bool = False

    def put(self, name: str, value: Any, line: str, line_no: int, keep: str = "first") -> None:
        """keep: first | last | min | max, for values printed by several workers or runs."""
        old = self.facts.get(name)
        if old is not None:
            if keep == "first":
                return
            if keep == "min" and not value < old.value:
                return
            if keep == "max" and not value > old.value:
                return
        self.facts[name] = Fact(value=value, line=line.strip()[:600], line_no=line_no)

    def mark(self, stage: str, line_no: int) -> None:
        self.markers.setdefault(stage, line_no)


# ---- line parsers ----------------------------------------------------------------------------

_RX: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = []


def rx(name: str, gates: tuple[str, ...], pattern: str, flags: int = 0) -> None:
    """A parser for lines holding one of `gates` (plain substrings: cheap to test first)."""
    _RX.append((name, re.compile(pattern, flags), gates))


rx("version", ("LLM engine (v", "version "), r"(?:LLM engine \(v|vLLM API server version |vLLM version |vllm version )v?(\d+\.\d+(?:\.\d+)?[\w.+-]*)")
rx("engine_config", ("with config", "non-default args"), r"(?:with config|non-default args)[:=]?\s*(.*)$")
rx("weights", ("weights took", "Model loading took"), r"(?:Loading model weights took|Model loading took) " + _SIZE)
rx("v0_profile_total", ("total_gpu_memory (",), r"total_gpu_memory \(([\d.]+)\s*GiB\) x gpu_memory_utilization \(([\d.]+)\) = ([\d.]+)\s*GiB")
rx("v0_profile_parts", ("model weights take",), r"model weights take ([\d.]+)\s*GiB; non_torch_memory takes ([\d.]+)\s*GiB; PyTorch activation peak memory takes ([\d.]+)\s*GiB; the rest of the memory reserved for KV Cache is (-?[\d.]+)\s*GiB")
rx("v064_profile", ("Memory profiling results",), r"Memory profiling results: total_gpu_memory=([\d.]+)GiB .*?peak_torch_memory=([\d.]+)GiB .*?non_torch_memory=([\d.]+)GiB kv_cache_size=(-?[\d.]+)GiB gpu_memory_utilization=([\d.]+)")
rx("gpu_blocks", (" blocks: ",), r"# (?:GPU|cuda|CUDA|gpu) blocks: " + _NUM)
rx("cpu_blocks", ("# CPU blocks: ",), r"# CPU blocks: (\d+)")
rx("kv_tokens", ("KV cache size:",), r"(?:GPU|CUDA|[A-Z]+) KV cache size: " + _NUM + r" tokens")
rx("concurrency", ("Maximum concurrency",), r"Maximum concurrency for " + _NUM + r" tokens per request: ([\d.]+)x")
rx("available_kv", ("Available KV cache memory",), r"Available KV cache memory: (-?[\d.]+) ?GiB")
rx("kv_memory_bytes", ("kv_cache_memory_bytes",), r"reserved ([\d.]+) ?GiB memory for KV Cache as specified by kv_cache_memory_bytes")
rx("v0_maxlen", ("max seq len",), r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)")
rx("v1_maxlen", ("max seq len",), r"max seq len \((\d+)\),\s*\(?([\d.]+) ?GI?B KV cache is needed, which is larger than the available KV cache memory \(([\d.]+) ?GI?B\)\.(?:\s*Based on the available memory,(?:\s*the estimated maximum model length is (\d+)\.)?)?", re.I)
rx("estimated_len", ("estimated maximum model length is",), r"the estimated maximum model length is (\d+)")
rx("no_kv_memory", ("No available memory for the cache", "Cannot auto-fit"), r"No available memory for the cache blocks|Cannot auto-fit max_model_len: not enough GPU memory")
rx("autofit", ("Auto-fit max_model_len",), r"Auto-fit max_model_len: reduced from (\d+) to (\d+)")
rx("free_check", ("Free memory on device",), r"Free memory on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory utilization \(([\d.]+), ([\d.]+) GiB\)")
rx("graph_mem", ("Graph capturing finished",), r"Graph capturing finished in \d+ secs?(?:, took ([\d.]+) GiB)?")
rx("graph_estimate", ("Estimated CUDA graph memory",), r"Estimated CUDA graph memory: ([\d.]+) GiB")
rx("capture_start", ("Capturing", "capture_model", "capture_end", "cuda/graphs.py", "_capture_cudagraphs"),
   r"Capturing the model for CUDA graphs|Capturing cudagraphs|Capturing CUDA graph|capture_model|capture_end|torch/cuda/graphs\.py|_capture_cudagraphs")
rx("sampler", ("when warming up",), r"CUDA out of memory occurred when warming up (sampler|pooler)(?: \([^)]*\))? with (\d+)")
rx("torch_oom_20", ("total capacity;",), r"Tried to allocate " + _SIZE + r" \(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE + r" free;(?: " + _SIZE + r" allowed;)? " + _SIZE + r" reserved in total by PyTorch\)")
rx("torch_oom_21", ("has a total capac",), r"Tried to allocate " + _SIZE + r"\. GPU (\d+) has a total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + r" is free\.")
rx("torch_oom_alloc", ("Of the allocated memory",), r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, (?:with " + _SIZE + r" allocated in private pools \(e\.g\., CUDA Graphs\), )?and " + _SIZE + r" is reserved by PyTorch but unallocated")
rx("torch_oom_self", ("this process has",), r"Including non-PyTorch memory, this process has " + _SIZE + r" memory in use")
rx("torch_oom_proc", ("memory in use",), r"Process (\d+) has " + _SIZE + r" memory in use")
rx("oom_generic", ("out of memory", "OutOfMemory", "cudaErrorMemoryAllocation", "ALLOC_FAILED", "OUT_OF_MEMORY"),
   r"CUDA out of memory|(?<!exceptions\.)OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY")
rx("weights_wrapper", ("Failed to load model",), r"Failed to load model - not enough GPU memory")
rx("world_size", ("World size (",), r"World size \((\d+)\) is larger than the number of available GPUs \((\d+)\)")
rx("tp_local", ("max local gpu count",), r"please (?:set tensor_parallel_size \((\d+)\) to less than|ensure that world_size \((\d+)\) is less than than) max local gpu count \((\d+)\)")
rx("ray_pg", ("placement group",), r"number of required GPUs exceeds the total number of available GPUs|Waiting for creating a placement group of specs|Cannot provide a placement group")
rx("heads_tp", ("must be divisible by tensor parallel size",), r"Total number of attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)")
rx("shm_segment", ("shared memory", "/dev/shm", "shm_open", "posix_fallocate", "</torch_"),
   r"Error while creating shared memory segment\s*(/dev/shm\S*)?(?: \(size (\d+)\))?"
   r"|(?:unable to|failed to|cannot|could not|Unable to|Failed to|Cannot|Could not) (?:create|allocate|open|map|mmap)[^\n]{0,60}(?:shared memory|/dev/shm|shm_open)"
   r"|/dev/shm[^\n]{0,80}No space left on device|No space left on device[^\n]{0,80}/dev/shm"
   r"|failed to extend /dev/shm|posix_fallocate failed|unable to write to file </torch_")
rx("shm_insufficient", ("Insufficient space in",), r"Insufficient space in (\S+?)(?: for [^:]+)?: (\d+) MiB required, (\d+) MiB free")
rx("bus_error", ("Bus error", "SIGBUS", "signal 7"), r"Bus error|SIGBUS|signal 7\b")
# NCCL's "system error" is what a full /dev/shm produces; network or CUDA errors are other causes
rx("nccl_error", ("ncclSystemError", "unhandled system error"), r"ncclSystemError|unhandled system error")
rx("host_oom", ("OOM killer", "killed by SIGKILL", "memory usage threshold", "Ray killed", "of memory: Killed", "oom-kill", "OOMKilled", "MemoryError", "running low on memory", "memory pressure (OOM)", "(SIGKILL)", "SIGKILL", "Killed", "unable to mmap"),
   r"OOM killer|killed by SIGKILL|exceeds the memory usage threshold|Ray killed this worker|[Oo]ut of memory: Killed process|oom-kill|OOMKilled|(?<![\w])MemoryError|node running low on memory"
   # the raylet's periodic summary: "N Workers (tasks / actors) killed due to memory pressure (OOM)"
   r"|killed due to memory pressure \(OOM\)"
   # torch/safetensors memory-mapping a checkpoint file and the host refusing the pages (ENOMEM)
   r"|unable to mmap \d+ bytes from file [^\n]*Cannot allocate memory"
   r"|exit(?:ed)? with exit code 137 \(SIGKILL\)|\bSIGKILL\b[^\n]{0,60}\b(?:OOM|out of memory|memory)\b"
   # a shell reporting its child SIGKILLed: the kernel OOM killer (no CUDA error, no traceback)
   r"|^\s*Killed\s*$|\bline \d+:\s+\d+\s+Killed\b")
rx("sigterm", ("KeyboardInterrupt", "SIGTERM", "signal 15", "Terminated"), r"KeyboardInterrupt: terminated|Received SIGTERM|signal 15|SIGTERM|^Terminated\b")
rx("weights_progress", ("checkpoint shards:",), r"Loading (?:safetensors|pt|bin) checkpoint shards:\s+(\d+)%")
rx("weights_start", ("Starting to load model", "Loading weights with", "Loading model from", "checkpoint shards", "Loading model weights"),
   r"Starting to load model|Loading weights with|Loading model from|checkpoint shards|Loading model weights")
rx("profile_start", ("profile run", "Memory profiling", "determine_num_available_blocks", "determine_available_memory", "profile_run"),
   r"Starting profile run|Memory profiling|determine_num_available_blocks|determine_available_memory|profile_run")
rx("engine_ready", ("init engine (profile", "Application startup complete", "Uvicorn running on", "Starting vLLM API server", "Available routes are"),
   r"init engine \(profile, create kv cache, warmup model\) took|Application startup complete|Uvicorn running on|Starting vLLM API server|Available routes are")
rx("error_line", ("Error", "Exception", "Interrupt"),
   r"(?:^|[\s\]\)>|])((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt))(?::(?:\s(.*))?)?\s*$")
rx("traceback", ("Traceback (most recent call last)",), r"Traceback \(most recent call last\)")
rx("frame", ('File "',), r'File "([^"]+)", line \d+, in (\w+)')
rx("alloc_conf_hint", ("ALLOC_CONF=expandable",), r"(PYTORCH_(?:CUDA_)?ALLOC_CONF)=expandable_segments")

KEYWORDS = sorted({g for _, _, gates in _RX for g in gates})
PATTERNS = {name: pattern for name, pattern, _ in _RX}  # vLLM's formats, for other readers of logs

# traceback function name -> stage it proves the process was in
FRAME_STAGES = {
    "capture_end": "graph_capture", "capture_model": "graph_capture", "_capture_cudagraphs": "graph_capture",
    "capture": "graph_capture", "capture_begin": "graph_capture", "_warmup_and_capture": "graph_capture",
    "_dummy_sampler_run": "warmup", "_dummy_pooler_run": "warmup",
    "profile_run": "profiling", "determine_num_available_blocks": "profiling",
    "profile_num_available_blocks": "profiling", "_dummy_run_for_profile": "profiling",
    "determine_available_memory": "profiling", "_profile_multimodal": "profiling",
    "_allocate_kv_cache": "kv_allocation", "initialize_kv_cache": "kv_allocation",
    "_allocate_kv_cache_tensors": "kv_allocation", "_init_cache_engine": "kv_allocation",
    "initialize_kv_cache_tensors": "kv_allocation", "_reshape_kv_cache_tensors": "kv_allocation",
    "raise_if_cache_size_invalid": "kv_sizing", "check_enough_kv_cache_memory": "kv_sizing",
    "get_kv_cache_config": "kv_sizing", "get_kv_cache_configs": "kv_sizing",
    "load_model": "weights", "load_weights": "weights", "_initialize_model": "weights",
    "process_weights_after_loading": "weights", "_process_weights_after_loading": "weights",
    "create_weights": "weights", "initialize_model": "weights",
    "make_layers": "weights", "get_model": "weights", "weight_loader": "weights",
    "init_device": "nccl_init", "init_distributed_environment": "nccl_init",
    "initialize_model_parallel": "nccl_init", "ensure_model_parallel_initialized": "nccl_init",
}
# Frames that only hint weights when they sit in model files (construction of layers).
MODEL_FILE_HINT = re.compile(r"model_executor/(?:models|layers)/|parallel_utils/|[\\/]models[\\/]\w+\.py")
FRAME_ORDER = {s: i for i, s in enumerate(STAGES)}


def _handle(state: _State, name: str, m: re.Match[str], line: str, n: int) -> None:
    g = m.groups()
    if name == "version":
        state.put("vllm_version", g[0].rstrip(".,)"), line, n)
    elif name == "engine_config":
        _parse_engine_config(state, g[0], line, n)
    elif name == "weights":
        state.put("weights_gib", to_gib(g[0], g[1]), line, n, keep="max")
        state.mark("weights", n)
        state.put("weights_loaded", True, line, n)
    elif name == "v0_profile_total":
        state.put("total_gpu_gib", float(g[0]), line, n)
        state.put("gpu_memory_utilization", float(g[1]), line, n)
        state.put("budget_gib", float(g[2]), line, n)
        state.mark("kv_sizing", n)
    elif name == "v0_profile_parts":
        state.put("weights_gib", float(g[0]), line, n, keep="max")
        state.put("non_torch_gib", float(g[1]), line, n)
        state.put("activation_gib", float(g[2]), line, n)
        state.put("available_kv_gib", float(g[3]), line, n, keep="min")
        state.mark("kv_sizing", n)
    elif name == "v064_profile":
        state.put("total_gpu_gib", float(g[0]), line, n)
        state.put("activation_gib", float(g[1]), line, n)
        state.put("non_torch_gib", float(g[2]), line, n)
        state.put("available_kv_gib", float(g[3]), line, n, keep="min")
        state.put("gpu_memory_utilization", float(g[4]), line, n)
        state.mark("kv_sizing", n)
    elif name == "gpu_blocks":
        state.put("gpu_blocks", to_int(g[0]), line, n, keep="min")
        state.mark("kv_sizing", n)
    elif name == "cpu_blocks":
        state.put("cpu_blocks", int(g[0]), line, n)
    elif name == "kv_tokens":
        state.put("kv_tokens", to_int(g[0]), line, n, keep="min")
        state.mark("kv_sizing", n)
    elif name == "concurrency":
        state.put("concurrency_len", to_int(g[0]), line, n)
        state.put("max_concurrency", float(g[1]), line, n, keep="min")
        state.mark("kv_sizing", n)
    elif name == "available_kv":
        state.put("available_kv_gib", float(g[0]), line, n, keep="min")
        state.mark("kv_sizing", n)
    elif name == "kv_memory_bytes":
        state.put("available_kv_gib", float(g[0]), line, n, keep="min")
    elif name == "v0_maxlen":
        state.put("required_len", int(g[0]), line, n)
        state.put("kv_capacity_tokens", int(g[1]), line, n, keep="min")
        state.mark("kv_sizing", n)
    elif name == "v1_maxlen":
        state.put("required_len", int(g[0]), line, n)
        state.put("kv_needed_gib", float(g[1]), line, n)
        state.put("available_kv_gib", float(g[2]), line, n, keep="min")
        if g[3]:
            state.put("estimated_max_len", int(g[3]), line, n, keep="min")
        state.mark("kv_sizing", n)
    elif name == "estimated_len":
        state.put("estimated_max_len", int(g[0]), line, n, keep="min")
    elif name == "no_kv_memory":
        state.put("no_kv_memory", True, line, n)
        state.mark("kv_sizing", n)
    elif name == "autofit":
        state.put("autofit_len", int(g[1]), line, n)
    elif name == "free_check":
        state.put("free_at_start_gib", float(g[0]), line, n)
        state.put("total_gpu_gib", float(g[1]), line, n)
        state.put("gpu_memory_utilization", float(g[2]), line, n)
        state.put("requested_gib", float(g[3]), line, n)
        state.put("free_memory_check_failed", True, line, n)
        state.mark("startup", n)
    elif name == "graph_mem":
        state.put("graph_capture_finished", True, line, n)
        if g[0]:
            state.put("graph_gib", float(g[0]), line, n, keep="max")
        state.mark("warmup", n)
    elif name == "graph_estimate":
        state.put("graph_gib", float(g[0]), line, n, keep="max")
    elif name == "capture_start":
        state.put("graph_capture_seen", True, line, n)
        state.mark("graph_capture", n)
    elif name == "sampler":
        state.put("sampler_oom_requests", int(g[1]), line, n)
        state.put("sampler_kind", g[0], line, n)
        state.mark("warmup", n)
    elif name == "torch_oom_20":
        state.put("oom_tried_gib", to_gib(g[0], g[1]), line, n)
        state.put("oom_total_gib", to_gib(g[3], g[4]), line, n)
        state.put("oom_allocated_gib", to_gib(g[5], g[6]), line, n)
        state.put("oom_free_gib", to_gib(g[7], g[8]), line, n)
        reserved = to_gib(g[11], g[12])
        state.put("oom_reserved_gib", reserved, line, n)
        state.put("oom_reserved_unallocated_gib", max(0.0, reserved - to_gib(g[5], g[6])), line, n)
        state.put("oom", True, line, n)
        state.put("torch_oom_format", "2.0", line, n)
    elif name == "torch_oom_21":
        state.put("oom_tried_gib", to_gib(g[0], g[1]), line, n)
        state.put("oom_total_gib", to_gib(g[3], g[4]), line, n)
        state.put("oom_free_gib", to_gib(g[5], g[6]), line, n)
        state.put("oom", True, line, n)
        state.put("torch_oom_format", "2.1+", line, n)
    elif name == "torch_oom_alloc":
        state.put("oom_allocated_gib", to_gib(g[0], g[1]), line, n)
        if g[2]:
            state.put("oom_private_pools_gib", to_gib(g[2], g[3]), line, n)
        state.put("oom_reserved_unallocated_gib", to_gib(g[4], g[5]), line, n)
    elif name == "torch_oom_self":
        state.put("oom_this_process_gib", to_gib(g[0], g[1]), line, n)
    elif name == "torch_oom_proc":
        # Only the processes listed in the first OOM message describe one GPU.
        if "oom_tried_gib" in state.facts and state.facts["oom_tried_gib"].line_no == n:
            for pid, val, unit in re.findall(r"Process (\d+) has " + _SIZE + r" memory in use", line):
                state.process_gib.setdefault(pid, to_gib(val, unit))
    elif name == "oom_generic":
        state.put("oom", True, line, n)
        if "CUDA error: out of memory" in line or "cudaErrorMemoryAllocation" in line:
            state.put("cuda_driver_oom", True, line, n)
    elif name == "weights_wrapper":
        state.put("weights_oom_wrapper", True, line, n)
        state.put("oom", True, line, n)
        state.mark("weights", n)
    elif name == "world_size":
        state.put("world_size_required", int(g[0]), line, n)
        state.put("gpus_visible", int(g[1]), line, n)
    elif name == "tp_local":
        state.put("world_size_required", int(g[0] or g[1]), line, n)
        state.put("gpus_visible", int(g[2]), line, n)
    elif name == "ray_pg":
        state.put("ray_placement_group_short", True, line, n)
    elif name == "heads_tp":
        state.put("heads_not_divisible", True, line, n)
    elif name == "shm_segment":
        state.put("shm_error", True, line, n)
        if g[1]:
            state.put("shm_required_mib", int(g[1]) / 2**20, line, n, keep="max")
    elif name == "shm_insufficient":
        state.put("shm_error", True, line, n)
        state.put("shm_required_mib", float(g[1]), line, n, keep="max")
        state.put("shm_free_mib", float(g[2]), line, n)
    elif name == "bus_error":
        state.put("bus_error", True, line, n)
    elif name == "nccl_error":
        state.put("nccl_error", True, line, n)
    elif name == "host_oom":
        # A shell's bare 'Killed' says only that the process got SIGKILL. With no Python exception
        # in the log it is the kernel OOM killer; vLLM V1 also SIGKILLs its own front-end after a
        # worker raised ("Got fatal signal from worker processes"), so signals.compute weighs it.
        bare = re.fullmatch(r"\s*Killed\s*|line \d+:\s+\d+\s+Killed", m.group(0)) is not None
        state.put("host_oom_bare" if bare else "host_oom", True, line, n)
    elif name == "sigterm":
        state.put("terminated_by_signal", True, line, n, keep="last")
    elif name == "weights_progress":
        state.put("weights_progress_pct", int(g[0]), line, n, keep="last")
        state.mark("weights", n)
    elif name == "weights_start":
        state.mark("weights", n)
    elif name == "profile_start":
        state.mark("profiling", n)
    elif name == "engine_ready":
        state.put("engine_ready", True, line, n)
        state.mark("ready", n)
    elif name == "error_line":
        state.errors.append(Fact(value=g[0], line=line.strip()[:600], line_no=n))
    elif name == "traceback":
        state.put("traceback_seen", True, line, n)
    elif name == "frame":
        path, func = g
        stage = FRAME_STAGES.get(func) if ("vllm" in path or "torch" in path) else None
        if path.endswith("cuda/graphs.py"):
            stage = "graph_capture"
        elif "vllm/v1/sample/" in path.replace("\\", "/"):
            stage = "warmup"  # the V1 sampler runs at start-up only in its warm-up (runtime: after 'ready')
        if stage is None and func == "__init__" and MODEL_FILE_HINT.search(path):
            stage = "weights"
        if stage:
            state.frame_stages.append(stage)
    elif name == "alloc_conf_hint":
        state.put("alloc_conf_hint_name", g[0], line, n, keep="last")


_CONFIG_KEYS = {
    "model": ("model", str), "max_seq_len": ("max_model_len", int), "max_model_len": ("max_model_len", int),
    "tensor_parallel_size": ("tensor_parallel_size", int), "pipeline_parallel_size": ("pipeline_parallel_size", int),
    "dtype": ("dtype", str), "quantization": ("quantization", str), "enforce_eager": ("enforce_eager", str),
    "kv_cache_dtype": ("kv_cache_dtype", str), "gpu_memory_utilization": ("gpu_memory_utilization", float),
    "max_num_seqs": ("max_num_seqs", int), "max_num_batched_tokens": ("max_num_batched_tokens", int),
    "block_size": ("block_size", int), "data_parallel_size": ("data_parallel_size", int),
}


def _parse_engine_config(state: _State, body: str, line: str, n: int) -> None:
    for key, raw in re.findall(r"'?(\w+)'?\s*[=:]\s*('[^']*'|\"[^\"]*\"|[^,}\s]+)", body):
        if key not in _CONFIG_KEYS:
            continue
        name, cast = _CONFIG_KEYS[key]
        value = raw.strip("'\"")
        if value in {"None", "none", ""}:
            continue
        if name == "dtype":
            value = value.replace("torch.", "")
        try:
            state.put("config_" + name, cast(value), line, n)
        except ValueError:
            continue
    state.recognised = True
    state.mark("startup", n)


# ---- the pass -----------------------------------------------------------------------------


def _iter_chunks(log: LogText) -> Iterator[bytes]:
    if log.path is not None:
        with open(log.path, "rb") as fh:
            while True:
                block = fh.read(CHUNK_BYTES)
                if not block:
                    return
                yield block
    else:
        data = (log.text or "").encode("utf-8", errors="replace")
        for i in range(0, len(data), CHUNK_BYTES):
            yield data[i : i + CHUNK_BYTES]


try:  # Aho-Corasick in Rust: one scan for all keywords (100 MB in ~0.25 s)
    import ahocorasick_rs
except ImportError:  # pragma: no cover - the pure-Python path is slower, not different
    ahocorasick_rs = None


class KeywordScanner:
    """Finds the start offsets of the lines of a byte chunk that hold any keyword."""

    def __init__(self, keywords: list[bytes]):
        self.keywords = keywords
        self.automaton = ahocorasick_rs.BytesAhoCorasick(keywords) if ahocorasick_rs else None

    def line_starts(self, chunk: bytes) -> list[int]:
        starts: list[int] = []
        if self.automaton is not None:
            line_end = -1
            for _, pos, _ in self.automaton.find_matches_as_indexes(chunk):
                if pos > line_end:
                    starts.append(chunk.rfind(b"\n", 0, pos) + 1)
                    end = chunk.find(b"\n", pos)
                    line_end = end if end != -1 else len(chunk)
            return starts
        found: set[int] = set()
        for kw in self.keywords:
            pos = chunk.find(kw)
            while pos != -1:
                found.add(chunk.rfind(b"\n", 0, pos) + 1)
                end = chunk.find(b"\n", pos)
                if end == -1:
                    break
                pos = chunk.find(kw, end)
        return sorted(found)


def _clean(raw: bytes) -> list[str]:
    """One physical line may hold several \r-separated tqdm frames; keep each."""
    text = raw.decode("utf-8", errors="replace")
    if "\x1b[" in text:
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    parts = [p for p in text.split("\r") if p.strip()] if "\r" in text else [text]
    return [p[:MAX_LINE_CHARS] for p in parts]


def extract(log: LogText, extra_literals: Iterable[str] = ()) -> LogFacts:
    """Read the log once and return what it says."""
    literals = list(dict.fromkeys(list(KEYWORDS) + [x for x in extra_literals if x]))
    scanner = KeywordScanner([k.encode() for k in literals])
    shapes: dict[bytes, int] = {}
    state = _State()
    head: list[str] = []
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    # the lines playbooks may search: the first ones (start-up) and the last ones (the crash)
    hits: list[tuple[int, str]] = []
    late_hits: deque[tuple[int, str]] = deque(maxlen=MAX_STORED_HITS)
    carry = b""
    line_base = 0
    total_bytes = 0
    binary = False
    first = True

    def consume(block: bytes) -> None:
        nonlocal line_base
        if not block:
            return
        if len(head) < HEAD_LINES:
            for raw in block.split(b"\n", HEAD_LINES)[:HEAD_LINES]:
                if len(head) >= HEAD_LINES:
                    break
                head.extend(_clean(raw)[:1] or [""])
        # line numbers: count newlines between hits (bytes.count is C speed)
        prev, line_no = 0, line_base
        for start in scanner.line_starts(block):
            line_no += block.count(b"\n", prev, start)
            prev = start
            end = block.find(b"\n", start)
            raw = block[start : end if end != -1 else len(block)]
            shape = raw[:160].translate(None, b"0123456789")
            seen = shapes.get(shape, 0)
            shapes[shape] = seen + 1
            if seen >= REPEATS_PARSED and len(shapes) < 100_000:
                continue
            for text in _clean(raw):
                missed = _parse_line(state, text, line_no + 1)
                if missed and end != -1:
                    # a message wrapped over lines (a terminal or a paste): retry with what follows
                    following = block[end + 1 : end + 1 + 2048].split(b"\n", 2)[:2]
                    joined = " ".join([text] + [(_clean(f) or [""])[-1] for f in following])
                    _parse_line(state, re.sub(r"\s+", " ", joined), line_no + 1, only=missed)
                (hits if len(hits) < MAX_STORED_HITS else late_hits).append((line_no + 1, text.strip()))
        line_base += block.count(b"\n")
        # tail: the last lines of the stream (this block's end is enough: TAIL_LINES << chunk)
        tail_start = len(block)
        for _ in range(TAIL_LINES + 1):
            tail_start = block.rfind(b"\n", 0, tail_start)
            if tail_start <= 0:
                tail_start = 0
                break
        for raw in block[tail_start:].split(b"\n"):
            for text in _clean(raw)[-1:]:
                tail.append(text)

    for chunk in _iter_chunks(log):
        total_bytes += len(chunk)
        if first:
            first = False
            sample = chunk[:8192]
            if b"\x00" in sample or _mostly_binary(sample):
                binary = True
                break
        data = carry + chunk
        cut = data.rfind(b"\n")
        if cut == -1:
            carry = data
            continue
        consume(data[: cut + 1])
        carry = data[cut + 1 :]
    if not binary and carry:
        consume(carry + b"\n")

    if state.process_gib:
        first_oom = state.facts["oom_tried_gib"]
        state.facts["oom_processes_gib"] = Fact(value=list(state.process_gib.values()),
                                                line=first_oom.line, line_no=first_oom.line_no)
    facts = LogFacts(
        facts=state.facts,
        markers=state.markers,
        frame_stages=state.frame_stages,
        errors=state.errors,
        hit_lines=hits + list(late_hits),
        head=head,
        tail=[t for t in tail if t.strip()],
        line_count=line_base,
        byte_count=total_bytes,
        binary=binary,
        recognised=state.recognised or bool(state.facts) or any(_VLLM_LINE.search(h) for h in head + list(tail)),
    )
    return facts


_VLLM_LINE = re.compile(
    r"(?:^|\) )(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d|vllm[./]|torch\.|CUDA|Traceback \(most recent")


def _mostly_binary(sample: bytes) -> bool:
    if not sample:
        return False
    control = sum(1 for b in sample if b < 9 or 13 < b < 32)
    try:
        sample.decode("utf-8")
        return control > len(sample) * 0.05
    except UnicodeDecodeError as exc:
        # a multibyte char cut at the sample's end is fine
        return exc.start < len(sample) - 4 or control > len(sample) * 0.05


_PARSERS_BY_GATE = {g: [i for i, (_, _, gates) in enumerate(_RX) if g in gates] for g in KEYWORDS}
_GATE_AUTOMATON = ahocorasick_rs.AhoCorasick(KEYWORDS) if ahocorasick_rs else None


# messages long enough to be wrapped by a terminal or an issue paste
WRAPPABLE = {"v0_maxlen", "v1_maxlen", "free_check", "torch_oom_20", "torch_oom_21", "torch_oom_alloc",
             "world_size", "tp_local", "sampler", "v0_profile_total", "v0_profile_parts", "shm_insufficient"}


def _parse_line(state: _State, line: str, n: int, only: set[int] | None = None) -> set[int]:
    """Run the parsers whose gates the line holds; return the wrappable ones that did not match."""
    if only is not None:
        todo = sorted(only)
    elif _GATE_AUTOMATON is not None:
        gates = _GATE_AUTOMATON.find_matches_as_strings(line, overlapping=True)
        todo = sorted({i for g in gates for i in _PARSERS_BY_GATE[g]})
    else:
        todo = [i for i, (_, _, gates) in enumerate(_RX) if any(g in line for g in gates)]
    missed: set[int] = set()
    for i in todo:  # in _RX order: a line's OOM total comes before its process list
        name, pattern, _ = _RX[i]
        m = pattern.search(line)
        if m:
            _handle(state, name, m, line, n)
        elif name in WRAPPABLE and only is None:
            missed.add(i)
    return missed
