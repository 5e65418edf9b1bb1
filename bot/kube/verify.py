"""Follow a rollout after a change: a new pod Ready (report vLLM's own KV-cache figures) or a new crash
(diagnose it again). Polling, not watches: simple, and the poll interval is configurable.

"New pods" are the workload's pods whose target container matches the workload's current
template (command, args, env, resources, mounts, probes): the Deployment controller copies the
template into the new ReplicaSet, the StatefulSet controller into each re-created pod.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable

from bot import changes as ch
from bot.kube.api import KubeApi
from bot.kube.collect import age_key, collect, read_head_and_tail
from bot.ports import Verification, WorkloadRef

log = logging.getLogger("bot.kube")

KV_CACHE_LINE = re.compile(
    r"(?:GPU|[A-Z]+) KV cache size: [\d,]+ tokens|# (?:GPU|cuda) blocks: \d+|Available KV cache memory: [\d.]+ ?GiB")
CONCURRENCY_LINE = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x")
CRASH_REASONS = {"CrashLoopBackOff", "Error", "OOMKilled", "ContainerCannotRun", "StartError",
                 "CreateContainerError", "RunContainerError"}


def kv_figures(log_text: str) -> tuple[str | None, str | None]:
    """vLLM's own KV-cache line(s) and maximum-concurrency line from a log (last occurrence wins)."""
    kv = [m.group(0) for m in KV_CACHE_LINE.finditer(log_text)]
    conc = [m.group(0) for m in CONCURRENCY_LINE.finditer(log_text)]
    # Prefer the token count; add the memory line when vLLM printed both.
    tokens = [k for k in kv if "tokens" in k or "blocks" in k]
    memory = [k for k in kv if "memory" in k]
    parts = ([tokens[-1]] if tokens else []) + ([memory[-1]] if memory else [])
    return ("; ".join(parts) or None), (conc[-1] if conc else None)


def selector_string(workload: dict[str, Any]) -> str:
    labels = (((workload.get("spec") or {}).get("selector") or {}).get("matchLabels")) or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def pod_state(pod: dict[str, Any], container: str) -> str:
    """"ready", "crashed", or "pending" for one pod."""
    status = pod.get("status") or {}
    if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return "ready"
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        waiting = (cs.get("state") or {}).get("waiting") or {}
        terminated = (cs.get("state") or {}).get("terminated") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        if waiting.get("reason") in CRASH_REASONS:
            return "crashed"
        if terminated and terminated.get("exitCode", 0) != 0:
            return "crashed"
        if last and int(cs.get("restartCount") or 0) > 0:
            return "crashed"
    return "pending"


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


def new_pods(api: KubeApi, workload: dict[str, Any], container: str) -> list[dict[str, Any]]:
    namespace = workload["metadata"]["namespace"]
    want = ch.fields_of(ch.pod_spec_of(workload), container)
    want.pop("volumes", None)
    pods = api.list_pods(namespace, label_selector=selector_string(workload))
    out = []
    for p in pods:
        if (p.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            have = ch.fields_of(p.get("spec") or {}, container)
        except ch.ChangeError:
            continue
        have.pop("volumes", None)
        if have == want:
            out.append(p)
    return sorted(out, key=age_key, reverse=True)


def newest_replicaset(api: KubeApi, workload: dict[str, Any]) -> str | None:
    """The ReplicaSet carrying the Deployment's current template (for the message)."""
    if workload.get("kind") != "Deployment":
        return None
    template = ch.pod_spec_of(workload)
    for rs in api.list_replicasets(workload["metadata"]["namespace"], selector_string(workload)):
        owners = (rs.get("metadata") or {}).get("ownerReferences") or []
        if any(o.get("uid") == workload["metadata"].get("uid") for o in owners) and ch.pod_spec_of(rs) == template:
            return rs["metadata"]["name"]
    return None


def follow_rollout(api: KubeApi, ref: WorkloadRef, timeout_seconds: float, poll_seconds: float = 5.0,
                   diagnose: Callable[..., Any] | None = None, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Verification:
    if ref.kind not in ("Deployment", "StatefulSet"):
        return Verification(outcome="unknown", message=f"{ref.kind} {ref.name}: no rollout to follow")
    deadline = clock() + timeout_seconds
    replicaset = None
    while True:
        workload = api.get_workload(ref.kind, ref.namespace, ref.name)
        replicaset = replicaset or newest_replicaset(api, workload)
        pods = new_pods(api, workload, ref.container)
        where = f" (ReplicaSet {replicaset})" if replicaset else ""
        for pod in pods:
            state = pod_state(pod, ref.container)
            name = pod["metadata"]["name"]
            if state == "ready":
                text = read_head_and_tail(api, ref.namespace, name, ref.container, previous=False).text or ""
                kv, conc = kv_figures(text)
                figures = "; ".join(x for x in (kv, conc) if x) or "vLLM printed no KV-cache figures"
                return Verification(outcome="ready", pod=name, kv_cache_line=kv, concurrency_line=conc,
                                    message=f"new pod {name}{where} is Ready: {figures}")
            if state == "crashed":
                evidence = collect(api, ref.namespace, name, ref.container)
                if diagnose is None:
                    from bot.diagnose import diagnose
                result = diagnose(evidence)
                return Verification(outcome="crashed", pod=name, diagnosis=result,
                                    message=f"new pod {name}{where} crashed again: {result.title}")
        if clock() >= deadline:
            seen = ", ".join(f"{p['metadata']['name']}: {why_not_ready(p, ref.container)}" for p in pods) \
                or "no new pod yet"
            return Verification(outcome="timeout", message=f"{ref.kind} {ref.name}: neither Ready nor crashed "
                                f"after {timeout_seconds:g}s ({seen}); vLLM can take many minutes to load")
        sleep(poll_seconds)
