"""Follow a rollout after a change: a new pod Ready (report vLLM's own KV-cache figures) or a new crash
(diagnose it again). Polling, not watches: simple, and the poll interval is configurable.

"New pods" are the pods of the workload's current template: for a Deployment, the pods of the
ReplicaSet whose template is the Deployment's (what `kubectl rollout status` follows); for a
StatefulSet, the pods of its update revision.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bot.app.records import CompletionCheck, Verification
from bot.diagnosis.diagnose import diagnose as default_diagnose
from bot.diagnosis.logfacts import PATTERNS
from bot.kube.api import KubeApi
from bot.kube.collect import age_key, collect, read_head_and_tail
from bot.kube.errors import KubeError
from bot.kube.prometheus import USED, Prometheus, PrometheusError, gpu_memory_trend
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


# ---- after Ready: a real request, then a soak (the seeds' check) ---------------------------

PROMPT = "Reply with the word OK."
MAX_TOKENS = 16


def served_model(pod: dict[str, Any], container: str) -> str | None:
    """The model name vLLM serves, from the container's command line: --served-model-name (its
    first name), else the model (`vllm serve MODEL` or --model)."""
    from bot.diagnosis.cmdline import parse

    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") != container:
            continue
        parsed = parse(c.get("command"), c.get("args"))
        served = parsed.get("--served-model-name")
        return (served.split()[0] if served else None) or parsed.model
    return None


def serving_port(pod: dict[str, Any], container: str) -> int:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            for port in c.get("ports") or []:
                if port.get("containerPort"):
                    return int(port["containerPort"])
    return 8000  # vLLM's default


class ServingChecks:
    """Steps 3 and 4 of verification on a live cluster (bot.app.rollout's ServingProbe).

    via="proxy" (default): requests go through the API server's pod proxy (RBAC: create and get
    on pods/proxy, nothing else); via="pod-ip": straight to status.podIP (the bot's pod must be
    allowed to reach it, NetworkPolicies permitting)."""

    def __init__(self, api: KubeApi, via: str = "proxy", diagnose: Callable[..., Any] | None = None,
                 poll_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, prometheus: Prometheus | None = None):
        self.api, self.via, self.prometheus = api, via, prometheus
        self._diagnose = diagnose or default_diagnose
        self.poll_seconds, self.clock, self.sleep = poll_seconds, clock, sleep

    def _request(self, pod: dict[str, Any], container: str, method: str, path: str,
                 body: dict[str, Any] | None, timeout: float) -> tuple[int, str]:
        meta, port = pod["metadata"], serving_port(pod, container)
        if self.via == "pod-ip":
            return _direct(f"http://{(pod.get('status') or {}).get('podIP')}:{port}{path}", method, body, timeout)
        from bot.kube.api import proxy_pod

        return proxy_pod(self.api, meta["namespace"], meta["name"], port, method, path, body, timeout)

    def ask(self, workload: WorkloadRef, pod_name: str, timeout_seconds: float) -> CompletionCheck:
        """POST /v1/completions (a short prompt, max_tokens 16) to the new pod; latency and tokens.
        An error or no answer in time is a failed check, re-diagnosed from the pod's log."""
        pod = self.api.get_pod(workload.namespace, pod_name)
        model = served_model(pod, workload.container)
        try:
            if model is None:
                code, text = self._request(pod, workload.container, "GET", "/v1/models", None, timeout_seconds)
                model = (json.loads(text).get("data") or [{}])[0].get("id") if code == 200 else None
            started = self.clock()
            body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
            code, text = self._request(pod, workload.container, "POST", "/v1/completions", body, timeout_seconds)
            latency = self.clock() - started
        except TimeoutError:
            return self._failed(workload, pod_name, model, f"no answer to a completion request within "
                                f"{timeout_seconds:g} s")
        except Exception as exc:
            return self._failed(workload, pod_name, model, f"the completion request failed: {exc}")
        if code != 200:
            return self._failed(workload, pod_name, model, f"the completion request got HTTP {code}: "
                                f"{_error_text(text)}")
        answer = json.loads(text)
        tokens = ((answer.get("usage") or {}).get("completion_tokens"))
        return CompletionCheck(ok=True, model=model, latency_seconds=round(latency, 3), tokens=tokens,
                               message=f"a completion request to {pod_name} (model {model}) returned "
                                       f"{tokens} tokens in {latency:.2f} s")

    def _failed(self, workload: WorkloadRef, pod_name: str, model: str | None, why: str) -> CompletionCheck:
        try:
            evidence = collect(self.api, workload.namespace, pod_name, workload.container)
            diagnosis = self._diagnose(evidence)
        except Exception as exc:  # the pod may be gone too: the failure is still the news
            log.warning("could not re-diagnose %s after a failed request: %s", pod_name, exc)
            diagnosis = None
        return CompletionCheck(ok=False, model=model, message=why, diagnosis=diagnosis)

    def soak(self, workload: WorkloadRef, pod_name: str, seconds: float) -> Verification:
        """Watch the new pod for `seconds`: "ready" if it neither restarted nor crashed, else
        "crashed" with the crash diagnosed."""
        start = self.api.get_pod(workload.namespace, pod_name)
        restarts = _restarts(start, workload.container)
        deadline = self.clock() + seconds
        while True:
            pod = self.api.get_pod(workload.namespace, pod_name)
            if _restarts(pod, workload.container) > restarts or pod_state(pod, workload.container) == "crashed":
                evidence = collect(self.api, workload.namespace, pod_name, workload.container)
                result = self._diagnose(evidence)
                return Verification(outcome="crashed", pod=pod_name, diagnosis=result,
                                    message=f"{pod_name} crashed during the soak: {result.title}")
            if self.clock() >= deadline:
                return Verification(outcome="ready", pod=pod_name,
                                    message=f"{pod_name}: no restart and no crash in {seconds:g} s")
            self.sleep(min(self.poll_seconds, max(0.0, deadline - self.clock())))


    def gpu_memory(self, workload: WorkloadRef, pod_name: str, start: datetime, end: datetime) -> str:
        """Step 5: the pod's GPU memory over the window from Prometheus, or why it is absent."""
        if self.prometheus is None:
            return ("GPU memory over the soak: not measured (no Prometheus URL configured: "
                    "VLLM_ONCALL_PROMETHEUS_URL)")
        try:
            node = ((self.api.get_pod(workload.namespace, pod_name).get("spec") or {}).get("nodeName"))
            trends = gpu_memory_trend(self.prometheus, node, workload.namespace, pod_name, start, end)
        except (PrometheusError, KubeError) as exc:
            return f"GPU memory over the soak: not measured ({exc})"
        if not trends:
            return (f"GPU memory over the soak: not measured (Prometheus has no {USED} series for pod {pod_name} "
                    f"or node {node}: is dcgm-exporter scraped?)")
        return "GPU memory over the soak:\n" + "\n".join(t.line() for t in trends)


def _restarts(pod: dict[str, Any], container: str) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            return int(cs.get("restartCount") or 0)
    return 0


def _error_text(text: str) -> str:
    try:
        doc = json.loads(text)
        return str(doc.get("message") or doc.get("detail") or text)[:300]
    except (ValueError, AttributeError):
        return text[:300]


def _direct(url: str, method: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", errors="replace")
    except TimeoutError:
        raise TimeoutError(f"no answer from {url} within {timeout:g} s") from None
