"""Plain-text renderings for the terminal (and the monospace parts of the chat message)."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.diagnosis.budget import Fit
    from bot.diagnosis.levers import MemoryModel
    from bot.diagnosis.models import DiagnosisResult
    from bot.diagnosis.signals import Signals

BAR_WIDTH = 48
SEGMENTS = [  # (label, bar character)
    ("other processes", "o"),
    ("weights", "W"),
    ("activations", "a"),
    ("non-torch", "n"),
    ("CUDA graphs", "g"),
    ("KV cache", "K"),
]


def memory_picture(signals: Signals, kv_gib: float | None = None) -> str:
    """One GPU's budget from the numbers the log gave; empty when it gave too few. `kv_gib`: the
    budget's KV pool as it ran (the log's own, or its blocks x bytes per token), so the picture and
    the budget table show one KV figure."""
    total = signals.get("gpu_total_gib")
    if not total:
        return ""
    weights = signals.get("weights_gib")
    activation = signals.get("activation_gib")
    parts = {
        "other processes": signals.get("other_processes_gib") or (
            max(0.0, total - signals.get("free_at_start_gib")) if signals.get("free_at_start_gib") is not None else None),
        "weights": weights,
        "activations": activation,
        "non-torch": signals.get("non_torch_gib"),
        "CUDA graphs": signals.get("graph_gib"),
        "KV cache": kv_gib if kv_gib is not None and kv_gib > 0 else None,
    }
    if not any(parts[k] for k in ("weights", "activations", "KV cache")) and signals.get("oom_tried_gib") is not None:
        return _oom_picture(signals, total)
    known = {k: v for k, v in parts.items() if v}
    if not known:
        return ""
    used = sum(known.values())
    free = max(0.0, total - used)
    bar, lines = "", []
    for label, ch in SEGMENTS:
        v = known.get(label)
        if v:
            bar += ch * max(1, round(v / total * BAR_WIDTH))
            lines.append(f"  {ch} {label:<16}{v:>8.2f} GiB")
    bar = bar[:BAR_WIDTH].ljust(BAR_WIDTH, ".")
    lines.append(f"  . {'free / unknown':<16}{free:>8.2f} GiB")
    util = signals.get("gpu_memory_utilization")
    head = f"GPU {total:.2f} GiB  [{bar}]"
    if util:
        mark = min(BAR_WIDTH, round(util * BAR_WIDTH))
        head += f"\n{' ' * (len(f'GPU {total:.2f} GiB  [') + mark - 1)}^ gpu-memory-utilization {util}"
    return "\n".join([head] + lines)


def _oom_picture(signals: Signals, total: float) -> str:
    """What PyTorch's out-of-memory message says about the GPU at the moment it failed."""
    free = signals.get("oom_free_gib") or 0.0
    others = signals.get("other_processes_gib") or 0.0
    pytorch = (signals.get("oom_allocated_gib") or 0.0) + (signals.get("oom_reserved_unallocated_gib") or 0.0)
    if others < 2.0:  # below this it is vLLM's own CUDA context and NCCL buffers
        others = 0.0
    rest = max(0.0, total - free - others - pytorch)
    rows = [("o", "other processes", others), ("P", "PyTorch (vLLM)", pytorch), ("n", "non-PyTorch", rest)]
    bar = "".join(ch * round(v / total * BAR_WIDTH) for ch, _, v in rows if v > 0)[:BAR_WIDTH].ljust(BAR_WIDTH, ".")
    lines = [f"GPU {total:.2f} GiB at the OOM  [{bar}]"]
    lines += [f"  {ch} {label:<16}{v:>8.2f} GiB" for ch, label, v in rows if v > 0]
    lines.append(f"  . {'free':<16}{free:>8.2f} GiB   (asked for {signals.get('oom_tried_gib'):.2f} GiB more)")
    return "\n".join(lines)


def command_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv) if argv else "(not known: no pod spec)"


def render_text(d: DiagnosisResult) -> str:
    where = "/".join(x for x in (d.namespace, d.pod) if x) or "(log only)"
    out = [f"vLLM crash diagnosis: {where}" + (f" container {d.container}" if d.container else "")]
    context = [x for x in (f"node {d.node}" if d.node else "", d.gpu or "", f"restarts {d.restarts}" if d.restarts else "") if x]
    if context:
        out.append("  " + ", ".join(context))
    out.append("")
    out.append(f"Cause: {d.cause or 'no known cause'} - {d.title}")
    if d.stage:
        out.append("Died during: " + ("serving, after start-up finished" if d.stage == "ready" else d.stage.replace("_", " ")))
    out.append("")
    out.append(d.explanation)
    if d.evidence:
        out.append("")
        out.append("Evidence from the log:")
        out.extend(f"  | {line}" for line in d.evidence)
    if d.memory_picture:
        out.append("")
        out.append("GPU memory:")
        out.append(d.memory_picture)
    out.append("")
    if d.changes:
        out.append("Proposed change:")
        for c in d.changes:
            out.append(f"  {c.kind} {c.name}: {c.before if c.before is not None else '(not set)'} -> {c.after}")
        out.append("")
        out.append("  before: " + command_line(d.command_before))
        if d.command_after and d.command_after != d.command_before:
            out.append("  after:  " + command_line(d.command_after))
        other = [c for c in d.changes if c.kind != "flag"]
        for c in other:
            if c.kind == "probe" and c.after:
                out.append(f"  {c.name}: {json.dumps(json.loads(c.after))}")
        if d.alternative:
            out.append("")
            out.append("Instead? " + d.alternative)
    else:
        out.append("No change proposed.")
    out.extend(advice_lines(d))
    out.extend(_findings(d))
    return "\n".join(out)


def advice_lines(d: DiagnosisResult) -> list[str]:
    """The advice, one item a paragraph: what, the changes it would take, its node selector YAML."""
    if not d.advice:
        return []
    out = ["", "Advice (not a change to approve):"]
    for a in d.advice:
        out.append(f"  - {a.text}")
        out += [f"      would set {c.name}: {c.after}" for c in a.changes]
        out += [f"      {line}" for line in (a.yaml or "").splitlines()]
    return out


def _findings(d: DiagnosisResult) -> list[str]:
    """Pod-spec faults beside the cause: what, why, and the change that would fix each."""
    out: list[str] = []
    for f in d.findings:
        out += ["", f"Also: {f.title} ({f.kind.value})", f"  {f.text}"]
        out += [f"  would change {c.kind} {c.name}: {c.before if c.before is not None else '(not set)'} -> {c.after}"
                for c in f.changes]
    return out


def _verdict(fit: Fit) -> str:
    if fit.verdict == "unknown":
        return "not judged"
    if fit.fits:
        return f"fits, {fit.margin_gib:.2f} GiB to spare" if fit.margin_gib is not None else "fits"
    return f"fails at {(fit.first_failure or '?').replace('_', ' ')}" + (
        f" ({-fit.margin_gib:.2f} GiB short)" if fit.margin_gib is not None and fit.margin_gib < 0 else "")


TAGS = {"measured: vLLM's log": "(log)", "measured, then this change": "(log + change)", "estimate": "(estimate)"}


def _column(fit: Fit) -> list[str]:
    """One column of the budget table; the KV pool and the tokens say whether vLLM measured them."""
    f = fit.figures
    kv = f"{fit.kv_available_gib:.2f} GiB {TAGS.get(fit.kv_source, '')}".rstrip() if fit.kv_available_gib is not None else "?"
    length = (f"{fit.max_len_that_fits:,} {TAGS.get(fit.tokens_source, '')}".rstrip()
              if fit.max_len_that_fits is not None else "?")
    return [f"{f['weights'].value:.2f} GiB" if "weights" in f else "?", kv, length, _verdict(fit)]


def budget_picture(model: MemoryModel | None, proposed: bool) -> str:
    """The GPUs granted, the budget before/after the chosen lever, what fits, and what was not chosen."""
    if model is None:
        return ""
    base = model.baseline()
    if base.verdict == "unknown" and not model.considered:
        return ""
    lines = [f"GPUs granted: {model.grant.describe()}"] if model.grant.granted else []
    weights = model.weights_gib()
    if weights is not None:
        lines.append(f"Weights: {weights[0]:.2f} GiB per GPU ({weights[1]})")
    chosen = model.chosen if proposed else None
    rows = ["weights per GPU", "KV cache", "tokens that fit", "verdict"]
    before, after = _column(base), _column(chosen.fit) if chosen is not None else None
    lines.append(f"  {'budget per GPU':<18}{'as it ran':<38}{'with the change' if after else ''}".rstrip())
    for i, name in enumerate(rows):
        lines.append(f"  {name:<18}{before[i]:<38}{after[i] if after else ''}".rstrip())
    if chosen is not None:
        from bot.diagnosis.levers import what_fits
        table = what_fits(model)
        if table:
            lines.append(f"What fits ({chosen.lever}):")
            lines += [f"  {label:<36}{_verdict(fit)}" for label, fit in table]
    others = [c for c in model.considered if not c.chosen]
    if others:
        lines.append("Considered and not chosen:")
        lines += [f"  - {lever}: {why}" for lever, why in _grouped_levers(others)[:5]]
    return "\n".join(lines)


def _grouped_levers(considered: list) -> list[tuple[str, str]]:
    """One line per flag and reason: '--cpu-offload-gb 10, 11, 12' rather than a line per step."""
    grouped: list[tuple[str, str]] = []
    for c in considered:
        flag, _, value = c.lever.partition(" ")
        if grouped and value and grouped[-1][1] == c.why_not and grouped[-1][0].split(" ")[0] == flag:
            grouped[-1] = (f"{grouped[-1][0]}, {value}", c.why_not)
        else:
            grouped.append((c.lever, c.why_not))
    return grouped
