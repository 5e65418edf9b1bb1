"""What vLLM and PyTorch print at start-up, as data: one `LogFormat` per message.

A declaration says which plain substrings a line must hold before its regex is tried (the
one-pass reader in `bot.diagnosis.logfacts` scans for all of them at once), the regex, and what
a match yields: facts taken from capture groups (`Put`), a stage marker, and, for the few
messages that need real logic, a named handler. It also records the vLLM/PyTorch versions that
print the message and where in their source it comes from, as read from
../shared/reference/vllm-facts.md and log-formats.md, or ("wheels read") from the source of the
vLLM 0.6.6 and 0.11.0 wheels; "unknown" where none of those says.

Every fact a format may yield is named in `FACTS` with its meaning; a declaration naming a
fact, handler, stage or capture group that does not exist fails at import with its own name.
A new number to read is one `LogFormat` (plus its line in `FACTS` if the fact is new).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any, NoReturn

from bot.support.regex_text import top_level_alternative

if TYPE_CHECKING:  # the reader's state; imported only for type checkers (it imports this module)
    from bot.diagnosis.logfacts import _State

# Stages of vLLM start-up, in the order they happen.
STAGES = ["startup", "nccl_init", "weights", "profiling", "kv_sizing", "kv_allocation",
          "graph_capture", "warmup", "ready"]

KEEP = ("first", "last", "min", "max")  # which value wins when a fact is printed more than once

_NUM = r"((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)"  # 230,528 or 1478 (not the comma after it)
_SIZE = r"([\d.]+)\s*([KMGT]i?B|Gib|bytes|B)"


class LogFormatError(ValueError):
    """A declaration that cannot work; the message starts with the declaration's name."""


# ---- converters: capture groups -> values --------------------------------------------------


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


def version_text(text: str) -> str:
    return text.rstrip(".,)")


def mib_of_bytes(text: str) -> float:
    return int(text) / 2**20


def gib_of_bytes(text: str) -> float:
    return int(text) / 2**30


def int_of_either(first: str | None, second: str | None) -> int:
    return int(first or second)  # type: ignore[arg-type]


def reserved_minus_allocated(reserved: str, reserved_unit: str, allocated: str, allocated_unit: str) -> float:
    """PyTorch 2.0 prints reserved and allocated; 2.1+ prints their difference itself."""
    return max(0.0, to_gib(reserved, reserved_unit) - to_gib(allocated, allocated_unit))


# ---- the facts a log can yield --------------------------------------------------------------

# engine config keys vLLM prints -> (fact name after "config_", type)
CONFIG_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "model": ("model", str), "max_seq_len": ("max_model_len", int), "max_model_len": ("max_model_len", int),
    "tensor_parallel_size": ("tensor_parallel_size", int), "pipeline_parallel_size": ("pipeline_parallel_size", int),
    "dtype": ("dtype", str), "quantization": ("quantization", str), "enforce_eager": ("enforce_eager", str),
    "kv_cache_dtype": ("kv_cache_dtype", str), "gpu_memory_utilization": ("gpu_memory_utilization", float),
    "max_num_seqs": ("max_num_seqs", int), "max_num_batched_tokens": ("max_num_batched_tokens", int),
    "block_size": ("block_size", int), "data_parallel_size": ("data_parallel_size", int),
    "kv_cache_memory_bytes": ("kv_cache_memory_bytes", int),  # 0.10.2+: non-default args print the bytes
}
CONFIG_FACTS = tuple(dict.fromkeys("config_" + name for name, _ in CONFIG_KEYS.values()))

# Memory is GiB unless the name says MiB; token counts are plain ints.
FACTS: dict[str, str] = {
    "vllm_version": "the vLLM version the log prints",
    "unrecognized_flags": "the words argparse refused at start-up ('error: unrecognized arguments: --a --b')",
    "weights_gib": "memory the model weights took on one GPU (largest worker)",
    "weights_loaded": "the weights finished loading",
    "total_gpu_gib": "one GPU's total memory, as vLLM measured it",
    "gpu_memory_utilization": "--gpu-memory-utilization as vLLM printed it",
    "budget_gib": "V0: total x utilization, what vLLM may use",
    "non_torch_gib": "memory outside PyTorch's allocator (CUDA context, NCCL) during profiling",
    "activation_gib": "peak activation memory of the profiling run (0.6.4 prints it with the weights)",
    "available_kv_gib": "memory left for the KV cache (smallest worker)",
    "gpu_blocks": "KV cache blocks on the GPU (smallest worker)",
    "cpu_blocks": "V0 swap blocks in host memory",
    "kv_tokens": "V1: tokens the KV cache holds (smallest worker)",
    "concurrency_len": "the request length of vLLM's 'Maximum concurrency' line",
    "max_concurrency": "requests of that length the KV cache holds at once (smallest worker)",
    "required_len": "the max_model_len a KV-cache error asks for",
    "kv_capacity_tokens": "V0: tokens the KV cache can store, from the error",
    "kv_needed_gib": "V1: KV cache one max-length request needs",
    "estimated_max_len": "V1: the longest max_model_len that fits, vLLM's estimate",
    "no_kv_memory": "nothing was left for KV cache blocks",
    "autofit_len": "the max_model_len auto-fit chose (a start, not a crash)",
    "len_above_model": "a --max-model-len vLLM refused as longer than the model's own context",
    "model_context_len": "the model's own longest context (derived from its config.json), from that refusal",
    "len_above_model_allowed": "that message as a warning: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 let vLLM start anyway",
    "device_assert": "a GPU kernel's assertion (device-side assert, index out of bounds): an index past a tensor's end",
    "free_at_start_gib": "V1: free GPU memory at start-up",
    "requested_gib": "V1: total x utilization, which had to be free at start-up",
    "free_memory_check_failed": "V1's start-up free-memory check failed",
    "graph_capture_finished": "CUDA graph capture finished",
    "graph_gib": "memory the CUDA graphs took or are estimated to take (largest)",
    "graph_capture_seen": "CUDA graph capture started (a message or a frame)",
    "sampler_oom_requests": "dummy requests of the sampler/pooler warm-up that ran out of memory",
    "sampler_kind": "'sampler' or 'pooler'",
    "oom_tried_gib": "the allocation PyTorch could not make",
    "oom_total_gib": "the GPU's total memory, from PyTorch's OOM message",
    "oom_allocated_gib": "memory PyTorch had allocated at the OOM",
    "oom_free_gib": "free GPU memory at the OOM",
    "oom_reserved_gib": "PyTorch 2.0: memory PyTorch had reserved at the OOM",
    "oom_reserved_unallocated_gib": "reserved by PyTorch but unallocated (fragmentation) at the OOM",
    "oom": "a CUDA out-of-memory message",
    "oom_on_npu": "the out-of-memory message is torch_npu's (an Ascend NPU)",
    "torch_oom_format": "'2.0' or '2.1+': which PyTorch OOM layout the log has",
    "oom_private_pools_gib": "memory allocated in private pools (CUDA graphs) at the OOM",
    "oom_this_process_gib": "memory this process held at the OOM, non-PyTorch memory included",
    "oom_processes_gib": "memory of each other process PyTorch listed in the first OOM message",
    "cuda_driver_oom": "the CUDA driver's out-of-memory error (not PyTorch's allocator)",
    "weights_oom_wrapper": "vLLM's 'Failed to load model - not enough GPU memory'",
    "world_size_required": "GPUs the parallel configuration needs",
    "gpus_visible": "GPUs the process can see",
    "ray_placement_group_short": "Ray could not place the workers on enough GPUs",
    "heads_not_divisible": "attention heads are not divisible by the tensor-parallel size",
    "shm_error": "creating or growing shared memory (/dev/shm) failed",
    "shm_required_mib": "shared memory a segment needed, MiB (largest)",
    "shm_free_mib": "shared memory free, MiB",
    "bus_error": "a bus error (SIGBUS), typically a full /dev/shm",
    "nccl_error": "NCCL's system error",
    "host_oom": "the host or container ran out of memory (kernel OOM killer, Ray, MemoryError)",
    "host_oom_bare": "a shell's bare 'Killed' (SIGKILL; the OOM killer only without an exception)",
    "terminated_by_signal": "the process was told to stop (SIGTERM, KeyboardInterrupt)",
    "traceback_seen": "a Python traceback",
    "weights_progress_pct": "the last checkpoint-shard progress percentage",
    "engine_ready": "the server finished start-up",
    "model_runner_v2": "a frame or line from Model Runner V2 (vllm/v1/worker/gpu/model_runner.py)",
    "model_runner_v1_fallback": "vLLM fell back from Model Runner V2 to the V1 runner",
    "weights_create_failed": "vLLM's 'Failed to create unquantized linear weights' (an OOM creating a layer's weights)",
    "sleep_freed_gib": "memory a sleep-mode instance freed when it fell asleep",
    "sleep_held_gib": "memory a sleeping instance still holds (it counts against a co-located pod's free memory)",
    "kv_pool_pinned": "--kv-cache-memory-bytes fixed the KV pool (profiling skipped, utilization not used for KV)",
    "kv_pool_cpu_space": "vLLM's CPU backend sized the KV pool from VLLM_CPU_KVCACHE_SPACE (its KV refusal names it)",
    "vllm_bounds": "bounds vLLM's own messages name for its flags: {'--max-num-seqs': {'at_most': 854}, ...}, in the "
                   "order printed (see `flag_bounds`)",
    "vllm_error_bounds": "the same, from error lines only (an exception or an ERROR line: the reason start-up stopped)",
    "external_weights_gib": "0.33 `vllm preload`: weights a daemon holds on this GPU outside vLLM's process, counted in its budget",
    "external_weights_exceed": "0.33: the externally held weights alone exceed total x --gpu-memory-utilization",
    "mamba_blocks": "Mamba (SSM state) cache blocks, one per decode sequence, that vLLM could allocate",
    "alloc_conf_hint_name": "the allocator variable PyTorch's hint names (PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF)",
    **{name: f"--{name[len('config_'):].replace('_', '-')} from the engine config line" for name in CONFIG_FACTS},
}


# ---- handlers: the few messages whose facts need real logic ---------------------------------

Handler = Callable[["_State", "re.Match[str]", str, int], None]
HANDLERS: dict[str, Handler] = {}


def handler(fn: Handler) -> Handler:
    """Register a handler under its function name, the name declarations refer to."""
    HANDLERS[fn.__name__] = fn
    return fn


# (?<!\w): a key starts a word. findall never starts a match inside a word without one (it would
# have matched from the word's first letter, or the value before it would have taken it), and trying
# every letter of a 1,600-character engine config line cost ~0.15 ms (issue 20).
_CONFIG_PAIR = re.compile(r"(?<!\w)'?(\w+)'?\s*[=:]\s*('[^']*'|\"[^\"]*\"|[^,}\s]+)")


@handler
def engine_config(state: _State, m: re.Match[str], line: str, n: int) -> None:
    for key, raw in _CONFIG_PAIR.findall(m.group(1)):
        if key not in CONFIG_KEYS:
            continue
        name, cast = CONFIG_KEYS[key]
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


_PROCESS = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")


@handler
def oom_processes(state: _State, m: re.Match[str], line: str, n: int) -> None:
    # Only the processes listed in the first OOM message describe one GPU.
    if "oom_tried_gib" in state.facts and state.facts["oom_tried_gib"].line_no == n:
        for pid, val, unit in _PROCESS.findall(line):
            state.process_gib.setdefault(pid, to_gib(val, unit))


@handler
def cuda_driver_oom(state: _State, m: re.Match[str], line: str, n: int) -> None:
    if "CUDA error: out of memory" in line or "cudaErrorMemoryAllocation" in line:
        state.put("cuda_driver_oom", True, line, n)


_BARE_KILL = re.compile(r"\s*Killed\s*|line \d+:\s+\d+\s+Killed")


@handler
def host_kill(state: _State, m: re.Match[str], line: str, n: int) -> None:
    # A shell's bare 'Killed' says only that the process got SIGKILL. With no Python exception
    # in the log it is the kernel OOM killer; vLLM V1 also SIGKILLs its own front-end after a
    # worker raised ("Got fatal signal from worker processes"), so signals.compute weighs it.
    bare = _BARE_KILL.fullmatch(m.group(0)) is not None
    state.put("host_oom_bare" if bare else "host_oom", True, line, n)


@handler
def exception_line(state: _State, m: re.Match[str], line: str, n: int) -> None:
    state.add_error(m.group(1), line, n)


# traceback function name -> stage it proves the process was in
FRAME_STAGES = {
    "capture_end": "graph_capture", "capture_model": "graph_capture", "_capture_cudagraphs": "graph_capture",
    "capture": "graph_capture", "capture_begin": "graph_capture", "_warmup_and_capture": "graph_capture",
    # 0.19+ profiles CUDA-graph memory by capturing before KV sizing; 0.2x+ capture context
    "profile_cudagraph_memory": "graph_capture", "_get_cudagraph_capture_context": "graph_capture",
    "_init_minimal_kv_cache_for_profiling": "profiling",
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


@handler
def frame_stage(state: _State, m: re.Match[str], line: str, n: int) -> None:
    path, func = m.groups()
    stage = FRAME_STAGES.get(func) if ("vllm" in path or "torch" in path) else None
    if path.endswith("cuda/graphs.py"):
        stage = "graph_capture"
    elif "vllm/v1/sample/" in path.replace("\\", "/"):
        stage = "warmup"  # the V1 sampler runs at start-up only in its warm-up (runtime: after 'ready')
    if stage is None and func == "__init__" and MODEL_FILE_HINT.search(path):
        stage = "weights"
    if stage:
        state.frame_stages.append(stage)


# vLLM names its own flags in its messages ("lower max_num_seqs to at most 854", "increase
# --gpu-memory-utilization to 0.8048", "max_num_batched_tokens (2048) is smaller than max_model_len
# (4096). Please increase max_num_batched_tokens"). The grammar below reads any such sentence; a
# word counts as a flag only when some vLLM release has it (data/vllm_flag_history.yaml), so a
# config field that is not a flag ('max_tokens_per_mm_item') bounds nothing. Advice without a
# number ("Try increasing gpu_memory_utilization") is not a bound: vLLM's direction-only hints are
# sometimes wrong (the weights wrapper's "lower --gpu-memory-utilization"), its numbers are not.
_FLAG_WORD = r"`?(--?[a-z][a-z0-9]*(?:[-_][a-z0-9]+)+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+)`?"
_BOUND_NUM = r"(\d+(?:,\d{3})*(?:\.\d+)?)"
# The bound patterns are compiled when a message first holds their core (below; re keeps them
# compiled), not at every start: most logs name no bound, and compiling them (two case-insensitive)
# was 2% of the instructions of a 2 MB log's diagnose (valgrind; issue 20).
_AT = _FLAG_WORD + r"\s+to\s+(at most|no more than|at least|no less than)\s+" + _BOUND_NUM
_MOVE = (r"(?i)\b(increase|raise|lower|decrease|reduce|set)\s+" + _FLAG_WORD
         + r"\s+(?:from\s+[\d.,]+\s+)?to\s+" + _BOUND_NUM + r"(?![\w.]*\s*(?:GiB|MiB|%))")
_ESTIMATE = re.compile(r"estimated maximum model length is " + _BOUND_NUM)
_PAIR = (_FLAG_WORD + r" \(" + _BOUND_NUM + r"\) (is larger than|is greater than|exceeds|is smaller than|"
         r"is less than)\s+(?:the\s+|available\s+)?([\w` -]{1,60}?)\s*\(" + _BOUND_NUM + r"\)")
# vLLM's Mamba check states the bound in its first sentence ("max_num_seqs (1024) exceeds available
# Mamba cache blocks (969)": one block per decode sequence); the "at most M" advice that follows it
# is often cut from a paste, so the block count alone bounds max_num_seqs.
# vLLM raises this sentence only from its max_num_seqs check, so a quote that starts at 'exceeds'
# still bounds max_num_seqs.
_SEQS_OVER_MAMBA_BLOCKS = re.compile(r"(?:max_num_seqs \((\d+)\) )?exceeds available Mamba cache blocks \((\d+)\)")
_ADVICE = r"(?i)\b(increas|rais|lower|decreas|reduc)(?:e|ing)\s+" + _FLAG_WORD
_DOWN = ("lower", "decreas", "reduc")


def vllm_flag(word: str | None) -> str | None:
    """'max_num_seqs', '`max_num_seqs`', '--max-num-seqs' -> '--max-num-seqs' when a vLLM release has it."""
    from bot.diagnosis.vllm_versions import TABLE

    if not word:
        return None
    name = "--" + word.strip("`").lstrip("-").replace("_", "-").strip()
    return name if name in TABLE().flags else None


def _number(text: str) -> float | int:
    value = float(text.replace(",", ""))
    return int(value) if value.is_integer() and "." not in text else value


def _add_bound(bounds: dict[str, dict[str, Any]], word: str | None, kind: str, value: str) -> None:
    flag = vllm_flag(word)
    if flag is None:
        return
    entry = bounds.setdefault(flag, {})
    number = _number(value)
    if kind not in entry or (number < entry[kind] if kind == "at_most" else number > entry[kind]):
        entry[kind] = number  # the tightest bound any message named


# What every match of each bound pattern holds, found fast (a literal start, no flag word to try at
# every position): a message without it is not searched with the pattern, ~0.1 ms a long line
# (issue 20). Each is a part of its pattern, so a message it misses the pattern misses too.
_AT_CORE = re.compile(r"to\s+(?:at most|no more than|at least|no less than)\s+\d")
_MOVE_CORE = re.compile(r"to\s+\d", re.I)
_PAIR_CORE = re.compile(r"\) (?:is larger than|is greater than|exceeds|is smaller than|is less than)")
_MAMBA_CORE = "exceeds available Mamba cache blocks ("


def read_flag_bounds(message: str) -> dict[str, dict[str, Any]]:
    """Every bound one message names for a vLLM flag (see the grammar above)."""
    bounds: dict[str, dict[str, Any]] = {}
    for word, how, value in re.findall(_AT, message) if _AT_CORE.search(message) else ():
        _add_bound(bounds, word, "at_most" if how in {"at most", "no more than"} else "at_least", value)
    for verb, word, value in re.findall(_MOVE, message) if _MOVE_CORE.search(message) else ():
        if verb.lower() != "set":
            _add_bound(bounds, word, "at_most" if verb.lower().startswith(_DOWN) else "at_least", value)
    for value in _ESTIMATE.findall(message):
        _add_bound(bounds, "max_model_len", "at_most", value)
    for _seqs, blocks in _SEQS_OVER_MAMBA_BLOCKS.findall(message) if _MAMBA_CORE in message else ():
        _add_bound(bounds, "max_num_seqs", "at_most", blocks)
    pairs = re.findall(_PAIR, message) if _PAIR_CORE.search(message) else []
    advice = [(verb.lower(), vllm_flag(word)) for verb, word in re.findall(_ADVICE, message)] if pairs else []
    for first, first_value, relation, second, second_value in pairs:
        larger = relation in {"is larger than", "is greater than", "exceeds"}
        one, other = vllm_flag(first), vllm_flag(second.strip().rsplit(" ", 1)[-1])
        for verb, flag in advice:
            down = verb.startswith(_DOWN)
            if flag is not None and flag == one and down == larger:  # shrink the larger / grow the smaller
                _add_bound(bounds, flag, "at_most" if down else "at_least", second_value)
            elif flag is not None and flag == other and down != larger:
                _add_bound(bounds, flag, "at_least" if larger else "at_most", first_value)
    return bounds


@handler
def flag_bounds(state: _State, m: re.Match[str], line: str, n: int) -> None:
    found = read_flag_bounds(m.string)
    if not found:
        return
    old = state.facts.get("vllm_bounds")
    merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (old.value if old else {}).items()}
    for flag, entry in found.items():
        for kind, value in entry.items():
            _add_bound(merged, flag, kind, str(value))
    # the line kept is the first that named a bound: the error, not a later repetition
    state.put("vllm_bounds", merged, old.line if old else line, old.line_no if old else n, keep="last")
    # an INFO hint on a healthy start bounds nothing that failed; the Mamba sentence is only ever
    # raised, so it is the error even when a quote drops the exception's name
    if _ERROR_LINE.search(line) or _SEQS_OVER_MAMBA_BLOCKS.search(line):
        state.put("vllm_error_bounds", found, line, n)


# pydantic's ValidationError prints each refusal as 'Value error, <message>' (vLLM's config checks, 0.10+)
_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|\bERROR\b|\bCRITICAL\b|\bValue error, ")


@handler
def external_budget(state: _State, m: re.Match[str], line: str, n: int) -> None:
    # the message prints the engine's budget after the daemon's weights, not the weights: total x utilization - budget
    total, utilization, engine = float(m.group(2)), float(m.group(3)), float(m.group(4))
    state.put("external_weights_gib", round(max(0.0, total * utilization - engine), 2), line, n)


# ---- declarations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Put:
    """One fact from a match: `convert(*groups)`, or `value` when the message itself is the fact.

    A put whose capture groups all took no part in the match (an optional clause vLLM left
    out) is skipped.
    """

    fact: str
    groups: tuple[int, ...] = ()
    convert: Callable[..., Any] | None = None
    value: Any = True
    keep: str = "first"


@dataclass(frozen=True)
class LogFormat:
    """One message: the literals that gate it, its regex, what a match yields, where it comes from."""

    name: str
    pattern: str
    literals: tuple[str, ...]  # a line holding none of these is never tried (cheap to scan for)
    versions: str  # releases that print it, e.g. "0.6.5-0.10.2", or "unknown"
    source: str  # where in vLLM/PyTorch it is printed, or "unknown"
    puts: tuple[Put, ...] = ()
    marks: str | None = None  # the start-up stage this message proves was reached
    handler: str | None = None  # a name in HANDLERS, run after the puts
    handler_yields: tuple[str, ...] = ()  # the facts that handler may put
    wrappable: bool = False  # long enough to be wrapped over lines by a terminal or a paste
    flags: int = 0

    def __post_init__(self) -> None:
        if not self.literals or not all(self.literals):
            self._fail("needs at least one non-empty literal to gate its lines")
        if not self.versions or not self.source:
            self._fail("record `versions` and `source` (write 'unknown' when the references do not say)")
        if self.marks is not None and self.marks not in STAGES:
            self._fail(f"marks unknown stage {self.marks!r}{_close(self.marks, STAGES)}")
        if self.handler is not None and self.handler not in HANDLERS:
            self._fail(f"unknown handler {self.handler!r}{_close(self.handler, HANDLERS)}")
        if self.handler_yields and self.handler is None:
            self._fail("handler_yields without a handler")
        for put in self.puts:
            self._check_put(put)
        for fact in self.handler_yields:
            self._check_fact(fact)

    @cached_property
    def regex(self) -> re.Pattern[str]:
        """The pattern compiled, and its capture groups checked against the puts, when a line first
        reaches this format: a log reaches few of them, and compiling all of them took 10-20 ms of
        every start (issue 20). tests/diagnosis/test_logfacts.py compiles every shipped format."""
        try:
            regex = re.compile(self.pattern, self.flags)
        except re.error as exc:
            self._fail(f"pattern is not a valid regex: {exc}")
        for put in self.puts:
            bad = [i for i in put.groups if not 0 <= i < regex.groups]
            if bad:
                self._fail(f"{put.fact}: capture group {bad[0]} does not exist (the pattern has {regex.groups})")
        return regex

    def _check_put(self, put: Put) -> None:
        self._check_fact(put.fact)
        if put.keep not in KEEP:
            self._fail(f"{put.fact}: keep={put.keep!r} is not one of {', '.join(KEEP)}")
        if bool(put.groups) != (put.convert is not None):
            self._fail(f"{put.fact}: give capture groups together with a converter, or neither (a constant)")

    def _check_fact(self, fact: str) -> None:
        if fact not in FACTS:
            self._fail(f"yields unknown fact {fact!r}{_close(fact, FACTS)}; facts are declared in FACTS")

    def _fail(self, problem: str) -> NoReturn:
        raise LogFormatError(f"log format {self.name!r}: {problem}")

    def yields(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([p.fact for p in self.puts] + list(self.handler_yields)))


def _close(name: str, known: Any) -> str:
    match = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def gib(value: int, unit: int, fact: str, keep: str = "first") -> Put:
    """A memory size printed as value + unit, in GiB."""
    return Put(fact, (value, unit), to_gib, keep=keep)


def number(group: int, fact: str, convert: Callable[..., Any] = float, keep: str = "first") -> Put:
    return Put(fact, (group,), convert, keep=keep)


def flag(fact: str, keep: str = "first") -> Put:
    """The message itself is the fact."""
    return Put(fact, keep=keep)


def check_formats(formats: tuple[LogFormat, ...]) -> None:
    """Names are unique, and every fact in FACTS is yielded by some format (no dead entries)."""
    seen: set[str] = set()
    for fmt in formats:
        if fmt.name in seen:
            raise LogFormatError(f"log format {fmt.name!r}: declared twice")
        seen.add(fmt.name)
    yielded = {fact for fmt in formats for fact in fmt.yields()}
    unused = [fact for fact in FACTS if fact not in yielded]
    if unused:
        raise LogFormatError(f"facts no log format yields: {', '.join(unused)}")


# ---- the formats, in the order a line's parsers run: a line's OOM total comes before its
# process list, a message's own numbers before the standalone estimate ----------------------

_V0_WORKER = "vllm/worker/worker.py determine_num_available_blocks"
_V1_KV = "vllm/v1/core/kv_cache_utils.py (0.22+: vllm/v1/core/kv_cache_planning.py)"
_TORCH_OOM = "PyTorch c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc"

FORMATS: tuple[LogFormat, ...] = (
    LogFormat(
        "version", r"(?:LLM engine \(v|vLLM API server version |vLLM version |vllm version )v?(\d+\.\d+(?:\.\d+)?[\w.+-]*)",
        # each alternative of the regex whole, not the word 'version ': request logs quote prompts,
        # and 'version ' in a prompt made most lines of a busy log a line to check (issue 20)
        literals=("LLM engine (v", "vLLM API server version ", "vLLM version ", "vllm version "),
        puts=(number(0, "vllm_version", version_text),),
        versions="wheels 0.6.0-0.33.0 read: 'Initializing an LLM engine (v%s)' 0.6.0-0.6.6, 'Initializing a V0/V1 "
                 "LLM engine (v%s)' 0.7.3-0.10.2 (V0) / 0.7.3-0.33.0 (V1); 'vLLM API server version %s' 0.6.0-0.24.0",
        source="vllm/engine/llm_engine.py, vllm/v1/engine/core.py 'Initializing an [V1] LLM engine (v%s) with config'; "
               "vllm/entrypoints/openai/api_server.py 'vLLM API server version %s'"),
    LogFormat(
        "version_server", r"(?:vLLM server version |Launching vLLM \(v|▀▄▀ █(?:\x1b\[[0-9;]*m)?\s+version\s+"
                          r"(?:\x1b\[[0-9;]*m)?)v?(\d+\.\d+(?:\.\d+)?[\w.+-]*)",
        literals=("vLLM server version ", "Launching vLLM (v", "▀▄▀"),
        puts=(number(0, "vllm_version", version_text),),
        versions="wheels 0.6.0-0.33.0 read: 'vLLM API server version %s' 0.6.0-0.24.0 (the 'version' declaration "
                 "above); 'vLLM server version %s, serving model %s' (VLLM_DISABLE_LOG_LOGO or no formatter), else "
                 "the logo's second line '... ▀▄▀ █  version %s' (bold with the color formatter), 0.15.1-0.33.0; "
                 "'Launching vLLM (v%s) headless multiproc executor' 0.11.2-0.33.0",
        source="vllm/entrypoints/serve/utils/api_utils.py log_version_and_model; vllm/entrypoints/cli/serve.py"),
    LogFormat(
        # argparse's own message, the same in every release: vLLM exits 2 before it logs a version.
        # The prefix is the parser's prog: 'api_server.py' for `python -m vllm.entrypoints.openai.api_server`,
        # 'vllm' for `vllm serve` (unknown words bubble up from the serve subparser to the top parser).
        "unrecognized_arguments", r"(?:^|\s)[\w./-]+(?: serve)?: error: unrecognized arguments: (.*\S)",
        literals=("error: unrecognized arguments: ",),
        puts=(number(0, "unrecognized_flags", str, keep="last"),),
        versions="any (Python argparse; vLLM 0.6.0-0.33.0 read: FlexibleArgumentParser.error adds a --task hint "
                 "on the following lines from 0.33.0)",
        source="Python argparse ArgumentParser.parse_args -> error(); vllm/utils/argparse_utils.py "
               "FlexibleArgumentParser (vllm/utils.py before 0.11)"),
    LogFormat(
        "engine_config", r"(?:with config|non-default args)[:=]?\s*(.*)$",
        literals=("with config", "non-default args"),
        handler="engine_config", handler_yields=CONFIG_FACTS,
        versions="'with config' seen in 0.6.6 and 0.11.0; 'non-default args' in 0.11.0, not 0.6.6; exact range unknown",
        source="vllm/engine/llm_engine.py, vllm/v1/engine/core.py; vllm/entrypoints/utils.py 'non-default args: %s'"),
    LogFormat(
        "weights", r"(?:Loading model weights took|Model loading took) " + _SIZE,
        literals=("weights took", "Model loading took"),
        puts=(gib(0, 1, "weights_gib", keep="max"), flag("weights_loaded")),
        marks="weights",
        versions="0.4.0-0.33.0 ('Loading model weights took %.4f GB' to 0.7.3, 'Model loading took' from 0.8.0)",
        source="vllm/worker/model_runner.py load_model (V0), vllm/v1/worker/gpu_model_runner.py load_model (V1)"),
    LogFormat(
        "v0_profile_total", r"total_gpu_memory \(([\d.]+)\s*GiB\) x gpu_memory_utilization \(([\d.]+)\) = ([\d.]+)\s*GiB",
        literals=("total_gpu_memory (",),
        puts=(number(0, "total_gpu_gib"), number(1, "gpu_memory_utilization"), number(2, "budget_gib")),
        marks="kv_sizing", wrappable=True,
        versions="0.6.5-0.10.2 (V0)", source=_V0_WORKER),
    LogFormat(
        "v0_profile_parts",
        r"model weights take ([\d.]+)\s*GiB; non_torch_memory takes ([\d.]+)\s*GiB; PyTorch activation peak memory takes "
        r"([\d.]+)\s*GiB; the rest of the memory reserved for KV Cache is (-?[\d.]+)\s*GiB",
        literals=("model weights take",),
        puts=(number(0, "weights_gib", keep="max"), number(1, "non_torch_gib"), number(2, "activation_gib"),
              number(3, "available_kv_gib", keep="min")),
        marks="kv_sizing", wrappable=True,
        versions="0.6.5-0.10.2 (V0)", source=_V0_WORKER),
    LogFormat(
        "v064_profile",
        r"Memory profiling results: total_gpu_memory=([\d.]+)GiB .*?peak_torch_memory=([\d.]+)GiB .*?"
        r"non_torch_memory=([\d.]+)GiB kv_cache_size=(-?[\d.]+)GiB gpu_memory_utilization=([\d.]+)",
        literals=("Memory profiling results",),
        puts=(number(0, "total_gpu_gib"), number(1, "activation_gib"), number(2, "non_torch_gib"),
              number(3, "available_kv_gib", keep="min"), number(4, "gpu_memory_utilization")),
        marks="kv_sizing",
        versions="0.6.4 (V0)", source=_V0_WORKER),
    LogFormat(
        "gpu_blocks", r"# (?:GPU|cuda|CUDA|gpu) blocks: " + _NUM,
        literals=(" blocks: ",),
        puts=(number(0, "gpu_blocks", to_int, keep="min"),),
        marks="kv_sizing",
        versions="0.4.0-0.11.0 ('# GPU blocks' to 0.6.6, '# cuda blocks' 0.7.0-0.11.0 V0; V1 '# GPU blocks: %d' 0.6.4-0.7.3)",
        source="vllm/executor/gpu_executor.py (to 0.6.6), vllm/executor/executor_base.py initialize_cache (0.7.0+), "
               "vllm/v1/core/kv_cache_utils.py (V1 0.7.x)"),
    LogFormat(
        "cpu_blocks", r"# CPU blocks: (\d+)",
        literals=("# CPU blocks: ",),
        puts=(number(0, "cpu_blocks", int),),
        versions="0.4.0-0.11.0 (V0)",
        source="vllm/executor/gpu_executor.py (to 0.6.6), vllm/executor/executor_base.py initialize_cache (0.7.0+)"),
    LogFormat(
        "kv_tokens", r"(?:GPU|CUDA|[A-Z]+) KV cache size: " + _NUM + r" tokens",
        literals=("KV cache size:",),
        puts=(number(0, "kv_tokens", to_int, keep="min"),),
        marks="kv_sizing",
        versions="0.8.0-0.33.0 (V1; one line with the concurrency from 0.28.0, device name from 0.30.0)",
        source="vllm/v1/core/kv_cache_utils.py"),
    LogFormat(
        "concurrency", r"Maximum concurrency for " + _NUM + r" tokens per request: ([\d.]+)x",
        literals=("Maximum concurrency",),
        puts=(number(0, "concurrency_len", to_int), number(1, "max_concurrency", keep="min")),
        marks="kv_sizing",
        versions="0.6.3-0.11.0 (V0), 0.7.1-0.33.0 (V1, thousands separators from 0.8.0)",
        source="vllm/executor/gpu_executor.py / executor_base.py (V0), vllm/v1/core/kv_cache_utils.py (V1)"),
    LogFormat(
        "available_kv", r"Available KV cache memory: (-?[\d.]+) ?GiB",
        literals=("Available KV cache memory",),
        puts=(number(0, "available_kv_gib", keep="min"),),
        marks="kv_sizing",
        versions="0.9.1-0.33.0 (V1)", source="vllm/v1/worker/gpu_worker.py determine_available_memory"),
    LogFormat(
        # vllm-ascend's NPU worker logs bytes, unclamped in some releases (negative when nothing is left)
        "ascend_available_kv", r"Available memory: (-?\d+), total memory: (\d+)",
        literals=("Available memory: ",),
        puts=(number(0, "available_kv_gib", gib_of_bytes, keep="min"), number(1, "total_gpu_gib", gib_of_bytes)),
        marks="kv_sizing",
        versions="vllm-ascend 0.7.3-0.11.x (worker_v1.py determine_available_memory; 'int(max(x, 0))' clamps it in "
                 "some releases, not in others)",
        source="vllm_ascend/worker/worker_v1.py NPUWorker.determine_available_memory "
               "'Available memory: {available_kv_cache_memory}, total memory: {total_npu_memory}'"),
    LogFormat(
        "kv_memory_bytes", r"reserved ([\d.]+) ?GiB memory for KV Cache as specified by kv_cache_memory_bytes",
        literals=("kv_cache_memory_bytes",),
        puts=(number(0, "available_kv_gib", keep="min"), flag("kv_pool_pinned")),
        versions="0.10.2-0.33.0 (--kv-cache-memory-bytes; 'This does does not respect' typo to 0.19.1, fixed by 0.33.0)",
        source="vllm/v1/worker/gpu_worker.py determine_available_memory (0.10.2:240-251, 0.33.0:664-676)"),
    LogFormat(
        "v0_maxlen",
        r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)",
        literals=("max seq len",),
        puts=(number(0, "required_len", int), number(1, "kv_capacity_tokens", int, keep="min")),
        marks="kv_sizing", wrappable=True,
        versions="0.4.0-0.10.2 (V0; also V1 0.6.4-0.6.6)", source="vllm/worker/worker.py raise_if_cache_size_invalid"),
    LogFormat(
        # the V0 CPU worker's refusals name the variable that sized the pool, not --gpu-memory-utilization
        "cpu_kv_space", r"Try increasing `VLLM_CPU_KVCACHE_SPACE`",
        literals=("VLLM_CPU_KVCACHE_SPACE",),
        puts=(flag("kv_pool_cpu_space"),),
        versions="V0 CPU backend ('max seq len' and 'No available memory' refusals; V1's CPU backend uses the GPU wording)",
        source="vllm/executor/cpu_executor.py _init_cache, later vllm/worker/cpu_worker.py _validate_num_cpu_blocks"),
    LogFormat(
        "v1_maxlen",
        # the literal verbatim, the rest in any case: the prefilter only lets lines holding the
        # literal as written through, so a regex matching it in another case would promise more
        r"max seq len (?i:\((\d+)\),\s*\(?([\d.]+) ?GI?B KV cache is needed, which is larger than the available KV cache "
        r"memory \(([\d.]+) ?GI?B\)\.(?:\s*Based on the available memory,(?:\s*the estimated maximum model length is (\d+)\.)?)?)",
        literals=("max seq len",),
        puts=(number(0, "required_len", int), number(1, "kv_needed_gib"), number(2, "available_kv_gib", keep="min"),
              number(3, "estimated_max_len", int, keep="min")),
        marks="kv_sizing", wrappable=True,
        versions="0.7.0-0.33.0 (V1; 'GB' to 0.8.3, no estimate 0.8.4-0.9.0, 'models's' to 0.19.1)",
        source=_V1_KV + " check_enough_kv_cache_memory"),
    LogFormat(
        # 'the' optional: a quoted paste that elides the sentence's start ('... estimated maximum ...')
        "estimated_len", r"\bestimated maximum model length is (\d+)",
        literals=("estimated maximum model length is",),
        puts=(number(0, "estimated_max_len", int, keep="min"),),
        versions="0.9.1-0.33.0 (V1, inside the max seq len error)", source=_V1_KV),
    LogFormat(
        "above_model_len",
        r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len \((\w+)=(\d+)",
        literals=("User-specified max_model_len",),
        puts=(number(0, "len_above_model", int), number(2, "model_context_len", int, keep="min")),
        marks="startup",
        versions="0.6.6 (vllm-facts.md, vllm/config.py) and 0.32.0 (a real log: tests/fixtures/realvllm/"
                 "max-model-len-above-model, pydantic's 'Value error, ' before it); 0.33 rewords the tail, not this "
                 "head; exact range unknown",
        source="vllm/config.py _get_and_verify_max_len (0.6.6), vllm/config/model.py (0.32.0 wheel read)"),
    LogFormat(
        # the same message as a warning: the refusal always adds "To allow overriding this maximum";
        # the warning ends with "Make sure the value is correct ..." (to 0.2x) or, in 0.33, with the
        # caution straight after "config.json)."
        "above_model_len_allowed",
        r"is greater than the derived max_model_len .*(?:Make sure the value is correct"
        r"|config\.json\)\. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used)",
        literals=("Make sure the value is correct", "config.json). VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used"),
        puts=(flag("len_above_model_allowed"),),
        versions="0.6.6-0.10.1 ('Make sure the value is correct and within the model context size.', read in the "
                 "0.10.1 wheel), 0.33.0 (logger.warning_once with 'VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
                 "extreme caution'); between them: unknown",
        source="vllm/config/__init__.py _get_and_verify_max_len (vllm@v0.10.1:2961-2964), vllm/config/model.py "
               "(vllm@v0.33.0:2663-2678)"),
    LogFormat(
        "device_assert",
        r"(?:CUDA|HIP) error: device-side assert triggered|Assertion `.*index out of bounds.*` failed",
        literals=("device-side assert triggered", "index out of bounds"),
        puts=(flag("device_assert"),),
        versions="any (PyTorch's C10_CUDA_KERNEL_LAUNCH_CHECK and kernels' CUDA_KERNEL_ASSERT; Triton's "
                 "'index out of bounds: 0 <= tmp < N' assertions)",
        source="c10/cuda/CUDAException.cpp (c10::AcceleratorError 'CUDA error: device-side assert triggered'), "
               "aten/src/ATen/native/cuda/IndexKernel.cu, Triton generated kernels"),
    LogFormat(
        "no_kv_memory", r"No available memory for the cache blocks|Cannot auto-fit max_model_len: not enough GPU memory",
        literals=("No available memory for the cache", "Cannot auto-fit"),
        puts=(flag("no_kv_memory"),),
        marks="kv_sizing",
        versions="0.4.0-0.33.0 ('No available memory'); 0.14.1-0.33.0 ('Cannot auto-fit')",
        source="vllm/worker/worker.py raise_if_cache_size_invalid (V0), " + _V1_KV + " check_enough_kv_cache_memory (V1)"),
    LogFormat(
        "autofit", r"Auto-fit max_model_len: reduced from (\d+) to (\d+)",
        literals=("Auto-fit max_model_len",),
        puts=(number(1, "autofit_len", int),),
        versions="0.14.1-0.33.0 (--max-model-len auto)", source=_V1_KV),
    LogFormat(
        "mamba_blocks",
        r"(?:max_num_seqs \((\d+)\) )?exceeds available Mamba cache blocks \((\d+)\)",
        literals=("Mamba cache blocks",),
        puts=(number(1, "mamba_blocks", int, keep="min"),),
        marks="kv_sizing", wrappable=True,
        versions="0.17-0.33.0 (read in 0.33.0; raised with FULL decode CUDA graphs for hybrid/Mamba models, "
                 "vllm-project/vllm#34094); ' Please lower max_num_seqs to at most M or increase "
                 "gpu_memory_utilization.' follows (read by `flag_bound`)",
        source="vllm/config/compilation.py resolve_cudagraph_mode_and_sizes (vllm@v0.33.0:1526-1532)"),
    LogFormat(
        # any sentence of vLLM's that names one of its flags with a number: the generic reader
        "flag_bound",
        r"\bto (?:at most|at least|no more than|no less than) \d"
        r"|(?:[Ii]ncrease|[Rr]aise|[Ll]ower|[Dd]ecrease|[Rr]educe) `?-{0,2}[a-z]+(?:[_-][a-z0-9]+)+`?\s+(?:from\s+[\d.]+\s+)?"
        r"to\s+\d|estimated maximum model length is \d"
        r"|\(\d+\) (?:is larger than|is greater than|exceeds|is smaller than|is less than).*?\bPlease"
        r"|exceeds available Mamba cache blocks \(\d",
        literals=("Mamba cache blocks", "to at most", "to at least", "to no more than", "to no less than", "estimated maximum model length",
                  "Please", "increase ", "Increase ", "raise ", "Raise ", "lower ", "Lower ", "decrease ", "Decrease ",
                  "reduce ", "Reduce "),
        handler="flag_bounds", handler_yields=("vllm_bounds", "vllm_error_bounds"),
        versions="0.4.0-0.33.0: 'estimated maximum model length is N' 0.9.1-0.33.0; 'lower max_num_seqs to at most M' "
                 "0.17-0.33.0 (Mamba), and its first sentence 'max_num_seqs (N) exceeds available Mamba cache blocks (M)' alone; 'increase --gpu-memory-utilization to %.4f' 0.22.0-0.33.0 (CUDA graph "
                 "profiling, gpu_worker.py); 'max_num_batched_tokens (N) is smaller than max_model_len (M). Please "
                 "increase max_num_batched_tokens or decrease max_model_len.' 0.4-0.33.0 (config/scheduler.py); "
                 "'... is larger than max_num_batched_tokens (M). Please increase max_num_batched_tokens.' "
                 "(v1/core/encoder_cache_manager.py)",
        source="the wording of vLLM's own messages, read in the 0.33.0 wheel: vllm/config/compilation.py, "
               "vllm/config/scheduler.py, vllm/v1/core/kv_cache_planning.py, vllm/v1/worker/gpu_worker.py, "
               "vllm/v1/core/encoder_cache_manager.py"),
    LogFormat(
        "model_runner_v2", r"vllm/v1/worker/gpu/model_runner\.py",
        literals=("worker/gpu/model_runner.py",),
        puts=(flag("model_runner_v2"),),
        versions="0.12.0-0.33.0 (opt-in VLLM_USE_V2_MODEL_RUNNER to 0.22; automatic for Llama/Mistral/Qwen3 from 0.23.0, "
                 "all supported models by 0.33.0); it has no 'Failed to load model' nor 'warming up sampler' wrapper, "
                 "its OOMs are raw torch.OutOfMemoryError with frames load_model / _dummy_sampler_run / capture_model",
        source="vllm/v1/worker/gpu/model_runner.py (vllm@v0.12.0:173; vllm@v0.23.0 vllm/config/vllm.py:69-75; "
               "vllm@v0.33.0 vllm/config/vllm.py:730-767)"),
    LogFormat(
        "model_runner_v1_fallback", r"Model Runner V2 (?:does not yet support .*|requires Triton); using the V1 model runner",
        literals=("Model Runner V2",),
        puts=(flag("model_runner_v1_fallback"),),
        versions="0.23.0-0.33.0 (read in 0.23.0 and 0.33.0; 0.14-0.22 not read)",
        source="vllm/config/vllm.py (vllm@v0.33.0:730-767)"),
    LogFormat(
        "unquantized_weights_failed", r"Failed to create unquantized linear weights",
        literals=("Failed to create unquantized linear weights",),
        puts=(flag("weights_create_failed"),),
        marks="weights",
        versions="seen in 0.11.0 logs (logger.error with the OOM, then RuntimeError '... This may be caused by insufficient "
                 "memory to allocate the weight.'); first release unknown",
        source="vllm/model_executor/layers/linear.py UnquantizedLinearMethod.create_weights"),
    LogFormat(
        "sleep_freed", r"Sleep mode freed ([\d.]+) GiB memory, ([\d.]+) GiB memory is still in use",
        literals=("Sleep mode freed",),
        puts=(number(0, "sleep_freed_gib"), number(1, "sleep_held_gib", keep="last")),
        versions="0.7.x-0.33.0 (--enable-sleep-mode; seen as v1/worker/gpu_worker.py:104 in a 2025-08 log; "
                 "'%s GiB' via format_gib in 0.33.0)",
        source="vllm/v1/worker/gpu_worker.py sleep() (V1), vllm/worker/worker.py sleep() (V0)"),
    LogFormat(
        "free_check",
        r"Free memory on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory utilization "
        r"\(([\d.]+), ([\d.]+) GiB\)",
        literals=("Free memory on device",),
        puts=(number(0, "free_at_start_gib"), number(1, "total_gpu_gib"), number(2, "gpu_memory_utilization"),
              number(3, "requested_gib"), flag("free_memory_check_failed")),
        marks="startup", wrappable=True,
        versions="0.9.1-0.33.0 (V1; device name printed from 0.14.1)",
        source="vllm/v1/worker/gpu_worker.py init_device (0.9.1-0.13.0), vllm/v1/worker/utils.py request_memory (0.14.1+)"),
    LogFormat(
        # the same start-up check reworded by a downstream build: the free memory against
        # utilization x total, with the same numbers in the same order
        "free_check_available_wording",
        r"Available memory on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) is below required GPU memory utilization "
        r"\(([\d.]+), ([\d.]+) GiB\)",
        literals=("is below required GPU memory utilization",),
        puts=(number(0, "free_at_start_gib"), number(1, "total_gpu_gib"), number(2, "gpu_memory_utilization"),
              number(3, "requested_gib"), flag("free_memory_check_failed")),
        marks="startup", wrappable=True,
        versions="not in upstream 0.16.0 or 0.17.0 (read: both say 'Free memory on device ... is less than desired'); "
                 "seen in a 2026-02 ROCm gfx1151 (TheRock) build's log, raised from v1 core start-up",
        source="a downstream rewording of vllm/v1/worker/utils.py request_memory"),
    LogFormat(
        "external_weights_exceed",
        r"Externally held weights on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) exceed the desired GPU memory "
        r"utilization \(([\d.]+), ([\d.]+) GiB\)",
        literals=("Externally held weights",),
        puts=(number(0, "external_weights_gib"), number(1, "total_gpu_gib"), number(2, "gpu_memory_utilization"),
              number(3, "requested_gib"), flag("external_weights_exceed")),
        marks="startup", wrappable=True,
        versions="0.33.0 (`vllm preload`, --load-format ipc_cache)",
        source="vllm/v1/worker/utils.py request_memory (vllm@v0.33.0:728-739)"),
    LogFormat(
        "free_check_external",
        r"Free memory on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than the engine's budget after "
        r"excluding external process's weights \(([\d.]+), ([\d.]+) GiB\)",
        literals=("after excluding external process",),
        puts=(number(0, "free_at_start_gib"), number(1, "total_gpu_gib"), number(2, "gpu_memory_utilization"),
              flag("free_memory_check_failed")),
        handler="external_budget", handler_yields=("external_weights_gib",),
        marks="startup", wrappable=True,
        versions="0.33.0 (`vllm preload`, --load-format ipc_cache)",
        source="vllm/v1/worker/utils.py request_memory (vllm@v0.33.0:740-750)"),
    LogFormat(
        "graph_mem", r"Graph capturing finished in \d+ secs?(?:, took ([\d.]+) GiB)?",
        literals=("Graph capturing finished",),
        puts=(flag("graph_capture_finished"), number(0, "graph_gib", keep="max")),
        marks="warmup",
        versions="0.4.0-0.33.0 (', took %.2f GiB' from 0.6.4)",
        source="vllm/worker/model_runner.py (V0), vllm/v1/worker/gpu_model_runner.py (V1)"),
    LogFormat(
        "graph_estimate", r"Estimated CUDA graph memory: ([\d.]+) GiB",
        literals=("Estimated CUDA graph memory",),
        puts=(number(0, "graph_gib", keep="max"),),
        versions="0.19.1-0.33.0 (sampled; 0.18+ per the references; not in model runner V2)",
        source="vllm/v1/worker/gpu_model_runner.py"),
    LogFormat(
        "capture_start",
        r"Capturing the model for CUDA graphs|Capturing cudagraphs|Capturing CUDA graph|capture_model|capture_end"
        r"|torch/cuda/graphs\.py|_capture_cudagraphs",
        literals=("Capturing", "capture_model", "capture_end", "cuda/graphs.py", "_capture_cudagraphs"),
        puts=(flag("graph_capture_seen"),),
        marks="graph_capture",
        versions="0.4.0-0.33.0 ('Capturing the model for CUDA graphs' to 0.6.3, 'Capturing cudagraphs for decoding' "
                 "0.6.4-0.10.2, tqdm 'Capturing CUDA graph shapes' / 'Capturing CUDA graphs (...)' later)",
        source="vllm/worker/model_runner.py, vllm/v1/worker/gpu_model_runner.py; frames in torch/cuda/graphs.py"),
    LogFormat(
        "sampler", r"CUDA out of memory occurred when warming up (sampler|pooler)(?: \([^)]*\))? with (\d+)",
        literals=("when warming up",),
        puts=(number(1, "sampler_oom_requests", int), number(0, "sampler_kind", str)),
        marks="warmup", wrappable=True,
        versions="0.8.0-0.33.0 (V1 runner; pooler 0.9.2+, with (task=...) 0.11.0+; not in model runner V2)",
        source="vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run / _dummy_pooler_run"),
    LogFormat(
        "torch_oom_20",
        r"Tried to allocate " + _SIZE + r" \((?:GPU|NPU) (\d+); " + _SIZE + r" total capacity; " + _SIZE
        + r" already allocated;(?: [\d.]+\s*[KMGT]i?B current active;)? "
        + _SIZE + r" free;(?: " + _SIZE + r" allowed;)? " + _SIZE + r" reserved in total by PyTorch\)",
        literals=("total capacity;",),
        puts=(gib(0, 1, "oom_tried_gib"), gib(3, 4, "oom_total_gib"), gib(5, 6, "oom_allocated_gib"),
              gib(7, 8, "oom_free_gib"), gib(11, 12, "oom_reserved_gib"),
              Put("oom_reserved_unallocated_gib", (11, 12, 5, 6), reserved_minus_allocated),
              flag("oom"), Put("torch_oom_format", value="2.0")),
        wrappable=True,
        versions="torch <=2.0.1; torch_npu (Ascend) 2.1-2.8 keeps this layout with '(NPU 0; ...; X current active; ...)'",
        source=_TORCH_OOM + "; torch_npu NPUCachingAllocator.cpp 'NPU out of memory. Tried to allocate'"),
    LogFormat(
        "npu_oom", r"NPU out of memory",
        literals=("NPU out of memory",),
        puts=(flag("oom_on_npu"),),
        wrappable=True,
        versions="torch_npu 2.1-2.8 (vllm-ascend 0.7-0.21)",
        source="torch_npu NPUCachingAllocator.cpp 'NPU out of memory. Tried to allocate'"),
    LogFormat(
        "torch_oom_21",
        r"Tried to allocate " + _SIZE + r"\. GPU (\d+) has a total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE
        + r" is free\.",
        # 'Tried to allocate' too: a paste that breaks the message after its first sentence leaves the
        # other literal on the next line, and the wrapped-line retry joins forward from the first
        literals=("has a total capac", "Tried to allocate"),
        puts=(gib(0, 1, "oom_tried_gib"), gib(3, 4, "oom_total_gib"), gib(5, 6, "oom_free_gib"),
              flag("oom"), Put("torch_oom_format", value="2.1+")),
        wrappable=True,
        versions="torch 2.1.x-2.14.0 ('capacty' typo in 2.1.x); the same sentence after 'HIP out of memory' (ROCm "
                 "builds, no per-process list) and 'XPU out of memory' (torch 2.5+)",
        source=_TORCH_OOM + "; c10/xpu/XPUCachingAllocator.cpp"),
    LogFormat(
        "tpu_buffer_oom",
        r"Attempting to allocate ([\d.]+)([KMGT])\.? That was not possible\. There are ([\d.]+)([KMGT]) free",
        literals=("That was not possible",),
        puts=(gib(0, 1, "oom_tried_gib"), gib(2, 3, "oom_free_gib"), flag("oom")),
        wrappable=True,
        versions="XLA/PJRT on TPU (torch_xla 2.x, JAX): vLLM TPU 0.5-0.33; exact range unknown",
        source="XLA PJRT TPU client 'RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate %s. "
               "That was not possible. There are %s free.'"),
    LogFormat(
        "tpu_hbm_oom",
        r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm",
        literals=(" hbm",),
        puts=(gib(2, 3, "oom_total_gib"), flag("oom")),
        versions="XLA TPU compiler (torch_xla 2.x, JAX): vLLM TPU 0.5-0.33; exact range unknown",
        source="XLA TPU 'RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
               "Used %s of %s hbm. Exceeded hbm capacity by %s.'"),
    LogFormat(
        "torch_oom_alloc",
        r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, (?:with " + _SIZE
        + r" allocated in private pools \(e\.g\., CUDA Graphs\), )?and " + _SIZE + r" is reserved by PyTorch but unallocated",
        literals=("Of the allocated memory",),
        puts=(gib(0, 1, "oom_allocated_gib"), gib(2, 3, "oom_private_pools_gib"), gib(4, 5, "oom_reserved_unallocated_gib")),
        wrappable=True,
        versions="torch 2.1.x-2.14.0 (private pools clause from 2.4/2.5)", source=_TORCH_OOM),
    LogFormat(
        "torch_oom_self", r"Including non-PyTorch memory, this process has " + _SIZE + r" memory in use",
        literals=("this process has",),
        puts=(gib(0, 1, "oom_this_process_gib"),),
        versions="torch 2.1.x-2.14.0", source="PyTorch c10/cuda/CUDACachingAllocator.cpp reportProcessMemoryInfo"),
    LogFormat(
        "torch_oom_proc", r"Process (\d+) has " + _SIZE + r" memory in use",
        literals=("memory in use",),
        handler="oom_processes", handler_yields=("oom_processes_gib",),
        wrappable=True,  # a piece of the OOM message: a paste that breaks it puts the list on later lines
        versions="torch 2.1.x-2.14.0", source="PyTorch c10/cuda/CUDACachingAllocator.cpp reportProcessMemoryInfo"),
    LogFormat(
        "oom_generic",
        r"CUDA out of memory|(?<!exceptions\.)OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
        r"|CUBLAS_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY"
        # the same allocator on other devices (hipify, c10/xpu, torch_npu), HIP's runtime error
        r"|(?:HIP|XPU|NPU) out of memory|hipErrorOutOfMemory|HIP error: out of memory"
        # TPU (XLA / PJRT): device buffers or a compiled program that exceed HBM
        r"|RESOURCE_EXHAUSTED[^\n]{0,200}?(?:memory|allocat|hbm|HBM)|Ran out of memory in memory space hbm",
        literals=("out of memory", "OutOfMemory", "cudaErrorMemoryAllocation", "ALLOC_FAILED", "OUT_OF_MEMORY",
                  "hipErrorOutOfMemory", "RESOURCE_EXHAUSTED", "memory space hbm"),
        puts=(flag("oom"),),
        handler="cuda_driver_oom", handler_yields=("cuda_driver_oom",),
        versions="torch 2.0.1-2.14.0 ('CUDA out of memory'; 'HIP out of memory' on ROCm builds, 'XPU out of memory' "
                 "torch 2.5+ XPU, 'NPU out of memory' torch_npu); XLA's RESOURCE_EXHAUSTED on TPU (vLLM TPU 0.5-0.33 "
                 "via torch_xla or tpu-inference/JAX); the CUDA driver and cuBLAS error names: unknown",
        source=_TORCH_OOM + "; c10/xpu/XPUCachingAllocator.cpp; torch_npu NPUCachingAllocator.cpp; XLA/PJRT "
               "'RESOURCE_EXHAUSTED: Error allocating device buffer' and 'Ran out of memory in memory space hbm'; "
               "CUDA runtime / cuBLAS error names"),
    LogFormat(
        "weights_wrapper", r"Failed to load model - not enough GPU memory",
        literals=("Failed to load model",),
        puts=(flag("weights_oom_wrapper"), flag("oom")),
        marks="weights",
        versions="0.13.0-0.33.0 (V1 runner only)", source="vllm/v1/worker/gpu_model_runner.py load_model"),
    LogFormat(
        "world_size", r"World size \((\d+)\) is larger than the number of available GPUs \((\d+)\)",
        literals=("World size (",),
        puts=(number(0, "world_size_required", int), number(1, "gpus_visible", int)),
        wrappable=True,
        versions="0.13.0-0.33.0", source="vllm/config/parallel.py"),
    LogFormat(
        "tp_local",
        r"please (?:set tensor_parallel_size \((\d+)\) to less than|ensure that world_size \((\d+)\) is less than than) "
        r"max local gpu count \((\d+)\)",
        literals=("max local gpu count",),
        puts=(Put("world_size_required", (0, 1), int_of_either), number(2, "gpus_visible", int)),
        wrappable=True,
        versions="0.5.x-0.10.2 (mp backend; 0.4.3 printed no numbers)",
        source="vllm/executor/multiproc_gpu_executor.py (0.5.x), vllm/executor/mp_distributed_executor.py (0.8.5)"),
    LogFormat(
        "ray_pg",
        r"number of required GPUs exceeds the total number of available GPUs|Waiting for creating a placement group of specs"
        r"|Cannot provide a placement group",
        literals=("placement group", "number of required GPUs exceeds"),
        puts=(flag("ray_placement_group_short"),),
        versions="texts cited at 0.4.3 and 0.10.2 (Ray backend, chosen silently when GPUs are short up to 0.12.x); "
                 "exact range unknown",
        source="vllm/executor/ray_utils.py"),
    LogFormat(
        "heads_tp", r"Total number of attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)",
        literals=("must be divisible by tensor parallel size",),
        puts=(flag("heads_not_divisible"),),
        versions="0.4.3-0.11.0 (cited; all versions per the references)",
        source="vllm/config.py (vllm/config/model.py from 0.11)"),
    LogFormat(
        "shm_segment",
        r"Error while creating shared memory segment\s*(/dev/shm\S*)?(?: \(size (\d+)\))?"
        r"|(?:unable to|failed to|cannot|could not|Unable to|Failed to|Cannot|Could not) (?:create|allocate|open|map|mmap)"
        r"[^\n]{0,60}(?:shared memory|/dev/shm|shm_open)"
        r"|/dev/shm[^\n]{0,80}No space left on device|No space left on device[^\n]{0,80}/dev/shm"
        r"|failed to extend /dev/shm|posix_fallocate failed|unable to write to file </torch_",
        literals=("shared memory", "/dev/shm", "shm_open", "posix_fallocate", "</torch_"),
        puts=(flag("shm_error"), Put("shm_required_mib", (1,), mib_of_bytes, keep="max")),
        versions="unknown", source="NCCL's shared-memory transport and PyTorch's shared-memory files, not vLLM"),
    LogFormat(
        "shm_insufficient", r"Insufficient space in (\S+?)(?: for [^:]+)?: (\d+) MiB required, (\d+) MiB free",
        literals=("Insufficient space in",),
        puts=(flag("shm_error"), number(1, "shm_required_mib", keep="max"), number(2, "shm_free_mib")),
        wrappable=True,
        versions="0.27.1-0.33.0 (' for <allocation>' from 0.29)",
        source="vllm/distributed/device_communicators/shm_broadcast.py"),
    LogFormat(
        # Ray's raylet sizing its object store (plasma) in /dev/shm: FATAL in Ray <= 1.x, a WARNING that clamps
        # the store in Ray 2.x; with vLLM's Ray executor (TP over Ray) it shows under '(raylet)' prefixes
        "ray_plasma_shm",
        r"System memory request exceeds memory available in (\S+?)\.? The request is for (\d+) bytes, and the amount "
        r"available is (\d+) bytes",
        literals=("System memory request exceeds memory available",),
        puts=(flag("shm_error"), Put("shm_required_mib", (1,), mib_of_bytes, keep="max"),
              Put("shm_free_mib", (2,), mib_of_bytes)),
        wrappable=True,
        versions="Ray 0.8-2.x (plasma store_main.cc, then src/ray/object_manager/plasma/store_runner.cc); vLLM's Ray "
                 "executor 0.2-0.33",
        source="ray src/ray/object_manager/plasma/store_runner.cc PlasmaStoreRunner (ARROW_LOG/RAY_LOG "
               "'System memory request exceeds memory available in <dir>. The request is for N bytes, and the amount "
               "available is M bytes. ...')"),
    LogFormat(
        "bus_error", r"Bus error|SIGBUS|signal 7\b",
        literals=("Bus error", "SIGBUS", "signal 7"),
        puts=(flag("bus_error"),),
        versions="unknown (before 0.27 an undersized /dev/shm shows only as this)",
        source="the kernel's SIGBUS as a shell or Python reports it, not vLLM"),
    # NCCL's "system error" is what a full /dev/shm produces; network or CUDA errors are other causes
    LogFormat(
        "nccl_error", r"ncclSystemError|unhandled system error",
        literals=("ncclSystemError", "unhandled system error"),
        puts=(flag("nccl_error"),),
        versions="0.4.3-0.33.0 (vLLM's 'NCCL error: ...' wrapper; the text is NCCL's)",
        source="vllm/distributed/device_communicators/pynccl_wrapper.py, text from ncclGetErrorString"),
    LogFormat(
        "host_oom",
        r"OOM killer|killed by SIGKILL|exceeds the memory usage threshold|Ray killed this worker|[Oo]ut of memory: Killed process"
        r"|oom-kill|OOMKilled|(?<![\w])MemoryError|node running low on memory"
        # the raylet's periodic summary: "N Workers (tasks / actors) killed due to memory pressure (OOM)"
        r"|killed due to memory pressure \(OOM\)"
        # torch/safetensors memory-mapping a checkpoint file and the host refusing the pages (ENOMEM)
        r"|unable to mmap \d+ bytes from file [^\n]*Cannot allocate memory"
        r"|exit(?:ed)? with exit code 137 \(SIGKILL\)|\bSIGKILL\b[^\n]{0,60}\b(?:OOM|out of memory|memory)\b"
        # a shell reporting its child SIGKILLed: the kernel OOM killer (no CUDA error, no traceback)
        r"|^\s*Killed\s*$|\bline \d+:\s+\d+\s+Killed\b",
        literals=("OOM killer", "killed by SIGKILL", "memory usage threshold", "Ray killed", "of memory: Killed", "oom-kill",
                  "OOMKilled", "MemoryError", "running low on memory", "memory pressure (OOM)", "(SIGKILL)", "SIGKILL",
                  "Killed", "unable to mmap"),
        handler="host_kill", handler_yields=("host_oom", "host_oom_bare"),
        versions="unknown", source="the kernel OOM killer, Ray's memory monitor, a shell, Python's MemoryError; not vLLM"),
    LogFormat(
        "sigterm", r"KeyboardInterrupt: terminated|Received SIGTERM|signal 15|SIGTERM|^Terminated\b",
        literals=("KeyboardInterrupt", "SIGTERM", "signal 15", "Terminated"),
        puts=(flag("terminated_by_signal", keep="last"),),
        versions="unknown",
        source="Python and the shell on SIGTERM ('KeyboardInterrupt: terminated' is how probe kills show, vLLM's k8s docs)"),
    LogFormat(
        "weights_progress", r"Loading (?:safetensors|pt|bin) checkpoint shards:\s+(\d+)%",
        literals=("checkpoint shards:",),
        puts=(number(0, "weights_progress_pct", int, keep="last"),),
        marks="weights",
        versions="seen in 0.6.6 and 0.11.0 (wheels read); exact range unknown",
        source="vllm/model_executor/model_loader/weight_utils.py (tqdm desc)"),
    LogFormat(
        "weights_start",
        r"Starting to load model|Loading weights with|Loading model from|checkpoint shards|Loading model weights",
        literals=("Starting to load model", "Loading weights with", "Loading model from", "checkpoint shards",
                  "Loading model weights"),
        marks="weights",
        versions="'Starting to load model' seen in 0.6.6 and 0.11.0 (wheels read); exact range unknown",
        source="vllm/worker/model_runner.py, vllm/v1/worker/gpu_model_runner.py load_model; "
               "vllm/model_executor/model_loader (BitsAndBytes); weight_utils.py (shard bars)"),
    LogFormat(
        "profile_start",
        r"Starting profile run|Memory profiling|determine_num_available_blocks|determine_available_memory|profile_run",
        literals=("profile run", "Memory profiling", "determine_num_available_blocks", "determine_available_memory",
                  "profile_run"),
        marks="profiling",
        versions="unknown (messages and frames of V0 and V1; 'Starting profile run' seen in 0.6.6)",
        source=_V0_WORKER + " (V0), vllm/v1/worker/gpu_worker.py determine_available_memory (V1), "
               "vllm/worker/enc_dec_model_runner.py 'Starting profile run for multi-modal models.'"),
    LogFormat(
        "engine_ready",
        r"init engine \(profile, create kv cache, warmup model\) took|Application startup complete|Uvicorn running on"
        r"|Starting vLLM API server|Available routes are",
        literals=("init engine (profile", "Application startup complete", "Uvicorn running on", "Starting vLLM API server",
                  "Available routes are"),
        puts=(flag("engine_ready"),),
        marks="ready",
        versions="0.6.5-0.33.0 ('init engine ... took'); 'Available routes are' seen in 0.6.6 and 0.11.0, "
                 "'Starting vLLM API server' in 0.11.0, not 0.6.6; uvicorn's lines: unknown",
        source="vllm/engine/llm_engine.py (V0), vllm/v1/engine/core.py (V1); vllm/entrypoints/launcher.py; "
               "vllm/entrypoints/openai/api_server.py; uvicorn"),
    LogFormat(
        "error_line", r"(?:^|[\s\]\)>|])((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt))(?::(?:\s(.*))?)?\s*$",
        literals=("Error", "Exception", "Interrupt"),
        handler="exception_line",
        versions="any", source="Python: the last line of a traceback"),
    LogFormat(
        "traceback", r"Traceback \(most recent call last\)",
        literals=("Traceback (most recent call last)",),
        puts=(flag("traceback_seen"),),
        versions="any", source="Python"),
    LogFormat(
        "frame", r'File "([^"]+)", line \d+, in (\w+)',
        literals=('File "',),
        handler="frame_stage",
        versions="any", source="Python traceback frames (function names: FRAME_STAGES)"),
    LogFormat(
        "alloc_conf_hint", r"(PYTORCH_(?:CUDA_|HIP_|NPU_|XPU_)?ALLOC_CONF)=expandable_segments",
        literals=("ALLOC_CONF=expandable",),
        puts=(number(0, "alloc_conf_hint_name", str, keep="last"),),
        versions="torch 2.2.2-2.14.0 (the newest builds name PYTORCH_ALLOC_CONF; ROCm builds PYTORCH_HIP_ALLOC_CONF "
                 "through hipify; torch_npu PYTORCH_NPU_ALLOC_CONF)",
        source=_TORCH_OOM + " (hipified on ROCm); torch_npu NPUCachingAllocator.cpp"),
)

check_formats(FORMATS)


# ---- line shapes: where a message starts on a line, and where a user's request begins -------
# A format's regex is tried on the message only: what a line holds after the prefixes below
# (stripped in any order and any number, none required: real pastes lose some or all of them)
# and before the first request payload marker. A prompt that quotes vLLM's KV-cache error sits
# after `Received request ...: prompt:`, so it is never read as vLLM's own message.


@dataclass(frozen=True)
class LineShape:
    """One piece of a line's shape: a prefix before the message, or where a request payload begins."""

    name: str
    pattern: str
    versions: str
    source: str


LINE_PREFIXES: tuple[LineShape, ...] = (
    LineShape("kubectl_timestamp", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+",
              versions="any", source="kubectl logs --timestamps (RFC 3339 before each line)"),
    LineShape("docker_compose", r"[A-Za-z0-9][\w.-]{0,80}\s+\|\s",
              versions="any", source="docker compose logs ('service-1  | ')"),
    LineShape("process",
              # a process name, optional words ('rank=7', 'TP0'), pid, Ray's ip; Ray's names may hold ':'
              r"\((?:[A-Za-z_][\w.:-]*(?: [\w.=-]+)*? )?pid=\d+(?:, ip=[\w.:-]+)?\)\s*",
              versions="0.4-0.33.0 ('(VllmWorkerProcess pid=N)' V0 multiproc to 0.10; '(RayWorkerVllm pid=N)' Ray "
                       "0.2-0.3, '(RayWorkerWrapper pid=N, ip=...)' 0.4-0.33; V1 '(VllmWorker rank=N pid=N)' 0.8-0.9, "
                       "'(VllmWorker TP0 pid=N)', '(EngineCore_0 pid=N)' 0.8.5, '(EngineCore_DP0 pid=N)' 0.10-0.32, "
                       "'(Worker_TP2 pid=N)' / '(Worker_PP1_TP3 pid=N)' 0.10-0.33, '(APIServer pid=N)'; 0.33 puts "
                       "'(EngineCore pid=N)' in the log format, so its tracebacks carry no prefix at all)",
              source="vllm/executor/multiproc_worker_utils.py, vllm/v1/executor/multiproc_executor.py, "
                     "vllm/v1/engine/utils.py, Ray's log prefix '(<actor> pid=<pid>, ip=<ip>)'"),
    LineShape("ray_system",
              r"\((?:raylet|gcs_server|autoscaler|monitor|dashboard[\w.]*|log_monitor)(?:, ip=[\w.:-]+)?\)\s*",
              versions="Ray 2.x (vLLM's Ray executor, 0.2-0.33)",
              source="Ray's log monitor: lines of its system processes, '(raylet)' / '(raylet, ip=10.0.0.2)'"),
    LineShape("ray_file",
              r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [EWIDF] \d+ \d+\] (?:\(\w+\) )?[\w.]+:\d+:?\s*",
              versions="Ray 2.x", source="Ray's C++ logs (raylet, store_runner.cc): '[2025-06-01 10:00:00,123 E 15 15] "
                                         "(raylet) store_runner.cc:48: ...' / 'store_runner.cc:48:'"),
    LineShape("vllm_logger",
              r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./<>-]+(?::\d+)?\]\s*",
              versions="0.4-0.33.0 ('file.py:N]' to 0.6.x, '[file.py:N]' later)",
              source="vllm/logger.py _FORMAT '%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s'"),
    LineShape("old_vllm_logger", r"[\w.]+\.py ?:\d+ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?\s+",
              versions="0.1-0.2 ('engine.py :190 2024-02-03 03:44:03,976 ')", source="vllm/logger.py (early releases)"),
    LineShape("python_logging", r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):(?:[\w.]+:|\s+)",
              versions="any", source="Python logging's default format; uvicorn's 'INFO:     '"),
    LineShape("iso_timestamp", r"\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\]?\s+",
              versions="any", source="timestamps log collectors put before lines"),
)

PAYLOAD_MARKS: tuple[LineShape, ...] = (
    LineShape("received_request", r"Received request \S+",
              versions="0.4-0.33.0 ('Received request %s: prompt: %r, params: ...' to 0.10; params only later)",
              source="vllm/entrypoints/logger.py RequestLogger.log_inputs (--enable-log-requests)"),
    LineShape("request_details", r"Request \S+ details:",
              versions="0.11-0.33.0 (debug level)", source="vllm/entrypoints/logger.py RequestLogger.log_inputs"),
    LineShape("generated_response", r"Generated response \S+|Generated (?:text|output)",
              versions="0.10-0.33.0 (--enable-log-outputs)", source="vllm/entrypoints/logger.py RequestLogger.log_outputs"),
    LineShape("prompt_field", r"\bprompt(?:_token_ids|_embeds shape|s)?: ",
              versions="0.4-0.33.0", source="vllm/entrypoints/logger.py: the prompt and its token ids"),
    LineShape("output_field", r"\boutput(?:_token_ids)?: ",
              versions="0.10-0.33.0", source="vllm/entrypoints/logger.py log_outputs: the model's output"),
    LineShape("http_request", r"\"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) \S* HTTP/\d",
              versions="any", source="uvicorn's access log: the path is the client's"),
)

# Every payload mark holds one of these verbatim ("equest " for "Received request " and
# "Request "): a line with none of them cannot hold a mark, and most lines have none, so the
# substring tests spare them the marks' regex search (tests/diagnosis/test_log_payload.py
# checks each mark against this list).
PAYLOAD_LITERALS = ("equest ", "Generated ", "prompt", "output", "HTTP/")
# One anchored alternation for the prefixes (repeated), one search for the first payload marker.
LINE_PREFIX = re.compile("(?:" + "|".join(f"(?:{p.pattern})" for p in LINE_PREFIXES) + r")*")
PAYLOAD = re.compile("|".join(f"(?:{p.pattern})" for p in PAYLOAD_MARKS))
# A request payload line (nothing but prefixes and white space before the first marker), in one
# anchored match: the prefixes as LINE_PREFIX takes them (possessive: a greedy `*` with nothing
# after it never gives anything back), then the marker. No marker starts with white space, so
# the marker it finds is the first one after the prefixes, the one `message_span` finds.
PAYLOAD_LINE = re.compile("(?:" + "|".join(f"(?:{p.pattern})" for p in LINE_PREFIXES) + r")*+\s*(?:"
                          + PAYLOAD.pattern + ")")


def message_span(line: str) -> tuple[int, int]:
    """Where vLLM's or PyTorch's own message lies on a line: after the prefixes, before the
    first request payload marker. Empty (start == end) for a request payload line."""
    prefix = LINE_PREFIX.match(line)  # `(...)*` matches at every line, if only the empty string
    start = prefix.end() if prefix is not None else 0
    first = first_mark(line)
    if first is None:  # no mark anywhere on the line: none after its prefixes
        return start, len(line)
    if first >= start:  # the first mark from the line's start is the first after its prefixes too
        return start, first
    payload = PAYLOAD.search(line, start)  # a mark inside the prefixes: the first one after them
    return start, payload.start() if payload is not None else len(line)


def first_mark(line: str) -> int | None:
    """Where the line's first request payload marker starts, searched from its very start; None
    when it has none."""
    if not may_hold_mark(line):  # most lines: no mark possible, no search
        return None
    # PAYLOAD's first match starts where the first of its alternatives' first matches does (at
    # each position the engine tries the alternatives in turn). Searched one by one, each starts
    # with a literal the engine skips to, where the alternation tried every position of the line:
    # 0.07 ms a 1,600-character engine config line holding "output" (issue 20).
    starts = [start for start in (_first_match(regex, boundary, line) for regex, boundary in _mark_searches())
              if start is not None]
    return min(starts) if starts else None


def may_hold_mark(text: str) -> bool:
    """Whether the text holds one of PAYLOAD_LITERALS, which every mark holds (a loop: a generator
    in any() cost a third more, on every line a pass reads)."""
    for literal in PAYLOAD_LITERALS:
        if literal in text:
            return True
    return False


def _first_match(regex: re.Pattern[str], boundary: bool, line: str) -> int | None:
    m = regex.search(line)
    while m is not None and boundary and m.start() > 0 and _WORD_CHAR.match(line, m.start() - 1):
        m = regex.search(line, m.start() + 1)  # `\b` did not hold there: the next match
    return m.start() if m is not None else None


def _mark_search(pattern: str) -> tuple[re.Pattern[str], bool]:
    """A mark's pattern to search with, and whether a `\b` it started with is checked by hand: a
    leading `\b` hides the literal after it from the regex engine, which then tries every position.
    Only a `\b` before a word character, in a pattern without a top-level `|` or a class, is moved."""
    rest = pattern[2:]
    if not pattern.startswith(r"\b") or not re.match(r"\w(?![?*+{])", rest) or "[" in rest or top_level_alternative(rest):
        return re.compile(pattern), False
    return re.compile(rest), True


@cache
def _mark_searches() -> tuple[tuple[re.Pattern[str], bool], ...]:
    """Compiled when a line first holds a payload literal, not at every start (issue 20)."""
    return tuple(_mark_search(mark.pattern) for mark in PAYLOAD_MARKS)


_WORD_CHAR = re.compile(r"\w")


LOG_FACTS = frozenset(fact for fmt in FORMATS for fact in fmt.yields())  # what signals may read
KEYWORDS = sorted({lit for fmt in FORMATS for lit in fmt.literals})  # what the reader scans for


class _Patterns(Mapping[str, re.Pattern[str]]):
    """Each format's regex by name, compiled when it is looked up (see `LogFormat.regex`)."""

    def __init__(self, formats: tuple[LogFormat, ...]) -> None:
        self._formats = {fmt.name: fmt for fmt in formats}

    def __getitem__(self, name: str) -> re.Pattern[str]:
        return self._formats[name].regex

    def __iter__(self) -> Iterator[str]:
        return iter(self._formats)

    def __len__(self) -> int:
        return len(self._formats)


PATTERNS: Mapping[str, re.Pattern[str]] = _Patterns(FORMATS)  # vLLM's formats, for other readers of logs
