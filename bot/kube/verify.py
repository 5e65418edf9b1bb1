"""Follow a rollout after a change: poll the new pods and read their logs and answers. What they
mean (Ready, crashed, timed out; the KV-cache line; a completion; a soak) is decided in
bot.app.verdict, and a crashed pod is diagnosed by the diagnoser the caller passes in. Polling,
not watches: simple, and the poll interval is configurable.

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

from bot.app import verdict
from bot.app.records import CompletionCheck, MemoryReading, PodState, Verification
from bot.app.verdict import Diagnoser
from bot.diagnosis.models import DiagnosisResult
from bot.kube.api import KubeApi
from bot.kube.collect import age_key, collect, read_head_and_tail
from bot.kube.errors import KubeError
from bot.kube.prometheus import USED, Prometheus, PrometheusError, gpu_memory_trend
from bot.remedy import changes as ch
from bot.remedy.models import WorkloadRef

log = logging.getLogger("bot.kube")

def selector_string(workload: dict[str, Any]) -> str:
    labels = (((workload.get("spec") or {}).get("selector") or {}).get("matchLabels")) or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


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


def follow_rollout(api: KubeApi, ref: WorkloadRef, timeout_seconds: float, diagnose: Diagnoser | None,
                   poll_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Verification:
    """Poll the workload's new pods until one is Ready or crashed, or the time is up; the verdict
    is bot.app.verdict's. A crashed pod's evidence goes to `diagnose` (the caller's), if given."""
    if ref.kind not in ("Deployment", "StatefulSet"):
        return verdict.no_rollout(ref.kind, ref.name)
    deadline = clock() + timeout_seconds
    while True:
        workload = api.get_workload(ref.kind, ref.namespace, ref.name)
        pods, replicaset = new_pods(api, workload, ref.container)
        where = f" (ReplicaSet {replicaset})" if replicaset else ""
        settled = verdict.settled_pod(pods, ref.container)
        if settled is not None:
            name, state = settled
            if state is PodState.READY:
                text = read_head_and_tail(api, ref.namespace, name, ref.container, previous=False).text or ""
                return verdict.ready(name, where, text)
            diagnosis = diagnose(collect(api, ref.namespace, name, ref.container)) if diagnose else None
            return verdict.crashed(name, where, diagnosis)
        if clock() >= deadline:
            return verdict.timed_out(ref.kind, ref.name, timeout_seconds, pods, ref.container)
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

    def __init__(self, api: KubeApi, via: str = "proxy", diagnose: Diagnoser | None = None,
                 poll_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, prometheus: Prometheus | None = None):
        self.api, self.via, self.prometheus = api, via, prometheus
        self._diagnose = diagnose  # only for callers that pass none to ask/soak (bot.app.rollout passes its own)
        self.poll_seconds, self.clock, self.sleep = poll_seconds, clock, sleep

    def _request(self, pod: dict[str, Any], container: str, method: str, path: str,
                 body: dict[str, Any] | None, timeout: float) -> tuple[int, str]:
        meta, port = pod["metadata"], serving_port(pod, container)
        if self.via == "pod-ip":
            return _direct(f"http://{(pod.get('status') or {}).get('podIP')}:{port}{path}", method, body, timeout)
        from bot.kube.api import proxy_pod

        return proxy_pod(self.api, meta["namespace"], meta["name"], port, method, path, body, timeout)

    def ask(self, workload: WorkloadRef, pod_name: str, timeout_seconds: float,
            diagnose: Diagnoser | None = None) -> CompletionCheck:
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
            why = f"no answer to a completion request within {timeout_seconds:g} s"
        except Exception as exc:
            why = f"the completion request failed: {exc}"
        else:
            answered = verdict.completion_answered(pod_name, model, code, text, latency)
            if isinstance(answered, CompletionCheck):
                return answered
            why = answered
        return verdict.completion_failed(model, why, self._rediagnosed(workload, pod_name, diagnose))

    def _rediagnosed(self, workload: WorkloadRef, pod_name: str, diagnose: Diagnoser | None) -> DiagnosisResult | None:
        diagnose = diagnose or self._diagnose
        if diagnose is None:
            return None
        try:
            return diagnose(collect(self.api, workload.namespace, pod_name, workload.container))
        except Exception as exc:  # the pod may be gone too: the failure is still the news
            log.warning("could not re-diagnose %s after a failed request: %s", pod_name, exc)
            return None

    def soak(self, workload: WorkloadRef, pod_name: str, seconds: float, diagnose: Diagnoser) -> Verification:
        """Watch the new pod for `seconds`: Ready if it neither restarted nor crashed, else
        crashed, with the crash diagnosed by `diagnose` (bot.app.verdict says which)."""
        start = self.api.get_pod(workload.namespace, pod_name)
        deadline = self.clock() + seconds
        while True:
            pod = self.api.get_pod(workload.namespace, pod_name)
            if verdict.broke_during_soak(start, pod, workload.container):
                evidence = collect(self.api, workload.namespace, pod_name, workload.container)
                return verdict.soak_crashed(pod_name, diagnose(evidence))
            if self.clock() >= deadline:
                return verdict.soak_clean(pod_name, seconds)
            self.sleep(min(self.poll_seconds, max(0.0, deadline - self.clock())))

    def gpu_memory(self, workload: WorkloadRef, pod_name: str, start: datetime, end: datetime) -> MemoryReading:
        """Step 5: the pod's GPU memory over the window from Prometheus, or why it is absent."""
        if self.prometheus is None:
            return verdict.memory_unmeasured("no Prometheus URL configured: VLLM_ONCALL_PROMETHEUS_URL")
        try:
            node = ((self.api.get_pod(workload.namespace, pod_name).get("spec") or {}).get("nodeName"))
            trends = gpu_memory_trend(self.prometheus, node, workload.namespace, pod_name, start, end)
        except (PrometheusError, KubeError) as exc:
            return verdict.memory_unmeasured(str(exc))
        if not trends:
            return verdict.memory_unmeasured(f"Prometheus has no {USED} series for pod {pod_name} "
                                             f"or node {node}: is dcgm-exporter scraped?")
        return verdict.memory_reading(trends)


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
