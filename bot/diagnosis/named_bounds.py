"""The bound vLLM itself names for one of its flags, as a proposal.

vLLM's error messages often say what to change and by how much: "Please lower max_num_seqs to at
most 854 or increase gpu_memory_utilization" (a hybrid model's Mamba cache), "max_num_batched_tokens
(2048) is smaller than max_model_len (4096). Please increase max_num_batched_tokens". The log
reader turns any such sentence into a bound per flag (`read_flag_bounds` in
bot.diagnosis.logformats, fact `vllm_error_bounds`); this formula proposes the first bound whose
flag the playbook allows, and only when the pod's current value breaks it.
"""

from __future__ import annotations

from typing import Any

from bot.diagnosis.cmdline import canonical
from bot.diagnosis.formulas import Computed, Context, formula
from bot.diagnosis.models import Change

_UTILIZATION_CAP = 0.98  # above this vLLM leaves nothing for the CUDA context


def _current(ctx: Context, flag: str) -> tuple[float | None, str | None]:
    """The flag's value now: the command line, else the engine config vLLM logged."""
    raw = ctx.cmd.get(flag)
    if raw is not None:
        try:
            return float(raw), raw
        except ValueError:
            return None, raw
    logged = ctx.signals.get("config_" + flag[2:].replace("-", "_"))
    if logged is not None:
        return float(logged), None
    return None, None  # a default is not guessed: the error says the value in force broke the bound


def _proposal(ctx: Context, flag: str, bound: dict[str, Any]) -> Computed | None:
    current, raw = _current(ctx, flag)
    if "at_most" in bound:
        value = bound["at_most"]
        if current is not None and current <= value:
            return None  # the pod already keeps the bound: vLLM's number is not what failed
        how = f"the error says {flag} must be at most {value:g}"
    else:
        value = bound["at_least"]
        if current is not None and current >= value:
            return None
        if flag == "--gpu-memory-utilization" and value > _UTILIZATION_CAP:
            return None
        how = f"the error says {flag} must be at least {value:g}"
    before = raw if raw is not None else (f"{current:g}" if current is not None else None)
    after = f"{value:g}" if isinstance(value, float) else str(value)
    change = Change(kind="flag", name=flag, before=before, after=after)
    was = f" (now {before})" if before is not None else ""
    return Computed(after=after, before=before, arithmetic=f"{how}; set to that bound{was}.", changes=(change,))


@formula
def bound_vllm_named(ctx: Context, *, flags: str) -> Computed | None:
    """The first flag an error names with a bound, when it is one of `flags` (space-separated)."""
    allowed = {canonical(f) for f in flags.split()}
    bounds: dict[str, dict[str, Any]] = ctx.facts.get("vllm_error_bounds") or {}
    for flag, bound in bounds.items():
        if canonical(flag) in allowed:
            proposal = _proposal(ctx, canonical(flag), bound)
            if proposal is not None:
                return proposal
    return None
