"""Evidence in, DiagnosisResult out. Pure: reads the log file, never the network.

Steps: one pass over the log (bot.logfacts) -> signals from log, pod, node and command line
(bot.signals) -> the most specific playbook whose conditions hold (bot.playbooks) -> the
first of its fixes whose values the evidence can compute (bot.formulas) -> the container's
command line before and after (bot.cmdline). No playbook: "no known cause", no change.
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bot.diagnosis import cmdline, impact, levers, podspec, render
from bot.diagnosis.budget import KvSource
from bot.diagnosis.catalogue import CatalogueError, load_bundle_config
from bot.diagnosis.evidence import gpu_summary, node_view, pod_view
from bot.diagnosis.formulas import Computed, Context, NoSafeChange, Target, device_target, run_formula, sentence
from bot.diagnosis.logfacts import LogFacts, extract
from bot.diagnosis.models import Advice, BundleError, Change, DiagnosisResult, Evidence
from bot.diagnosis.playbooks import Condition, Playbook, default_playbooks
from bot.diagnosis.redact import redact
from bot.diagnosis.signals import BENIGN_ERRORS, Signals, compute

log = logging.getLogger(__name__)
MAX_EVIDENCE_LINES = 10
MAX_EVIDENCE_CHARS = 400
MAX_DECISIVE_CHARS = 1500  # the decisive (first) line is quoted whole: vLLM's errors run to ~600 characters


def diagnose(evidence: Evidence, playbooks: Iterable[Playbook] | None = None) -> DiagnosisResult:
    books = list(playbooks) if playbooks is not None else list(default_playbooks())
    facts = _read_log(evidence, books)
    pod = pod_view(evidence)
    node = node_view(evidence)
    container = pod.container
    parsed = cmdline.parse(container.command if container else None, container.args if container else None,
                           container.env if container else None)
    signals = compute(facts, pod, node, parsed)
    memory = levers.build(facts, signals, parsed, evidence.pod, evidence.node, container.name if container else None,
                          _bundle_config(evidence))
    _slice_capacity(memory, signals)
    ctx = Context(signals=signals, facts=facts, cmd=parsed, pod=pod, node=node, raw_pod=evidence.pod, memory=memory)

    base = dict(
        container=container.name if container else None,
        pod=pod.name or None,
        namespace=pod.namespace or None,
        node=pod.node_name or node.name,
        gpu=_gpu_line(memory, node),
        restarts=container.restart_count if container else None,
        command_before=parsed.argv(),
        memory_picture=render.memory_picture(signals, _measured_kv(memory, signals)),
        facts=_public_facts(signals),
        stage=signals.get("stage"),
    )

    if facts.binary:
        return DiagnosisResult(cause=None, title="The log is not text",
                               explanation="The previous container's log holds binary data, so there is nothing to read. "
                                           "No change is proposed.", confidence="low", **base)

    hit_text = _hit_text(facts)
    for book in sorted(books, key=lambda b: -b.priority):
        matched_lines: list[str] = []
        if not all(_holds(c, signals, facts, matched_lines, hit_text) for c in book.when):
            continue
        problem = levers.software_problem(memory, signals)
        fixed: FixResult = ([], [problem], None, [], []) if problem else _first_fix(book, ctx)
        changes, arithmetic, note, cautions, advice = fixed
        impact.record_change(memory, changes)
        picture = _picture(memory, signals, base["memory_picture"], bool(changes))
        new_command, new_args = cmdline.apply_flag_changes(parsed, changes)
        return DiagnosisResult(
            cause=book.id,
            title=book.title,
            explanation=_explain(book, signals, changes, arithmetic, note, cautions, software=bool(problem)),
            evidence=_evidence_lines(book, signals, matched_lines, facts),
            changes=changes,
            confidence=("medium" if cautions and book.confidence == "high" else book.confidence) if changes else "low",
            command_after=list(new_command or []) + list(new_args or []),
            advice=advice,
            alternative=impact.alternative(memory, changes) if changes else "",
            findings=podspec.findings(ctx, book.id),  # last: it may try levers the picture must not list
            **{**base, "memory_picture": picture},
        )

    return _unknown(facts, signals, {**base, "findings": podspec.findings(ctx, None)})


def _read_log(evidence: Evidence, books: list[Playbook]) -> LogFacts:
    """The one pass over the log, looking for every playbook's literals too."""
    try:
        return extract(evidence.log, _literals(books))
    except OSError as exc:
        raise BundleError(f"{evidence.log.describe()}: cannot read the log ({exc.strerror or exc})") from None


# The literals of a list of playbooks, by the playbooks' identities: every alert diagnoses with the
# same few lists (the default one, the operator's), and walking their conditions was ~2% of a
# diagnosis (issue 20). Each entry holds its playbooks, so their ids cannot be reused while it lives.
_LITERALS_BY_BOOKS: dict[tuple[int, ...], tuple[list[Playbook], list[str]]] = {}
_LITERAL_LISTS_KEPT = 16


def _literals(books: list[Playbook]) -> list[str]:
    key = tuple(id(b) for b in books)
    kept = _LITERALS_BY_BOOKS.get(key)
    if kept is None:
        if len(_LITERALS_BY_BOOKS) >= _LITERAL_LISTS_KEPT:
            _LITERALS_BY_BOOKS.clear()
        kept = _LITERALS_BY_BOOKS[key] = (list(books), [lit for b in books for lit in b.literals()])
    return kept[1]


def _measured_kv(memory: levers.MemoryModel, signals: Signals) -> float | None:
    """The KV pool as it ran when vLLM's log measured it (the budget's figure, for the picture);
    the logged figure itself when the budget cannot be judged (no capacity or weights)."""
    base = memory.baseline()
    if base.kv_source == KvSource.LOG:
        return base.kv_available_gib
    return signals.get("available_kv_gib") if base.verdict == "unknown" else None


def _slice_capacity(memory: levers.MemoryModel, signals: Signals) -> None:
    """A MIG slice's size (from the pod's limit and the node's labels) when the log did not print the total."""
    if memory.grant.mig_profile and memory.grant.memory_gib and memory.grant.memory_source != "log":
        signals.set("gpu_total_gib", memory.grant.memory_gib)  # the slice the pod got, not the node's card


def _explain(book: Playbook, signals: Signals, changes: list[Change], arithmetic: list[str], note: str | None,
             cautions: list[str], software: bool = False) -> str:
    # A software problem replaces the playbook's memory story, which its numbers contradict.
    explanation = (f"It looks like this cause ({book.title[0].lower()}{book.title[1:]}), but the numbers say otherwise." if software
                   else _fill(book.explanation, signals))
    if arithmetic:
        explanation += "\n" + "\n".join(arithmetic)
    if note:
        explanation += "\n" + note
    if cautions:
        explanation += "\nCaution: " + " ".join(cautions)
    if not changes and not arithmetic:
        explanation += "\nThe evidence does not hold the numbers to compute a safe change; none is proposed."
    elif not changes:
        explanation += "\nNo change is proposed."
    return explanation


HIT_TEXT_CHARS = 256 * 1024  # a typical log's lines are a few KiB; a large log's are searched line by line


def _hit_text(facts: LogFacts) -> str | None:
    """Every line a `log` condition may match, in one text (a literal it does not hold is in no
    line: one search, not one per line, issue 20); None when that copy would be large."""
    if sum(len(line) + 1 for _, line in facts.hit_lines) > HIT_TEXT_CHARS:
        return None
    return "\n".join(line for _, line in facts.hit_lines)


def _holds(cond: Condition, signals: Signals, facts: LogFacts, matched: list[str], hit_text: str | None) -> bool:
    if cond.log is not None:
        literal = cond.gate() or ""
        if hit_text is not None and literal not in hit_text:
            return False
        regex = re.compile(cond.log)  # re caches compiled patterns
        for _, line in facts.hit_lines:
            if literal in line and regex.search(line):
                matched.append(line)
                return True
        return False
    if cond.any is not None:
        return any(_holds(c, signals, facts, matched, hit_text) for c in cond.any)
    if cond.all is not None:
        return all(_holds(c, signals, facts, matched, hit_text) for c in cond.all)
    if cond.not_ is not None:
        return not _holds(cond.not_, signals, facts, [], hit_text)
    value = signals.get(cond.signal or "")
    if cond.is_ is not None:
        ok = value == cond.is_
    elif cond.in_ is not None:
        ok = value in cond.in_
    elif cond.above is not None or cond.below is not None or cond.at_least is not None or cond.at_most is not None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        ok = ((cond.above is None or value > cond.above) and (cond.below is None or value < cond.below)
              and (cond.at_least is None or value >= cond.at_least) and (cond.at_most is None or value <= cond.at_most))
    else:
        ok = bool(value)
    if ok and cond.signal in signals.lines:
        matched.append(signals.lines[cond.signal])
    return ok


def _picture(memory: levers.MemoryModel, signals: Signals, picture: str, proposed: bool) -> str:
    """The log's memory picture, then the budget's; one weights figure (the budget's) in the whole message."""
    weights = memory.weights_gib()
    if weights is not None and signals.get("weights_estimate_gib") is not None:
        signals.values["weights_estimate_gib"] = round(weights[0], 1)
    return "\n\n".join(p for p in (picture, render.budget_picture(memory, proposed)) if p)


def _bundle_config(evidence: Evidence) -> dict[str, Any] | None:
    """A config.json beside the bundle's log (the model's shape when the catalogue does not know it)."""
    folder = Path(evidence.source) if evidence.source else None
    if folder is None or not folder.is_dir():
        return None
    try:
        return load_bundle_config(folder)
    except CatalogueError as exc:
        log.warning("%s", exc)
        return None


def _gpu_line(memory: levers.MemoryModel, node: Any) -> str | None:
    """The GPUs granted beside the node's: '1 of 8 x NVIDIA-H100-80GB-HBM3 (79.65 GiB)'."""
    grant = memory.grant
    if not grant.granted or not (grant.product or grant.memory_gib):
        return gpu_summary(node)
    return "granted " + grant.describe()


FixResult = tuple[list[Change], list[str], str | None, list[str], list[Advice]]


def _first_fix(book: Playbook, ctx: Context) -> FixResult:
    """The first fix whose values can all be computed; else no change, with the reasons known (and advice)."""
    reasons: list[str] = []
    advice: list[Advice] = []
    for fix in book.fixes:
        computed: list[tuple[Any, Computed]] = []
        for spec in fix.changes:
            try:
                result = run_formula(spec.value, ctx, Target(spec.kind, device_target(ctx, spec.kind, spec.name)), spec.params)
            except NoSafeChange as exc:
                if str(exc) not in reasons:  # two fixes refused for one reason say it once
                    reasons.append(str(exc))
                advice = advice or exc.advice
                break
            except (ArithmeticError, ValueError, TypeError, KeyError) as exc:
                # a formula meeting numbers it did not expect must not cost the diagnosis: no value
                log.warning("formula %s failed on %s: %s", spec.value, book.id, exc)
                result = None
            if result is None and spec.optional:
                continue
            if result is None or not (result.changes or _within_bounds(result.after, spec.min, spec.max)):
                break
            computed.append((spec, result))
        else:
            if not computed:
                continue
            fitted, why = _in_release_spelling([c for spec, r in computed for c in (
                r.changes or [Change(kind=spec.kind, name=device_target(ctx, spec.kind, spec.name), before=r.before,
                                     after=r.after)])], ctx)
            if fitted is None:  # never propose a flag the running vLLM release does not have
                reasons.append(why)
                continue
            changes: list[Change] = []
            arithmetic: list[str] = []
            for _, r in computed:
                if r.changes:  # a placeholder name: the formula named the changes itself
                    changes.extend(fitted[len(changes):len(changes) + len(r.changes)])
                    arithmetic.append(f"Proposed: {sentence(r.arithmetic)}")
                    continue
                c = fitted[len(changes)]
                changes.append(c)
                arithmetic.append(f"Proposed: {c.name} {c.after}. {sentence(r.arithmetic)}" if c.kind != "probe" else
                                  f"Proposed: a {c.name}. {sentence(r.arithmetic)}")
            return changes, arithmetic, fix.note, [r.caution for _, r in computed if r.caution], []
    return [], reasons, None, [], advice


def _in_release_spelling(changes: list[Change], ctx: Context) -> tuple[list[Change] | None, str]:
    from bot.diagnosis.flag_drift import fit_to_release

    container = ctx.pod.container
    return fit_to_release(changes, ctx.signals.get("vllm_version"), container.image if container else None)


def _within_bounds(value: str | None, lo: float | None, hi: float | None) -> bool:
    if value is None:
        return False
    if lo is None and hi is None:
        return True
    m = re.match(r"^(\d+(?:\.\d+)?)", value)
    if not m:
        return True
    number = float(m.group(1))
    return (lo is None or number >= lo) and (hi is None or number <= hi)


class _Blank(string.Formatter):
    def get_value(self, key: Any, args: Any, kwargs: Any) -> Any:
        value = kwargs.get(key)
        return "unknown" if value is None else value

    def format_field(self, value: Any, spec: str) -> str:
        if isinstance(value, float) and not spec:
            return f"{value:,.2f}".rstrip("0").rstrip(".")
        if isinstance(value, int) and not isinstance(value, bool) and not spec:
            return f"{value:,}"
        try:
            return super().format_field(value, spec)
        except (ValueError, TypeError):
            return str(value)


_OPTIONAL = re.compile(r"\[\[(.*?)\]\]", re.S)


def _fill(template: str, signals: Signals) -> str:
    """Fill {signal} names; a [[...]] part is kept only when every signal in it is known."""
    def optional(m: re.Match[str]) -> str:
        names = [f[1] for f in string.Formatter().parse(m.group(1)) if f[1]]
        return m.group(1) if all(signals.get(n) is not None for n in names) else ""

    text = _OPTIONAL.sub(optional, template)
    return re.sub(r"  +", " ", _Blank().format(text, **signals.values)).replace(" .", ".").replace(" ,", ",")


def _evidence_lines(book: Playbook, signals: Signals, matched: list[str], facts: LogFacts) -> list[str]:
    lines: list[str] = []
    for line in matched + [signals.lines.get(name, "") for name in book.evidence]:
        line = (line or "").strip()
        if line and line not in lines:
            lines.append(line)
    if not lines and facts.tail:
        lines = [t.strip() for t in facts.tail[-3:]]
    return _quoted(lines)


# vLLM 0.13+'s "Failed to load model" advice: utilization caps vLLM's budget, it frees nothing for weights.
_WRONG_ADVICE = re.compile(r"Try lowering --gpu-memory-utilization to free memory for weights, increasing")
_ADVICE_DROPPED = "[vLLM's advice to lower --gpu-memory-utilization left out: it frees nothing for weights] Try increasing"


def _quoted(lines: list[str]) -> list[str]:
    """Log lines as they may leave the bot: secrets redacted, bounded in number and length, never
    repeating vLLM's wrong utilization advice."""
    quoted = [redact(_WRONG_ADVICE.sub(_ADVICE_DROPPED, line))[:MAX_DECISIVE_CHARS if i == 0 else MAX_EVIDENCE_CHARS]
              for i, line in enumerate(lines)]
    return list(dict.fromkeys(quoted))[:MAX_EVIDENCE_LINES]


def _unknown(facts: LogFacts, signals: Signals, base: dict[str, Any]) -> DiagnosisResult:
    errors = [e.line for e in facts.errors if e.value not in BENIGN_ERRORS]
    evidence = list(dict.fromkeys(errors[-3:])) if errors else [t.strip() for t in facts.tail[-5:] if t.strip()]
    if facts.byte_count == 0:
        why = "The previous container's log is empty: the container died before printing anything, or its log was rotated away."
    elif not facts.recognised:
        why = ("The log is in a format this bot does not recognise (no vLLM or PyTorch start-up lines). "
               "The last lines are shown below.")
    elif errors and not signals.get("died_before_ready"):
        why = ("vLLM started and reported ready, then failed while serving in a way no playbook recognises "
               "(no out-of-memory figure). The error that killed the engine is shown below; no change is proposed.")
    elif errors:
        why = ("vLLM failed, but not in a way any playbook recognises as a memory or start-up cause. "
               "The error is shown below; no change is proposed.")
    else:
        why = "No crash cause was found in the log; the last lines are shown below. No change is proposed."
    return DiagnosisResult(cause=None, title="No known cause", explanation=why,
                           evidence=_quoted(evidence),
                           confidence="low", **base)


_PUBLIC = ["stage", "engine", "vllm_version", "gpu_total_gib", "weights_gib", "available_kv_gib", "kv_capacity_tokens_effective",
           "max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "pod_gpus", "other_processes_gib",
           "oom_tried_gib", "exit_code"]


def _public_facts(signals: Signals) -> dict[str, Any]:
    return {k: signals.values[k] for k in _PUBLIC if signals.values.get(k) is not None}
