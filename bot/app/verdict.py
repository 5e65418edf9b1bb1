"""The rollout verdict, written once: what the pods, logs and answers a cluster adapter observed
mean for an applied change. No I/O here: the adapter (bot.kube.verify) polls and reads, and hands
what it saw to these functions; the one diagnoser is passed in by the caller (bot.app.rollout
passes the service's own, with the operator's playbooks), never chosen here.

Steps: (1) a new pod of the current template Ready, or crashed (diagnosed again), or neither
within the time given; (2) vLLM's own KV-cache line in the Ready pod's log; (3) a completion
request answered; (4) a soak window without a restart or a crash; then the GPU memory over the
soak: a climbing trend ends as "running, memory climbing", never as verified.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bot.app.records import (
    CompletionCheck,
    GpuMemory,
    MemoryReading,
    MemoryTrend,
    PodState,
    Verification,
    VerifyOutcome,
)
from bot.diagnosis.logfacts import PATTERNS
from bot.diagnosis.models import DiagnosisResult, Evidence

Diagnoser = Callable[[Evidence], DiagnosisResult]

CRASH_REASONS = {"CrashLoopBackOff", "Error", "OOMKilled", "ContainerCannotRun", "StartError",
                 "CreateContainerError", "RunContainerError"}


def kv_figures(log_text: str) -> tuple[str | None, str | None]:
    """vLLM's own KV-cache line(s) and maximum-concurrency line from a log (last occurrence wins).

    The formats are the diagnosis core's (bot.diagnosis.logfacts): one definition of what vLLM prints.
    """
    def last(*names: str) -> str | None:
        found = [m for name in names for m in PATTERNS[name].finditer(log_text)]
        return max(found, key=lambda m: m.start()).group(0) if found else None

    # Prefer the token count; add the memory line when vLLM printed both.
    parts = [p for p in (last("kv_tokens", "gpu_blocks"), last("available_kv")) if p]
    return ("; ".join(parts) or None), last("concurrency")


def pod_state(pod: dict[str, Any], container: str) -> PodState:
    """Ready, crashed (a crash reason, a non-zero exit, or a restart after a termination), or pending."""
    status = pod.get("status") or {}
    if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return PodState.READY
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        waiting = (cs.get("state") or {}).get("waiting") or {}
        terminated = (cs.get("state") or {}).get("terminated") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        if waiting.get("reason") in CRASH_REASONS:
            return PodState.CRASHED
        if terminated and terminated.get("exitCode", 0) != 0:
            return PodState.CRASHED
        if last and int(cs.get("restartCount") or 0) > 0:
            return PodState.CRASHED
    return PodState.PENDING


def why_not_ready(pod: dict[str, Any], container: str) -> str:
    """What a pending pod waits for: unschedulable (e.g. not enough nvidia.com/gpu), image pull, loading."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"not scheduled: {cond.get('message') or cond.get('reason')}"
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if cs.get("name") == container and waiting:
            return f"waiting: {waiting.get('reason')}"
    return f"{status.get('phase', 'Pending')}, not Ready yet"


def settled_pod(pods: list[dict[str, Any]], container: str) -> tuple[str, PodState] | None:
    """The first of `pods` (newest first) that is Ready or crashed, with its state; None: all pending."""
    for pod in pods:
        state = pod_state(pod, container)
        if state is not PodState.PENDING:
            return pod["metadata"]["name"], state
    return None


def no_rollout(kind: str, name: str) -> Verification:
    return Verification(outcome=VerifyOutcome.UNKNOWN, message=f"{kind} {name}: no rollout to follow")


def ready(pod: str, where: str, log_text: str) -> Verification:
    """Step 1 passed; step 2 is whether vLLM printed its KV-cache figures (the caller reads them)."""
    kv, conc = kv_figures(log_text)
    figures = "; ".join(x for x in (kv, conc) if x) or "vLLM printed no KV-cache figures"
    return Verification(outcome=VerifyOutcome.READY, pod=pod, kv_cache_line=kv, concurrency_line=conc,
                        message=f"new pod {pod}{where} is Ready: {figures}")


def crashed(pod: str, where: str, diagnosis: DiagnosisResult | None) -> Verification:
    """None: the caller had no diagnoser to give (a terminal command); the crash is still the news."""
    why = diagnosis.title if diagnosis else "not diagnosed (no diagnoser given)"
    return Verification(outcome=VerifyOutcome.CRASHED, pod=pod, diagnosis=diagnosis,
                        message=f"new pod {pod}{where} crashed again: {why}")


def timed_out(kind: str, name: str, timeout_seconds: float, pods: list[dict[str, Any]],
              container: str) -> Verification:
    seen = ", ".join(f"{p['metadata']['name']}: {why_not_ready(p, container)}" for p in pods) or "no new pod yet"
    return Verification(outcome=VerifyOutcome.TIMEOUT, message=f"{kind} {name}: neither Ready nor crashed after "
                        f"{timeout_seconds:g}s ({seen}); vLLM can take many minutes to load")


def restarts(pod: dict[str, Any], container: str) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            return int(cs.get("restartCount") or 0)
    return 0


def broke_during_soak(start: dict[str, Any], now: dict[str, Any], container: str) -> bool:
    """The pod restarted or crashed since the soak began."""
    return restarts(now, container) > restarts(start, container) or pod_state(now, container) is PodState.CRASHED


def soak_crashed(pod: str, diagnosis: DiagnosisResult) -> Verification:
    return Verification(outcome=VerifyOutcome.CRASHED, pod=pod, diagnosis=diagnosis,
                        message=f"{pod} crashed during the soak: {diagnosis.title}")


def soak_clean(pod: str, seconds: float) -> Verification:
    return Verification(outcome=VerifyOutcome.READY, pod=pod, message=f"{pod}: no restart and no crash in {seconds:g} s")


def completion_answered(pod: str, model: str | None, code: int, text: str, latency: float) -> CompletionCheck | str:
    """Step 3 from the pod's answer: a passed check, or why it failed (the caller re-diagnoses)."""
    if code != 200:
        return f"the completion request got HTTP {code}: {error_text(text)}"
    answer = json.loads(text)
    tokens = (answer.get("usage") or {}).get("completion_tokens")
    return CompletionCheck(ok=True, model=model, latency_seconds=round(latency, 3), tokens=tokens,
                           message=f"a completion request to {pod} (model {model}) returned "
                                   f"{tokens} tokens in {latency:.2f} s")


def completion_failed(model: str | None, why: str, diagnosis: DiagnosisResult | None) -> CompletionCheck:
    return CompletionCheck(ok=False, model=model, message=why, diagnosis=diagnosis)


def error_text(text: str) -> str:
    """The error a server put in its JSON answer (vLLM's "message", FastAPI's "detail"), else the text."""
    try:
        doc = json.loads(text)
        return str(doc.get("message") or doc.get("detail") or text)[:300]
    except (ValueError, AttributeError):
        return text[:300]


# ---- GPU memory over the soak -------------------------------------------------------------

WARN_FRACTION = 0.95  # a peak this close to the card leaves no room for a longer request
CLIMB_HORIZON_HOURS = 1.0  # climbing: at the soak's slope the card is full within this


def gpu_trend(capacity_gib: float | None, peak_gib: float, end_gib: float, slope_gib_per_hour: float) -> MemoryTrend:
    """Climbing when the card would be full within CLIMB_HORIZON_HOURS at the soak's slope ("a slow
    climb points to fragmentation or a KV cache sized too close to the limit", as the seeds say);
    near the limit when the peak came within WARN_FRACTION of the card; else stable."""
    if capacity_gib and slope_gib_per_hour > 0 and (capacity_gib - end_gib) / slope_gib_per_hour < CLIMB_HORIZON_HOURS:
        return MemoryTrend.CLIMBING  # first: a climb that has reached the limit is still a climb
    if capacity_gib and peak_gib >= WARN_FRACTION * capacity_gib:
        return MemoryTrend.NEAR_LIMIT
    return MemoryTrend.STABLE


_WORST = [MemoryTrend.CLIMBING, MemoryTrend.NEAR_LIMIT, MemoryTrend.STABLE]


def memory_reading(gpus: list[GpuMemory]) -> MemoryReading:
    """The pod's GPUs over the soak: the worst trend of them decides."""
    trend = next(t for t in _WORST if t is MemoryTrend.STABLE or any(g.trend is t for g in gpus))
    return MemoryReading(trend=trend, gpus=gpus,
                         text="GPU memory over the soak:\n" + "\n".join(g.line() for g in gpus))


def memory_unmeasured(why: str) -> MemoryReading:
    return MemoryReading(trend=MemoryTrend.UNMEASURED, text=f"GPU memory over the soak: not measured ({why})")


def memory_climbing(pod: str, reading: MemoryReading) -> Verification:
    """Ready, serving and soaked, but memory climbed: running, not verified; the numbers and what to do."""
    climbing = [g for g in reading.gpus if g.trend is MemoryTrend.CLIMBING]
    figures = "; ".join(_climb(g) for g in climbing)
    return Verification(outcome=VerifyOutcome.MEMORY_CLIMBING, pod=pod, message=(
        f"{pod} is running, but its GPU memory climbed over the soak: {figures}. Not verified. Suggestion: "
        "watch it for the next hour; if it keeps climbing, roll back, or lower --gpu-memory-utilization by 0.05 "
        "to leave the card headroom (a steady climb points to fragmentation or a KV cache sized too close "
        "to the limit)."))


def _climb(g: GpuMemory) -> str:
    to_full = g.hours_to_full
    full = f", full in about {to_full * 60:.0f} min at this rate" if to_full is not None else ""
    cap = f" of {g.capacity_gib:.1f}" if g.capacity_gib else ""
    return (f"GPU {g.gpu} {g.start_gib:.1f} -> {g.end_gib:.1f} GiB{cap} "
            f"({g.slope_gib_per_hour:+.2f} GiB/h{full})")
