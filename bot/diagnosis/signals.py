"""Signals: the flat set of named facts playbooks read, from log, pod, node and command line.

A signal is a value plus the evidence line it came from (for the message). Raw log facts keep
their names; the derived ones below do the arithmetic once (the stage where vLLM died, memory
held by other processes, token capacity of the KV cache, ...), so playbooks stay declarative.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bot.diagnosis import accelerators
from bot.diagnosis.cmdline import ParsedCommand
from bot.diagnosis.evidence import parse_quantity
from bot.diagnosis.logfacts import FRAME_ORDER, LogFacts
from bot.diagnosis.logformats import LOG_FACTS  # every fact a log format yields: one declaration per message
from bot.diagnosis.models import NodeView, PodView

DERIVED = {
    "stage": "where start-up died: the furthest stage named by traceback frames, else by log markers",
    "engine": "v0 or v1",
    "gpu_total_gib": "one GPU's memory (log, else node label)",
    "other_processes_gib": "GPU memory held by other processes when the OOM hit",
    "fragmented": "PyTorch's reserved-but-unallocated memory would have covered the failed allocation",
    "large_single_allocation": "the failed allocation was at least 2 GiB and 8% of the GPU",
    "kv_capacity_tokens_effective": "tokens the KV cache holds (error text, blocks x block size, or KV size line)",
    "max_model_len": "the effective --max-model-len",
    "kv_short": "the KV cache holds fewer tokens than --max-model-len",
    "weights_estimate_gib": "weights per GPU estimated from the model name's parameter count and dtype",
    "weights_exceed_gpu_estimate": "estimated weights per GPU exceed 95% of one GPU",
    "tensor_parallel_size": "effective --tensor-parallel-size",
    "pipeline_parallel_size": "effective --pipeline-parallel-size",
    "data_parallel_size": "effective --data-parallel-size",
    "world_size": "TP x PP",
    "pod_gpus": "the accelerator devices in the container's limits (nvidia.com/gpu, amd.com/gpu, ...)",
    "world_exceeds_pod_gpus": "TP x PP is larger than the GPUs the pod got",
    "has_shm_volume": "a memory-backed volume at /dev/shm (or hostIPC)",
    "multi_process": "several vLLM processes share tensors (TP, PP or DP > 1)",
    "exit_code": "previous container's exit code",
    "oom_killed": "previous container was OOMKilled (host RAM)",
    "liveness_failed": "pod events show liveness probe failures",
    "startup_probe_failed": "pod events show startup probe failures",
    "has_startup_probe": "the container has a startupProbe",
    "has_liveness_probe": "the container has a livenessProbe",
    "fatal_error": "the log holds an exception other than a termination signal",
    "oom_any": "any CUDA out-of-memory text",
    "enforce_eager": "eager mode is already on",
    "shared_gpu_node": "the node's GPU is MIG-sliced or time-sliced",
    "log_recognised": "the log holds vLLM or PyTorch lines",
    "sleep_mode": "--enable-sleep-mode (expandable segments are not allowed)",
    "alloc_conf_set": "PYTORCH_(CUDA_)ALLOC_CONF already enables expandable_segments",
    "died_before_ready": "the log never reached 'ready'",
    "memory_limit_bytes": "the container's memory limit",
    "fragmented_far": "reserved-but-unallocated memory at the OOM is at least twice the request (and 1 GiB) and below "
                      "what PyTorch had allocated: the room was there, split",
    "shm_volume_short": "the pod's memory-backed /dev/shm has a sizeLimit and the log says shared memory ran out",
    "npu_oom_past_budget": "an Ascend NPU ran out while PyTorch already held more than --gpu-memory-utilization's share "
                           "of the card: vllm-ascend's own plan overran its budget, not a split cache",
    "oom_past_budget_gib": "how far PyTorch's allocated memory plus the failed request went past the utilization budget",
    "named_bound_flag": "the first vLLM flag an error message names with a bound ('lower max_num_seqs to at most 854')",
}

SIGNALS = LOG_FACTS | set(DERIVED)
# exceptions a process prints when it is told to stop, not because something failed
BENIGN_ERRORS = {"KeyboardInterrupt", "SystemExit", "CancelledError"}


@dataclass
class Signals:
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, str] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        v = self.values.get(name)
        return default if v is None else v

    def set(self, name: str, value: Any, line: str | None = None) -> None:
        self.values[name] = value
        if line:
            self.lines[name] = line


_PARAMS = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*[xX]\s*(\d+(?:\.\d+)?)[bB](?![a-zA-Z])|(?<![\d.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")
_DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "fp32": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0,
                "bf16": 2.0, "fp16": 2.0, "auto": 2.0}
_QUANT_BYTES = [("int4", 0.55), ("awq", 0.55), ("gptq", 0.55), ("4bit", 0.55), ("nf4", 0.55), ("bnb", 0.55),
                ("mxfp4", 0.55), ("nvfp4", 0.55), ("w4a16", 0.55), ("fp8", 1.05), ("int8", 1.05), ("w8a8", 1.05),
                ("gguf", 0.6)]


def params_billions(model: str | None) -> float | None:
    """7B, 70b, 8x7B, 1.5B in a model name (the last path segment); None if absent."""
    if not model:
        return None
    name = model.rstrip("/").rsplit("/", 1)[-1].replace("--", "-")
    best = None
    for m in _PARAMS.finditer(name):
        val = float(m.group(1)) * float(m.group(2)) if m.group(1) else float(m.group(3))
        best = val if best is None else max(best, val)
    return best


def bytes_per_param(model: str | None, dtype: str | None, quantization: str | None) -> float:
    text = f"{model or ''} {quantization or ''}".lower()
    for key, val in _QUANT_BYTES:
        if key in text:
            return val
    return _DTYPE_BYTES.get((dtype or "auto").lower().replace("torch.", ""), 2.0)


def _num(value: Any) -> float | None:
    try:
        return float(str(value))
    except (TypeError, ValueError):
        return None


def compute(facts: LogFacts, pod: PodView, node: NodeView, cmd: ParsedCommand) -> Signals:
    s = Signals()
    for name, fact in facts.facts.items():
        s.set(name, fact.value, fact.line)
    _correct_activation(s, facts)
    _stage_and_engine(s, facts)
    _parallelism(s, facts, cmd)
    _gpu_size(s, facts, node)
    _memory_at_oom(s, facts)
    _npu_past_budget(s, facts, cmd)
    _kv_capacity(s, facts, cmd)
    _weights_estimate(s, facts, cmd)
    bounds = facts.get("vllm_error_bounds") or {}
    if bounds:
        s.set("named_bound_flag", next(iter(bounds)), facts.line_of("vllm_error_bounds"))
    _pod(s, pod)
    _events(s, pod)
    fatal = [e for e in facts.errors if e.value not in BENIGN_ERRORS]
    s.set("fatal_error", bool(fatal) or bool(s.get("oom_any")), fatal[-1].line if fatal else None)
    # a bare 'Killed' is the kernel OOM killer only when no Python exception explains the death
    if s.get("host_oom_bare") and not s.get("host_oom") and not fatal:
        s.set("host_oom", True, facts.line_of("host_oom_bare"))
    s.set("log_recognised", facts.recognised)
    return s


def _correct_activation(s: Signals, facts: LogFacts) -> None:
    weights, activation = facts.get("weights_gib"), facts.get("activation_gib")
    if weights is not None and activation is not None and "Memory profiling results" in (facts.line_of("activation_gib") or ""):
        # vLLM 0.6.4 prints the torch peak including the weights; later versions print the increase
        s.set("activation_gib", max(0.0, activation - weights), facts.line_of("activation_gib"))


def _stage_and_engine(s: Signals, facts: LogFacts) -> None:
    """Where it died (the deepest start-up stage the frames or markers prove), and V0 or V1."""
    frame_stages = [st for st in facts.frame_stages if not (st == "warmup" and facts.get("engine_ready"))]
    frame_stage = max(frame_stages, key=lambda st: FRAME_ORDER[st]) if frame_stages else None
    marker_stage = max((st for st in facts.markers if st != "ready"), key=lambda st: FRAME_ORDER[st], default=None)
    stage = frame_stage or marker_stage
    if frame_stage and marker_stage and FRAME_ORDER[marker_stage] > FRAME_ORDER[frame_stage] \
            and marker_stage == "graph_capture" and not facts.get("graph_capture_finished"):
        stage = marker_stage  # capture started and never finished: frames were cut off
    oom = facts.facts.get("oom_tried_gib")
    if oom is not None and "ready" in facts.markers and oom.line_no > facts.markers["ready"] \
            and not any(st != "warmup" for st in frame_stages):
        stage = "ready"  # the OOM came after the server reported ready: run time, not a start-up stage
    if stage == "nccl_init" and facts.get("free_memory_check_failed"):
        stage = "startup"  # V1 init_device raises the free-memory check before any NCCL set-up
    s.set("stage", stage)
    s.set("died_before_ready", not facts.get("engine_ready"))
    v1 = any(k in facts.facts for k in ("kv_tokens", "free_memory_check_failed", "sampler_oom_requests",
                                         "kv_needed_gib", "estimated_max_len")) or any(
        "EngineCore" in line or "v1/" in line or "VllmWorker" in line or "V1 LLM engine" in line
        for _, line in facts.hit_lines[:400])
    s.set("engine", "v1" if v1 else "v0")


def _effective(cmd: ParsedCommand, facts: LogFacts, flag: str, config_key: str, default: Any, cast: Any) -> Any:
    """A setting from the command line, else from the log's engine config, else vLLM's default."""
    raw = cmd.get(flag)
    if raw is None:
        raw = facts.get(config_key)
    if raw is None:
        return default
    try:
        return cast(raw)
    except (TypeError, ValueError):
        return default


def _parallelism(s: Signals, facts: LogFacts, cmd: ParsedCommand) -> None:
    tp = _effective(cmd, facts, "--tensor-parallel-size", "config_tensor_parallel_size", 1, int)
    pp = _effective(cmd, facts, "--pipeline-parallel-size", "config_pipeline_parallel_size", 1, int)
    dp = _effective(cmd, facts, "--data-parallel-size", "config_data_parallel_size", 1, int)
    s.set("tensor_parallel_size", tp)
    s.set("pipeline_parallel_size", pp)
    s.set("data_parallel_size", dp)
    s.set("world_size", tp * pp)
    s.set("multi_process", tp * pp > 1 or dp > 1 or bool(facts.get("nccl_error")))
    eager = str(cmd.get("--enforce-eager") or facts.get("config_enforce_eager") or "false").lower() == "true"
    s.set("enforce_eager", eager)
    s.set("sleep_mode", str(cmd.get("--enable-sleep-mode") or "false").lower() == "true")


def _gpu_size(s: Signals, facts: LogFacts, node: NodeView) -> None:
    node_gib = node.gpu_memory_mib / 1024 if node.gpu_memory_mib else None
    total = facts.get("total_gpu_gib") or facts.get("oom_total_gib") or node_gib
    s.set("gpu_total_gib", total)
    product = (node.gpu_product or "").upper()
    s.set("shared_gpu_node", "MIG" in product or "SHARED" in product or bool(node.sharing_strategy and node.sharing_strategy != "none")
          or (node.replicas or 1) > 1)


def _memory_at_oom(s: Signals, facts: LogFacts) -> None:
    """Memory held by others at the OOM, fragmentation, and one outsized allocation."""
    tried = facts.get("oom_tried_gib")
    if tried is not None and facts.get("oom_total_gib"):
        o_total = facts.get("oom_total_gib")
        s.set("other_processes_gib", round(_others_at_oom(facts), 2), facts.line_of("oom_tried_gib"))
        unalloc = facts.get("oom_reserved_unallocated_gib") or 0.0
        s.set("fragmented", unalloc >= tried and unalloc >= max(0.5, 0.02 * o_total), facts.line_of("oom_tried_gib"))
        # far more cached than asked, beside memory really in use (online fp8 quantization frees the bf16 copies
        # in pieces): the room was there, split. A cache larger than all that is in use is no split but a
        # loader holding what it should not (a software problem, see levers.software_problem).
        allocated = facts.get("oom_allocated_gib") or 0.0
        s.set("fragmented_far", bool(s.get("fragmented")) and unalloc >= max(1.0, 2 * tried) and unalloc < allocated,
              facts.line_of("oom_tried_gib"))
        # one allocation of many GiB at start-up is a dummy batch's activations, not a weight or a KV block
        s.set("large_single_allocation", tried >= max(2.0, 0.08 * o_total), facts.line_of("oom_tried_gib"))
    s.set("oom_any", bool(facts.get("oom") or facts.get("cuda_driver_oom")))


def _npu_past_budget(s: Signals, facts: LogFacts, cmd: ParsedCommand) -> None:
    """vllm-ascend's NPU worker can allocate past the budget it sized the KV cache for: it did not count
    graph-capture memory before vllm-ascend#8289 (2026-04) and allocated Qwen3-Next's shared hybrid cache
    once per layer (vllm-ascend#3368). PyTorch then holds more than utilization x total when the next KV
    tensor fails, and a few GiB of cached remainder look like fragmentation; the maintainers' fix in those
    threads is a lower --gpu-memory-utilization. CUDA's caching allocator reports no such overrun."""
    tried, total, allocated = facts.get("oom_tried_gib"), facts.get("oom_total_gib"), facts.get("oom_allocated_gib")
    if not (facts.get("oom_on_npu") and tried is not None and total and allocated is not None):
        return
    util = _num(cmd.get("--gpu-memory-utilization")) or _num(facts.get("gpu_memory_utilization")) or 0.9
    past = allocated + tried - util * total
    line = facts.line_of("oom_tried_gib")
    s.set("oom_past_budget_gib", round(past, 2), line)
    s.set("npu_oom_past_budget", past >= max(1.0, 0.02 * total), line)


def _others_at_oom(facts: LogFacts) -> float:
    o_total, o_free = facts.get("oom_total_gib"), facts.get("oom_free_gib") or 0.0
    procs = facts.get("oom_processes_gib") or []
    if facts.get("torch_oom_format") == "2.0":
        reserved = facts.get("oom_reserved_gib") or 0.0
        return max(0.0, o_total - o_free - reserved)
    if facts.get("oom_this_process_gib") is not None:
        # The list names only the processes this container can see; the rest of the used memory
        # (other containers, other pods on the card) is total - free - this process. A container
        # can also print 'this process has 0 bytes': PyTorch's own numbers are then the floor.
        mine = max(facts.get("oom_this_process_gib"),
                   (facts.get("oom_allocated_gib") or 0.0) + (facts.get("oom_reserved_unallocated_gib") or 0.0))
        return max(sum(procs), o_total - o_free - mine)
    if len(procs) > 1:
        mine = (facts.get("oom_allocated_gib") or 0.0) + (facts.get("oom_reserved_unallocated_gib") or 0.0)
        # with the allocation line cut off, vLLM (sized to most of the GPU) is the largest entry
        own = min(procs, key=lambda p: abs(p - mine)) if mine > 0 else max(procs)
        return sum(procs) - own
    if len(procs) == 1 and o_total is not None and procs[0] < 0.5 * (o_total - o_free):
        # vLLM sizes itself to most of the card, so a lone entry holding under half of the used
        # memory is not vLLM: it is another process beside it (the 'this process' line was cut)
        return procs[0]
    return 0.0  # the only process listed is vLLM itself (container PID namespace)


def _kv_capacity(s: Signals, facts: LogFacts, cmd: ParsedCommand) -> None:
    """KV cache capacity in tokens vs --max-model-len."""
    pp = s.get("pipeline_parallel_size")
    block_size = _effective(cmd, facts, "--block-size", "config_block_size", 16, int)
    capacity = facts.get("kv_capacity_tokens") or facts.get("estimated_max_len")
    if capacity is None and facts.get("gpu_blocks") is not None:
        capacity = facts.get("gpu_blocks") * block_size // max(1, pp if s.get("engine") == "v0" else 1)
        s.lines.setdefault("kv_capacity_tokens_effective", facts.line_of("gpu_blocks") or "")
    if capacity is None and facts.get("kv_tokens") is not None:
        capacity = facts.get("kv_tokens")
        s.lines.setdefault("kv_capacity_tokens_effective", facts.line_of("kv_tokens") or "")
    if capacity is not None:
        s.values["kv_capacity_tokens_effective"] = capacity
    max_len = _num(facts.get("required_len")) or _num(cmd.get("--max-model-len")) or _num(facts.get("config_max_model_len"))
    if max_len is not None and max_len > 0:
        s.set("max_model_len", int(max_len))
    s.set("kv_short", bool(capacity is not None and max_len and 0 < capacity < max_len))


def _weights_estimate(s: Signals, facts: LogFacts, cmd: ParsedCommand) -> None:
    """Weights per GPU from the parameter count in the model's name."""
    model = cmd.model or facts.get("config_model")
    dtype = cmd.get("--dtype") or facts.get("config_dtype")
    quant = cmd.get("--quantization") or facts.get("config_quantization")
    billions = params_billions(model)
    if not billions:
        return
    world = max(1, s.get("world_size"))
    per_gpu = billions * 1e9 * bytes_per_param(model, dtype, quant) / 2**30 / world
    s.set("weights_estimate_gib", round(per_gpu, 1))
    total = s.get("gpu_total_gib")
    if total:
        # the model alone (nearly) fills the card: with the OOM showing vLLM itself holding it all
        filled = (facts.get("oom_allocated_gib") or 0.0) >= 0.93 * total
        s.set("weights_exceed_gpu_estimate", per_gpu >= 0.95 * total or (per_gpu >= 0.88 * total and filled))


def _pod(s: Signals, pod: PodView) -> None:
    container = pod.container
    if not container:
        return
    resource, count = accelerators.pod_device_resource(container.limits)
    gpus = count if resource else None
    if gpus is not None:
        s.set("pod_gpus", int(gpus))
        s.set("world_exceeds_pod_gpus", s.get("world_size") > gpus)
    s.set("exit_code", container.last_exit_code)
    s.set("oom_killed", (container.last_reason or "") == "OOMKilled")
    s.set("has_startup_probe", container.has_startup_probe)
    s.set("has_liveness_probe", container.has_liveness_probe)
    limit = parse_quantity(container.limits.get("memory")) if container.limits.get("memory") else None
    s.set("memory_limit_bytes", limit)
    # any device's allocator variable (CUDA, HIP, NPU, the generic one)
    conf = ",".join(v for k, v in container.env.items() if k.startswith("PYTORCH_") and k.endswith("ALLOC_CONF"))
    s.set("alloc_conf_set", "expandable_segments:true" in conf.lower())
    shm = pod.shm_volume or {}
    mem_backed = (shm.get("emptyDir") or {}).get("medium") == "Memory" or bool(shm.get("hostPath"))
    s.set("has_shm_volume", bool(mem_backed or pod.host_ipc))
    # a memory-backed /dev/shm with a sizeLimit that the log says ran out (vLLM's pre-check, a failed
    # segment, SIGBUS): mounted, but too small; hostIPC or an unbounded emptyDir cannot be "too small"
    size_limit = (shm.get("emptyDir") or {}).get("sizeLimit") if mem_backed and not pod.host_ipc else None
    required, free = s.get("shm_required_mib"), s.get("shm_free_mib")
    short = (required is not None and free is not None and free < required) or bool(s.get("shm_error")) \
        or (bool(s.get("bus_error")) and bool(s.get("multi_process")))
    s.set("shm_volume_short", bool(size_limit) and short)


def _events(s: Signals, pod: PodView) -> None:
    liveness = [m for r, m in zip(pod.event_reasons, pod.event_messages)
                if "Liveness probe failed" in m or "failed liveness probe" in m or r == "Unhealthy" and "Liveness" in m]
    s.set("liveness_failed", bool(liveness), liveness[0] if liveness else None)
    startup = [m for m in pod.event_messages if "Startup probe failed" in m or "failed startup probe" in m]
    s.set("startup_probe_failed", bool(startup), startup[0] if startup else None)
    if any(r in {"OOMKilling", "SystemOOM"} or "OOMKilled" in m for r, m in zip(pod.event_reasons, pod.event_messages)):
        s.set("oom_killed", True)


def gib(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.2f} GiB" if value < 100 else f"{value:.1f} GiB"
