"""Pod-spec checks that run whatever the log says (issue 21).

A log's fatal error (NCCL's "Duplicate GPU detected", an OOM, a KV-cache shortfall) can hide a
fault of the pod itself that will kill the next start as surely: more tensor x pipeline ranks
than devices, no /dev/shm for several ranks, a probe window shorter than the load. Each is a
typed Finding beside the primary cause, with the change that would fix it; the primary cause's
own finding is left out (it is the cause).
"""

from __future__ import annotations

import math
import re

from bot.diagnosis import formulas
from bot.diagnosis.evidence import parse_quantity
from bot.diagnosis.formulas import Computed, Context, NoSafeChange, Target
from bot.diagnosis.models import Change, Finding, FindingKind

# the playbook that already names each finding as its cause
_PRIMARY = {
    FindingKind.PARALLEL_ABOVE_POD_DEVICES: "tensor-parallel-mismatch",
    FindingKind.PARALLEL_ABOVE_NODE_DEVICES: "tensor-parallel-mismatch",
    FindingKind.SHM_MISSING: "shm-too-small",
    FindingKind.SHM_TOO_SMALL: "shm-too-small",
    FindingKind.PROBE_BUDGET_SHORT: "probe-killed-during-load",
}
# LeaderWorkerSet puts the group's size on every pod (annotation) and in its environment
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
LWS_SIZE_ENV = "LWS_GROUP_SIZE"
SHM_FLOOR_GIB = 1.0  # below this a multi-rank /dev/shm fills with NCCL's and vLLM's queues
_SECONDS = re.compile(r"(?:and|took) ([\d.]+) s(?:ec(?:ond)?s?)?\b")


def findings(ctx: Context, primary: str | None) -> list[Finding]:
    """Every pod-spec finding, except the one the primary cause already is."""
    found = [f for f in (_parallel_pod(ctx), _parallel_node(ctx), _shm(ctx), _probe(ctx)) if f is not None]
    return [f for f in found if _PRIMARY[f.kind] != primary]


def group_size(ctx: Context) -> int:
    """Pods in this pod's LeaderWorkerSet group (1 outside one): their devices add up."""
    meta = (ctx.raw_pod or {}).get("metadata") or {}
    raw = ((meta.get("annotations") or {}).get(LWS_SIZE_ANNOTATION)
           or (meta.get("labels") or {}).get(LWS_SIZE_ANNOTATION)
           or (ctx.pod.container.env.get(LWS_SIZE_ENV) if ctx.pod.container else None))
    try:
        return max(1, int(str(raw)))
    except (TypeError, ValueError):
        return 1


def _changes(ctx: Context, kind: str, name: str, formula: str) -> tuple[list[Change], str]:
    """The change a formula computes for this finding, and its arithmetic ('' when none is safe)."""
    try:
        target = formulas.device_target(ctx, kind, name)
        result: Computed | None = formulas.run_formula(formula, ctx, Target(kind, target), {})
    except NoSafeChange as exc:
        return [], str(exc)
    if result is None or result.after is None:
        return [], ""
    return [Change(kind=kind, name=target, before=result.before, after=result.after)], result.arithmetic


def _parallel_pod(ctx: Context) -> Finding | None:
    s = ctx.signals
    world, gpus = s.get("world_size") or 1, s.get("pod_gpus")
    size = group_size(ctx)
    if gpus is None or world <= gpus * size:
        return None
    have = f"{gpus} device(s)" + (f" x {size} pods in its LeaderWorkerSet group = {gpus * size}" if size > 1 else "")
    text = (f"--tensor-parallel-size {s.get('tensor_parallel_size')} x --pipeline-parallel-size "
            f"{s.get('pipeline_parallel_size')} = {world} ranks, one device each, but the pod has {have}: vLLM "
            f"cannot start them all (NCCL then reports duplicate GPUs or an invalid device ordinal).")
    changes, why = _changes(ctx, "flag", "--tensor-parallel-size", "tensor_parallel_for_pod_gpus") if size == 1 else ([], "")
    return Finding(kind=FindingKind.PARALLEL_ABOVE_POD_DEVICES, title="More parallel ranks than the pod's devices",
                   text=_join(text, why), changes=changes)


def _parallel_node(ctx: Context) -> Finding | None:
    s = ctx.signals
    world, size = s.get("world_size") or 1, group_size(ctx)
    node = formulas.node_device_count(ctx)
    if not node or size > 1 or world <= node:
        return None  # a LeaderWorkerSet spreads the ranks over several nodes
    text = (f"TP x PP = {world} ranks need {world} devices in one pod, and node {ctx.node.name or '?'} has {node}: "
            f"no pod on this node can run it; a LeaderWorkerSet over {math.ceil(world / node)} nodes or fewer "
            f"ranks can.")
    return Finding(kind=FindingKind.PARALLEL_ABOVE_NODE_DEVICES, title="More parallel ranks than the node's devices",
                   text=text)


def _shm(ctx: Context) -> Finding | None:
    s = ctx.signals
    ranks = (s.get("world_size") or 1) * (s.get("data_parallel_size") or 1)
    if ranks < 2 or ctx.pod.host_ipc:
        return None
    volume = ctx.pod.shm_volume or {}
    if not s.get("has_shm_volume"):
        changes, why = _changes(ctx, "volume", "/dev/shm", "shm_size")
        return Finding(kind=FindingKind.SHM_MISSING, title="No /dev/shm volume for several ranks",
                       text=_join(f"{ranks} vLLM processes exchange tensors through /dev/shm, and without a "
                                  f"memory-backed volume the container gets 64 MiB.", why), changes=changes)
    limit = (volume.get("emptyDir") or {}).get("sizeLimit")
    size = parse_quantity(str(limit)) if limit else None
    if size is None or size >= SHM_FLOOR_GIB * 2**30:
        return None
    want = f"{max(2, ranks)}Gi"
    return Finding(kind=FindingKind.SHM_TOO_SMALL, title="/dev/shm too small for several ranks",
                   text=f"/dev/shm is limited to {limit} for {ranks} ranks; NCCL and vLLM's queues need about 1 GiB "
                        f"per rank, at least 2 GiB: sizeLimit {want}.",
                   changes=[Change(kind="volume", name="/dev/shm", before=str(limit), after=want)])


def load_seconds(ctx: Context) -> tuple[float, str] | None:
    """How long start-up took, as the log says ("Model loading took 14.9 GiB and 41.2 seconds",
    "init engine ... took 12.3 seconds"), else as long as a run that died still loading lived."""
    parts = []
    for fact in ("weights_gib", "engine_ready"):
        line = ctx.facts.line_of(fact) or ""
        m = _SECONDS.search(line)
        if m:
            parts.append(float(m.group(1)))
    if parts:
        return sum(parts), "the log's load and engine start-up times"
    lived = ctx.pod.container.last_finished_after_seconds if ctx.pod.container else None
    if lived and ctx.signals.get("died_before_ready"):
        return lived, "the previous run, still loading when it ended"
    return None


def _probe(ctx: Context) -> Finding | None:
    container = ctx.pod.container
    if container is None:
        return None
    window = _probe_window(ctx)
    load = load_seconds(ctx)
    if window is None or load is None or load[0] < window[0]:
        return None
    new = int(min(3600, max(600, math.ceil(load[0] * 2 / 60) * 60)))
    probe = f'{{"httpGet":{{"path":"/health","port":8000}},"periodSeconds":10,"failureThreshold":{new // 10}}}'
    return Finding(kind=FindingKind.PROBE_BUDGET_SHORT, title="The probe window is shorter than the load",
                   text=f"{window[1]} allows {window[0]:.0f} s before it kills the container, but start-up took "
                        f"{load[0]:.0f} s ({load[1]}): once the primary cause is fixed, the probe kills the next "
                        f"start. A startupProbe of {new // 10} x 10 s = {new} s (twice the load, at least 10 "
                        f"minutes) holds the liveness probe back.",
                   changes=[Change(kind="probe", name="startupProbe", after=probe)])


def _probe_window(ctx: Context) -> tuple[float, str] | None:
    container = ctx.pod.container
    raw = formulas.pick_container(ctx.raw_pod or {}, container.name) if container else None
    startup = (raw or {}).get("startupProbe")
    if startup:
        seconds = int(startup.get("initialDelaySeconds", 0)) + int(startup.get("periodSeconds", 10)) * int(
            startup.get("failureThreshold", 3))
        return float(seconds), "the startupProbe"
    if container is not None and container.liveness_budget_seconds is not None:
        return float(container.liveness_budget_seconds), "the livenessProbe (no startupProbe)"
    return None


def _join(text: str, why: str) -> str:
    return text + (" " + formulas.sentence(why) if why else "")

