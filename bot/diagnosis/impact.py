"""What a proposed change does to the budget, and the answer to the obvious alternative. Pure.

Every proposal that touches the memory budget (a flag vLLM sizes memory from, or the pod's GPU
count) gets the budget as it ran and with the change, from the same `Budget` the table and the
memory picture are drawn from. And the alternative an engineer asks first at 3 a.m. ("why not
raise --gpu-memory-utilization?", "why not just shorten the context?") is answered with that
budget's figures, never with a separate estimate.
"""

from __future__ import annotations

from typing import Any

from bot.diagnosis.budget import Config, Fit
from bot.diagnosis.levers import MemoryModel
from bot.diagnosis.models import Change, revised

# The flags the budget reads, and how each is stored in a Config.
_INT_FLAGS = {"--max-model-len": "max_model_len", "--max-num-seqs": "max_num_seqs",
              "--max-num-batched-tokens": "max_num_batched_tokens", "--tensor-parallel-size": "tensor_parallel_size",
              "--pipeline-parallel-size": "pipeline_parallel_size", "--kv-cache-memory-bytes": "kv_cache_memory_bytes"}
_FLOAT_FLAGS = {"--gpu-memory-utilization": "gpu_memory_utilization", "--cpu-offload-gb": "cpu_offload_gb"}
_TEXT_FLAGS = {"--kv-cache-dtype": "kv_cache_dtype", "--quantization": "quantization", "--dtype": "dtype"}
HIGHEST_UTILIZATION = 0.95  # the most anyone should give vLLM: the rest is the CUDA context's and the driver's


def _number(text: str | None, kind: type[int] | type[float]) -> int | float | None:
    try:
        return kind(str(text)) if text is not None else None
    except ValueError:
        return None


def _update(change: Change) -> dict[str, Any] | None:
    """The Config fields one change sets; None when the budget does not read it."""
    name = change.name
    if change.kind == "resources" and name.startswith("limits.") and name.endswith("/gpu"):
        count = _number(change.after, int)
        return {"gpu_count": count} if count else None
    if change.kind != "flag":
        return None
    if name == "--enforce-eager":
        return {"enforce_eager": change.after is not None and change.after.lower() != "false"}
    for table, kind in ((_INT_FLAGS, int), (_FLOAT_FLAGS, float)):
        if name in table:
            value = _number(change.after, kind)
            return {table[name]: value} if value is not None else None
    if name in _TEXT_FLAGS:
        return {_TEXT_FLAGS[name]: change.after or ("auto" if name == "--kv-cache-dtype" else None)}
    return None


def after_config(ran: Config, changes: list[Change]) -> Config | None:
    """The configuration the proposal would run; None when no change touches the budget."""
    updates = [u for u in (_update(c) for c in changes) if u]
    if not updates:
        return None
    merged: dict[str, Any] = {}
    for u in updates:
        merged.update(u)
    return revised(ran, **merged)


def lever_of(changes: list[Change]) -> str:
    return ", ".join(f"{c.name} {c.after if c.after is not None else '(removed)'}" for c in changes
                     if _update(c) is not None)


def record_change(model: MemoryModel, changes: list[Change]) -> None:
    """Give every budget-touching proposal its 'with the change' column: the formulas that search
    levers (TP, quantization) record theirs; the others (context length, utilization, eager
    mode, batch size) are fitted here with the same budget."""
    if not changes or model.chosen is not None:
        return
    config = after_config(model.ran, changes)
    if config is None or config == model.ran:
        return
    model.consider(lever_of(changes), model.budget.fits(config), True)


def _gib(value: float) -> str:
    return f"{value:.2f} GiB"


def _changed(changes: list[Change], name: str) -> Change | None:
    return next((c for c in changes if c.kind == "flag" and c.name == name), None)


def alternative(model: MemoryModel, changes: list[Change]) -> str:
    """One sentence answering the obvious alternative to this proposal, from the budget; "" when
    the budget cannot say (no GPU size or weights) or the change is not about the KV budget."""
    base = model.baseline()
    if base.verdict == "unknown" or "capacity" not in base.figures:
        return ""
    util = _changed(changes, "--gpu-memory-utilization")
    if util is not None:
        raised = (_number(util.after, float) or 0) > base.figures["utilization"].value
        return _shorter_context_instead(base) if raised else ""
    if _changed(changes, "--tensor-parallel-size") is not None or _changed(changes, "--quantization") is not None:
        return _utilization_for_weights(model, base)
    if _changed(changes, "--max-model-len") is not None:
        return _more_utilization_instead(model, base)
    return ""


def _ceiling(model: MemoryModel, base: Fit) -> tuple[float, float]:
    """(the highest utilization this GPU allows, GiB held by other processes)."""
    capacity, others = base.figures["capacity"].value, base.figures["others"].value
    room = (capacity - others) / capacity if capacity else 0.0
    return round(min(HIGHEST_UTILIZATION, int(room * 100) / 100), 2), others


def _more_utilization_instead(model: MemoryModel, base: Fit) -> str:
    ran_util = base.figures["utilization"].value
    ceiling, others = _ceiling(model, base)
    flag = "raising --gpu-memory-utilization"
    if model.ran.kv_cache_memory_bytes and base.kv_available_gib is not None:
        return (f"{flag} cannot help: --kv-cache-memory-bytes pins the KV cache at {_gib(base.kv_available_gib)}, "
                "whatever the utilization.")
    if ceiling <= ran_util:
        if ceiling < HIGHEST_UTILIZATION:
            return (f"{flag} cannot help: {_gib(others)} of this GPU is held by another process, "
                    f"so {ceiling:g} is the most vLLM can ask for and it runs at {ran_util:g}.")
        return (f"{flag} cannot help: it is {ran_util:g} already; above {HIGHEST_UTILIZATION:g} nothing is "
                "left for the CUDA context and the driver.")
    fit = model.budget.fits(revised(model.ran, gpu_memory_utilization=ceiling))
    length, tokens = fit.figures.get("max_model_len"), fit.max_len_that_fits
    if length is None or tokens is None or fit.kv_available_gib is None:
        return ""
    held = f"{tokens:,} tokens ({fit.kv_available_gib:.2f} GiB)"
    if tokens < length.value:
        return (f"{flag} alone is not enough: at {ceiling:g} the KV cache would hold {held}, "
                f"fewer than the {int(length.value):,} of --max-model-len.")
    if fit.fits:
        spare = f", {_gib(fit.margin_gib)} to spare" if fit.margin_gib is not None else ""
        return (f"{flag} to {ceiling:g} would also start: the KV cache would hold {held}{spare}; "
                "the proposal keeps the memory as it ran.")
    return (f"{flag} to {ceiling:g} would make room for the context: {held}, but it fails at "
            f"{(fit.first_failure or '?').replace('_', ' ')}{_short(fit)}.")


def _short(fit: Fit) -> str:
    return f" ({-fit.margin_gib:.2f} GiB short)" if fit.margin_gib is not None and fit.margin_gib < 0 else ""


def _shorter_context_instead(base: Fit) -> str:
    kv = base.kv_available_gib
    if kv is None:
        return ""
    util = base.figures["utilization"].value
    flag = "lowering --max-model-len"
    if kv <= 0:
        return (f"{flag} alone is not enough: at {util:g} nothing is left for the KV cache "
                f"({kv:.2f} GiB after the weights and the profiling peak), whatever the length.")
    tokens = base.max_len_that_fits
    if tokens is None or tokens <= 0:
        return ""
    return (f"{flag} to {tokens:,} would also start at {util:g} (a KV cache of {kv:.2f} GiB), but refuses "
            "every longer request; the proposal keeps the context.")


def _utilization_for_weights(model: MemoryModel, base: Fit) -> str:
    weights = base.figures.get("weights")
    if weights is None:
        return ""
    capacity, others = base.figures["capacity"].value, base.figures["others"].value
    if weights.value >= capacity - others:
        return (f"raising --gpu-memory-utilization cannot help: the weights alone ({_gib(weights.value)} per GPU) "
                f"need more than the GPU's {_gib(capacity - others)}.")
    ceiling, _ = _ceiling(model, base)
    fit = model.budget.fits(revised(model.ran, gpu_memory_utilization=ceiling))
    if fit.fits:
        return (f"raising --gpu-memory-utilization to {ceiling:g} would also start on the GPUs it has "
                f"({fit.max_len_that_fits or 0:,} tokens of KV cache).")
    return (f"raising --gpu-memory-utilization to {ceiling:g} is not enough: it fails at "
            f"{(fit.first_failure or '?').replace('_', ' ')}{_short(fit)}.")
