"""Named formulas that turn evidence numbers into a proposed value, with the arithmetic shown.

A playbook's change says `value: <formula name>` and, when the formula takes any, its
parameters under `params:`. A formula's parameters are its keyword-only arguments: their type
(str, int, float or bool) and default are what the playbook loader checks. Each formula returns
a Computed (the new value, the current one, and one sentence of arithmetic a human can check)
or None when the evidence does not hold the numbers it needs; then the playbook's next fix is
tried. `constant` proposes a value written in the playbook, so a fixed-value fix needs no Python.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from bot.diagnosis import accelerators, levers
from bot.diagnosis.cmdline import ParsedCommand
from bot.diagnosis.evidence import format_gib_quantity, parse_quantity, pick_container
from bot.diagnosis.levers import MARGIN_GIB, MemoryModel
from bot.diagnosis.logfacts import LogFacts
from bot.diagnosis.models import Advice, AdviceKind, Change, NodeView, PodView
from bot.diagnosis.signals import Signals, gib


@dataclass(frozen=True)
class Target:
    """What the change being computed sets: its kind and name as the playbook spells them."""

    kind: str
    name: str


@dataclass
class Context:
    signals: Signals
    facts: LogFacts
    cmd: ParsedCommand
    pod: PodView
    node: NodeView
    raw_pod: dict[str, Any] | None
    target: Target | None = None  # set per change by run_formula
    memory: MemoryModel | None = None  # grant, model shape and budget: built once per diagnosis


@dataclass
class Computed:
    after: str | None
    before: str | None
    arithmetic: str
    caution: str | None = None  # the value is right by the numbers but may not be enough on its own
    # For a change whose playbook name is a placeholder ({unrecognized_flags}): the changes the
    # formula found the names of in the evidence; they replace the one change `after` would make.
    changes: tuple[Change, ...] = ()


class NoSafeChange(Exception):
    """The numbers are known and say that no value of this change can work (e.g. nothing free).

    advice: what would work but is not a change to this pod (a pre-quantized variant, a larger
    MIG profile, a node pool with bigger or more GPUs): said in the message, with no button."""

    def __init__(self, message: str, advice: list[Advice] | None = None) -> None:
        super().__init__(message)
        self.advice = advice or []


Formula = Callable[..., Computed | None]
FORMULAS: dict[str, Formula] = {}
PARAMETER_TYPES = (str, int, float, bool)


def formula(fn: Formula) -> Formula:
    FORMULAS[fn.__name__] = fn
    for p in parameters(fn.__name__).values():
        if p.type not in PARAMETER_TYPES:  # a playbook can only write these in YAML
            raise TypeError(f"formula {fn.__name__}: parameter {p.name} must be one of str, int, float, bool")
    return fn


@dataclass(frozen=True)
class Parameter:
    name: str
    type: type
    default: Any = inspect.Parameter.empty

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


def parameters(name: str) -> dict[str, Parameter]:
    """The parameters a playbook may give formula `name`: its keyword-only arguments."""
    fn = FORMULAS[name]
    hints = typing.get_type_hints(fn)
    return {p.name: Parameter(p.name, hints[p.name], p.default)
            for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def run_formula(name: str, ctx: Context, target: Target, params: Mapping[str, Any]) -> Computed | None:
    """Compute one change's value: formula `name` with the playbook's parameters."""
    return FORMULAS[name](replace(ctx, target=target), **params)


# ---- helpers ------------------------------------------------------------------------------


def version_tuple(text: str | None) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def default_utilization(ctx: Context) -> float:
    """vLLM's default --gpu-memory-utilization: 0.9, raised to 0.92 in 0.22."""
    return 0.92 if version_tuple(ctx.signals.get("vllm_version")) >= (0, 22) else 0.9


def current_utilization(ctx: Context) -> tuple[float, str | None]:
    """(value in effect, value as the manifest spells it or None when the flag is absent)."""
    raw = ctx.cmd.get("--gpu-memory-utilization")
    if raw is not None:
        try:
            return float(raw), raw
        except ValueError:
            pass
    logged = ctx.signals.get("gpu_memory_utilization") or ctx.signals.get("config_gpu_memory_utilization")
    return (float(logged) if logged else default_utilization(ctx)), None


def floor_pow2(n: float) -> int:
    return 1 if n < 2 else 2 ** int(math.floor(math.log2(n)))


def ceil_pow2(n: float) -> int:
    return 1 if n <= 1 else 2 ** int(math.ceil(math.log2(n - 1e-9)))


def round_down_len(tokens: int) -> int:
    """A sensible --max-model-len not above `tokens`: multiples of 1024, 256 or 16."""
    for step, floor in ((1024, 8192), (256, 1024), (16, 16)):
        if tokens >= floor:
            return tokens // step * step
    return max(1, tokens)


def fmt_util(u: float) -> str:
    return f"{u:.2f}"


def before_text(raw: str | None, effective: Any) -> str:
    """The value in effect: the manifest's spelling when the flag is set, else vLLM's own."""
    return raw if raw is not None else str(effective)


def current_int(ctx: Context, flag: str, config_key: str) -> tuple[int | None, str | None]:
    raw = ctx.cmd.get(flag)
    if raw is not None:
        try:
            return int(float(raw)), raw
        except ValueError:
            return None, raw
    logged = ctx.signals.get(config_key)
    return (int(logged), None) if logged else (None, None)


# ---- --max-model-len ------------------------------------------------------------------------

# the KV error prints GiB to two decimals: "{:.2f}" 0.7.0-0.12.0, format_gib (round(x, 2)) 0.13.0-0.33.0
GIB_PRINT_ROUNDING = 0.005


@formula
def max_model_len_that_fits(ctx: Context) -> Computed | None:
    s = ctx.signals
    current = s.get("max_model_len")
    raw = ctx.cmd.get("--max-model-len")
    if s.get("estimated_max_len"):
        cap, how = s.get("estimated_max_len"), f"vLLM estimates the longest context that fits at {s.get('estimated_max_len'):,} tokens"
    elif s.get("kv_capacity_tokens"):
        cap, how = s.get("kv_capacity_tokens"), f"the KV cache holds {s.get('kv_capacity_tokens'):,} tokens"
    elif s.get("kv_needed_gib") and s.get("available_kv_gib") and current:
        # vLLM prints both sizes rounded to 0.01 GiB: take the least the printed figures allow, so
        # the proposal cannot land between the true cap and the rounded one (130000 x 2.4 / 2.43
        # is 128,395 where vLLM's own estimate is 127,968)
        available, needed = s.get("available_kv_gib") - GIB_PRINT_ROUNDING, s.get("kv_needed_gib") + GIB_PRINT_ROUNDING
        cap = int(current * available / needed)
        how = (f"{current:,} tokens need {gib(s.get('kv_needed_gib'))} of KV cache but {gib(s.get('available_kv_gib'))} "
               f"is available, so at most {current:,} x {available:.3f} / {needed:.3f} = {cap:,} tokens fit "
               f"(each size read at the bound of its 0.01 GiB rounding)")
    elif s.get("kv_capacity_tokens_effective"):
        cap = s.get("kv_capacity_tokens_effective")
        blocks = s.get("gpu_blocks")
        how = (f"{blocks:,} KV blocks x {cap // blocks} tokens = {cap:,} tokens" if blocks
               else f"the KV cache holds {cap:,} tokens")
    else:
        return None
    if cap <= 0:
        return None
    new = round_down_len(int(cap))
    if current and new >= current:
        return None
    text = f"{how}; rounded down to {new:,}"
    if current:
        text += f" (was {current:,})"
    if levers.kv_pool_pinned(ctx.memory, s):
        text += (". --kv-cache-memory-bytes fixes the KV pool, so --gpu-memory-utilization does not size it; a larger "
                 "--kv-cache-memory-bytes is the other way")
    return Computed(after=str(new), before=raw if raw is not None else (str(current) if current else None),
                    arithmetic=text + ".")


CPU_KV_SPACE_DEFAULT_GIB = 4  # what vLLM's CPU backend uses when VLLM_CPU_KVCACHE_SPACE is unset or 0


@formula
def cpu_kv_space_for_context(ctx: Context) -> Computed | None:
    """vLLM's CPU backend sizes the KV pool from VLLM_CPU_KVCACHE_SPACE (GiB of host memory): scale it to the context.

    Only when the refusal names the variable (the V0 CPU worker's wording) and the pod's memory limit still holds
    the weights and the larger pool; otherwise the playbook's next fix (a shorter context) is tried.
    """
    s = ctx.signals
    capacity, wanted = s.get("kv_capacity_tokens"), s.get("max_model_len")
    container = ctx.pod.container
    if not s.get("kv_pool_cpu_space") or not capacity or not wanted or capacity >= wanted or container is None:
        return None
    raw = container.env.get("VLLM_CPU_KVCACHE_SPACE")
    try:
        current = int(raw) if raw not in (None, "") else 0
    except ValueError:
        return None  # not a whole number of GiB: leave it to a person
    space = current or CPU_KV_SPACE_DEFAULT_GIB
    new = math.ceil(space * wanted / capacity)
    text = (f"{capacity:,} tokens fit in {space} GiB{'' if current else ' (the default when it is unset)'}, so "
            f"{wanted:,} tokens need {space} x {wanted:,} / {capacity:,} = {space * wanted / capacity:.1f} GiB, "
            f"rounded up to {new}")
    limit, weights = s.get("memory_limit_bytes"), s.get("weights_estimate_gib")
    if limit:
        if weights is None or weights + new + MARGIN_GIB > limit / 2**30:
            return None  # the pool lives in the container's memory: a larger one must fit under its limit
        text += f"; with the weights ({gib(weights)}) it stays under the {gib(limit / 2**30)} memory limit"
    return Computed(after=str(new), before=raw, arithmetic=text + ".")


@formula
def max_model_len_of_model(ctx: Context) -> Computed | None:
    """vLLM refused a --max-model-len above the model's own context: serve the model's context."""
    s = ctx.signals
    cap, asked = s.get("model_context_len"), s.get("len_above_model")
    if not cap or not asked or cap >= asked:
        return None
    raw = ctx.cmd.get("--max-model-len")
    outcome = ("VLLM_ALLOW_LONG_MAX_MODEL_LEN let vLLM start with it, and a request past the model's positions killed "
               "the engine" if s.get("len_above_model_allowed") else "so vLLM refuses to start")
    return Computed(after=str(int(cap)), before=raw if raw is not None else str(asked),
                    arithmetic=f"vLLM derives the model's longest context from its config.json: {int(cap):,} tokens; "
                               f"{int(asked):,} is above it, {outcome}.")


# ---- --gpu-memory-utilization ------------------------------------------------------------


@formula
def utilization_for_free_memory(ctx: Context, *, margin_gib: float = 0.1) -> Computed | None:
    """Ask for no more than the GPU had free at start-up (less `margin_gib`), or what other processes left."""
    s = ctx.signals
    util, raw = current_utilization(ctx)
    total = s.get("gpu_total_gib")
    external = s.get("external_weights_gib") or 0.0  # 0.33 preload: a daemon's weights count in the budget
    if s.get("free_at_start_gib") is not None and total and external:
        free = s.get("free_at_start_gib")
        new = math.floor((free - margin_gib + external) / total * 100) / 100
        text = (f"{gib(free)} of {gib(total)} was free at start-up; the budget counts the {gib(external)} of weights "
                f"the preload daemon holds, so the engine may ask for ({free} + {external} - {margin_gib} GiB margin) / "
                f"{total} = {(free - margin_gib + external) / total:.4f}, rounded down to {fmt_util(new)}")
    elif s.get("free_at_start_gib") is not None and total:
        free = s.get("free_at_start_gib")
        new = math.floor((free - margin_gib) / total * 100) / 100
        text = (f"{gib(free)} of {gib(total)} was free at start-up but utilization {util} asks for "
                f"{util} x {gib(total)} = {gib(util * total)}; ({free} - {margin_gib} GiB margin) / {total} = "
                f"{(free - margin_gib) / total:.4f}, rounded down to {fmt_util(new)}")
    elif s.get("other_processes_gib") and total:
        others = s.get("other_processes_gib")
        usable = total - others - 0.5
        new = math.floor(usable / total * 100) / 100
        text = (f"other processes held {gib(others)} of the {gib(total)} GPU; ({total} - {others} - 0.5 GiB margin) "
                f"/ {total} = {usable / total:.4f}, rounded down to {fmt_util(new)}")
    else:
        return None
    if new <= 0.05 and s.get("free_at_start_gib") is not None:
        raise NoSafeChange(f"only {gib(s.get('free_at_start_gib'))} of {gib(total)} was free at start-up: another "
                           f"process holds this GPU, and no --gpu-memory-utilization can fit beside it. Free the GPU "
                           f"(or give the pod its own) and restart.")
    if new <= 0.05 or new >= util:
        return None
    weights = s.get("weights_gib") or s.get("weights_estimate_gib")
    figure = ctx.memory.weights_gib() if ctx.memory is not None else None
    if figure is not None:
        weights = figure[0]
    caution = None
    if figure is not None and new * total < weights + 1.0:
        assert ctx.memory is not None
        raise NoSafeChange(
            f"{gib(s.get('free_at_start_gib') or (total - (s.get('other_processes_gib') or 0)))} of this {gib(total)} "
            f"GPU is free, and {fmt_util(new)} x {gib(total)} = {gib(new * total)} cannot hold the model's "
            f"{gib(weights)} of weights ({figure[1]}) plus a KV cache: no --gpu-memory-utilization can work beside "
            f"what else holds this GPU.",
            advice=levers.advice_for_weights(ctx.memory, node_device_count(ctx)) if weights > 0.9 * total
            else _shared_advice(ctx.memory))
    if weights and new * total < weights + 1.0:
        caution = (f"{fmt_util(new)} x {gib(total)} = {gib(new * total)} cannot hold the model's ~{gib(weights)} of "
                   f"weights plus a KV cache: the lasting fix is to free this GPU (or give the pod its own).")
    elif new * total < 2.0:
        caution = (f"{fmt_util(new)} x {gib(total)} = {gib(new * total)} is enough only for a very small model: "
                   f"the lasting fix is to free this GPU (or give the pod its own).")
    return Computed(after=fmt_util(new), before=before_text(raw, util), arithmetic=text + ".", caution=caution)


def _shared_advice(model: MemoryModel) -> list[Advice]:
    grant = model.grant
    where = (f"a MIG {grant.mig_profile} slice" if grant.mig_profile else "a GPU") + (
        f" shared by {grant.replicas} time-sliced replicas" if grant.shared and grant.replicas else
        (" shared with other pods" if grant.shared else ""))
    return [Advice(kind=AdviceKind.OWN_GPU,
                   text=f"this pod runs on {where}. Give it a GPU of its own (a node pool without time-slicing, "
                        f"selected with a nodeSelector, or a larger MIG profile), or stop what else holds the GPU",
                   yaml="nodeSelector:\n  nvidia.com/gpu.sharing-strategy: none"),
            Advice(kind=AdviceKind.QUANTIZED_VARIANT,
                   text="a pre-quantized (AWQ/GPTQ 4-bit) variant of the model needs about a third of the memory")]


def graph_outgrows_steps(ctx: Context, util: float, total: float | None, cap: float = 0.95) -> None:
    """Refuse the guessed KV-room steps when the log names a CUDA-graph estimate they are not shown to outgrow.

    Without a breakdown, raising the utilization one step or shrinking the profiling batch is a guess; an
    estimate at least as large as all the utilization step could add (or on a card of unknown size) is the
    one consumer the log names, so neither guess is shown to leave room for the KV cache."""
    graph = ctx.signals.get("graph_gib")
    if graph is None or (total and graph < (max(cap, util) - util) * total):
        return
    adds = f" (raising it to {cap} adds {gib((max(cap, util) - util) * total)})" if total else ""
    raise NoSafeChange(
        f"vLLM counted {gib(graph)} of estimated CUDA-graph memory inside the --gpu-memory-utilization budget and "
        f"logged no breakdown of the rest, so neither a higher utilization nor a smaller profiling batch is shown to "
        f"leave room for the KV cache{adds}. Smaller graphs free that memory (--enforce-eager, or fewer cudagraph "
        f"capture sizes); VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 takes the estimate out of the budget, with a "
        f"lower --gpu-memory-utilization to leave the graphs room, as vLLM's own warning says.")


@formula
def utilization_raise_for_kv(ctx: Context, *, cap: float = 0.95) -> Computed | None:
    """Give the KV cache room: from the profiling breakdown when the log has it, else one step (never above `cap`)."""
    s = ctx.signals
    if levers.kv_pool_pinned(ctx.memory, s):
        return None  # --kv-cache-memory-bytes sizes the pool; utilization does not
    util, raw = current_utilization(ctx)
    total = s.get("total_gpu_gib") or s.get("gpu_total_gib")
    weights, act, non_torch = s.get("weights_gib"), s.get("activation_gib"), s.get("non_torch_gib")
    needed, available = s.get("kv_needed_gib"), s.get("available_kv_gib")
    if total and needed is not None and available is not None and needed > available:
        new = math.ceil((util + (needed - available) / total) * 100) / 100 + 0.01
        text = (f"one request needs {gib(needed)} of KV cache and {gib(available)} is available: "
                f"{util} + ({needed} - {available}) / {total:.2f} = {util + (needed - available) / total:.4f}, "
                f"rounded up plus 0.01 headroom")
        if util < new <= cap:
            return Computed(after=fmt_util(new), before=before_text(raw, util), arithmetic=text + ".")
        return None  # more than the card can give: another fix
    # A graph figure in a log that stopped at KV sizing is the start-up estimate ("Estimated CUDA graph
    # memory", 0.18+; graphs are captured only after the KV cache is allocated), which vLLM counts inside
    # the budget (by default since 0.21), so it belongs with the weights and activations.
    graph = s.get("graph_gib")
    if total and weights is not None and act is not None:
        need_kv = max(1.0, s.get("kv_needed_gib") or 1.0)
        need = weights + act + (non_torch or 0.0) + (graph or 0.0) + need_kv
        new = math.ceil(need / total * 100) / 100 + 0.02
        graphs = f" + CUDA-graph estimate {gib(graph)}" if graph else ""
        text = (f"weights {gib(weights)} + activations {gib(act)} + non-torch {gib(non_torch or 0)}{graphs} + at least "
                f"{gib(need_kv)} of KV cache = {gib(need)} of {gib(total)} = {need / total:.3f}, plus 0.02 headroom")
        if util < new <= cap:
            return Computed(after=fmt_util(new), before=before_text(raw, util), arithmetic=text + ".")
    else:
        graph_outgrows_steps(ctx, util, total, cap)
    if util < 0.85:
        new, why = 0.90, f"{util} leaves too little after weights and activations; 0.90 is vLLM's long-standing default"
    elif util < cap - 0.005:
        new = cap
        extra = f" = {gib((cap - util) * total)} more" if total else ""
        why = f"raising {util} to {cap} gives the KV cache {cap - util:.2f} x {gib(total) if total else 'the GPU'}{extra}"
    else:
        return None
    return Computed(after=fmt_util(new), before=before_text(raw, util), arithmetic=why + ".")


@formula
def utilization_above_external_weights(ctx: Context, *, headroom_fraction: float = 0.1, cap: float = 0.95) -> Computed | None:
    """0.33 preload: total x utilization must hold the daemon's weights and leave the engine room (KV, activations)."""
    s = ctx.signals
    external, total = s.get("external_weights_gib"), s.get("gpu_total_gib")
    if not external or not total:
        return None
    util, raw = current_utilization(ctx)
    headroom = max(2.0, headroom_fraction * total)
    new = math.ceil((external + headroom) / total * 100) / 100
    if new > cap:
        raise NoSafeChange(f"the preload daemon holds {gib(external)} of this {gib(total)} GPU; with {gib(headroom)} "
                           f"for the engine's own KV cache and activations that is more than {fmt_util(cap)} of it, so no "
                           f"--gpu-memory-utilization fits. Load a smaller or quantized model in the daemon, or shard it.")
    if new <= util:
        return None
    return Computed(after=fmt_util(new), before=before_text(raw, util),
                    arithmetic=f"the budget total x utilization counts the {gib(external)} the preload daemon holds; "
                               f"({external} + {headroom:.2f} GiB for the engine) / {total} = "
                               f"{(external + headroom) / total:.4f}, rounded up to {fmt_util(new)}.")


@formula
def utilization_lower_for_headroom(ctx: Context) -> Computed | None:
    """Leave memory outside vLLM's budget for what it does not count (graphs, sampler)."""
    s = ctx.signals
    if levers.kv_pool_pinned(ctx.memory, s):
        return None  # a pinned KV pool does not shrink with utilization: lowering it frees nothing
    util, raw = current_utilization(ctx)
    total = s.get("gpu_total_gib")
    if not total or s.get("free_at_start_gib") is not None:
        return None  # vLLM said how much was free: only that number can size the budget
    tried, free = s.get("oom_tried_gib"), s.get("oom_free_gib")
    past = s.get("oom_past_budget_gib") if s.get("npu_oom_past_budget") else None
    if past is not None:
        room = past + 1.0  # what the device held beyond the old budget, and a margin
    elif s.get("stage") == "kv_allocation" and tried is not None and free is not None:
        room = max(tried - free, 0.0) + 1.0  # only the shortfall, not the whole KV tensor
    else:
        room = max(s.get("graph_gib") or 0.0, tried or 0.0, 1.0)
    new = math.floor((util - room / total) * 100) / 100
    if new <= 0.3 or new >= util:
        return None
    held = s.get("oom_allocated_gib")
    # (past the budget, what is held already includes the overrun KV tensors: the margin above is the check)
    if held is not None and past is None and s.get("stage") == "kv_allocation" and new * total < held + 1.0:
        return None  # the new budget would not even cover what vLLM held before the KV cache
    text = f"{util} - {gib(room)} / {gib(total)} = {util - room / total:.4f}, rounded down to {fmt_util(new)}"
    return Computed(after=fmt_util(new), before=before_text(raw, util), arithmetic=text + ".")


@formula
def utilization_for_runtime_headroom(ctx: Context) -> Computed | None:
    """Headroom for a run-time allocation (utilization_lower_for_headroom), checked by the budget: the
    smaller KV pool must still hold --max-model-len, else the context is shortened with it."""
    lowered = utilization_lower_for_headroom(ctx)
    if lowered is None or lowered.after is None or ctx.memory is None:
        return lowered
    found = levers.try_lever(ctx.memory, f"--gpu-memory-utilization {lowered.after}", shorten=True,
                             gpu_memory_utilization=float(lowered.after))
    if found is None:
        return None if ctx.memory.considered[-1].fit.verdict != "unknown" else lowered
    return Computed(after=lowered.after, before=lowered.before,
                    arithmetic=lowered.arithmetic + levers.margin_text(found.fit))


# ---- boolean and count flags ------------------------------------------------------------


@formula
def enforce_eager_on(ctx: Context) -> Computed | None:
    if ctx.signals.get("enforce_eager"):
        return None
    return Computed(after="true", before=ctx.cmd.get("--enforce-eager"),
                    arithmetic="eager mode skips CUDA-graph capture, which needs memory outside "
                               "--gpu-memory-utilization (vLLM: 'CUDA graphs can take additional 1~3 GiB memory per GPU').")


def default_max_num_seqs(ctx: Context) -> int:
    """V1's default --max-num-seqs: 1024 in 0.8.0-0.8.4, later 1024 only on big non-A100 cards, else 256."""
    version = version_tuple(ctx.signals.get("vllm_version"))
    total = ctx.signals.get("gpu_total_gib") or 0
    product = (ctx.node.gpu_product or "").upper()
    if version == (0, 8) or (total >= 70 and "A100" not in product):
        return 1024
    return 256


@formula
def max_num_seqs_below_warmup(ctx: Context) -> Computed | None:
    n = ctx.signals.get("sampler_oom_requests")
    current, raw = current_int(ctx, "--max-num-seqs", "config_max_num_seqs")
    if n:
        base = min(n, current) if current else n
        why = f"the sampler warm-up ran out of memory with {n} dummy requests"
    else:
        base = current or default_max_num_seqs(ctx)
        why = f"the sampler warm-up runs one dummy request per --max-num-seqs slot ({base}{'' if current else ', the default here'})"
    new = floor_pow2(base / 2)
    if new < 1 or new >= base:
        return None
    return Computed(after=str(new), before=raw if raw is not None else str(base),
                    arithmetic=f"{why}; half of that, rounded down to a power of two, is {new}.")


_MULTIMODAL_NAME = re.compile(r"(?i)(?:-vl\b|-vl-|vision|llava|minicpm-v|-v-|qwen2?\.?5?-?vl|pixtral|idefics|mllama|"
                              r"internvl|phi-3(?:\.5)?-vision|gemma-3-\d+b-it|paligemma)")


def _multimodal_profile(ctx: Context) -> bool:
    if any("multi-modal" in line or "multimodal" in line for _, line in ctx.facts.hit_lines[:2000]):
        return True
    if ctx.cmd.has("--limit-mm-per-prompt"):  # only multimodal models take per-prompt item limits
        return True
    model = ctx.cmd.model or ctx.signals.get("config_model") or ""
    return bool(_MULTIMODAL_NAME.search(model.rsplit("/", 1)[-1]))


def _shrink_ratio(ctx: Context) -> tuple[float, str]:
    s = ctx.signals
    tried, free = s.get("oom_tried_gib"), s.get("oom_free_gib")
    if tried and free is not None:
        avail = free + (s.get("oom_reserved_unallocated_gib") or 0.0)
        ratio = max(0.05, min(0.5, avail / tried))
        return ratio, (f"the failed allocation was {gib(tried)} with {gib(avail)} available, so the profiling batch must "
                       f"shrink to at most {avail:.2f}/{tried:.2f} = {avail / tried:.2f} of its size (capped at 0.5)")
    return 0.25, "the log does not say how much was missing; a quarter of the batch is a conservative step"


@formula
def profile_max_num_seqs(ctx: Context) -> Computed | None:
    """Multimodal profiling gives each of max_num_seqs dummy sequences its own image inputs."""
    if not _multimodal_profile(ctx):
        return None
    current, raw = current_int(ctx, "--max-num-seqs", "config_max_num_seqs")
    base = current or 256
    ratio, why = _shrink_ratio(ctx)
    new = floor_pow2(base * ratio)
    if new >= base:
        return None
    return Computed(after=str(new), before=raw if raw is not None else str(base),
                    arithmetic=f"{why}; {base} x {ratio:.2f} = {base * ratio:.1f}, rounded down to a power of two: {new}.")


@formula
def profile_max_num_batched_tokens(ctx: Context) -> Computed | None:
    """The profiling batch is max_num_batched_tokens tokens (V1, and V0 with chunked prefill)."""
    current, raw = current_int(ctx, "--max-num-batched-tokens", "config_max_num_batched_tokens")
    v0 = ctx.signals.get("engine") == "v0"
    if v0 and current is None:
        return None  # V0 batches max(max_model_len, 2048): --max-model-len is the lever there
    total = ctx.signals.get("gpu_total_gib") or 0
    if ctx.signals.get("activation_gib") is None:
        util, _ = current_utilization(ctx)
        graph_outgrows_steps(ctx, util, total or ctx.signals.get("total_gpu_gib"))
    base = current or (8192 if total >= 70 else 2048)
    ratio, why = _shrink_ratio(ctx)
    new = max(256, floor_pow2(base * ratio))
    max_len = ctx.signals.get("max_model_len")
    if new >= base or (v0 and max_len and new < max_len):
        return None
    return Computed(after=str(new), before=raw if raw is not None else str(base),
                    arithmetic=f"{why}; {base} x {ratio:.2f} = {base * ratio:.0f}, rounded down to a power of two: {new}.")


@formula
def profile_max_model_len(ctx: Context) -> Computed | None:
    """V0 without chunked prefill profiles one sequence of max_model_len tokens."""
    if ctx.signals.get("engine") != "v0":
        return None
    current = ctx.signals.get("max_model_len")
    if not current:
        return None
    ratio, why = _shrink_ratio(ctx)
    new = round_down_len(int(current * ratio))
    if new >= current or new < 256:
        return None
    raw = ctx.cmd.get("--max-model-len")
    return Computed(after=str(new), before=raw if raw is not None else str(current),
                    arithmetic=f"{why}; V0 profiles a batch of max(max_model_len, 2048) tokens: {current:,} x {ratio:.2f} "
                               f"= {current * ratio:,.0f}, rounded down to {new:,}.")


# ---- parallelism and GPUs --------------------------------------------------------------


@formula
def tensor_parallel_for_pod_gpus(ctx: Context) -> Computed | None:
    s = ctx.signals
    gpus = s.get("pod_gpus") or s.get("gpus_visible")
    if not gpus:
        return None
    pp = s.get("pipeline_parallel_size") or 1
    new = floor_pow2(max(1, gpus // pp))
    current, raw = current_int(ctx, "--tensor-parallel-size", "config_tensor_parallel_size")
    current = current or (s.get("world_size_required") // pp if s.get("world_size_required") else None)
    if current is not None and new >= current:
        return None
    checked = ""
    if ctx.memory is not None:  # fewer ranks hold more weights each: only when the budget says they fit
        lever = f"--tensor-parallel-size {new} on the pod's {gpus} GPU(s)"
        fit = ctx.memory.fit(tensor_parallel_size=new, gpu_count=gpus)
        if fit.fits or levers.fails_on_memory(fit):
            # a shorter context may make room for the KV cache the fewer ranks leave (plan searches the same way)
            found = levers.try_lever(ctx.memory, lever, shorten=True, tensor_parallel_size=new, gpu_count=gpus)
            if found is None:
                return None
            fit = found.fit
        else:
            ctx.memory.consider(lever, fit, False, levers.why_not(fit))
        checked = levers.margin_text(fit)
    text = f"the pod gets {gpus} GPU(s)"
    if pp > 1:
        text += f" and pipeline parallelism is {pp}, so {gpus} // {pp} = {gpus // pp}"
    if new != gpus // pp:
        text += f"; tensor parallelism must divide the attention heads, so the largest power of two is {new}"
    else:
        text += f", so --tensor-parallel-size {new}"
    if current:
        text += f" (was {current})"
    return Computed(after=str(new), before=raw if raw is not None else (str(current) if current else None),
                    arithmetic=text + "." + checked)


def _weights_total(ctx: Context) -> float | None:
    if ctx.memory is not None:  # one weights figure per message: the budget's
        figure = ctx.memory.weights_gib()
        if figure is not None:
            return figure[0] * max(1, ctx.memory.ran.world_size)
    s = ctx.signals
    per_gpu = s.get("weights_estimate_gib")
    if per_gpu is None:
        return None
    return per_gpu * max(1, s.get("world_size") or 1)


def _weights_source(ctx: Context) -> str:
    figure = ctx.memory.weights_gib() if ctx.memory is not None else None
    return figure[1] if figure is not None else "parameter count x bytes per parameter"


def _tp_needed(ctx: Context) -> tuple[int, str] | None:
    s = ctx.signals
    grant = ctx.memory.grant if ctx.memory is not None else None
    # the log's or the labels' device total, else the vendor catalogue's (TPU, Ascend: no memory label)
    total_w, gpu = _weights_total(ctx), s.get("gpu_total_gib") or (grant.memory_gib if grant else None)
    if total_w is None or not gpu:
        return None
    per = 0.8 * gpu
    need = ceil_pow2(total_w / per)
    return need, (f"the weights are about {gib(total_w)} ({_weights_source(ctx)}); one GPU "
                  f"can hold 80% x {gib(gpu)} = {gib(per)} of them next to activations and KV cache, so "
                  f"{total_w:.1f} / {per:.1f} = {total_w / per:.2f} -> {need} GPUs")


def node_device_count(ctx: Context) -> int | None:
    """Physical devices on the node: NVIDIA's labels, else what the grant read for any vendor."""
    grant = ctx.memory.grant if ctx.memory is not None else None
    return ctx.node.gpu_count or ctx.node.gpu_capacity or (grant.cards_on_node if grant else None)


def sentence(text: str) -> str:
    """The text with a capital first letter, unless its second is one too: a name spelt that way on
    purpose ("vLLM estimates ...") keeps its spelling."""
    if text[1:2].isupper():
        return text
    return text[:1].upper() + text[1:]


def _device_limit(ctx: Context) -> tuple[str, str | None]:
    """The pod's own accelerator resource (amd.com/gpu stays amd.com/gpu) and its limit now."""
    limits = ctx.pod.container.limits if ctx.pod.container else {}
    resource, _ = accelerators.pod_device_resource(limits)
    resource = resource or "nvidia.com/gpu"
    return resource, limits.get(resource)


_CUDA_ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def alloc_env(ctx: Context) -> str | None:
    """The caching allocator's variable on this pod's PyTorch build: the one PyTorch's own OOM hint
    names when it is a device's (ROCm prints PYTORCH_HIP_ALLOC_CONF), else the pod's vendor's
    (data/accelerators.yaml); None on a vendor whose allocator has no expandable segments."""
    hinted = ctx.signals.get("alloc_conf_hint_name")
    if hinted and hinted not in {_CUDA_ALLOC_ENV, "PYTORCH_ALLOC_CONF"}:
        return str(hinted)
    own, _ = accelerators.pod_device_resource(ctx.pod.container.limits if ctx.pod.container else {})
    vendor = accelerators.vendor_of(own) if own else None
    return vendor.alloc_env if vendor is not None else _CUDA_ALLOC_ENV


def refuse_unknown_device(ctx: Context) -> str | None:
    """The pod's own known device resource (None: it asks for none). A pod that asks for an
    accelerator the data does not know (no known device among its limits, some vendor's extended
    resource instead) gets no device or parallelism change (NoSafeChange): the bot cannot say how
    many of them the node has or what each holds, and NVIDIA's resource is not the pod's."""
    limits = ctx.pod.container.limits if ctx.pod.container else {}
    own, _ = accelerators.pod_device_resource(limits)
    unknown = accelerators.unknown_devices(limits) if own is None else []
    if unknown:
        raise NoSafeChange(f"the pod asks for {', '.join(unknown)}, an accelerator this bot does not know "
                           "(bot/diagnosis/data/accelerators.yaml), so it cannot say how many the node has or "
                           "what each holds: no device or parallelism change is proposed")
    return own


def device_target(ctx: Context, kind: str, name: str) -> str:
    """A playbook's accelerator resource (limits.nvidia.com/gpu) as the pod's own: a pod asking
    for amd.com/gpu, gpu.intel.com/xe or huawei.com/Ascend910 gets more of that, never NVIDIA's;
    the CUDA allocator's variable as the device's own (PYTORCH_HIP_ALLOC_CONF on ROCm)."""
    if kind == "env" and name == _CUDA_ALLOC_ENV:
        return alloc_env(ctx) or name
    section, _, resource = name.partition(".")
    if kind != "resources" or not accelerators.is_device_resource(resource):
        return name
    own = refuse_unknown_device(ctx)
    return f"{section}.{own}" if own else name


def _no_tensor_parallel_here(ctx: Context) -> str | None:
    grant = ctx.memory.grant if ctx.memory is not None else None
    if grant is None or grant.can_tensor_parallel:
        return None
    return f"tensor parallelism cannot run across {grant.no_tensor_parallel_reason()}"


@formula
def tensor_parallel_for_weights_on_node(ctx: Context) -> Computed | None:
    refuse_unknown_device(ctx)
    need = _tp_needed(ctx)
    node_gpus = node_device_count(ctx)
    if need is None or not node_gpus or _no_tensor_parallel_here(ctx):
        return None
    if ctx.memory is None or ctx.memory.baseline().verdict == "unknown":
        return tensor_parallel_for_weights(ctx) if need[0] <= node_gpus else None
    current, raw = current_int(ctx, "--tensor-parallel-size", "config_tensor_parallel_size")
    found, tried = levers.tp_search(ctx.memory, node_gpus, (current or 1) * 2)
    if found is None:
        return None
    tp = found.fit.config.tensor_parallel_size
    text = need[1] if need[0] == tp else (f"{need[1]}; the budget check finds {tp} enough"
                                          if tp < need[0] else f"{need[1]}; the budget check needs {tp}")
    return Computed(after=str(tp), before=raw if raw is not None else str(current or 1),
                    arithmetic=text + "." + levers.margin_text(found.fit))


@formula
def tensor_parallel_for_weights(ctx: Context) -> Computed | None:
    refuse_unknown_device(ctx)
    need = _tp_needed(ctx)
    current, raw = current_int(ctx, "--tensor-parallel-size", "config_tensor_parallel_size")
    current = current or 1
    if need is None:
        new, text = current * 2, f"doubling tensor parallelism halves the weights each GPU holds ({current} -> {current * 2})"
    else:
        new, text = max(need[0], current * 2), need[1]
    chosen = ctx.memory.chosen if ctx.memory is not None else None
    if chosen is not None and chosen.fit.config.tensor_parallel_size > 1:
        new = chosen.fit.config.tensor_parallel_size  # the TP the budget check chose
    node_gpus = node_device_count(ctx)
    if node_gpus and new > node_gpus:
        if ctx.memory is not None:  # a pod that can never schedule is not a change to approve
            raise NoSafeChange(f"{text}; this node has {node_gpus} GPU(s), so no --tensor-parallel-size on it "
                               f"holds the weights.", advice=levers.advice_for_weights(ctx.memory, node_gpus))
        text += f"; this node has {node_gpus} GPU(s), so the pod must move to a node with {new}"
    blocked = _no_tensor_parallel_here(ctx)
    if blocked and ctx.memory is not None:
        raise NoSafeChange(blocked + ".", advice=levers.advice_for_weights(ctx.memory, node_gpus))
    return Computed(after=str(new), before=raw if raw is not None else str(current), arithmetic=text + ".")


@formula
def gpu_limit_for_tensor_parallel(ctx: Context) -> Computed | None:
    """Keep limits.nvidia.com/gpu equal to the new TP x PP (computed the same way as TP)."""
    tp = tensor_parallel_for_weights(ctx)
    if tp is None or tp.after is None:
        return None
    pp = ctx.signals.get("pipeline_parallel_size") or 1
    want = int(tp.after) * pp
    resource, current = _device_limit(ctx)
    if current is not None and int(float(current)) >= want:
        return None
    return Computed(after=str(want), before=current,
                    arithmetic=f"the pod needs one GPU per tensor-parallel rank: {tp.after} x PP {pp} = {want}.")


@formula
def gpu_limit_for_world_size(ctx: Context) -> Computed | None:
    s = ctx.signals
    world = s.get("world_size_required") or s.get("world_size")
    node_gpus = node_device_count(ctx)
    resource, current = _device_limit(ctx)
    if not world or (current and int(float(current)) >= world):
        return None
    if node_gpus and world > node_gpus and ctx.memory is not None:
        raise NoSafeChange(f"TP x PP = {world} needs {world} GPUs but this node has {node_gpus}, and fewer ranks "
                           f"cannot hold the weights.", advice=levers.advice_for_weights(ctx.memory, node_gpus))
    if not node_gpus or world > node_gpus:
        return None
    checked = ""
    if ctx.memory is not None:
        blocked = _no_tensor_parallel_here(ctx) if world > 1 else None
        if blocked:
            raise NoSafeChange(blocked + ".", advice=levers.advice_for_weights(ctx.memory, node_gpus))
        fit = ctx.memory.fit(gpu_count=world)
        ctx.memory.consider(f"limits.{resource} {world} with --tensor-parallel-size kept", fit,
                            fit.verdict != "fails", levers.why_not(fit) if fit.verdict == "fails" else "")
        checked = levers.margin_text(fit)
    return Computed(after=str(world), before=current,
                    arithmetic=f"TP x PP = {world} processes need {world} GPUs and the node has {node_gpus}." + checked)


@formula
def quantization_fp8_for_weights(ctx: Context) -> Computed | None:
    """Online fp8 weights (--quantization fp8): native W8A8 on 8.9+, weight-only FP8 Marlin on Ampere."""
    model = ctx.memory
    if model is None or ctx.cmd.get("--quantization") or ctx.signals.get("config_quantization") not in (None, "None"):
        return None
    support = model.fp8()
    if support not in {"native", "weight-only"}:
        if support == "none" and model.grant.compute_capability:
            major, minor = model.grant.compute_capability
            model.consider("--quantization fp8", model.baseline(), False,
                           f"compute capability {major}.{minor} has no fp8 path for this model")
        return None
    found = levers.try_lever(model, "--quantization fp8", shorten=True, quantization="fp8")
    if found is None:
        return None
    weights = model.weights_gib(found.fit)
    how = "native W8A8 (compute capability 8.9+)" if support == "native" else "weight-only W8A16 through FP8 Marlin"
    size = f": about {weights[0]:.2f} GiB per GPU ({weights[1]})" if weights else ""
    return Computed(after="fp8", before=None,
                    arithmetic=f"fp8 weights take one byte per parameter instead of two{size}, {how} on "
                               f"{model.grant.product or 'this GPU'}." + levers.margin_text(found.fit))


@formula
def max_model_len_for_lever(ctx: Context) -> Computed | None:
    """The --max-model-len the chosen lever needs (the budget check shortened the context to fit)."""
    chosen = ctx.memory.chosen if ctx.memory is not None else None
    if chosen is None or chosen.fit.config.max_model_len in (None, ctx.memory.ran.max_model_len if ctx.memory else None):
        return None
    new = chosen.fit.config.max_model_len
    raw = ctx.cmd.get("--max-model-len")
    current = ctx.memory.ran.max_model_len if ctx.memory else None
    return Computed(after=str(new), before=raw if raw is not None else (str(current) if current else None),
                    arithmetic=f"with that change the KV cache holds {chosen.fit.max_len_that_fits:,} tokens; "
                               f"--max-model-len {new:,} fits.")


@formula
def shm_for_tensor_parallel(ctx: Context) -> Computed | None:
    """A /dev/shm emptyDir comes with every TP > 1 the pod did not have (NCCL and vLLM's queues need it)."""
    if ctx.signals.get("has_shm_volume"):
        return None
    chosen = ctx.memory.chosen if ctx.memory is not None else None
    ranks = chosen.fit.config.world_size if chosen is not None else 0
    tp = tensor_parallel_for_weights(ctx) if not ranks else None
    ranks = max(ranks, int(tp.after) if tp is not None and tp.after else 0)
    if ranks < 2:
        return None
    size = max(2, ranks)
    limit = ctx.signals.get("memory_limit_bytes")
    if limit:
        size = min(size, max(2, int(limit / 4 / 2**30)))
    return Computed(after=f"{size}Gi", before=None,
                    arithmetic=f"{ranks} tensor-parallel ranks talk through /dev/shm, which is 64 MiB without a "
                               f"volume: emptyDir medium Memory, sizeLimit {size}Gi (1 GiB per rank, at least 2).")


@formula
def half_precision_dtype(ctx: Context) -> Computed | None:
    dtype = (ctx.cmd.get("--dtype") or ctx.signals.get("config_dtype") or "").lower()
    if dtype not in {"float32", "float", "fp32"}:
        return None
    product = (ctx.node.gpu_product or "").upper()
    old_arch = any(k in product for k in ("V100", "T4", "P100", "P40", "RTX-20", "2080", "TITAN"))
    new = "float16" if old_arch else "bfloat16"
    total = _weights_total(ctx)
    size = f" ({gib(total)} -> {gib(total / 2)})" if total else ""
    return Computed(after=new, before=ctx.cmd.get("--dtype") or dtype,
                    arithmetic=f"float32 weights take 4 bytes per parameter, {new} takes 2: half the memory{size}"
                               + ("; this GPU has no bfloat16, so float16" if old_arch else "") + ".")


# Each forward pass copies the offloaded weights over PCIe (4.0 x16: ~25 GB/s in practice), so 16 GiB
# per GPU is about 0.7 s per generated token: slow but a server; far more is no fix.
MAX_OFFLOAD_GIB = 16


@formula
def cpu_offload_for_weights(ctx: Context) -> Computed | None:
    s = ctx.signals
    total_w, gpu = _weights_total(ctx), s.get("gpu_total_gib")
    if total_w is None or not gpu:
        return None
    util, _ = current_utilization(ctx)
    world = max(1, s.get("world_size") or 1)
    room = util * gpu - 2.0
    # "7B" in a name is 7.2 to 8.3 billion parameters in practice, plus embeddings: 10% more
    per_gpu = total_w / world * 1.1
    offload = math.ceil(per_gpu - room)
    if offload <= 0 or offload >= per_gpu:
        return None
    host = _host_room(ctx, offload * world)
    if host is False or (host is None and offload > 0.5 * per_gpu):
        return None  # host memory unknown: offloading most of the model might not even fit the host
    if offload > MAX_OFFLOAD_GIB:
        return None  # every forward pass streams the offloaded part: past ~16 GiB a token takes a second
    checked, estimate = "", offload
    if ctx.memory is not None:
        found = _offload_that_fits(ctx.memory, ctx, offload, per_gpu, world)
        if found is None and ctx.memory.considered[-1].fit.verdict != "unknown":
            return None
        if found is not None:
            offload, checked = found[0], levers.margin_text(found[1].fit)
            if offload != estimate:  # the estimate leaves CUDA graphs and the margin out
                checked = f" The budget check with CUDA graphs and the margin needs {offload} GiB.{checked}"
    return Computed(after=str(offload), before=ctx.cmd.get("--cpu-offload-gb"),
                    arithmetic=f"per GPU the weights are about {gib(per_gpu)} (the name's parameter count + 10%) but "
                               f"{util} x {gib(gpu)} - 2 GiB for activations and KV cache = {gib(room)} is left; "
                               f"{per_gpu:.2f} - {room:.2f} = {per_gpu - room:.2f}, rounded up: offload {estimate} GiB per GPU "
                               f"to CPU memory (slower, but it starts: every forward pass streams the offloaded weights over PCIe)"
                               + _host_text(ctx, offload * world) + "." + checked)


def _offload_that_fits(model: MemoryModel, ctx: Context, first: int, per_gpu: float,
                       world: int) -> tuple[int, levers.Considered] | None:
    """The smallest offload from `first` up (a few GiB more at most, within the host) the budget check passes."""
    util = model.ran.gpu_memory_utilization
    # the KV pool grows to the utilization's budget, so when offloading leaves too thin a margin
    # beside what the GPU already holds, a utilization 0.05 lower buys it back
    utils = [None] + [round(util - step, 2) for step in (0.05, 0.1) if util and util - step >= 0.5]
    for offload in range(first, min(first + 4, math.ceil(per_gpu), MAX_OFFLOAD_GIB + 1)):
        if offload > first and not _host_room(ctx, offload * world):
            return None
        for lower in utils:
            update: dict[str, Any] = {"cpu_offload_gb": float(offload)}
            label = f"--cpu-offload-gb {offload}"
            if lower is not None:
                update["gpu_memory_utilization"], label = lower, f"{label} with --gpu-memory-utilization {lower}"
            found = levers.try_lever(model, label, shorten=True, **update)
            if found is not None:
                return offload, found
            if model.considered[-1].fit.verdict == "unknown":
                return None
    return None


@formula
def utilization_for_lever(ctx: Context) -> Computed | None:
    """The --gpu-memory-utilization the chosen lever needs (the budget check lowered it for the margin)."""
    chosen = ctx.memory.chosen if ctx.memory is not None else None
    new = chosen.fit.config.gpu_memory_utilization if chosen is not None else None
    if new is None or ctx.memory is None or new == ctx.memory.ran.gpu_memory_utilization:
        return None
    util, raw = current_utilization(ctx)
    return Computed(after=fmt_util(new), before=raw if raw is not None else fmt_util(util),
                    arithmetic=f"the KV pool fills the utilization's budget: at {fmt_util(new)} every stage keeps "
                               f"{MARGIN_GIB} GiB free beside the non-PyTorch memory.")


def _host_bytes(ctx: Context) -> tuple[float, str] | None:
    """The host memory the container may use: its limit, else the node's allocatable memory."""
    limit = ctx.signals.get("memory_limit_bytes")
    if limit:
        return float(limit), "the container's memory limit"
    if ctx.node.memory_allocatable_bytes:
        return float(ctx.node.memory_allocatable_bytes), "the node's allocatable memory"
    return None


def _host_room(ctx: Context, offload_gib: float) -> bool | None:
    """Does host memory hold the offloaded weights beside vLLM's own (60% of it at most)? None: unknown."""
    host = _host_bytes(ctx)
    if host is None:
        return None
    return offload_gib * 2**30 <= 0.6 * host[0]


def _host_text(ctx: Context, offload_gib: float) -> str:
    host = _host_bytes(ctx)
    if host is None:
        return ""
    return (f"; {offload_gib} GiB offloaded in all is within 60% of {host[1]} "
            f"({gib(host[0] / 2**30)} x 0.6 = {gib(0.6 * host[0] / 2**30)})")


# ---- host memory, shm, probes, env ------------------------------------------------------


@formula
def memory_limit_raise(ctx: Context, *, factor: float = 1.5) -> Computed | None:
    container = ctx.pod.container
    if not container or not container.limits.get("memory"):
        return None
    current = parse_quantity(container.limits["memory"])
    if not current:
        return None
    s = ctx.signals
    world = max(1, s.get("world_size") or 1)
    pinned = (float(ctx.cmd.get("--swap-space") or 0) + float(ctx.cmd.get("--cpu-offload-gb") or 0)) * world * 2**30
    new = max(current * factor, current + pinned)
    new = int(math.ceil(new / (8 * 2**30)) * 8 * 2**30)
    text = f"{container.limits['memory']} x {factor:g}"
    if pinned:
        text = f"max({text}, {container.limits['memory']} + {pinned / 2**30:.0f} GiB pinned swap/offload for {world} worker(s))"
    text += f", rounded up to a multiple of 8 GiB = {format_gib_quantity(new)}"
    alloc = ctx.node.memory_allocatable_bytes
    if alloc and new > 0.9 * alloc:
        new = int(0.9 * alloc) // 2**30 * 2**30
        if new <= current:
            raise NoSafeChange(f"the memory limit ({container.limits['memory']}) is already at the node's capacity "
                               f"({alloc / 2**30:.0f} GiB allocatable): the pod needs a node with more memory, or less "
                               f"host memory per worker (--swap-space, --cpu-offload-gb).")
        text += f", capped at 90% of the node's allocatable memory ({format_gib_quantity(new)})"
    return Computed(after=format_gib_quantity(new), before=container.limits["memory"], arithmetic=text + ".")


@formula
def swap_space_off(ctx: Context) -> Computed | None:
    raw = ctx.cmd.get("--swap-space")
    cpu_blocks = ctx.signals.get("cpu_blocks")
    if raw is None and ctx.signals.get("engine") == "v0" and cpu_blocks:
        # V0 pins --swap-space 4 GiB of host RAM per worker by default; "# CPU blocks: N" (N > 0) shows it is in use
        world = max(1, ctx.signals.get("world_size") or 1)
        return Computed(after="0", before="4",
                        arithmetic=f"V0's default --swap-space 4 pins 4 GiB of host RAM per GPU worker ({4 * world} GiB "
                                   f"for {world}; the log shows {cpu_blocks} CPU blocks allocated).")
    if raw is None or float(raw) <= 0:
        return None
    world = max(1, ctx.signals.get("world_size") or 1)
    return Computed(after="0", before=raw,
                    arithmetic=f"--swap-space {raw} pins {raw} GiB of host RAM per GPU worker ({float(raw) * world:.0f} GiB for {world}).")


@formula
def shm_size(ctx: Context) -> Computed | None:
    s = ctx.signals
    if s.get("has_shm_volume") and not s.get("shm_volume_short") \
            and not (s.get("shm_required_mib") and s.get("shm_free_mib") is not None):
        return None
    ranks = max(2, (s.get("world_size") or 1) * (s.get("data_parallel_size") or 1))
    need_gib = max(2, ranks)
    why = f"{ranks} communicating processes x 1 GiB (NCCL and vLLM's shared-memory queues), at least 2 GiB as vLLM's docs use"
    if s.get("shm_required_mib"):
        stated = s.get("shm_required_mib")
        need_gib = max(need_gib, math.ceil(stated * 4 / 1024))
        why += f"; the log asked for {stated:.0f} MiB, x4 headroom"
    current = None
    shm = ctx.pod.shm_volume or {}
    if shm:
        current = str((shm.get("emptyDir") or {}).get("sizeLimit") or "unbounded")
        limit_now = parse_quantity(current) if current != "unbounded" else None
        if limit_now and need_gib * 2**30 <= limit_now:
            # the mounted limit already holds the estimate and still ran out: double it
            need_gib = math.ceil(limit_now * 2 / 2**30)
            why += f"; the mounted {current} ran out, so twice that"
    limit = s.get("memory_limit_bytes")
    if limit:
        cap = max(2, int(limit / 4 / 2**30))
        if need_gib > cap:
            need_gib = cap
            why += f"; capped at a quarter of the {limit / 2**30:.0f} GiB memory limit (memory-backed emptyDir counts against it)"
    if current and (parse_quantity(current) or 0) >= need_gib * 2**30:
        return None  # nothing larger fits the container's memory limit
    return Computed(after=f"{need_gib}Gi", before=current,
                    arithmetic=f"the container runtime gives /dev/shm 64 MiB by default; {why} = emptyDir medium Memory, sizeLimit {need_gib}Gi.")


@formula
def startup_probe_for_load(ctx: Context) -> Computed | None:
    container = ctx.pod.container
    if container is None:
        return None
    raw_container = pick_container(ctx.raw_pod or {}, container.name) or {}
    startup = raw_container.get("startupProbe") or {}
    if startup and not ctx.signals.get("startup_probe_failed"):
        return None  # a startup probe that did not fail is not what killed it
    source = startup or raw_container.get("livenessProbe") or {}
    handler = {k: v for k, v in source.items() if k in {"httpGet", "tcpSocket", "exec", "grpc"}} or {
        "httpGet": {"path": "/health", "port": 8000}}
    period = 10
    lived = container.last_finished_after_seconds
    budget = container.liveness_budget_seconds
    if startup:
        budget = int(startup.get("initialDelaySeconds", 0)) + int(startup.get("periodSeconds", 10)) * int(
            startup.get("failureThreshold", 3))
    observed = lived or budget or 90
    pct = ctx.signals.get("weights_progress_pct")
    if pct and 0 < pct < 100:
        estimate = observed * 100 / pct * 1.5
        why = (f"the container was killed after {observed:.0f} s with weights {pct}% loaded; {observed:.0f} / {pct}% "
               f"x 1.5 for profiling and CUDA graphs = {estimate:.0f} s")
    else:
        estimate = observed * 3
        why = f"the container was killed after {observed:.0f} s while still loading; 3 x {observed:.0f} = {estimate:.0f} s"
    window = int(min(3600, max(600, math.ceil(estimate / 60) * 60)))
    threshold = window // period
    probe = {**handler, "periodSeconds": period, "failureThreshold": threshold}
    if startup and budget is not None and threshold * period <= budget:
        return None
    before = json.dumps(startup, separators=(",", ":")) if startup else None
    return Computed(after=json.dumps(probe, separators=(",", ":")), before=before,
                    arithmetic=f"{why}; a startupProbe allows {threshold} x {period} s = {window} s (at least 10 minutes) "
                               f"before the liveness probe starts counting.")


@formula
def expandable_segments(ctx: Context) -> Computed | None:
    s = ctx.signals
    env = alloc_env(ctx)
    if s.get("sleep_mode") or s.get("alloc_conf_set") or env is None:
        return None  # (env None: this device's allocator has no expandable segments to turn on)
    container = ctx.pod.container
    current = container.env.get(env) if container else None
    new = f"{current},expandable_segments:True" if current else "expandable_segments:True"
    unalloc, tried = s.get("oom_reserved_unallocated_gib"), s.get("oom_tried_gib")
    text = "PyTorch's caching allocator had the memory but in pieces too small"
    if unalloc is not None and tried is not None:
        text = (f"{gib(unalloc)} was reserved by PyTorch but unallocated, more than the {gib(tried)} requested: "
                f"the memory was there but fragmented")
    return Computed(after=new, before=current,
                    arithmetic=text + "; expandable segments let the allocator grow blocks instead of splitting them.")


# ---- values written in the playbook -------------------------------------------------------


def current_value(ctx: Context) -> str | None:
    """The value the change's target has now in the container (None when it is not set)."""
    target, container = ctx.target, ctx.pod.container
    if target is None:
        return None
    if target.kind == "flag":
        return ctx.cmd.get(target.name)
    if container is None:
        return None
    if target.kind == "env":
        return container.env.get(target.name)
    if target.kind == "resources":
        section, _, key = target.name.partition(".")
        return (container.limits if section == "limits" else container.requests).get(key)
    if target.kind == "volume":  # the pod view follows the one memory volume that matters: /dev/shm
        volume = ctx.pod.shm_volume if target.name == "/dev/shm" else None
        return str((volume.get("emptyDir") or {}).get("sizeLimit") or "unbounded") if volume else None
    raw_container = pick_container(ctx.raw_pod or {}, container.name) or {}
    probe = raw_container.get(target.name)  # kind probe: startupProbe, livenessProbe, ...
    return json.dumps(probe, separators=(",", ":")) if probe else None


def _same_value(a: str, b: str) -> bool:
    """Equal as written, or the same boolean spelled differently ("True" and "true")."""
    a, b = a.strip(), b.strip()
    return a == b or (a.lower() == b.lower() and a.lower() in {"true", "false"})


@formula
def constant(ctx: Context, *, value: str, reason: str) -> Computed | None:
    """The value the playbook writes; nothing to change when the container already has it."""
    before = current_value(ctx)
    if before is not None and _same_value(before, value):
        return None
    return Computed(after=value, before=before, arithmetic=reason.strip().rstrip(".") + ".")


# Formulas kept in their own modules register themselves on import.
from bot.diagnosis import flag_drift, named_bounds  # noqa: E402,F401  (drop_unrecognized_flags, bound_vllm_named)
