"""Follow a rollout after a change: a new pod Ready (report vLLM's own KV-cache figures) or a new crash
(diagnose it again). Polling, not watches: simple, and the poll interval is configurable.

"New pods" are the pods of the workload's current template: for a Deployment, the pods of the
ReplicaSet whose template is the Deployment's (what `kubectl rollout status` follows); for a
StatefulSet, the pods of its update revision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from bot.app.records import Verification
from bot.diagnosis.diagnose import diagnose as default_diagnose
from bot.diagnosis.logfacts import PATTERNS
from bot.kube.api import KubeApi
from bot.kube.collect import age_key, collect, read_head_and_tail
from bot.remedy import changes as ch
from bot.remedy.models import WorkloadRef

log = logging.getLogger("bot.kube")

CRASH_REASONS = {"CrashLoopBackOff", "Error", "OOMKilled", "ContainerCannotRun", "StartError",
                 "CreateContainerError", "RunContainerError"}


def kv_figures(log_text: str) -> tuple[str | None, str | None]:
    """vLLM's own KV-cache line(s) and maximum-concurrency line from a log (last occurrence wins).

    The formats are the diagnosis core's (bot.logfacts): one definition of what vLLM prints.
    """
    def last(*names: str) -> str | None:
        found = [m for name in names for m in PATTERNS[name].finditer(log_text)]
        return max(found, key=lambda m: m.start()).group(0) if found else None

    # Prefer the token count; add the memory line when vLLM printed both.
    parts = [p for p in (last("kv_tokens", "gpu_blocks"), last("available_kv")) if p]
    return ("; ".join(parts) or None), last("concurrency")


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


def current_replicaset(api: KubeApi, workload: dict[str, Any]) -> dict[str, Any] | None:
    """The Deployment's ReplicaSet whose pod template is the Deployment's current one (what
    `kubectl rollout status` follows). None until the controller has created it."""
    template = ch.pod_spec_of(workload)
    uid = workload["metadata"].get("uid")
    for rs in api.list_replicasets(workload["metadata"]["namespace"], selector_string(workload)):
        owners = (rs.get("metadata") or {}).get("ownerReferences") or []
        if any(o.get("uid") == uid for o in owners) and ch.pod_spec_of(rs) == template:
            return rs
    return None


def new_pods(api: KubeApi, workload: dict[str, Any], container: str) -> tuple[list[dict[str, Any]], str | None]:
    """(the pods of the workload's current template, newest first; the ReplicaSet's name).

    Deployment: the pods owned by the ReplicaSet of the current template. StatefulSet: the pods of
    status.updateRevision, else those whose container has every field of the template's (pods may
    carry more: admission webhooks and LimitRanges add env, mounts and resources to pods)."""
    namespace = workload["metadata"]["namespace"]
    pods = [p for p in api.list_pods(namespace, label_selector=selector_string(workload))
            if not (p.get("metadata") or {}).get("deletionTimestamp")]
    replicaset_name = None
    if workload.get("kind") == "Deployment":
        rs = current_replicaset(api, workload)
        if rs is None:
            return [], None
        replicaset_name, uid = rs["metadata"]["name"], rs["metadata"].get("uid")
        chosen = [p for p in pods if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])]
    else:
        revision = (workload.get("status") or {}).get("updateRevision")
        if revision:
            chosen = [p for p in pods if (p["metadata"].get("labels") or {}).get("controller-revision-hash") == revision]
        else:
            want = ch.fields_of(ch.pod_spec_of(workload), container)
            want.pop("volumes", None)
            chosen = []
            for p in pods:
                try:
                    have = ch.fields_of(p.get("spec") or {}, container)
                except ch.ChangeError:
                    continue
                if contains(have, want):
                    chosen.append(p)
    return sorted(chosen, key=age_key, reverse=True), replicaset_name


def contains(actual: Any, expected: Any) -> bool:
    """Every field of `expected` is in `actual` (which may have more); lists of named items match by name."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and contains(actual[k], v) for k, v in expected.items())
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return False
        if all(isinstance(e, dict) and "name" in e for e in expected):
            by_name = {a.get("name"): a for a in actual if isinstance(a, dict)}
            return all(e["name"] in by_name and contains(by_name[e["name"]], e) for e in expected)
        return len(actual) == len(expected) and all(contains(a, e) for a, e in zip(actual, expected))
    return actual == expected or (actual is not None and str(actual) == str(expected))


def follow_rollout(api: KubeApi, ref: WorkloadRef, timeout_seconds: float, poll_seconds: float = 5.0,
                   diagnose: Callable[..., Any] | None = None, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Verification:
    if ref.kind not in ("Deployment", "StatefulSet"):
        return Verification(outcome="unknown", message=f"{ref.kind} {ref.name}: no rollout to follow")
    deadline = clock() + timeout_seconds
    while True:
        workload = api.get_workload(ref.kind, ref.namespace, ref.name)
        pods, replicaset = new_pods(api, workload, ref.container)
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
                result = (diagnose or default_diagnose)(evidence)
                return Verification(outcome="crashed", pod=name, diagnosis=result,
                                    message=f"new pod {name}{where} crashed again: {result.title}")
        if clock() >= deadline:
            seen = ", ".join(f"{p['metadata']['name']}: {why_not_ready(p, ref.container)}" for p in pods) \
                or "no new pod yet"
            return Verification(outcome="timeout", message=f"{ref.kind} {ref.name}: neither Ready nor crashed "
                                f"after {timeout_seconds:g}s ({seen}); vLLM can take many minutes to load")
        sleep(poll_seconds)
